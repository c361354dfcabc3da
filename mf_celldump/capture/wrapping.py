"""Replace a cell's ``construct`` with a capturing one, and put the original back.

Arguments are identified by the cell's ``construct`` signature, the same way in both
modes: a positional-or-keyword parameter is ``input.i`` (its position) whether the
caller passed it by position or by keyword; a keyword-only parameter is an
``input_kwargs`` entry under its name; defaults are applied, so a parameter left at
its default is recorded too. Non-tensor values (int, float, bool, None) are recorded
as values.

Two wrapper shapes, chosen by execution mode at attach time:

* PyNative: plain Python. It knows the step and the call index, skips all work on
  steps that are not captured, and walks any nesting of tuples, lists and dicts.
* Graph: code MindSpore's compiler parses. Facts it relies on (MindSpore 2.9):
  - the function is bound with ``types.MethodType`` and its first parameter is named
    ``self`` (a plain function assigned to ``cell.construct`` fails to parse);
  - it has the original's explicit parameters, generated from the signature: a loop
    like MindFormers' ``for i in range(n): self.layers[i](...)`` is compiled as a
    graph loop that switches between the layers' constructs, and that path rejects a
    ``*args, **kwargs`` wrapper ("parameters number ... provided arguments");
  - the generated source is registered with ``linecache`` (the parser reads source),
    its module name is ours, and everything it uses comes in as closure variables
    (the parser resolves closures, not the ``exec`` namespace);
  - no ``for`` loops: MindSpore may compile a loop whose body holds capture ops into
    a graph while-loop whose index is no longer a constant; sequences are walked by
    recursion instead;
  - dicts inside arguments pass through uncaptured.
  A construct with ``*args``/``**kwargs`` itself gets a generic varargs wrapper.

The wrapper is an instance attribute; detaching deletes it (or restores an instance
``construct`` the cell already had), so the cell's class is never touched.
"""

from __future__ import annotations

import inspect
import linecache
import logging
import types
from dataclasses import dataclass
from typing import Callable, List, Tuple

from mf_celldump import naming
from mf_celldump.capture.runtime import CaptureRuntime
from mf_celldump.capture.selection import CellInfo
from mf_celldump.mapping.model import ArgModes

logger = logging.getLogger(__name__)

_MISSING = object()


@dataclass
class InstalledWrapper:
    info: CellInfo
    previous: object  # the instance's own ``construct`` before wrapping, or _MISSING

    def restore(self) -> None:
        cell = self.info.cell
        if self.previous is _MISSING:
            cell.__dict__.pop("construct", None)
        else:
            cell.__dict__["construct"] = self.previous


def install(info: CellInfo, construct: Callable) -> InstalledWrapper:
    cell = info.cell
    previous = cell.__dict__.get("construct", _MISSING)
    cell.__dict__["construct"] = types.MethodType(construct, cell)
    return InstalledWrapper(info, previous)


@dataclass(frozen=True)
class ParamSlot:
    """Where one ``construct`` parameter lands in the dump."""

    name: str
    kind: object  # inspect.Parameter kind
    slot: str  # naming.SLOT_ARG / SLOT_KWARG; "" for **kwargs (passed through)
    index: int  # argument index (SLOT_ARG) or index in CellInfo.params (SLOT_KWARG)
    default: object


def param_slots(original: Callable, params: Tuple[str, ...]) -> List[ParamSlot]:
    """The signature of the bound ``original`` as capture slots (see module docstring)."""
    slots = []
    position = 0
    for name, param in inspect.signature(original).parameters.items():
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD, param.VAR_POSITIONAL):
            slots.append(ParamSlot(name, param.kind, naming.SLOT_ARG, position, param.default))
            position += 1
        elif param.kind == param.KEYWORD_ONLY:
            slots.append(ParamSlot(name, param.kind, naming.SLOT_KWARG, params.index(name), param.default))
        else:
            slots.append(ParamSlot(name, param.kind, "", -1, param.default))
    return slots


# ---------------------------------------------------------------------------
# PyNative
# ---------------------------------------------------------------------------


