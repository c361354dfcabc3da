"""The PyNative capturing ``construct``: plain Python around the original.

It knows the step and the call index, skips all work on steps that are not captured,
walks any nesting of tuples, lists and dicts, and names arguments by the signature
(see ``construct``); a parameter the caller left at its default is not recorded.
Non-tensor values (int, float, bool, None) are handed to the backend, which records them
as values.

Gradients of inputs follow msprobe 26.2's L0 convention (``construct``): the
top-level tensor positional inputs of a call go through ONE backend op (``backward_inputs``), so an
input that depends on no parameter (an attention mask) gets its gradient as soon as
another input of the call does; positional ones are numbered by their rank among the
call's top-level tensor arguments. A call with tensor inputs none of which is
differentiable gets an explicit null per tensor input (``no_gradient``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

from mf_celldump.capture.backends.base import PyNativeFace
from mf_celldump.capture.construct import (
    NESTED,
    NOT_DIFFERENTIABLE,
    GradientGapLog,
    ParamSlot,
    differentiable_dtypes,
    param_slots,
)
from mf_celldump.capture.runtime import CaptureRuntime
from mf_celldump.capture.selection import SelectedCell
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
                       forward: bool, backward: bool, gaps: Optional[GradientGapLog] = None) -> Callable:
    """A Python ``construct`` that captures inputs, outputs and their gradients."""
    from mindspore import Tensor

    original = selected.cell.construct
    cell_id = selected.cell_id
    signature = inspect.signature(original)
    slots = {slot.name: slot for slot in param_slots(original, selected.params)}
    tie = _InputTie(cell_id, type(selected.cell).__name__, slots, modes, face,
                    gaps if gaps is not None else GradientGapLog(), differentiable_dtypes())

    def capture(value, slot: str, path: Tuple[int, ...], call: int, mode: str, grad: bool):
        if isinstance(value, (tuple, list)):
            items = [capture(v, slot, path + (i,), call, mode, grad) for i, v in enumerate(value)]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if isinstance(value, dict):
            return {k: capture(v, slot, path + (i,), call, mode, grad) for i, (k, v) in enumerate(value.items())}
        if isinstance(value, Tensor):
            kind = KIND_TENSOR
            if grad:
                value = face.backward(value, ProbeKey(cell_id, BACKWARD, slot, kind, path, call), mode)
        else:
            kind = KIND_NONE  # the backend refines the kind of a Python value
        return face.forward(value, ProbeKey(cell_id, FORWARD, slot, kind, path, call), mode)

    def capture_arguments(bound, call: int) -> None:
        for name, value in bound.arguments.items():
            slot = slots[name]
            if slot.kind == inspect.Parameter.VAR_POSITIONAL:
                bound.arguments[name] = tuple(
                    capture(v, SLOT_ARG, (slot.index + i,), call, modes.input_mode(slot.index + i), False)
                    for i, v in enumerate(value)
                )
            elif slot.slot == SLOT_ARG:
                bound.arguments[name] = capture(value, SLOT_ARG, (slot.index,), call, modes.input_mode(slot.index),
                                                False)
            elif slot.slot == SLOT_KWARG:  # not tied (msprobe ties positional arguments only): a hook each
                bound.arguments[name] = capture(value, SLOT_KWARG, (slot.index,), call, "out", backward)

    def construct(self, *args, **kwargs):
        if not runtime.active:
            return original(*args, **kwargs)
        call = runtime.next_call(cell_id)
        bound = signature.bind(*args, **kwargs)  # no defaults applied: only what the caller passed
        if backward:
            tie.apply(bound, call)
        capture_arguments(bound, call)
        out = original(*bound.args, **bound.kwargs)
        if isinstance(out, (tuple, list)):
            items = [capture(item, SLOT_OUTPUT, (i,), call, modes.output_mode(i), backward)
                     for i, item in enumerate(out)]
            return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
        return capture(out, SLOT_OUTPUT, (0,), call, modes.output_mode(0), backward)

    return construct


def _holds_tensor(value, tensor_type) -> bool:
    if isinstance(value, (tuple, list)):
        return any(_holds_tensor(v, tensor_type) for v in value)
    return isinstance(value, tensor_type)


def _slot_name(key: ProbeKey) -> str:
    return f"backward output.{key.path[0]}"


@dataclass
class _InputTie:
    """The call's top-level tensor positional inputs through one op of the backend, so their gradients
    come together (an input that depends on no parameter included), numbered by their rank among them
    (msprobe's backward ``output.i``); keyword-only inputs keep a hook each."""

    cell_id: int
    class_name: str
    slots: Dict[str, ParamSlot]
    modes: ArgModes
    face: PyNativeFace
    gaps: GradientGapLog
    differentiable: tuple

    def inputs(self, bound, call: int) -> List[tuple]:
        """(where, tensor, backward key, mode) of each top-level tensor positional input."""
        from mindspore import Tensor

        found, rank = [], 0
        for name, value in bound.arguments.items():
            slot = self.slots[name]
            if slot.kind == inspect.Parameter.VAR_POSITIONAL:
                items = [((name, i), v, slot.index + i) for i, v in enumerate(value)]
            elif slot.slot == SLOT_ARG:
                items = [((name, None), value, slot.index)]
            else:
                continue
            for where, item, index in items:
                if isinstance(item, Tensor):
                    key = ProbeKey(self.cell_id, BACKWARD, SLOT_ARG, KIND_TENSOR, (rank,), call)
                    found.append((where, item, key, self.modes.input_mode(index)))
                    rank += 1
                elif isinstance(item, (tuple, list)) and _holds_tensor(item, Tensor):
                    self.gaps.note(self.class_name, NESTED, f"input.{index}", "msprobe numbers top-level tensors")
        return found

    def apply(self, bound, call: int) -> None:
        """Replace the inputs in ``bound`` by the tied ones, or write a null for each when none of them
        can have a gradient."""
        found = self.inputs(bound, call)
        if not found:
            return
        if not any(item.dtype in self.differentiable for _, item, _, _ in found):
            for _, _, key, mode in found:
                self.face.no_gradient(key.with_kind(KIND_NONE), mode)
            self.gaps.note(self.class_name, NOT_DIFFERENTIABLE, ", ".join(_slot_name(key) for _, _, key, _ in found),
                           ", ".join(str(item.dtype) for _, item, _, _ in found))
            return
        tied = self.face.backward_inputs(tuple(item for _, item, _, _ in found),
                                         tuple(key for _, _, key, _ in found), tuple(mode for _, _, _, mode in found))
        for ((name, position), _, _, _), value in zip(found, tied):
            if position is None:
                bound.arguments[name] = value
            else:
                values = list(bound.arguments[name])
                values[position] = value
                bound.arguments[name] = tuple(values)
