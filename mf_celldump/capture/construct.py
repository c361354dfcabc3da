"""A cell's ``construct`` as capture sees it, the same in both modes: its parameters as
capture slots, the input modes a mapping entry may give it, the input gradients that
cannot be recorded, and the capturing ``construct`` put in its place and back.

Slots: a positional-or-keyword parameter is ``input.i`` (its position) whether the caller
passed it by position or by keyword; a keyword-only parameter is an ``input_kwargs``
entry under its name; ``**kwargs`` passes through uncaptured. Only what the caller
passed is recorded, as msprobe records a call: a parameter left at its default is not.

Input modes: a mode list longer than the arguments is accepted by the mapping file
format, and the extra modes are simply never used; that usually means the entry was
written for another cell (or a different model version), so capture says which modes
are surplus.

Input gradients: msprobe 26.2 ties the top-level tensor positional arguments of each
call into one backward hook (``CellBackwardHook``) when at least one of them is
differentiable, and numbers the gradients it records (``backward.N.output.i``) by
position among those tensors only: a tensor inside a tuple argument, a keyword argument
or a non-tensor argument takes no number. When no tensor input of a call is
differentiable (only int or bool tensors, e.g. ``input_ids``), msprobe hooks nothing; we
write an explicit ``null`` for each of those tensor inputs instead, and say why in one
log line per cell class (``GradientGapLog``).

Installing: the wrapper is an instance attribute bound with ``types.MethodType``
(MindSpore's graph parser needs a bound method whose first parameter is ``self``);
restoring deletes it, or puts back an instance ``construct`` the cell already had, so the
cell's class is never touched.
"""

from __future__ import annotations

import inspect
import logging
import types
from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Mapping, Optional, Set, Tuple

from mf_celldump.mapping import ArgModes
from mf_celldump.rawformat.keys import SLOT_ARG, SLOT_KWARG

logger = logging.getLogger(__name__)

# The graph wrapper's default for every defaulted parameter: a string constant the compiler
# folds, so generated code can tell at compile time that the caller left the parameter out
# (then nothing is recorded and the original's own default is put in before the call).
UNPASSED = "__mf_celldump_unpassed__"


# -- parameters as capture slots ----------------------------------------------------------------------

@dataclass(frozen=True)
class ParamSlot:
    """Where one ``construct`` parameter lands in the dump."""

    name: str
    kind: object  # inspect.Parameter kind
    slot: str  # SLOT_ARG / SLOT_KWARG; "" for **kwargs (passed through)
    index: int  # argument index (SLOT_ARG) or index in the cell's params (SLOT_KWARG)
    default: object


def construct_params(cell) -> Tuple[str, ...]:
    """Names of the class ``construct``'s parameters, without ``self`` and ``*``/``**`` ones."""
    try:
        signature = inspect.signature(type(cell).construct)
    except (TypeError, ValueError):
        return ()
    return tuple(name for name, p in signature.parameters.items()
                 if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))


def param_slots(original: Callable, params: Tuple[str, ...]) -> List[ParamSlot]:
    """The signature of the bound ``original`` as capture slots."""
    slots = []
    position = 0
    for name, param in inspect.signature(original).parameters.items():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD, param.VAR_POSITIONAL):
            slots.append(ParamSlot(name, param.kind, SLOT_ARG, position, param.default))
            position += 1
        elif param.kind == param.KEYWORD_ONLY:
            slots.append(ParamSlot(name, param.kind, SLOT_KWARG, params.index(name), param.default))
        else:
            slots.append(ParamSlot(name, param.kind, "", -1, param.default))
    return slots


# -- the input modes a mapping entry may give ---------------------------------------------------------

def positional_inputs(cell) -> Optional[Tuple[str, ...]]:
    """Names of the positional parameters of the cell class's ``construct``; None when unbounded (``*args``)."""
    try:
        signature = inspect.signature(type(cell).construct)
    except (TypeError, ValueError):
        return None
    names = []
    for name, param in signature.parameters.items():
        if param.kind == param.VAR_POSITIONAL:
            return None
        if name != "self" and param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            names.append(name)
    return tuple(names)


def surplus_mode_warnings(modes: Mapping[str, ArgModes], cells: Iterable[Tuple[str, object]]) -> List[str]:
    """One message per cell whose mapping entry lists more input modes than its ``construct`` takes.

    ``modes`` is cell name -> modes (``mapping.modes_for_network``); ``cells`` yields
    (cell name, cell) pairs, e.g. ``model.cells_and_names()``.
    """
    out = []
    for name, cell in cells:
        entry = modes.get(name)
        if entry is None:
            continue
        params = positional_inputs(cell)
        if params is None or len(entry.input_modes) <= len(params):
            continue
        surplus = entry.input_modes[len(params):]
        where = f"{entry.where}: " if entry.where else ""
        shown = [f"#{len(params) + i} {m}" for i, m in enumerate(surplus[:SHOWN_MODES])]
        more = f" and {len(surplus) - SHOWN_MODES} more" if len(surplus) > SHOWN_MODES else ""
        out.append(
            f"{where}{name} ({type(cell).__name__}) takes {len(params)} input(s) ({_cut(', '.join(params))}) but the "
            f"entry {_cut(entry.format())} gives {len(entry.input_modes)} input modes; surplus, ignored: "
            f"{', '.join(shown)}{more}")
    return out


SHOWN_MODES = 12  # surplus modes named in a warning; a mapping may list millions
SHOWN_CHARS = 200


def _cut(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS - 20]}... ({len(text)} characters)"


# -- input gradients that cannot be recorded ----------------------------------------------------------

NOT_DIFFERENTIABLE = "not-differentiable"
NESTED = "nested"

_WHY = {
    NOT_DIFFERENTIABLE: ("no gradient can exist for its tensor inputs %s (%s: no floating-point tensor among "
                         "the call's inputs); written as null"),
    NESTED: ("gradients of tensors inside tuple/list arguments %s (%s) are not recorded, as msprobe records none; "
             "backward output indices count top-level tensor arguments only"),
}


@dataclass
class GradientGapLog:
    """Logs each (cell class, reason) once per attached dump."""

    _seen: Set[Tuple[str, str]] = field(default_factory=set)

    def note(self, class_name: str, reason: str, slots: str, detail: str) -> None:
        if (class_name, reason) in self._seen:
            return
        self._seen.add((class_name, reason))
        logger.info("%s: " + _WHY[reason], class_name, slots, detail)


def differentiable_dtypes() -> tuple:
    """MindSpore dtypes that can carry a gradient (float and complex): a call whose tensor inputs have
    none of them gets the explicit nulls."""
    from mindspore.common import dtype as mstype

    return tuple(mstype.float_type) + tuple(getattr(mstype, "complex_type", ()))


# -- the capturing construct in place, and back -------------------------------------------------------

_MISSING = object()


@dataclass
class InstalledConstruct:
    cell: object
    previous: object  # the instance's own ``construct`` before wrapping, or _MISSING

    def restore(self) -> None:
        if self.previous is _MISSING:
            self.cell.__dict__.pop("construct", None)
        else:
            self.cell.__dict__["construct"] = self.previous


def install(cell, construct: Callable) -> InstalledConstruct:
    """Make ``construct(self, ...)`` the construct of this one ``cell``."""
    previous = cell.__dict__.get("construct", _MISSING)
    cell.__dict__["construct"] = types.MethodType(construct, cell)
    return InstalledConstruct(cell, previous)
