"""A network of ``Morph`` cells whose declared infer_dtype / infer_shape are not what they compute.

MindFormers' mcore ``VocabParallelEmbedding`` declares, through ``embedding_infer_dtype``, the
int32 of ``input_ids`` for its float32 embedding output. In graph mode MindSpore first infers a
``Morph`` with the declared functions, then replaces it by its function and re-infers the graph
(docs/capture.md, "Morph cells in graph mode"). The cells below lie the same way:

- ``Lookup``: an embedding lookup declared with the dtype of the ids (int32), as MindFormers';
- ``Square``: a row-wise sum of squares (B, S, H) -> (B, S) declared as float16 of shape (B*S,);
- ``Energy``: a mean of squares, a 0-d float32 declared as int32 (the loss).

``expected`` computes every captured value of one step with numpy, independently.
Morph runs only in graph mode; in PyNative the tests run its function eagerly (``run_morph_eagerly``).
"""

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops.operations import Morph

VOCAB, HIDDEN, OUT = 10, 4, 3
IDS = np.array([[1, 2, 3], [4, 5, 9]], dtype=np.int32)


def _declare_first_dtype(*dtypes):
    return dtypes[0]  # the ids' int32, as MindFormers' embedding_infer_dtype


def _lookup_shape(ids_shape, weight_shape):
    return [ids_shape[0], ids_shape[1], weight_shape[-1]]


def _declare_float16(*dtypes):
    return mstype.TensorType(ms.float16)  # a tensor type: a bare dtype would declare a scalar


def _declare_flat(x_shape):
    return [x_shape[0] * x_shape[1]]


def _declare_int32(*dtypes):
    return mstype.TensorType(ms.int32)


def _scalar_shape(*shapes):
    return []


class Lookup(nn.Cell):
    def __init__(self):
        super().__init__()
        self.weight = Parameter(Tensor(np.arange(VOCAB * HIDDEN, dtype=np.float32).reshape(VOCAB, HIDDEN) / 37.0),
                                name="weight")
        self.lookup = Morph(self.lookup_fn, _lookup_shape, _declare_first_dtype)

    def construct(self, ids):
        return self.lookup(ids, self.weight)

    def lookup_fn(self, ids, weight):
        return ops.gather(weight, ids, 0) * 2.0


class Square(nn.Cell):
    def __init__(self):
        super().__init__()
        self.square = Morph(self.square_fn, _declare_flat, _declare_float16)

    def construct(self, x):
        return self.square(x)

    def square_fn(self, x):
        return (x * x).sum(-1)


class Energy(nn.Cell):
    def __init__(self):
        super().__init__()
        self.energy = Morph(self.energy_fn, _scalar_shape, _declare_int32)

    def construct(self, x):
        return self.energy(x)

    def energy_fn(self, x):
        return (x * x).mean()


class Top(nn.Cell):
    def __init__(self):
        super().__init__()
        self.lookup = Lookup()
        self.dense = nn.Dense(HIDDEN, OUT, weight_init="ones", bias_init="zeros")
        self.square = Square()
        self.energy = Energy()

    def construct(self, ids):
        # The casts are what lets the declared dtypes through the first inference (MindFormers'
        # LanguageModelEmbedding casts its embedding to the compute dtype the same way). A chain: with
        # backward capture, a tensor used by two captured cells changed the last bit of its gradient
        # in graph mode (a different summation order; a separate finding, not a Morph one).
        h = self.dense(ops.cast(self.lookup(ids), ms.float32))
        return ops.cast(self.energy(ops.cast(self.square(h), ms.float32)), ms.float32)


def make_input():
    return Tensor(IDS)


def train_one_step_cell(net):
    return nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.01))


def run_morph_eagerly(monkeypatch):
    """PyNative: ``Morph.__call__`` raises outside graph mode; run the wrapped function instead
    (the operations graph mode expands a Morph into)."""
    monkeypatch.setattr(Morph, "__call__", lambda self, *args: self.__morph_fn__(*args))


def expected(weights):
    """{(cell, direction, slot, index): value} of one step from ``weights`` (the step's parameters)."""
    table, dense_w, dense_b = weights["lookup.weight"], weights["dense.weight"], weights["dense.bias"]
    e = table[IDS] * np.float32(2.0)
    h = e @ dense_w.T + dense_b
    square = (h * h).sum(-1)
    energy = np.float32((square * square).mean())
    d_square = 2 * square / np.float32(square.size)  # d energy / d square
    d_e = (2 * h * d_square[..., None]) @ dense_w
    return {
        ("lookup", "forward", "o", 0): e,
        ("lookup", "backward", "o", 0): d_e,
        ("square", "forward", "a", 0): h,
        ("square", "forward", "o", 0): square,
        ("square", "backward", "o", 0): d_square,
        ("energy", "forward", "a", 0): square,
        ("energy", "forward", "o", 0): energy,
        ("energy", "backward", "o", 0): np.float32(1.0),
    }
