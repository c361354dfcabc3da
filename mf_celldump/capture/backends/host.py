"""Host capture op: an identity pyfunc ``ops.Custom`` whose Python body writes the data.

Python runs when the op executes, in either mode, so this works wherever MindSpore
runs pyfunc ops (CPU and GPU, PyNative and graph). The op takes ``(x, key)`` where
``key`` is a small int32 tensor (dtype code + probe key codes), so one op instance
serves every probe. Its ``bprop`` passes the incoming gradient through a second
pyfunc op that records it. Their outputs feed the graph, so the compiler keeps them;
only the op recording non-tensor values (whose output is unused) carries
``side_effect_io``. Execution is asynchronous in graph mode, so the session
synchronises before marking a step complete.
"""

from __future__ import annotations

from typing import Callable, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops
from mindspore.ops.primitive import constexpr

from mf_celldump.capture.backends.base import BackendContext, CaptureBackend, GraphFace, PyNativeFace
from mf_celldump.dtypes import dtype_names, mindspore_dtype_name, numpy_dtype_name
from mf_celldump.rawformat.keys import (
    BACKWARD,
    FORWARD,
    KIND_BOOL,
    KIND_CODES,
    KIND_FLOAT,
    KIND_INT,
    KIND_NONE,
    KIND_TENSOR,
    UNKNOWN_CALL,
    ProbeKey,
    kind_of_value,
    scalar_of_kind,
)

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


def _same_shape(x_shape, key_shape):
    return x_shape


def _same_dtype(x_dtype, key_dtype):
    return x_dtype


class HostBackend(CaptureBackend):
    """Captures through identity pyfunc ops; both faces share the two ops."""

    name = "host"

    def __init__(self, context: BackendContext):
        super().__init__(context)
        forward_enabled, backward_enabled = self.config.captures_forward, self.config.captures_backward

        def forward_body(x, key):
            if forward_enabled:
                self._emit(x, key, FORWARD)
            return x

        def backward_body(dout, key):
            self._emit(dout, key, BACKWARD)
            return dout

        grad_op = ops.Custom(backward_body, out_shape=_same_shape, out_dtype=_same_dtype, func_type="pyfunc")
        zeros_like = ops.zeros_like

        if backward_enabled:
            def bprop(x, key, out, dout):
                return (grad_op(dout, key), zeros_like(key))
        else:
            def bprop(x, key, out, dout):
                return (dout, zeros_like(key))

        self.probe_op = ops.Custom(forward_body, out_shape=_same_shape, out_dtype=_same_dtype,
                                   func_type="pyfunc", bprop=bprop)
        # Non-tensor values: the op's output is unused, so only side_effect_io keeps it.
        self.value_op = ops.Custom(forward_body, out_shape=_same_shape, out_dtype=_same_dtype,
                                   func_type="pyfunc")
        self.value_op.add_prim_attr("side_effect_io", True)

    def _emit(self, data, key, direction: str) -> None:
        """Runs inside a capture op: write the value of the running step, if it is captured."""
        runtime = self.context.runtime
        if not runtime.active:
            return
        codes = np.asarray(key).reshape(-1).tolist()
        probe = ProbeKey.from_codes(codes[1:], direction)
        sink = self.context.sink
        if probe.kind != KIND_TENSOR:
            sink.value(probe, scalar_of_kind(probe.kind, data))
            return
        dtype = _DTYPE_NAMES[codes[0]] if 0 <= codes[0] < len(_DTYPE_NAMES) else None
        array = _owned(data)
        if dtype and dtype != "bfloat16" and array.dtype.name != dtype:
            array = array.astype(dtype)  # a 0-d tensor arrives as a Python scalar
        dtype = dtype or array.dtype.name
        # The writer's thread saves the array or computes its statistics; the op returns at once.
        if self.config.task == "tensor":
            sink.tensor(probe, array, dtype)
        else:
            sink.statistics_of(probe, mindspore_dtype_name(dtype), array, self.config.statistics)

    def pynative(self) -> PyNativeFace:
        return HostPyNative(self)

    def graph(self) -> GraphFace:
        return HostGraph(self)


class HostPyNative(PyNativeFace):
    def __init__(self, backend: HostBackend):
        self.backend = backend

    def forward(self, value, key: ProbeKey, mode: str):
        backend = self.backend
        if isinstance(value, Tensor):
            codes = Tensor(_dtype_code(value.dtype) + key.to_codes(), dtype=ms.int32)
            return backend.probe_op(value, codes)
        kind = kind_of_value(value)
        if kind is not None and backend.config.captures_forward:
            backend.context.sink.value(key.with_kind(kind), value)
        return value

    def backward(self, tensor, key: ProbeKey, mode: str):
        return tensor  # the probe op inserted by forward() records the gradient in its bprop


class HostGraph(GraphFace):
    def __init__(self, backend: HostBackend):
        self.backend = backend

    def probe_function(self) -> Callable:
        probe_op, value_op = self.backend.probe_op, self.backend.value_op
        forward_enabled = self.backend.config.captures_forward
        int32, int64, float32, bool_ = ms.int32, ms.int64, ms.float32, ms.bool_
        key_codes = _make_graph_key_codes()
        none_code, bool_code = KIND_CODES[KIND_NONE], KIND_CODES[KIND_BOOL]
        int_code, float_code = KIND_CODES[KIND_INT], KIND_CODES[KIND_FLOAT]

        def graph_probe(value, head, path, use_in):
            if isinstance(value, Tensor):
                return probe_op(value, Tensor(key_codes(head, 0, path, value.dtype), int32))
            if forward_enabled:
                if value is None:
                    value_op(Tensor(0, int32), Tensor(key_codes(head, none_code, path, None), int32))
                elif isinstance(value, bool):
                    value_op(Tensor(value, bool_), Tensor(key_codes(head, bool_code, path, None), int32))
                elif isinstance(value, int):
                    value_op(Tensor(value, int64), Tensor(key_codes(head, int_code, path, None), int32))
                elif isinstance(value, float):
                    value_op(Tensor(value, float32), Tensor(key_codes(head, float_code, path, None), int32))
            return value

        return graph_probe


def _make_graph_key_codes():
    @constexpr
    def graph_key_codes(head, kind_code, path, ms_dtype):
        # Runs in Python at graph compile time: everything here is a constant.
        dtype = _dtype_code(ms_dtype) if ms_dtype is not None else (_NO_DTYPE,)
        return dtype + (head[0], head[1], kind_code, UNKNOWN_CALL) + tuple(path)

    return graph_key_codes
