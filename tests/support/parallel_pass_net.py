"""Small networks for what MindSpore's parallel pass does to dumps beyond per-consumer copies.

Each cell's input (or output, for ``Row``) is a probed value; ``redistribute`` functions stand
where the compiler would insert a redistribution (identity or a half of the last axis without
the emulation, ``RedistributedValue.consumer`` with it), ``allreduce`` where it would insert a
forward AllReduce (tests/support/ascend_emulation.py ``ForwardCommunication``):

* ``Regions``: two consumers taking the lower and the upper half of the last axis (one shard
  shape, different regions);
* ``Outside``: one consumer in the producer's layout and one user outside the pass's consumers;
* ``Widened``: a bfloat16 input with one consumer (a statistics capture dumps a float32 copy);
* ``Row``: an output completed by a forward AllReduce.

Layer mappings dump inputs in ``in`` mode (what the pass moves) and ``Row``'s output in ``out``.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

WIDTH = 4
BATCH = 3
LAYOUTS = {"regions": ("half", "upper"), "outside": ("same", "outside"), "widened": ("same",)}
MAPPING = ("TopLayer:\n  regions: regions([in], [out])\n  outside: outside([in], [out])\n"
           "  widened: widened([in], [out])\n  row: row([out], [out])\n")


def _identity(x):
    return x


def _lower(x):
    return x[..., :x.shape[-1] // 2]


def _upper(x):
    return x[..., x.shape[-1] // 2:]


PLAIN = {"same": _identity, "outside": _identity, "half": _lower, "upper": _upper}


def plain_consumers(layouts: Sequence[str]):
    return [PLAIN[layout] for layout in layouts]


def _weight(rows: int, seed: int, name: str) -> Parameter:
    return Parameter(Tensor(np.random.RandomState(seed).randn(rows, WIDTH).astype(np.float32) * 0.5), name=name)


class Regions(nn.Cell):
    def __init__(self, redistribute: Sequence[Callable]):
        super().__init__()
        self.r0, self.r1 = redistribute
        self.w0, self.w1 = _weight(WIDTH // 2, 10, "rw0"), _weight(WIDTH // 2, 11, "rw1")

    def construct(self, x):
        return ops.matmul(self.r0(x), self.w0) + ops.matmul(self.r1(x), self.w1)

    def consume(self, parts):
        return ops.matmul(parts[0], self.w0) + ops.matmul(parts[1], self.w1)


class Outside(nn.Cell):
    def __init__(self, redistribute: Sequence[Callable]):
        super().__init__()
        self.r0, self.r1 = redistribute
        self.w0 = _weight(WIDTH, 12, "ow0")

    def construct(self, x):
        return ops.matmul(self.r0(x), self.w0) + self.r1(x) * 0.5

    def consume(self, parts):
        return ops.matmul(parts[0], self.w0) + parts[1] * 0.5


class Widened(nn.Cell):
    """Takes a bfloat16 value; its one consumer computes in float32 (no bfloat16 MatMul on CPU)."""

    def __init__(self, redistribute: Sequence[Callable]):
        super().__init__()
        self.r0 = redistribute[0]
        self.w0 = _weight(WIDTH, 13, "ww0")

    def construct(self, x):
        return ops.matmul(ops.cast(self.r0(x), ms.float32), self.w0)


class Row(nn.Cell):
    """An output completed by a forward AllReduce (bfloat16 Mul runs on CPU; MatMul does not)."""

    def __init__(self, allreduce: Callable, dtype=ms.float32):
        super().__init__()
        self.allreduce, self.dtype = allreduce, dtype
        # the batch's shape: no broadcast, whose backward would need a bfloat16 ReduceSum (none on CPU)
        self.w = Parameter(Tensor(np.linspace(0.5, 1.5, BATCH * WIDTH).reshape(BATCH, WIDTH).astype(np.float32)),
                           name="roww")

    def construct(self, x):
        return self.allreduce(ops.cast(x, self.dtype) * ops.cast(self.w, self.dtype))


class Net(nn.Cell):
    def __init__(self, consumers: Optional[Dict[str, Sequence[Callable]]] = None,
                 allreduce: Callable = _identity, row_dtype=ms.float32):
        super().__init__()
        consumers = consumers or {name: plain_consumers(layouts) for name, layouts in LAYOUTS.items()}
        self.pre = nn.Dense(WIDTH, WIDTH)
        self.regions = Regions(consumers["regions"])
        self.outside = Outside(consumers["outside"])
        self.widened = Widened(consumers["widened"])
        self.row = Row(allreduce, row_dtype)

    def construct(self, x):
        h = self.outside(self.regions(self.pre(x)))
        h = self.widened(ops.cast(h, ms.bfloat16))
        return (ops.cast(self.row(h), ms.float32) ** 2).sum()


def make_net(consumers=None, allreduce: Callable = _identity, row_dtype=ms.float32) -> Net:
    net = Net(consumers, allreduce, row_dtype)
    for index, param in enumerate(net.pre.trainable_params()):
        param.set_data(Tensor(np.random.RandomState(index).randn(*param.shape).astype(np.float32) * 0.5))
    return net


def make_input() -> Tensor:
    return Tensor(np.random.RandomState(3).randn(BATCH, WIDTH).astype(np.float32))


def reference(net: Net, x: Tensor, ranks: int = 1) -> dict:
    """Per cell: its input, what each consumer took, the gradient back from each, the whole gradient; for
    ``row`` its partial output (before the AllReduce) and the reduced one (``ranks`` equal partials)."""
    h0 = net.pre(x)
    h1 = net.regions(h0)
    h2 = net.outside(h1)
    hb = ops.cast(h2, ms.bfloat16)

    def tail_after_widened(v):
        # the other ranks' partials (equal to this one's) are added, but only this rank's carries its gradient
        partial = ops.cast(net.row(v), ms.float32)
        return (partial + ops.stop_gradient(partial) * (ranks - 1)) ** 2

    after = {
        "regions": lambda v: tail_after_widened(net.widened(ops.cast(net.outside(v), ms.bfloat16))).sum(),
        "outside": lambda v: tail_after_widened(net.widened(ops.cast(v, ms.bfloat16))).sum(),
    }
    out = {}
    for name, value in (("regions", h0), ("outside", h1)):
        cell = getattr(net, name)
        takes = [Tensor(f(value).asnumpy()) for f in plain_consumers(LAYOUTS[name])]
        parts = ms.grad(lambda a, b, cell=cell, f=after[name]: f(cell.consume((a, b))), grad_position=(0, 1))(*takes)
        whole = ms.grad(lambda v, cell=cell, f=after[name]: f(cell(v)))(value)
        out[name] = {"input": value.asnumpy(), "takes": [t.asnumpy() for t in takes],
                     "parts": [p.asnumpy() for p in parts], "gradient": whole.asnumpy()}
    whole = ms.grad(lambda v: tail_after_widened(net.widened(v)).sum())(hb)
    out["widened"] = {"input": hb.astype(ms.float32).asnumpy(), "gradient": whole.astype(ms.float32).asnumpy()}
    partial = net.row(net.widened(hb))
    out["row"] = {"partial": partial.astype(ms.float32).asnumpy(),
                  "reduced": (partial.astype(ms.float32) * ranks).asnumpy()}
    return out
