"""The PyNative capturing ``construct``: plain Python around the original.

It knows the step and the call index, skips all work on steps that are not captured,
walks any nesting of tuples, lists and dicts, and applies defaults so arguments are
named by the signature (see ``signature``). Non-tensor values (int, float, bool,
None) are handed to the backend, which records them as values.
"""

from __future__ import annotations

import inspect
from typing import Callable, Tuple

from mf_celldump.capture.backends.base import PyNativeFace
from mf_celldump.capture.runtime import CaptureRuntime
from mf_celldump.capture.selection import SelectedCell
from mf_celldump.capture.signature import param_slots
from mf_celldump.mapping import ArgModes
from mf_celldump.rawformat.keys import (
    BACKWARD,
    FORWARD,
    KIND_NONE,
    KIND_TENSOR,
    SLOT_ARG,
    SLOT_KWARG,
    SLOT_OUTPUT,
    ProbeKey,
)


def pynative_construct(selected: SelectedCell, modes: ArgModes, face: PyNativeFace, runtime: CaptureRuntime,
                       forward: bool, backward: bool) -> Callable:
    """A Python ``construct`` that captures inputs, outputs and their gradients."""
    from mindspore import Tensor

    original = selected.cell.construct
    cell_id = selected.cell_id
    signature = inspect.signature(original)
    slots = {slot.name: slot for slot in param_slots(original, selected.params)}

    def capture(value, slot: str, path: Tuple[int, ...], call: int, mode: str):
        if isinstance(value, (tuple, list)):
            items = [capture(v, slot, path + (i,), call, mode) for i, v in enumerate(value)]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if isinstance(value, dict):
            return {k: capture(v, slot, path + (i,), call, mode) for i, (k, v) in enumerate(value.items())}
        if isinstance(value, Tensor):
            kind = KIND_TENSOR
            if backward:
                value = face.backward(value, ProbeKey(cell_id, BACKWARD, slot, kind, path, call), mode)
        else:
            kind = KIND_NONE  # the backend refines the kind of a Python value
        return face.forward(value, ProbeKey(cell_id, FORWARD, slot, kind, path, call), mode)

    def capture_arguments(bound, call: int) -> None:
        for name, value in bound.arguments.items():
            slot = slots[name]
            if slot.kind == inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[name] = tuple(
                    capture(v, SLOT_ARG, (slot.index + i,), call, modes.input_mode(slot.index + i))
                    for i, v in enumerate(value)
                )
            elif slot.slot == SLOT_ARG:
                bound.arguments[name] = capture(value, SLOT_ARG, (slot.index,), call, modes.input_mode(slot.index))
            elif slot.slot == SLOT_KWARG:
                bound.arguments[name] = capture(value, SLOT_KWARG, (slot.index,), call, "out")

    def construct(self, *args, **kwargs):
        if not runtime.active:
            return original(*args, **kwargs)
        call = runtime.next_call(cell_id)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        capture_arguments(bound, call)
        out = original(*bound.args, **bound.kwargs)
        if isinstance(out, (tuple, list)):
            items = [capture(item, SLOT_OUTPUT, (i,), call, modes.output_mode(i)) for i, item in enumerate(out)]
            return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
        return capture(out, SLOT_OUTPUT, (0,), call, modes.output_mode(0))

    return construct
