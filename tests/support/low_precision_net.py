"""A network whose cell boundaries carry bfloat16 and float16 while it computes in float32.

Most bfloat16 kernels are missing on CPU (MatMul, ReduceSum, even AddN); Cast, Add, Mul
and Concat run in bfloat16 in both modes. So the ``Up`` cells compute in float32 and cast
their output down, ``Mix`` and ``Cat`` work in the low dtype, and ``Down`` casts up again
before its float32 ``Dense``. No low-precision value is used twice (its gradient would need
an AddN). One ``Branch`` runs in bfloat16 (``bf``), one in float16 (``fp``). ``reference``
gives what every boundary holds, forward and backward, computed in PyNative without
capture, keyed like ``tests/support/processed.py`` reads ``dump.json``.
"""

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops


class Up(nn.Cell):
    def __init__(self, dtype):
        super().__init__()
        self.lin = nn.Dense(4, 4)
        self.dtype = dtype

    def construct(self, x):
        return ops.cast(self.lin(x), self.dtype)


class Mix(nn.Cell):
    def construct(self, a, b, c):
        return a * b + c


class Cat(nn.Cell):
    def construct(self, a, b):
        return ops.concat((a, b), axis=-1)


class Down(nn.Cell):
    def __init__(self):
        super().__init__()
        self.lin = nn.Dense(8, 2)

    def construct(self, h):
        return self.lin(ops.cast(h, ms.float32))


class Branch(nn.Cell):
    def __init__(self, dtype):
        super().__init__()
        self.up1, self.up2, self.up3, self.up4 = Up(dtype), Up(dtype), Up(dtype), Up(dtype)
        self.mix = Mix()
        self.cat = Cat()
        self.down = Down()

    def construct(self, x):
        m = self.mix(self.up1(x), self.up2(x), self.up3(x))
        return (self.down(self.cat(m, self.up4(x))) ** 2).sum()


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.bf = Branch(ms.bfloat16)
        self.fp = Branch(ms.float16)

    def construct(self, x):
        return self.bf(x) + self.fp(x)


def make_net() -> Net:
    net = Net()
    for index, param in enumerate(net.trainable_params()):
        param.set_data(Tensor(np.random.RandomState(index).randn(*param.shape).astype(np.float32) * 0.5))
    return net


def make_input() -> Tensor:
    return Tensor(np.random.RandomState(5).randn(3, 4).astype(np.float32))


def reference(net: Net, x: Tensor) -> dict:
    """{(entry, io, index): (dump.json dtype, float32 array)} of every low-precision boundary and of the
    heads' float32 outputs (PyNative)."""
    out = {}
    for branch, dtype in (("bf", "BFloat16"), ("fp", "Float16")):
        for key, value in _branch_reference(getattr(net, branch), x, branch).items():
            out[key] = ("Float32" if key == (f"Cell.{branch}.down.Down.forward.0", "output", 0) else dtype, value)
    return out


def _branch_reference(net: Branch, x: Tensor, prefix: str) -> dict:
    def _entry(cell: str, klass: str, direction: str) -> str:
        return f"Cell.{prefix}.{cell}.{klass}.{direction}.0"

    ups = [net.up1(x), net.up2(x), net.up3(x), net.up4(x)]
    m = net.mix(*ups[:3])
    h = net.cat(m, ups[3])
    y = net.down(h)

    def from_cat(a, b):
        return (net.down(net.cat(a, b)) ** 2).sum()

    g_h = ms.grad(lambda v: (net.down(v) ** 2).sum())(h)
    g_m, g_d = ms.grad(from_cat, grad_position=(0, 1))(m, ups[3])
    g_ups = ms.grad(lambda a, b, c: from_cat(net.mix(a, b, c), ups[3]), grad_position=(0, 1, 2))(*ups[:3])
    out = {}
    for i, (value, grad) in enumerate(zip(ups, list(g_ups) + [g_d]), start=1):
        out[(_entry(f"up{i}", "Up", "forward"), "output", 0)] = value
        out[(_entry(f"up{i}", "Up", "backward"), "input", 0)] = grad
    for i, (value, grad) in enumerate(zip(ups[:3], g_ups)):
        out[(_entry("mix", "Mix", "forward"), "input", i)] = value
        out[(_entry("mix", "Mix", "backward"), "output", i)] = grad
    out[(_entry("mix", "Mix", "forward"), "output", 0)] = m
    out[(_entry("mix", "Mix", "backward"), "input", 0)] = g_m
    for i, (value, grad) in enumerate(((m, g_m), (ups[3], g_d))):
        out[(_entry("cat", "Cat", "forward"), "input", i)] = value
        out[(_entry("cat", "Cat", "backward"), "output", i)] = grad
    out[(_entry("cat", "Cat", "forward"), "output", 0)] = h
    out[(_entry("cat", "Cat", "backward"), "input", 0)] = g_h
    out[(_entry("down", "Down", "forward"), "input", 0)] = h
    out[(_entry("down", "Down", "backward"), "output", 0)] = g_h
    out[(_entry("down", "Down", "forward"), "output", 0)] = y
    return {key: value.astype(ms.float32).asnumpy() for key, value in out.items()}