def pynative_construct(info: CellInfo, modes: ArgModes, backend, runtime: CaptureRuntime,
                       forward: bool, backward: bool) -> Callable:
    """A Python ``construct`` that captures inputs, outputs and their gradients."""
    from mindspore import Tensor

    original = info.cell.construct
    cell_id = info.id
    signature = inspect.signature(original)
    slots = {slot.name: slot for slot in param_slots(original, info.params)}

    def capture(value, slot: str, path: Tuple[int, ...], call: int, mode: str):
        if isinstance(value, (tuple, list)):
            items = [capture(v, slot, path + (i,), call, mode) for i, v in enumerate(value)]
            if hasattr(value, "_fields"):
                return type(value)(*items)
            return type(value)(items)
        if isinstance(value, dict):
            return {k: capture(v, slot, path + (i,), call, mode) for i, (k, v) in enumerate(value.items())}
        if isinstance(value, Tensor):
            kind = naming.VKIND_TENSOR
            if backward:
                key = naming.ProbeKey(cell_id, naming.BACKWARD, slot, kind, path, call)
                value = backend.pynative_backward(value, key, mode)
        else:
            kind = naming.VKIND_NONE  # the backend refines the kind of a Python value
        key = naming.ProbeKey(cell_id, naming.FORWARD, slot, kind, path, call)
        return backend.pynative_forward(value, key, mode)

    def construct(self, *args, **kwargs):
        if not runtime.active:
            return original(*args, **kwargs)
        call = runtime.next_call(cell_id)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            slot = slots[name]
            if slot.kind == inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[name] = tuple(
                    capture(v, naming.SLOT_ARG, (slot.index + i,), call, modes.input_mode(slot.index + i))
                    for i, v in enumerate(value)
                )
            elif slot.slot == naming.SLOT_ARG:
                bound.arguments[name] = capture(value, naming.SLOT_ARG, (slot.index,), call,
                                                modes.input_mode(slot.index))
            elif slot.slot == naming.SLOT_KWARG:
                bound.arguments[name] = capture(value, naming.SLOT_KWARG, (slot.index,), call, "out")
        out = original(*bound.args, **bound.kwargs)
        if isinstance(out, (tuple, list)):
            items = [
                capture(item, naming.SLOT_OUTPUT, (i,), call, modes.output_mode(i))
                for i, item in enumerate(out)
            ]
            return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
        return capture(out, naming.SLOT_OUTPUT, (0,), call, modes.output_mode(0))

    return construct


# ---------------------------------------------------------------------------
# Graph
# ---------------------------------------------------------------------------

_GENERATED_MODULE = __name__


def _graph_helpers(probe: Callable):
    """Graph-parsable helpers shared by both graph wrapper shapes."""
    from mindspore.ops.functional import is_sequence_shape_unknown as is_dynamic_length
    from mindspore.ops.primitive import constexpr

    @constexpr
    def uses_in(flags, index):
        return flags if isinstance(flags, bool) else (index < len(flags) and flags[index])

    @constexpr
    def extend(path, index):
        return path + (index,)

    def capture_items(items, head, path, flags, index):
        if is_dynamic_length(items):
            return items  # length unknown at compile time: passed through uncaptured
        if not items:
            return ()
        first = capture(items[0], head, extend(path, index), uses_in(flags, index))
        return (first,) + capture_items(items[1:], head, path, flags, index + 1)

    def capture(value, head, path, use_in):
        if isinstance(value, tuple):
            return capture_items(value, head, path, use_in, 0)
        if isinstance(value, list):
            return list(capture_items(tuple(value), head, path, use_in, 0))
        return probe(value, head, path, use_in)

    def capture_output(out, head, flags):
        if isinstance(out, tuple):
            return capture_items(out, head, (), flags, 0)
        return capture(out, head, (0,), uses_in(flags, 0))

    return capture, capture_items, capture_output


def graph_construct(info: CellInfo, modes: ArgModes, probe: Callable) -> Callable:
    """A graph-parsable ``construct``; ``probe`` is the backend's graph probe function."""
    original = info.cell.construct
    slots = param_slots(original, info.params)
    in_flags = tuple(modes.input_mode(i) == "in" for i in range(len(modes.input_modes)))
    out_flags = tuple(modes.output_mode(i) == "in" for i in range(len(modes.output_modes)))
    heads = {slot: (info.id, naming.SLOT_CODES[slot]) for slot in naming.SLOTS}
    capture, capture_items, capture_output = _graph_helpers(probe)
    if any(slot.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) for slot in slots):
        return _varargs_graph_construct(original, slots, heads, in_flags, out_flags,
                                        capture, capture_items, capture_output)
    return _generated_graph_construct(original, slots, heads, in_flags, out_flags, capture, capture_output)


