"""A small LLaMA-like network (MindSpore) whose layers can carry one fault each, for the noise-bound tests.

Each layer: RMSNorm, attention (q, k, v with bias, rotary embedding on q and k, a core that
scales the scores and takes their softmax, an output projection), RMSNorm, MLP (up with bias,
GELU, down with bias). Every place a fault goes is a cell of its own, so the cell that
carries it is the one compare must name first. Faults (``FAULTS``), set on one layer:

* ``weight_element``: one element of the MLP's up projection scaled by 1.5;
* ``epsilon``: the first norm's epsilon 0.5 instead of 1e-6;
* ``bias``: the MLP's down projection without its bias;
* ``softmax_scale``: scores divided by the head size instead of its square root;
* ``rotary_half``: the two halves of the rotated vector swapped the wrong way round.

Weights come from one seed, so every run computes the same thing but for its fault.
"""

from __future__ import annotations

import numpy as np

LAYERS, HIDDEN, HEADS, SEQ, BATCH = 4, 16, 2, 6, 2
HEAD = HIDDEN // HEADS
# the cell that carries each fault (under model.layers.N) and what it does
FAULTS = {
    "weight_element": "mlp.up",
    "epsilon": "norm1",
    "bias": "mlp.down",
    "softmax_scale": "attention.core",
    "rotary_half": "attention.rotary",
}


def build(fault=None, layer=None):
    """The network, with ``fault`` (a key of ``FAULTS``) on layer ``layer``."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops

    class RMSNorm(nn.Cell):
        def __init__(self, eps):
            super().__init__()
            self.eps = eps
            self.weight = Parameter(Tensor(np.ones(HIDDEN, np.float32)), name="weight")

        def construct(self, x):
            return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + self.eps) * self.weight

    class Rotary(nn.Cell):
        def __init__(self, swapped):
            super().__init__()
            angles = np.outer(np.arange(SEQ), 1.0 / 10000 ** (np.arange(HEAD // 2) * 2.0 / HEAD))
            self.cos = Tensor(np.cos(np.concatenate([angles, angles], -1)).astype(np.float32))
            self.sin = Tensor(np.sin(np.concatenate([angles, angles], -1)).astype(np.float32))
            self.swapped = swapped

        def construct(self, x):  # [batch, heads, seq, head]
            first, second = x[..., :HEAD // 2], x[..., HEAD // 2:]
            turned = ops.concat((second, -first) if self.swapped else (-second, first), -1)
            return x * self.cos + turned * self.sin

    class CoreAttention(nn.Cell):
        def __init__(self, scale):
            super().__init__()
            self.scale = scale

        def construct(self, q, k, v):
            scores = ops.softmax(ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale, axis=-1)
            return ops.matmul(scores, v)

    class Attention(nn.Cell):
        def __init__(self, mine):
            super().__init__()
            self.q, self.k, self.v, self.out = (nn.Dense(HIDDEN, HIDDEN) for _ in range(4))
            self.rotary = Rotary(mine == "rotary_half")
            self.core = CoreAttention(1.0 / HEAD if mine == "softmax_scale" else 1.0 / float(np.sqrt(HEAD)))

        def construct(self, x):
            q, k, v = (t.reshape(BATCH, SEQ, HEADS, HEAD).transpose(0, 2, 1, 3) for t in (self.q(x), self.k(x),
                                                                                        self.v(x)))
            context = self.core(self.rotary(q), self.rotary(k), v)
            return self.out(context.transpose(0, 2, 1, 3).reshape(BATCH, SEQ, HIDDEN))

    class MLP(nn.Cell):
        def __init__(self, mine):
            super().__init__()
            self.up = nn.Dense(HIDDEN, 4 * HIDDEN)
            self.act = nn.GELU()
            self.down = nn.Dense(4 * HIDDEN, HIDDEN, has_bias=mine != "bias")

        def construct(self, x):
            return self.down(self.act(self.up(x)))

    class Layer(nn.Cell):
        def __init__(self, mine):
            super().__init__()
            self.norm1 = RMSNorm(0.5 if mine == "epsilon" else 1e-6)
            self.attention = Attention(mine)
            self.norm2 = RMSNorm(1e-6)
            self.mlp = MLP(mine)

        def construct(self, x):
            h = x + self.attention(self.norm1(x))
            return h + self.mlp(self.norm2(h))

    class Model(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layers = nn.CellList([Layer(fault if i == layer else None) for i in range(LAYERS)])
            self.norm = RMSNorm(1e-6)
            self.head = nn.Dense(HIDDEN, 1)

        def construct(self, x):
            for block in self.layers:
                x = block(x)
            return self.head(self.norm(x))

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.model = Model()

        def construct(self, x):
            return self.model(x)

    ms.set_seed(0)
    net = Net()
    for param in net.trainable_params():  # seeded by name: the same weights whatever the fault
        if param.name.split(".")[-2].startswith("norm"):
            continue  # norms keep their weight of ones
        value = np.random.default_rng(sum(param.name.encode())).normal(0, 0.3, param.shape).astype(np.float32)
        if fault == "weight_element" and param.name == f"model.layers.{layer}.mlp.up.weight":
            value[0, 0] *= 1.5
        param.set_data(Tensor(value))
    return net


def data():
    from mindspore import Tensor

    rng = np.random.default_rng(11)
    return (Tensor(rng.normal(size=(BATCH, SEQ, HIDDEN)).astype(np.float32)),
            Tensor(rng.normal(size=(BATCH, SEQ, 1)).astype(np.float32)))


def capture(dump_path: str, fault=None, layer=None) -> str:
    """One training step (SGD, PyNative, CPU) captured with ``attach`` (tensor task) and processed."""
    import mindspore as ms
    from mindspore import nn

    import mf_celldump
    from mf_celldump.processing.driver import process_dump

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    net = build(fault, layer)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01))
    handle = mf_celldump.attach(train, {"dump_path": dump_path, "task": "tensor", "steps": "0"})
    with handle.step(0):
        train(*data())
    handle.detach()
    assert process_dump(dump_path, jobs=1).ok
    return dump_path
