"""Graph-mode statistics reduced by graph ops: a captured value hands the host a few numbers, not its data.

The host backend's statistics task in graph mode, by default on a device (not on CPU, where
device memory is host memory and MindSpore's reduction kernels cost more than numpy on the
array the host op receives; ``HostBackend.reduce_in_graph`` overrides). A floating-point
tensor whose shape is
static and not empty is reduced inside the graph into two small vectors: its max and min,
in its own dtype (bfloat16: in float32, exact), and its sum and sum of squares (and the
NaN and Inf counts when configured), **accumulated in float32** (float16 and bfloat16 are
cast to float32 first; float64 stays float64). A pyfunc op (``side_effect_io``) receives
them with the key and the tensor's shape as the running graph computes it, and writes the
record: mean = sum / count and norm = sqrt(sum of squares), in Python floats. The dtype
and the shape come from those run-time values, not from compile-time constants: a
``Morph`` cell's declared dtype and shape can differ from what it computes (docs/capture.md,
"Morph cells in graph mode"); only bfloat16, which arrives as float32, is named from the
compile-time key. Against
today's host path (numpy, float64 accumulation) max and min are equal; mean and norm
differ by float32 rounding of the sums (relative error about count x 2^-24 at worst,
far less in practice: ``tests/test_graph_statistics.py`` pins them at rtol 1e-5 on a
training step).

NaN follows numpy, as the host path does: a NaN anywhere makes max and min NaN. MindSpore
2.9's CPU ReduceMax/ReduceMin skip a NaN unless it comes first, so the host side looks at
the sum of squares instead: it is NaN exactly when an element is (squares of infinities
are +inf and never cancel).

Everything else keeps the host probe, which hands the whole tensor to numpy: integer and
bool tensors (exact integer statistics), empty or dynamic shapes, and ``md5`` (a checksum
of the bytes). Gradients: a Cell whose forward is the identity and whose ``bprop`` reduces
the incoming gradient the same way (no host op in the forward at all); the gradients of
positional inputs are reduced by the call's input tie (``host.HostGraph``), where the
recording op keeps ``side_effect_io`` (a mask's gradient is used by nothing). Inside the
Cell's ``bprop`` the recording op is joined to the gradient by ``depend`` only: with
``side_effect_io`` there MindSpore 2.9 fails the compile ("Graph cycle exists", a loop of
UpdateState nodes).
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from mf_celldump.statistics import StatValues, statistics_record

# Statistics this path computes; anything else configured (md5) sends tensors to the host.
REDUCED = ("max", "min", "mean", "norm", "nan_count", "inf_count")
_FLOAT_NAMES = ("Float16", "Float32", "Float64", "BFloat16")


def reduces(wanted: Sequence[str]) -> bool:
    """Whether the configured statistics can all be computed from the reduced numbers."""
    return all(name in REDUCED for name in wanted)


def record_of(extremes: np.ndarray, moments: np.ndarray, dims: List[int], wanted: Sequence[str]) -> Dict[str, object]:
    """The statistics of a float tensor of shape ``dims`` from its reduced vectors (see the module docstring)."""
    high, low = (float(v) for v in np.asarray(extremes).reshape(-1)[:2])
    values = [float(v) for v in np.asarray(moments).reshape(-1)]
    total, squares = values[:2]
    count = math.prod(dims)
    if math.isnan(squares):  # an element is NaN: numpy's max and min are NaN then
        high = low = math.nan
    stats = StatValues(max=high, min=low, mean=total / count, norm=math.sqrt(squares) if squares >= 0 else squares)
    if len(values) > 2:
        stats.nan_count, stats.inf_count = int(values[2]), int(values[3])
    return statistics_record(stats, wanted, "f")


def graph_helpers(wanted: Sequence[str]) -> Tuple[Callable, Callable]:
    """``(reducible, reduce)``: graph-parsable helpers.

    ``reducible(dtype, shape)`` (compile time): whether a tensor goes through the graph
    reduction; ``reduce(x)`` -> ``(extremes, moments, shape)``: what the host receives.
    """
    import mindspore as ms
    from mindspore import ops
    from mindspore.ops.primitive import constexpr

    counts = "nan_count" in wanted or "inf_count" in wanted
    float32, stack, cast, isnan, isinf = ms.float32, ops.stack, ops.cast, ops.isnan, ops.isinf
    shape_of = ops.TensorShape()  # a kernel: the shape the running graph computed

    @constexpr
    def reducible(dtype, shape):
        static = all(isinstance(d, int) and d > 0 for d in shape)
        return static and str(dtype) in _FLOAT_NAMES

    @constexpr
    def half(dtype):
        return str(dtype) in ("Float16", "BFloat16")  # reduced in float32

    @constexpr
    def no_kernel(dtype):
        return str(dtype) == "BFloat16"  # MindSpore 2.9 has no CPU ReduceMax for it

    def reduce(x):
        e = cast(x, float32) if no_kernel(x.dtype) else x
        w = cast(x, float32) if half(x.dtype) else x
        extremes = stack((e.max(), e.min()))
        if counts:
            moments = stack((w.sum(), (w * w).sum(), cast(isnan(w).sum(), w.dtype), cast(isinf(w).sum(), w.dtype)))
        else:
            moments = stack((w.sum(), (w * w).sum()))
        return extremes, moments, shape_of(x)

    return reducible, reduce


def gradient_tap(record_op, reduce: Callable):
    """A Cell ``(x, key, call) -> x`` whose ``bprop`` hands ``record_op`` the reduced gradient."""
    from mindspore import nn, ops

    depend, zeros_like = ops.depend, ops.zeros_like

    class GradientStatistics(nn.Cell):
        """Identity forward (no op at all); its bprop reduces the gradient and records it."""

        def __init__(self):
            super().__init__()
            self.record_op = record_op
            self.reduce = reduce

        def construct(self, x, key, call):
            return x

        def bprop(self, x, key, call, out, dout):
            extremes, moments, shape = self.reduce(dout)
            recorded = self.record_op(extremes, moments, key, shape, call)
            return depend(dout, recorded), zeros_like(key), zeros_like(call)

    return GradientStatistics()