def _generated_graph_construct(original, slots: List[ParamSlot], heads, in_flags, out_flags,
                               capture, capture_output) -> Callable:
    """Source for a wrapper with exactly the original's parameters, compiled and registered."""
    params, body, call = ["self"], [], []
    kw_only_seen = False
    for slot in slots:
        if slot.kind == inspect.Parameter.KEYWORD_ONLY and not kw_only_seen:
            params.append("*")
            kw_only_seen = True
        params.append(f"{slot.name}=None" if slot.default is not inspect.Parameter.empty else slot.name)
        if slot.slot == naming.SLOT_ARG:
            use_in = slot.index < len(in_flags) and in_flags[slot.index]
            body.append(f"{slot.name} = _mfcd_capture({slot.name}, {heads[naming.SLOT_ARG]!r}, "
                        f"({slot.index},), {use_in!r})")
            call.append(slot.name)
        else:
            body.append(f"{slot.name} = _mfcd_capture({slot.name}, {heads[naming.SLOT_KWARG]!r}, "
                        f"({slot.index},), False)")
            call.append(f"{slot.name}={slot.name}")
    lines = [
        "def _mfcd_make(_mfcd_original, _mfcd_capture, _mfcd_capture_output, _mfcd_out_head,",
        "               _mfcd_out_flags):",
        f"    def construct({', '.join(params)}):",
        *[f"        {line}" for line in body],
        f"        _mfcd_out = _mfcd_original({', '.join(call)})",
        "        return _mfcd_capture_output(_mfcd_out, _mfcd_out_head, _mfcd_out_flags)",
        "    return construct",
        "",
    ]
    source = "\n".join(lines)
    file_name = f"<mf_celldump generated construct {id(original):x}>"
    linecache.cache[file_name] = (len(source), None, source.splitlines(True), file_name)
    namespace = {"__name__": _GENERATED_MODULE}
    exec(compile(source, file_name, "exec"), namespace)  # noqa: S102 - our own generated source
    make = namespace["_mfcd_make"]
    construct = make(original, capture, capture_output, heads[naming.SLOT_OUTPUT], out_flags)
    positional_defaults = tuple(
        slot.default for slot in slots
        if slot.kind != inspect.Parameter.KEYWORD_ONLY and slot.default is not inspect.Parameter.empty
    )
    construct.__defaults__ = positional_defaults or None
    construct.__kwdefaults__ = {
        slot.name: slot.default for slot in slots
        if slot.kind == inspect.Parameter.KEYWORD_ONLY and slot.default is not inspect.Parameter.empty
    } or None
    return construct


def _varargs_graph_construct(original, slots: List[ParamSlot], heads, in_flags, out_flags,
                             capture, capture_items, capture_output) -> Callable:
    """For a construct taking ``*args``/``**kwargs``: positional values by position, named
    keywords by their parameter's slot, other keywords passed through."""
    from mindspore.ops.primitive import constexpr

    named = {slot.name: (naming.SLOT_CODES[slot.slot], slot.index) for slot in slots if slot.slot}
    arg_head, out_head = heads[naming.SLOT_ARG], heads[naming.SLOT_OUTPUT]
    cell_id = arg_head[0]

    @constexpr
    def keyword_head(name):
        slot_code, index = named.get(name, (-1, -1))
        return (cell_id, slot_code), index

    def capture_kwargs(kwargs, names):
        if not names:
            return {}
        captured = capture_kwargs(kwargs, names[1:])
        name = names[0]
        head, index = keyword_head(name)
        if index >= 0:
            captured[name] = capture(kwargs[name], head, (index,), False)
        else:
            captured[name] = kwargs[name]  # absorbed by **kwargs: no stable index to name it by
        return captured

    def construct(self, *args, **kwargs):
        new_args = capture_items(args, arg_head, (), in_flags, 0)
        new_kwargs = capture_kwargs(kwargs, tuple(kwargs.keys()))
        out = original(*new_args, **new_kwargs)
        return capture_output(out, out_head, out_flags)

    return construct


DEFAULT_MODES = ArgModes(bench_name="")
