"""A network whose probed values feed 2 and 3 consumers that each need a redistribution.

``fan2``'s input goes to two consumers taking it in the producer's layout; ``fan3``'s to two
such and one taking half of its last axis (a split layout's local shard). Each consumer
multiplies what it takes by its own weight; the cell returns the sum. ``redistribute`` is
where the compiler would insert the redistribution: identity functions without the
emulation, ``RedistributedValue.consumer`` with it (tests/support/ascend_emulation.py). The
layer mapping ``MAPPING`` dumps both inputs in ``in`` mode, as MindFormers' bundled
mappings do for hidden states, which is what MindSpore's pass moves.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

WIDTH = 4
LAYOUTS = {"fan2": ("same", "same"), "fan3": ("same", "same", "half")}
MAPPING = "TopLayer:\n  fan2: fan2([in], [out])\n  fan3: fan3([in], [out])\n"


def _identity(x):
    return x


def _half(x):
    return x[:, :x.shape[1] // 2]


def plain_consumers(layouts: Sequence[str]):
    return [_half if layout == "half" else _identity for layout in layouts]


class Fan(nn.Cell):
    def __init__(self, redistribute: Sequence[Callable]):
        super().__init__()
        self.count = len(redistribute)
        functions = list(redistribute) + [_identity] * (3 - len(redistribute))  # r2 unused by a 2-consumer fan
        self.r0, self.r1, self.r2 = functions
        self.w0 = Parameter(Tensor(np.eye(WIDTH, dtype=np.float32) * 0.5), name="w0")
        self.w1 = Parameter(Tensor(np.full((WIDTH, WIDTH), 0.1, np.float32)), name="w1")
        self.w2 = Parameter(Tensor(np.arange(WIDTH * WIDTH // 2, dtype=np.float32).reshape(WIDTH // 2, WIDTH) / 8),
                            name="w2")

    def construct(self, x):
        out = ops.matmul(self.r0(x), self.w0) + ops.matmul(self.r1(x), self.w1)
        if self.count > 2:
            out = out + ops.matmul(self.r2(x), self.w2)
        return out

    def consume(self, parts):
        """The same sum from the values the consumers took (for gradients w.r.t. each)."""
        out = ops.matmul(parts[0], self.w0) + ops.matmul(parts[1], self.w1)
        if self.count > 2:
            out = out + ops.matmul(parts[2], self.w2)
        return out


class Net(nn.Cell):
    def __init__(self, consumers: Optional[Dict[str, Sequence[Callable]]] = None):
        super().__init__()
        consumers = consumers or {name: plain_consumers(layouts) for name, layouts in LAYOUTS.items()}
        self.pre = nn.Dense(WIDTH, WIDTH)
        self.fan2 = Fan(consumers["fan2"])
        self.fan3 = Fan(consumers["fan3"])

    def construct(self, x):
        return (self.fan3(self.fan2(self.pre(x))) ** 2).sum()


def make_net(consumers=None) -> Net:
    net = Net(consumers)
    for index, param in enumerate(net.pre.trainable_params()):
        param.set_data(Tensor(np.random.RandomState(index).randn(*param.shape).astype(np.float32) * 0.5))
    return net


def make_input() -> Tensor:
    return Tensor(np.random.RandomState(3).randn(3, WIDTH).astype(np.float32))


def _grads_of_takes(fan: Fan, after: Callable, takes):
    """d loss / d (what each consumer took), each as its own input (``mindspore.grad`` over explicit inputs)."""
    if len(takes) == 2:
        return ms.grad(lambda a, b: after(fan.consume((a, b))), grad_position=(0, 1))(*takes)
    return ms.grad(lambda a, b, c: after(fan.consume((a, b, c))), grad_position=(0, 1, 2))(*takes)


def reference(net: Net, x: Tensor) -> dict:
    """Per fan: its input, what each consumer took, the gradient coming back from each, and their sum."""
    h1 = net.pre(x)
    h2 = net.fan2(h1)
    afters = {"fan2": lambda v: (net.fan3(v) ** 2).sum(), "fan3": lambda v: (v ** 2).sum()}
    out = {}
    for name, value in (("fan2", h1), ("fan3", h2)):
        fan, after = getattr(net, name), afters[name]
        # distinct tensors: PyNative autodiff tells inputs apart by object, and identity returns its input
        takes = [Tensor(f(value).asnumpy()) for f in plain_consumers(LAYOUTS[name])]
        grads = _grads_of_takes(fan, after, takes)
        total = ms.grad(lambda v, fan=fan, after=after: after(fan(v)))(value)
        out[name] = {"input": value.asnumpy(), "takes": [t.asnumpy() for t in takes],
                     "parts": [g.asnumpy() for g in grads], "gradient": total.asnumpy()}
    return out
