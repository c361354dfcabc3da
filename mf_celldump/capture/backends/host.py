"""Host capture op: an identity pyfunc ``ops.Custom`` whose Python body writes the data.

Python runs when the op executes, in either mode, so this works wherever MindSpore
runs pyfunc ops (CPU and GPU, PyNative and graph). The op takes ``(x, key, call)`` where
``key`` is a small int32 tensor (dtype code, constants note, backward rank + 1 of a top-level
tensor positional input or 0, probe key codes) and
``call`` the call number when only the running graph knows it (below), so one op instance
serves every probe. Its ``bprop`` passes the incoming gradient through a second
pyfunc op that records it. The forward op carries ``side_effect_io``, so graph mode neither
drops a probe whose output goes unused nor merges two calls' probes of one tensor.

Gradients of a call's top-level tensor positional inputs are recorded under their rank
among those arguments, as msprobe numbers ``backward.output.i``. In PyNative the call's
tie records them (``GradientHookCache.apply_many``: one hook over the tuple of those
arguments) and the inputs' probes record forward values only. In graph mode the tie (one
``InsertGradientOf`` over the tuple, before the probes, graph_wrapper) passes them through
and each input's probe records its gradient in its ``bprop``, with the call's number (below).

Non-tensor values in graph mode: a constant (``None``, a Python int or flag) is noted at
compile time in a table of this backend, and the call's first tensor probe carries the
note's id in its key, so the values are written when that probe runs, once per call,
with no op touching them (an op on a constant, even one whose output is unused, made
MindSpore treat it as a variable). A value that is not a compile-time constant
(a ``mutable`` scalar) goes through the ``side_effect_io`` value op as before.

Call numbers in graph mode: one compiled ``construct`` serves every call of a cell, so a
probe's key cannot say which call it belongs to. A third op (``call_op``, ``side_effect_io``
so two calls are never merged) runs first in each call and returns the call's number from
the runtime's counter; the graph probe op takes it as a third input, and its ``bprop``
receives the same value, so an output's gradient is recorded under the call that produced
it even when gradients do not flow in reverse call order (Qwen3's rotary cell applied to
query, then key, whose backward runs in data order; micro-batches, whose backward runs
in whatever order the graph's schedule gives). Input gradients, recorded by the inputs'
probes, carry the call the same way.

Execution is asynchronous in graph mode, so the session synchronises before marking a
step complete.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Dict, Optional, Set, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops
from mindspore.ops.primitive import constexpr

from mf_celldump.capture.backends import graph_statistics
from mf_celldump.capture.backends.base import (
    BackendContext,
    CaptureBackend,
    GraphFace,
    InputTie,
    PyNativeFace,
    joined_gradients,
)
from mf_celldump.capture.backends.gradient_hooks import GradientHookCache
from mf_celldump.dtypes import dtype_names, mindspore_dtype_name, numpy_dtype_name
from mf_celldump.rawformat.keys import (
    BACKWARD,
    CODE_SLOTS,
    FORWARD,
    KIND_BOOL,
    KIND_CODES,
    KIND_FLOAT,
    KIND_INT,
    KIND_NONE,
    KIND_TENSOR,
    SLOT_ARG,
    SLOT_CODES,
    UNKNOWN_CALL,
    ProbeKey,
    kind_of_value,
    scalar_of_kind,
)
from mf_celldump.statistics import compute_statistics

logger = logging.getLogger(__name__)

# Dtype codes carried in host-op keys (0-d tensors reach a pyfunc as Python scalars,
# so the dtype cannot be read back from the value).
_DTYPE_NAMES = dtype_names()
_NO_DTYPE = -1


def _dtype_code(ms_dtype) -> Tuple[int]:
    """``mindspore.float32`` -> the index of ``float32`` in the code table."""
    name = numpy_dtype_name(str(ms_dtype))
    return (_DTYPE_NAMES.index(name) if name in _DTYPE_NAMES else _NO_DTYPE,)


def _owned(data) -> np.ndarray:
    """``data`` as an array the writer may keep after the op returns: copied unless numpy owns its memory
    (the op's input may be a view of memory MindSpore reuses)."""
    array = np.asarray(data)
    if array.base is None and array.flags.owndata:
        return array
    return np.array(array, copy=True)


# Kinds of numpy-style dtype names (by prefix) and of numpy dtypes: bool, integer, float, complex.
_NAME_KINDS = (("bool", "b"), ("int", "i"), ("uint", "i"), ("float", "f"), ("bfloat", "f"), ("complex", "c"))
_NUMPY_KINDS = {"b": "b", "i": "i", "u": "i", "f": "f", "c": "c"}


def _as_computed(data, declared: Optional[str], keep: bool = True):
    """``(array, dtype name)`` of the value a capture op received, as the op computed it.

    The declared dtype (the op key's, a compile-time constant) comes from the compiler's first
    inference. For a ``Morph`` that is the user's infer_dtype, and the graph is re-inferred only
    after the ``Morph`` is expanded (docs/capture.md): MindFormers declares int32 for a float32
    embedding. An array arrives with the dtype it was computed in, so that is the truth; a 0-d
    tensor arrives as a Python scalar and only the declared dtype gives its width, used when it is
    of the scalar's kind. Otherwise the name is None and the array keeps the value exactly
    (float64, int64, bool). ``keep``: the array outlives the op (copied unless numpy owns it).
    """
    array = _owned(data) if keep else np.asarray(data)
    if declared == "bfloat16" and array.dtype == np.float32:
        return array, declared  # passed as float32 by ``through_float32`` (a pyfunc op takes no bfloat16)
    if isinstance(data, np.ndarray) or not declared:
        return array, array.dtype.name
    kind = next((k for prefix, k in _NAME_KINDS if declared.startswith(prefix)), None)
    if kind != _NUMPY_KINDS.get(array.dtype.kind):
        return array, None
    if declared != "bfloat16":
        array = array.astype(declared)
    return array, declared


def through_float32(op: Callable, with_call: bool = True) -> Callable:
    """``op(x, key[, call])`` for a value of any dtype (graph-parsable; also eager in PyNative).

    A pyfunc op takes no bfloat16 (numpy has no buffer format for it: "cannot include dtype
    'E' in a buffer", MindSpore 2.9 CPU, both modes), so a bfloat16 value goes through as
    float32 and comes back as bfloat16, both casts exact; its gradient takes the same way
    back. The key still says bfloat16 (the compile-time dtype), and ``_as_computed`` records
    the float32 array under that name, as the raw format stores bfloat16.
    """
    cast, float32, bfloat16 = ops.cast, ms.float32, ms.bfloat16

    @constexpr
    def is_bf16(dtype):
        return dtype == bfloat16

    if with_call:
        def run(x, key, call):
            if is_bf16(x.dtype):
                return cast(op(cast(x, float32), key, call), bfloat16)
            return op(x, key, call)
    else:
        def run(x, key):
            if is_bf16(x.dtype):
                return cast(op(cast(x, float32), key), bfloat16)
            return op(x, key)
    return run


def _same_shape(x_shape, *key_shapes):
    return x_shape


def _same_dtype(x_dtype, *key_dtypes):
    return x_dtype


def _decode_probe(codes, direction: str, number: int) -> Optional[ProbeKey]:
    """The probe key of a capture op's codes (dtype, constants note, argument rank, key codes...) and the
    call number the graph counted (negative: not counted); None when nothing is to be recorded."""
    probe = ProbeKey.from_codes(codes[3:], direction)
    if direction == BACKWARD and probe.slot == SLOT_ARG:
        if not codes[2]:
            return None  # not a top-level tensor argument: msprobe numbers no gradient for it
        probe = dataclasses.replace(probe, path=(codes[2] - 1,))  # its rank among them: backward output.{rank}
    if number >= 0:
        probe = dataclasses.replace(probe, call=number)
    return probe


class HostBackend(CaptureBackend):
    """Captures through identity pyfunc ops; both faces share the probe ops."""

    name = "host"
    graph_recompute_safe = True  # every capture op is marked recompute=False (``_keep_out_of_recompute``)
    # Graph mode, statistics task: True reduces float tensors inside the graph (graph_statistics), False
    # hands every tensor to the host op. None: inside the graph on a device, on the host on CPU, where
    # device memory is host memory and MindSpore's CPU reduction kernels cost more than numpy on the
    # array the op receives (and run in every step, selected or not: bench/README.md, "capture cost near its floor").
    reduce_in_graph = None

    def __init__(self, context: BackendContext):
        super().__init__(context)
        self._make_probe_ops(self.config.captures_forward, self.config.captures_backward)
        wanted = self.config.statistics
        in_graph = self.reduce_in_graph if self.reduce_in_graph is not None else context.device != "CPU"
        self.reduces_in_graph = self.config.task == "statistics" and graph_statistics.reduces(wanted) and in_graph
        if self.reduces_in_graph:
            self._make_statistics_ops()

        def record_body(x, key):
            self._emit(x, key, BACKWARD)
            return x

        # Graph mode: a call whose tensor inputs are all integer writes a null per input (backward, kind
        # None) when it runs forward; nothing uses the op's output, so only side_effect_io keeps it.
        self.null_op = ops.Custom(record_body, out_shape=_same_shape, out_dtype=_same_dtype, func_type="pyfunc")
        self.null_op.add_prim_attr("side_effect_io", True)

        def gradient_body(x, key, call):
            self._emit(x, key, BACKWARD, call)
            return x

        # Gradients the optimizer receives (parameters_grad): recorded when the op runs, never differentiated.
        self.record_op = ops.Custom(gradient_body, out_shape=_same_shape, out_dtype=_same_dtype, func_type="pyfunc")

        # Graph-mode constant values, filled at compile time: note id -> (cell id, leaves).
        self.constants: Dict[int, tuple] = {}
        self._constant_notes: Dict[tuple, int] = {}
        self._width_warned: Set[tuple] = set()
        # (key bytes, direction, call) -> the probe key it decodes to (None: not recorded). Bounded by the
        # compiled probes times the calls of a step; decoding costs ~7 µs a value, a look-up ~0.2.
        self._decoded: Dict[tuple, Optional[ProbeKey]] = {}
        self._keep_out_of_recompute()
        # Capture ops whose Python body ran, selected step or not (the call counter included): in graph
        # mode an unselected step runs a graph without them and leaves this unchanged (graph_switch).
        self.ops_run = 0

    def _keep_out_of_recompute(self) -> None:
        """Mark every capture op ``recompute=False``, so a cell under ``Cell.recompute()`` records each call once.

        Graph mode: ``Cell.recompute()`` gives the cell's nodes the recompute scope, and MindSpore's
        recompute pass clones the recomputed forward nodes into the backward pass; our probes (and the
        call counter) were cloned with them, recording a second forward call per cell and its gradients
        under it (bench/recompute_check.py). A primitive's own ``recompute`` attribute wins over its
        cell's (``Cell.recompute`` and ``Primitive.recompute`` docstrings, ``mindspore/nn/cell.py`` and
        ``mindspore/ops/primitive.py``, 2.9), so these ops stay in the forward pass and their outputs are
        kept instead of recomputed; measured equal to the dump without recompute
        (tests/test_recompute_capture.py). PyNative recomputes by running the construct again and is
        refused at attach instead (``capture/recompute.py``).
        """
        ops_ = [self.call_op, self.probe_op, self.grad_op, self.input_probe_op, self.value_op, self.null_op,
                self.record_op]
        if self.reduces_in_graph:
            ops_ += [self.reduced_forward_op, self.reduced_backward_op, self.reduced_tap_op]
        for op in ops_:
            # What Primitive.recompute(False) sets; called directly because some MindSpore releases'
            # recompute() raises TypeError in PyNative mode, where this backend is built too.
            op.add_prim_attr("recompute", False)

    def _make_probe_ops(self, forward_enabled: bool, backward_enabled: bool) -> None:
        """The call counter (graph mode), and the probes ``(x, key, call)``: ``call`` is the counter's
        output in graph mode, a constant -1 in PyNative (where the key holds the call number)."""
        runtime = self.context.runtime

        def call_body(cell):
            self.ops_run += 1
            number = runtime.next_call(int(np.asarray(cell).reshape(-1)[0])) if runtime.active else UNKNOWN_CALL
            return np.full(np.shape(cell), number, np.int32)

        self.call_op = ops.Custom(call_body, out_shape=_same_shape, out_dtype=_same_dtype, func_type="pyfunc")
        self.call_op.add_prim_attr("side_effect_io", True)  # never merged with another call's, never dropped

        def forward_body(x, key, call):
            if forward_enabled:
                self._emit(x, key, FORWARD, call)
            return x

        def backward_body(dout, key, call):
            self._emit(dout, key, BACKWARD, call)
            return dout

        grad_op = ops.Custom(backward_body, out_shape=_same_shape, out_dtype=_same_dtype, func_type="pyfunc")
        # Graph mode: the gradient of an input that depends on no parameter (recorded by the call's tie,
        # graph_wrapper) goes nowhere after this op; side_effect_io keeps it from being dropped.
        grad_op.add_prim_attr("side_effect_io", True)
        self.grad_op = grad_op
        zeros_like = ops.zeros_like
        if backward_enabled:
            def bprop(x, key, call, out, dout):
                return (grad_op(dout, key, call), zeros_like(key), zeros_like(call))
        else:
            def bprop(x, key, call, out, dout):
                return (dout, zeros_like(key), zeros_like(call))

        self.probe_op = ops.Custom(forward_body, out_shape=_same_shape, out_dtype=_same_dtype,
                                   func_type="pyfunc", bprop=bprop)
        # side_effect_io: in graph mode a pure probe is dropped when its output is unused later
        # (FreqsMgr's swap mask in LLaMA, Qwen3's labels) and merged with another call's probe
        # when both see the same tensor under the same key (a cell called twice on one tensor).
        self.probe_op.add_prim_attr("side_effect_io", True)

        def pass_bprop(x, key, call, out, dout):
            return (dout, zeros_like(key), zeros_like(call))

        # PyNative positional inputs: their gradients are recorded by the call's one gradient hook
        # (HostPyNative.backward_inputs), so this op only records the forward value.
        self.input_probe_op = ops.Custom(forward_body, out_shape=_same_shape, out_dtype=_same_dtype,
                                         func_type="pyfunc", bprop=pass_bprop)
        # Non-constant scalars: the op's output is unused, so only side_effect_io keeps it.
        self.value_op = ops.Custom(forward_body, out_shape=_same_shape, out_dtype=_same_dtype, func_type="pyfunc")
        self.value_op.add_prim_attr("side_effect_io", True)

    def _make_statistics_ops(self) -> None:
        """Graph mode, statistics: ops receiving reduced tensors ``(extremes, moments, key, shape, call)``."""
        forward_enabled = self.config.captures_forward

        def forward_body(extremes, moments, key, shape, call):
            if forward_enabled:
                self._emit_reduced(extremes, moments, key, shape, FORWARD, call)
            return extremes

        def backward_body(extremes, moments, key, shape, call):
            self._emit_reduced(extremes, moments, key, shape, BACKWARD, call)
            return extremes

        self.reduced_forward_op = ops.Custom(forward_body, out_shape=_same_shape, out_dtype=_same_dtype,
                                             func_type="pyfunc")
        self.reduced_forward_op.add_prim_attr("side_effect_io", True)  # nothing uses its output
        # Input ties and the optimizer's gradients: side_effect_io keeps the record of a gradient nothing uses
        # (an attention mask's).
        self.reduced_backward_op = ops.Custom(backward_body, out_shape=_same_shape, out_dtype=_same_dtype,
                                              func_type="pyfunc")
        self.reduced_backward_op.add_prim_attr("side_effect_io", True)
        # Output gradients, inside the tap Cell's bprop: joined to the gradient by ``depend`` only; with
        # side_effect_io there MindSpore 2.9 fails the compile ("Graph cycle exists", an UpdateState loop).
        self.reduced_tap_op = ops.Custom(backward_body, out_shape=_same_shape, out_dtype=_same_dtype,
                                         func_type="pyfunc")

    def note_constants(self, cell_id: int, leaves) -> int:
        """Compile time: keep the recordable constants of one call site; their note id (0: none)."""
        recorded = tuple((CODE_SLOTS[slot_code], tuple(path), kind_of_value(value), value)
                         for slot_code, path, value in leaves if kind_of_value(value) is not None)
        if not recorded:
            return 0
        ident = (cell_id, tuple((slot, path, kind, repr(value)) for slot, path, kind, value in recorded))
        note = self._constant_notes.get(ident)
        if note is None:
            note = self._constant_notes[ident] = len(self._constant_notes) + 1
            self.constants[note] = (cell_id, recorded)
        return note

    def _probe(self, key, direction: str, call) -> Optional[ProbeKey]:
        """The probe key a capture op received, or None when nothing is to be recorded; writes the call's
        constants when its first forward probe runs."""
        self.ops_run += 1
        if not self.context.runtime.active:
            return None
        codes = np.asarray(key).reshape(-1)
        number = -1 if call is None else int(np.asarray(call).reshape(-1)[0])
        memo = (codes.tobytes(), direction, number)
        try:
            probe = self._decoded[memo]
        except KeyError:
            probe = self._decoded[memo] = _decode_probe(codes.tolist(), direction, number)
        if probe is not None and codes[1] and direction == FORWARD:
            self._emit_constants(self.context.sink, int(codes[1]), probe.call)
        return probe

    def _emit(self, data, key, direction: str, call=None) -> None:
        """Runs inside a capture op: write the value of the running step, if it is captured.
        ``call``: the call number a graph-mode call op handed over (negative: not counted)."""
        probe = self._probe(key, direction, call)
        if probe is None:
            return
        sink = self.context.sink
        if probe.kind != KIND_TENSOR:
            sink.value(probe, scalar_of_kind(probe.kind, data))
            return
        codes0 = int(np.asarray(key).reshape(-1)[0])
        declared = _DTYPE_NAMES[codes0] if 0 <= codes0 < len(_DTYPE_NAMES) else None
        array, dtype = _as_computed(data, declared, keep=self.config.task == "tensor")
        if dtype is None:
            dtype = array.dtype.name
            self._warn_width_unknown(probe, declared, dtype)
        self._emit_array(sink, probe, array, dtype)

    def _emit_reduced(self, extremes, moments, key, shape, direction: str, call) -> None:
        """Runs inside a statistics op (graph mode): the record of a tensor reduced inside the graph."""
        probe = self._probe(key, direction, call)
        if probe is None:
            return
        dims = [int(d) for d in np.asarray(shape).reshape(-1)]
        extremes = np.asarray(extremes)
        declared = _DTYPE_NAMES[int(np.asarray(key).reshape(-1)[0])]
        dtype = declared if declared == "bfloat16" else extremes.dtype.name  # bfloat16 arrives as float32
        stats = graph_statistics.record_of(extremes, moments, dims, self.config.statistics)
        self.context.sink.statistics(probe, mindspore_dtype_name(dtype), tuple(dims), stats,
                                     self.context.runtime.next_seq())

    def emit_gradient(self, gradient, probe: ProbeKey, mode: str = "out") -> None:
        """PyNative: a gradient Tensor handed over by the call's gradient hook, written like ``_emit``'s."""
        if not self.context.runtime.active:
            return
        dtype = numpy_dtype_name(str(gradient.dtype))
        host = gradient.astype(ms.float32) if gradient.dtype == ms.bfloat16 else gradient
        array = host.asnumpy()
        self._emit_array(self.context.sink, probe, _owned(array) if self.config.task == "tensor" else array, dtype)

    def _emit_array(self, sink, probe: ProbeKey, array: np.ndarray, dtype: str) -> None:
        """A tensor goes to the writer's thread (which saves it); statistics are computed here, at once,
        so only numbers leave the op (numpy on the array the op received: no copy, nothing kept)."""
        if self.config.task == "tensor":
            sink.tensor(probe, array, dtype)
        else:
            stats = compute_statistics(array, self.config.statistics)
            sink.statistics(probe, mindspore_dtype_name(dtype), array.shape, stats, self.context.runtime.next_seq())

    def _warn_width_unknown(self, probe: ProbeKey, declared: str, recorded: str) -> None:
        """Once per probe: a 0-d value whose declared dtype is not of its kind (see ``_as_computed``)."""
        where = (probe.cell_id, probe.direction, probe.slot, probe.path)
        if where in self._width_warned:
            return
        self._width_warned.add(where)
        logger.warning("cell id %d (manifest.json names it), %s %s%s: the compiler declared %s for this 0-d "
                       "tensor but it computed a value of another kind (a Morph's infer_dtype?); recorded "
                       "exactly as %s, the tensor's own width is unknown", probe.cell_id, probe.direction,
                       probe.slot, list(probe.path), declared, recorded)

    def _emit_constants(self, sink, note: int, call: Optional[int]) -> None:
        cell_id, recorded = self.constants[note]
        for slot, path, kind, value in recorded:
            sink.value(ProbeKey(cell_id, FORWARD, slot, kind, path, call), value)

    def pynative(self) -> PyNativeFace:
        return HostPyNative(self)

    def graph(self) -> GraphFace:
        return HostGraph(self)


class HostPyNative(PyNativeFace):
    def __init__(self, backend: HostBackend):
        self.backend = backend
        self._no_call = Tensor((UNKNOWN_CALL,), ms.int32)  # the key itself holds the call number
        self._input_probe = through_float32(backend.input_probe_op)
        self._probe = through_float32(backend.probe_op)
        self.gradient_hooks = GradientHookCache(backend.context.runtime, backend.emit_gradient)

    def forward(self, value, key: ProbeKey, mode: str):
        backend = self.backend
        if isinstance(value, Tensor):
            codes = Tensor(_dtype_code(value.dtype) + (0, 0) + key.to_codes(), dtype=ms.int32)
            probe = self._input_probe if key.slot == SLOT_ARG else self._probe
            return probe(value, codes, self._no_call)
        kind = kind_of_value(value)
        if kind is not None and backend.config.captures_forward:
            backend.context.sink.value(key.with_kind(kind), value)
        return value

    def backward(self, tensor, key: ProbeKey, mode: str):
        return tensor  # the probe op inserted by forward() records the gradient in its bprop

    def backward_inputs(self, tensors, keys, modes):
        return self.gradient_hooks.apply_many(tensors, keys, modes)

    def no_gradient(self, key: ProbeKey, mode: str) -> None:
        if self.backend.context.runtime.active:
            self.backend.context.sink.value(key, None)


class HostGraph(GraphFace):
    def __init__(self, backend: HostBackend):
        self.backend = backend

    def call_function(self) -> Callable:
        call_op, int32 = self.backend.call_op, ms.int32

        def call_number(cell_id):
            return call_op(Tensor((cell_id,), int32))

        return call_number

    def probe_function(self) -> Callable:
        value_op = self.backend.value_op
        forward_enabled = self.backend.config.captures_forward
        int32, int64, float32, bool_ = ms.int32, ms.int64, ms.float32, ms.bool_
        key_codes = _make_graph_key_codes()
        to_tensor = ops.scalar_to_tensor
        bool_code, int_code, float_code = KIND_CODES[KIND_BOOL], KIND_CODES[KIND_INT], KIND_CODES[KIND_FLOAT]

        tensor_probe = self._tensor_probe()

        def graph_probe(value, head, path, use_in, note, call):
            if isinstance(value, Tensor):
                return tensor_probe(value, head, path, note, call)
            # A variable scalar (``mutable``); constants come through notes. ``scalar_to_tensor``, not
            # ``Tensor(value, dtype)``: MindSpore 2.9 compiles the latter on a variable into an any-type
            # sub-graph, where a Custom op fails ("The prim is not a PrimitivePy", custom_op_infer.cc).
            if forward_enabled:
                if isinstance(value, bool):
                    value_op(to_tensor(value, bool_), Tensor(key_codes(head, bool_code, path, None, 0), int32), call)
                elif isinstance(value, int):
                    value_op(to_tensor(value, int64), Tensor(key_codes(head, int_code, path, None, 0), int32), call)
                elif isinstance(value, float):
                    value_op(to_tensor(value, float32), Tensor(key_codes(head, float_code, path, None, 0), int32),
                             call)
            return value

        return graph_probe

    def _tensor_probe(self) -> Callable:
        """``(tensor, head, path, note, call) -> tensor``: through the host probe op, or (statistics reduced in
        the graph, graph_statistics) through the reduction and the gradient tap."""
        probe_op, int32 = through_float32(self.backend.probe_op), ms.int32
        key_codes = _make_graph_key_codes()

        def host_probe(value, head, path, note, call):
            return probe_op(value, Tensor(key_codes(head, 0, path, value.dtype, note), int32), call)

        if not self.backend.reduces_in_graph:
            return host_probe
        reducible, reduce = graph_statistics.graph_helpers(self.backend.config.statistics)
        forward_op = self.backend.reduced_forward_op
        forward_enabled = self.backend.config.captures_forward
        tap = graph_statistics.gradient_tap(self.backend.reduced_tap_op, reduce)
        taps_gradient = _make_gradient_rule(self.backend.config.captures_backward)

        def reduced_probe(value, head, path, note, call):
            if not reducible(value.dtype, value.shape):
                return host_probe(value, head, path, note, call)
            key = Tensor(key_codes(head, 0, path, value.dtype, note), int32)
            if forward_enabled:
                extremes, moments, shape = reduce(value)
                forward_op(extremes, moments, key, shape, call)
            if taps_gradient(head):
                return tap(value, key, call)
            return value

        return reduced_probe

    def constants_function(self) -> Callable:
        backend = self.backend

        @constexpr
        def note_constants(cell_id, leaves):
            # Runs in Python at graph compile time: the leaves are constants.
            return backend.note_constants(cell_id, leaves) if backend.config.captures_forward else 0

        return note_constants

    def input_gradients_function(self) -> Optional[Callable]:
        """The call's tie, placed before the inputs' probes, joins their gradients (``joined_gradients``): after
        it, a mask's probe takes a value that depends on the call's other inputs, so autodiff builds its bprop,
        whose grad op records the gradient with the call's number (the counter op's runtime value, like an
        output's), and the join keeps that recording alive. A tie that recorded the gradients itself could not
        say which call they belong to (InsertGradientOf's function sees gradients only), and calls of equal
        shape, such as micro-batches, would be told apart by the order of their backward alone."""
        if not self.backend.config.captures_backward:
            return None
        null_op, int32, arg_code = self.backend.null_op, ms.int32, SLOT_CODES[SLOT_ARG]
        none_code = KIND_CODES[KIND_NONE]
        key_codes = _make_graph_key_codes()

        on_gradients = joined_gradients()

        def for_cell(cell_id):
            head = (cell_id, arg_code)

            def no_gradient(tensors, rank):
                if tensors:
                    null_op(Tensor(0, int32), Tensor(key_codes(head, none_code, (rank,), None, 0, rank + 1), int32))
                    no_gradient(tensors[1:], rank + 1)

            def on_no_gradient(tensors):
                no_gradient(tensors, 0)
                return tensors

            return InputTie(on_gradients, on_no_gradient, before_probes=True)

        return for_cell

    def _gradient_recorder(self, op: Callable) -> Callable:
        """``(gradient, key, call) -> gradient``, recording it: through the host op ``op``, or reduced inside
        the graph (graph_statistics) when it can be."""
        if not self.backend.reduces_in_graph:
            return op
        reducible, reduce = graph_statistics.graph_helpers(self.backend.config.statistics)
        reduced_op, depend = self.backend.reduced_backward_op, ops.depend

        def record(gradient, key, call):
            if not reducible(gradient.dtype, gradient.shape):
                return op(gradient, key, call)
            extremes, moments, shape = reduce(gradient)
            return depend(gradient, reduced_op(extremes, moments, key, shape, call))

        return record

    def gradient_probe_function(self) -> Callable:
        record, int32 = self._gradient_recorder(through_float32(self.backend.record_op)), ms.int32
        key_codes = _make_graph_key_codes()
        no_call = Tensor((UNKNOWN_CALL,), int32)

        def gradient_probe(value, head, path):
            return record(value, Tensor(key_codes(head, 0, path, value.dtype, 0), int32), no_call)

        return gradient_probe


def _make_gradient_rule(backward_enabled: bool):
    @constexpr
    def taps_gradient(head):
        # Compile time: every probe's tap records its gradient; a positional input's is kept only where it is
        # a top-level tensor argument (its rank, head[2], goes into the key; HostBackend._probe drops the rest).
        return backward_enabled and (head[1] != SLOT_CODES[SLOT_ARG] or (len(head) > 2 and head[2] >= 0))

    return taps_gradient


def _make_graph_key_codes():
    @constexpr
    def graph_key_codes(head, kind_code, path, ms_dtype, note, ranked=None):
        # Runs in Python at graph compile time: everything here is a constant. ``ranked``: the backward
        # rank + 1 of a top-level tensor positional input (graph_wrapper's head[2]), 0 for anything else.
        dtype = _dtype_code(ms_dtype) if ms_dtype is not None else (_NO_DTYPE,)
        if ranked is None:
            ranked = head[2] + 1 if len(head) > 2 and head[2] >= 0 else 0
        return dtype + (note, ranked, head[0], head[1], kind_code, UNKNOWN_CALL) + tuple(path)

    return graph_key_codes
