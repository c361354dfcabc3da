"""A network that needs its non-tensor arguments to stay compile-time constants.

Each construct below compiles in graph mode only if the value it receives is a constant
to MindSpore's compiler, as in MindFormers' mcore ``GPTModel``:

- ``Model`` fills a dict from ``None`` arguments (``extra or {}``, then ``d[k] = v``) and
  spreads it into a call by keyword;
- ``Repeat`` runs ``range(times)`` over an int argument and branches on a flag whose
  default is ``True`` (so a wrapper that changed the default would change the result);
- ``Pick`` takes a tuple mixing a tensor, ``None`` and an int, and a keyword-only string;
- ``Spread`` has a ``*args, **kwargs`` construct;
- ``repeat`` is called twice per step with different constants.
"""

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 4, weight_init="ones", bias_init="zeros")

    def construct(self, x, attention_mask=None, actual_seq_len=None):
        y = self.dense(x)
        if actual_seq_len is not None:
            y = y + 1.0
        if attention_mask is not None:
            y = y * attention_mask
        return y


class Repeat(nn.Cell):
    def __init__(self):
        super().__init__()
        self.scale = ms.Parameter(Tensor(np.full((4,), 0.9, np.float32)), name="scale")

    def construct(self, x, times, flag=True):
        for _ in range(times):
            x = x * self.scale
        if flag:
            x = x + 0.5
        return x


class Pick(nn.Cell):
    def construct(self, pair, *, how="sum"):
        tensor, nothing, count = pair
        if nothing is None and how == "sum":
            return tensor.sum(axis=-1) * count
        return tensor.mean(axis=-1)


class Spread(nn.Cell):
    def construct(self, *args, **kwargs):
        x = args[0]
        if kwargs.get("double") is not None:
            x = x * 2.0
        return x


class Model(nn.Cell):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.repeat = Repeat()
        self.pick = Pick()
        self.spread = Spread()

    def construct(self, x, extra_block_kwargs=None, actual_seq_len=None):
        extra_block_kwargs = extra_block_kwargs or {}
        extra_block_kwargs["actual_seq_len"] = actual_seq_len
        h = self.block(x, **extra_block_kwargs)
        h = self.repeat(h, 2)
        h = self.repeat(h, 1, False)
        h = self.spread(h, double=None)
        return self.pick((h, None, 3), how="sum").mean()


class Top(nn.Cell):
    def __init__(self):
        super().__init__()
        self.model = Model()

    def construct(self, x):
        return self.model(x, None, None)


def make_input():
    return Tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 8.0)


def train_one_step_cell(net):
    return nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.01))


