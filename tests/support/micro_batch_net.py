"""A model run as micro-batches: by MindSpore's gradient-accumulation wrappers, or in a pipeline stage's order.

``Model`` = ``front`` (``inp``, then ``shared`` applied twice) and ``back`` (``out`` and a
square-sum loss), so a micro-batch calls ``shared`` twice (its backward runs in reverse
call order inside the micro-batch) and every other cell once. ``reference`` gives, per
micro-batch, every value and gradient at those cells' boundaries (PyNative,
``mindspore.grad``), keyed by the ``dump.json`` entry that must hold it.

``ScheduledPipeline`` stands in for MindSpore's pipeline wrapper on one CPU (pipeline
parallel does not compile on CPU): it runs the stage's forward and backward units in the
order a scheduler gives (``tests/support/pipeline_schedules.py``), each unit one
``mindspore.vjp`` of a chunk, chained by ``depend`` as MindSpore's ``ControlOrder`` chains
the units' border nodes. Its construct is generated per order and written to a real file
(MindSpore parses source).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from typing import Dict, List, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops

ROWS, WIDTH = 2, 4  # rows per micro-batch


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.lin = nn.Dense(WIDTH, WIDTH)

    def construct(self, x):
        return ops.tanh(self.lin(x))


class Front(nn.Cell):
    def __init__(self):
        super().__init__()
        self.inp = Block()
        self.shared = Block()

    def construct(self, x):
        return self.shared(self.shared(self.inp(x)))


class Back(nn.Cell):
    def __init__(self):
        super().__init__()
        self.out = Block()

    def construct(self, h):
        return (self.out(h) ** 2).sum()


class Model(nn.Cell):
    def __init__(self):
        super().__init__()
        self.front = Front()
        self.back = Back()

    def construct(self, x):
        return self.back(self.front(x))


def make_model() -> Model:
    model = Model()
    for index, param in enumerate(model.trainable_params()):
        param.set_data(Tensor(np.random.RandomState(10 + index).randn(*param.shape).astype(np.float32) * 0.6))
    return model


def make_batch(micro: int, seed: int = 0) -> Tensor:
    """``micro`` micro-batches of ``ROWS`` rows, each clearly different."""
    rng = np.random.RandomState(seed)
    return Tensor((rng.randn(micro * ROWS, WIDTH) + np.repeat(np.arange(micro), ROWS)[:, None]).astype(np.float32))


def _entry(name: str, klass: str, direction: str, call: int) -> str:
    return f"Cell.{name}.{klass}.{direction}.{call}"


def _boundaries(model: Model, x: Tensor) -> Dict[str, Tuple[Tensor, Tensor]]:
    """value -> (forward value, gradient of the loss w.r.t. it) for one micro-batch."""
    a = model.front.inp(x)
    s1 = model.front.shared(a)
    s2 = model.front.shared(s1)
    y = model.back.out(s2)
    loss = (y ** 2).sum()
    g_y = ms.grad(lambda v: (v ** 2).sum())(y)
    g_s2 = ms.grad(lambda v: model.back(v))(s2)
    g_s1 = ms.grad(lambda v: model.back(model.front.shared(v)))(s1)
    g_a = ms.grad(lambda v: model.back(model.front.shared(model.front.shared(v))))(a)
    return {"a": (a, g_a), "s1": (s1, g_s1), "s2": (s2, g_s2), "y": (y, g_y), "loss": (loss, None)}


def reference(model: Model, batch: Tensor, micro: int) -> Dict[tuple, np.ndarray]:
    """{(entry, io, index): array} for every micro-batch, entries numbered by call (micro-batch order)."""
    out = {}
    for m in range(micro):
        v = {k: (f.asnumpy(), None if g is None else g.asnumpy())
             for k, (f, g) in _boundaries(model, batch[m * ROWS:(m + 1) * ROWS]).items()}
        cells = [("front.inp", "Block", m, None, "a"), ("front.shared", "Block", 2 * m, "a", "s1"),
                 ("front.shared", "Block", 2 * m + 1, "s1", "s2"), ("back.out", "Block", m, "s2", "y"),
                 ("front", "Front", m, None, "s2"), ("back", "Back", m, "s2", None)]
        for name, klass, call, source, result in cells:
            forward, backward = _entry(name, klass, "forward", call), _entry(name, klass, "backward", call)
            if source is not None:
                out[(forward, "input", 0)] = v[source][0]
                out[(backward, "output", 0)] = v[source][1]
            if result is not None:
                out[(forward, "output", 0)] = v[result][0]
                out[(backward, "input", 0)] = v[result][1]
        out[(_entry("back", "Back", "forward", m), "output", 0)] = v["loss"][0]
    return out


# -- a pipeline stage's order on one CPU -------------------------------------------------------
def _unit_lines(order: List[tuple], chunks: int) -> List[str]:
    lines = []
    for direction, c, m in order:
        if direction == "F":
            source = f"xs[{m}]" if c == 0 else f"o_{c - 1}_{m}"
            lines += [f"o_{c}_{m}, f_{c}_{m} = vjp(self.chunks[{c}], depend({source}, last), weights=self.w{c})",
                      f"last = o_{c}_{m}"]
        else:
            sens = f"ones_like(o_{c}_{m})" if c == chunks - 1 else f"g_{c + 1}_{m}"
            lines += [f"b_{c}_{m} = f_{c}_{m}(depend({sens}, last))", f"g_{c}_{m} = b_{c}_{m}[0][0]",
                      f"last = g_{c}_{m}"]
    return lines


def _construct_source(order: List[tuple], micro: int, chunks: int) -> str:
    losses = " + ".join(f"o_{chunks - 1}_{m}" for m in range(micro))
    body = [f"xs = ({', '.join(f'x[{m * ROWS}:{(m + 1) * ROWS}]' for m in range(micro))},)", "last = x"]
    body += _unit_lines(order, chunks) + [f"return depend({losses}, last)"]
    return ("import mindspore as ms\nfrom mindspore import ops\n\nvjp, depend, ones_like = ms.vjp, ops.depend, "
            "ops.ones_like\n\n\ndef construct(self, x):\n" + "".join(f"    {line}\n" for line in body))


def _load_construct(source: str, folder: str):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "scheduled_construct.py")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(source)
    name = f"scheduled_construct_{abs(hash(source))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module  # MindSpore's parser resolves names through the function's module
    return module.construct


class _Scheduled:
    """``network`` run as ``micro_size`` micro-batches in ``order`` (units of its chunks: the model itself
    for one chunk, ``front`` and ``back`` for two)."""

    def __init__(self, network: Model, micro_size: int, order: List[tuple], chunks: int, folder: str = ""):
        nn.Cell.__init__(self, auto_prefix=False)
        self.network = network
        self.micro_size = micro_size
        self.chunks = nn.CellList([network] if chunks == 1 else [network.front, network.back])
        for c, chunk in enumerate(self.chunks):
            setattr(self, f"w{c}", ms.ParameterTuple(chunk.trainable_params()))
        source = _construct_source(order, micro_size, chunks)
        self.construct = _load_construct(source, folder or tempfile.mkdtemp()).__get__(self)


class ScheduledPipeline(_Scheduled, nn.PipelineCell):
    """A ``PipelineCell`` to the capture, which reads ``micro_size`` on it as on MindSpore's own wrapper."""


class ScheduledGradAccumulation(_Scheduled, nn.GradAccumulationCell):
    """A ``GradAccumulationCell`` to the capture."""
