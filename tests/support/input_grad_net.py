"""A small network whose cells take inputs that depend on no parameter.

- ``Lookup`` takes only an int tensor (like ``input_ids``): no gradient can exist for it;
  two instances, so the log line about it must appear once for the class;
- ``Attend`` takes ``(x, pair, mask)``: ``pair`` is a tuple of tensors (like LLaMA's
  ``freqs_cis``) and ``mask`` an additive float mask from the batch (like the attention
  mask): msprobe numbers the mask's gradient ``backward.output.1`` (rank among top-level
  tensor arguments), not 2;
- ``Head`` is a loss taking float logits, int labels and a float weight per row (like
  the loss's ``input_mask``).
Weights are deterministic so runs can be compared bit for bit.
"""

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

HIDDEN, VOCAB, ROWS = 8, 10, 6


class Lookup(nn.Cell):
    def __init__(self):
        super().__init__()
        self.table = Parameter(Tensor(np.zeros((VOCAB, HIDDEN), np.float32)), name="table")

    def construct(self, ids):
        return ops.gather(self.table, ids, 0)


class Attend(nn.Cell):
    def __init__(self):
        super().__init__()
        self.proj = nn.Dense(HIDDEN, HIDDEN)

    def construct(self, x, pair, mask):
        h = self.proj(x) * pair[0] + pair[1]
        return ops.softmax(h + mask, -1) * x


class Head(nn.Cell):
    def construct(self, logits, labels, weights):
        picked = (ops.log_softmax(logits, -1) * ops.one_hot(labels, HIDDEN, 1.0, 0.0)).sum(-1)
        return -(picked * weights).sum() / weights.sum()


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embed = Lookup()
        self.embed2 = Lookup()
        self.layers = nn.CellList([Attend(), Attend()])
        self.head = Head()

    def construct(self, ids, pair, mask, labels, weights):
        return self.forward(ids, pair, (mask, mask), labels, weights)

    def forward(self, ids, pair, masks, labels, weights):
        """The same computation with one mask per layer (for independent gradients)."""
        h = self.embed(ids) + self.embed2(ids)
        h = self.layers[0](h, pair, masks[0])
        h = self.layers[1](h, pair, masks[1])
        return self.head(h, labels, weights)


def make_net(weights=None):
    net = Net()
    for index, param in enumerate(net.trainable_params()):
        value = weights[param.name] if weights is not None else \
            np.random.RandomState(index).randn(*param.shape).astype(np.float32) * 0.5
        param.set_data(Tensor(value))
    return net


def snapshot(net):
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def make_inputs():
    rng = np.random.RandomState(99)
    ids = Tensor(rng.randint(0, VOCAB, (ROWS,)).astype(np.int32))
    pair = (Tensor(rng.randn(ROWS, HIDDEN).astype(np.float32)), Tensor(rng.randn(ROWS, HIDDEN).astype(np.float32)))
    mask = Tensor(np.where(rng.rand(ROWS, HIDDEN) < 0.3, -4.0, 0.0).astype(np.float32))
    labels = Tensor(rng.randint(0, HIDDEN, (ROWS,)).astype(np.int32))
    weights = Tensor(rng.rand(ROWS).astype(np.float32) + 0.5)
    return ids, pair, mask, labels, weights


def set_mode(mode):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")


CAPTURED_CELLS = {"embed": "Lookup", "embed2": "Lookup", "layers.0": "Attend", "layers.0.proj": "Dense",
                  "layers.1": "Attend", "layers.1.proj": "Dense", "head": "Head"}
