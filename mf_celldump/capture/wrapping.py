"""Replace a cell's ``construct`` with a capturing one, and put the original back.

Two wrapper shapes, chosen by execution mode at attach time:

* PyNative: plain Python. It knows the step and the call index, skips all work on
  steps that are not captured, and walks any nesting of tuples, lists and dicts.
* Graph: code MindSpore's compiler parses. Facts it relies on (MindSpore 2.9): the
  function must be bound with ``types.MethodType`` and its first parameter must be
  named ``self`` (a plain function assigned to ``cell.construct`` fails to parse);
  closures over primitives, ints, tuples and ``constexpr`` helpers are fine, as are
  ``*args``/``**kwargs``, ``isinstance`` and recursion over tuples. Dicts inside
  arguments are passed through uncaptured in graph mode.

The wrapper is an instance attribute; detaching deletes it (or restores an instance
``construct`` the cell already had), so the cell's class is never touched.
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass
from typing import Callable, Dict, Tuple

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


# ---------------------------------------------------------------------------
# PyNative
# ---------------------------------------------------------------------------


def pynative_construct(info: CellInfo, modes: ArgModes, backend, runtime: CaptureRuntime,
                       forward: bool, backward: bool) -> Callable:
    """A Python ``construct`` that captures inputs, outputs and their gradients."""
    from mindspore import Tensor

    original = info.cell.construct
    cell_id = info.id
    param_index: Dict[str, int] = {name: i for i, name in enumerate(info.params)}

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
        args = tuple(
            capture(arg, naming.SLOT_ARG, (i,), call, modes.input_mode(i)) for i, arg in enumerate(args)
        )
        captured_kwargs = {}
        for name, arg in kwargs.items():
            index = param_index.get(name)
            if index is None:
                captured_kwargs[name] = arg  # absorbed by **kwargs: no stable index to name it by
                continue
            captured_kwargs[name] = capture(arg, naming.SLOT_KWARG, (index,), call, "out")
        out = original(*args, **captured_kwargs)
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


def graph_construct(info: CellInfo, modes: ArgModes, probe: Callable) -> Callable:
    """A graph-parsable ``construct``; ``probe`` is the backend's graph probe function."""
    from mindspore import Tensor  # noqa: F401 - referenced by the parsed code through probe
    from mindspore.ops.primitive import constexpr

    original = info.cell.construct
    cell_id = info.id
    params = tuple(info.params)
    in_modes = tuple(modes.input_mode(i) == "in" for i in range(len(modes.input_modes)))
    out_modes = tuple(modes.output_mode(i) == "in" for i in range(len(modes.output_modes)))
    arg_head = (cell_id, naming.SLOT_CODES[naming.SLOT_ARG])
    kwarg_head = (cell_id, naming.SLOT_CODES[naming.SLOT_KWARG])
    out_head = (cell_id, naming.SLOT_CODES[naming.SLOT_OUTPUT])

    @constexpr
    def uses_in(flags, index):
        return index < len(flags) and flags[index]

    @constexpr
    def param_position(names, name):
        return names.index(name) if name in names else -1

    @constexpr
    def extend(path, index):
        return path + (index,)

    def capture(value, head, path, use_in):
        if isinstance(value, tuple):
            items = ()
            for i in range(len(value)):
                items = items + (capture(value[i], head, extend(path, i), use_in),)
            return items
        if isinstance(value, list):
            items = []
            for i in range(len(value)):
                items.append(capture(value[i], head, extend(path, i), use_in))
            return items
        return probe(value, head, path, use_in)

    def construct(self, *args, **kwargs):
        new_args = ()
        for i in range(len(args)):
            new_args = new_args + (capture(args[i], arg_head, (i,), uses_in(in_modes, i)),)
        new_kwargs = {}
        for name, value in kwargs.items():
            position = param_position(params, name)
            if position >= 0:
                new_kwargs[name] = capture(value, kwarg_head, (position,), False)
            else:
                new_kwargs[name] = value
        out = original(*new_args, **new_kwargs)
        if isinstance(out, tuple):
            items = ()
            for i in range(len(out)):
                items = items + (capture(out[i], out_head, (i,), uses_in(out_modes, i)),)
            return items
        return capture(out, out_head, (0,), uses_in(out_modes, 0))

    return construct


DEFAULT_MODES = ArgModes(bench_name="")
