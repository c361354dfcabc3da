"""A small network with every shape of call the capture engine must handle.

- ``split`` returns a tuple and has a parameter left at its ``None`` default;
- ``gate`` takes a non-tensor positional input, a tensor passed by keyword and a
  keyword-only float;
- ``shared`` is called twice per step;
- ``layers`` is a CellList.
``TwoHeads`` applies one cell to two independent tensors (graph mode schedules their
gradients in call order, not reverse).
Weights are deterministic so runs can be compared bit for bit.
"""

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops


class Split(nn.Cell):
    def __init__(self):
        super().__init__()
        self.proj = nn.Dense(8, 16)

    def construct(self, x, mask=None):
        y = self.proj(x)
        if mask is not None:
            y = y * mask
        return y[:, :8], y[:, 8:]


class Gate(nn.Cell):
    def __init__(self):
        super().__init__()
        self.lin = nn.Dense(8, 8)

    def construct(self, x, scale, gate=None, *, shift=0.0):
        y = self.lin(x) * scale + shift
        if gate is not None:
            y = y * ops.sigmoid(gate)
        return y


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embed = nn.Dense(4, 8)
        self.split = Split()
        self.gate = Gate()
        self.shared = nn.Dense(8, 8)
        self.layers = nn.CellList([nn.Dense(8, 8) for _ in range(2)])
        self.act = nn.ReLU()

    def construct(self, x):
        h = self.embed(x)
        a, b = self.split(h)
        h = self.gate(a, 2, gate=b, shift=0.5)
        h = self.shared(self.act(self.shared(h)))
        for layer in self.layers:
            h = layer(h)
        return (h * h).mean()


class Rotate(nn.Cell):
    """Parameter-free, called on two independent tensors (as Qwen3's rotary cell on query, then key)."""

    def construct(self, x):
        return x * 2.0 + 1.0


def attention(q, k):
    return ops.matmul(ops.softmax(ops.matmul(q, k.transpose(0, 2, 1)), -1), k).sum()


class TwoHeads(nn.Cell):
    """Grouped-query attention in miniature: 2 query heads, 1 key head. Graph mode runs the backward of
    ``rotate(k)`` (key used twice) before that of ``rotate(q)``: not in reverse call order."""

    def __init__(self):
        super().__init__()
        self.wq = nn.Dense(4, 4)
        self.wk = nn.Dense(4, 2)
        self.rotate = Rotate()

    def construct(self, x):
        q = self.rotate(self.wq(x).reshape(2, 2, 2))
        k = self.rotate(self.wk(x).reshape(2, 1, 2))
        return attention(q, k)


def make_two_heads():
    """A TwoHeads with fixed weights."""
    net = TwoHeads()
    for index, param in enumerate(net.trainable_params()):
        param.set_data(Tensor(np.random.RandomState(100 + index).randn(*param.shape).astype(np.float32) * 0.5))
    return net



def make_net(weights=None):
    """A Net with fixed weights (or the given {name: array})."""
    net = Net()
    for index, param in enumerate(net.trainable_params()):
        if weights is not None:
            value = weights[param.name]
        else:
            value = np.random.RandomState(index).randn(*param.shape).astype(np.float32) * 0.3
        param.set_data(Tensor(value))
    return net


def snapshot(net):
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def make_input():
    return Tensor(np.random.RandomState(1234).randn(2, 4).astype(np.float32))


def train_one_step_cell(net):
    return nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1))


def set_mode(mode):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")


# name -> class of every captured cell (the root and the uncalled CellList capture nothing)
CAPTURED_CELLS = {
    "embed": "Dense",
    "split": "Split",
    "split.proj": "Dense",
    "gate": "Gate",
    "gate.lin": "Dense",
    "shared": "Dense",
    "layers.0": "Dense",
    "layers.1": "Dense",
    "act": "ReLU",
}
CALLS_PER_STEP = {name: (2 if name == "shared" else 1) for name in CAPTURED_CELLS}


class Doubles(nn.Cell):
    def construct(self, x):
        return x * 2.0


class Big(nn.Cell):
    """One cell between input and loss: a dump whose size is the input's (the channel-limit tests)."""

    def __init__(self):
        super().__init__()
        self.double = Doubles()

    def construct(self, x):
        return self.double(x).sum()
