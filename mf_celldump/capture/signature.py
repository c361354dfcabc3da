"""How a cell's ``construct`` parameters map to capture slots; the same in both modes.

A positional-or-keyword parameter is ``input.i`` (its position) whether the caller
passed it by position or by keyword; a keyword-only parameter is an ``input_kwargs``
entry under its name; ``**kwargs`` passes through uncaptured. Only what the caller
passed is recorded, as msprobe records a call: a parameter left at its default is not.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, List, Tuple

from mf_celldump.rawformat.keys import SLOT_ARG, SLOT_KWARG

# The graph wrapper's default for every defaulted parameter: a string constant the compiler
# folds, so generated code can tell at compile time that the caller left the parameter out
# (then nothing is recorded and the original's own default is put in before the call).
UNPASSED = "__mf_celldump_unpassed__"


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
