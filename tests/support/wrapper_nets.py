"""Test-only wrappers of classes mf_celldump has never heard of, built like (or unlike) MindFormers' own.

The capture must find each by what it holds, never by its name: a training step of its own
(an optimizer and a ``GradOperation``), a gradient accumulation with its own slicer class
(with or without the marks MindSpore's passes read), a loop that slices the batch itself
(which cannot be read and must be refused), a training step holding two models (no single
child is the model: refused). ``TwoOutputModel`` gives MindFormers' ``*WithTwoOutput``
wrappers the two outputs they add up (a loss and a token count).
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from tests.support import micro_batch_net as mb


class TwoOutputModel(nn.Cell):
    """``model``'s loss and a constant token count, as per-token-loss models return them."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def construct(self, x):
        loss = self.model(x)
        return loss, ops.ones_like(loss)


class TupleTrainStep(nn.Cell):
    """A training step of an unknown class: gradients of the first output (the others are carried along), then
    the optimizer; one forward per step."""

    def __init__(self, network, optimizer):
        super().__init__(auto_prefix=False)
        self.network = network
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ms.value_and_grad(self.network, None, self.weights, has_aux=True)

    def construct(self, x):
        (loss, _), grads = self.grad(x)
        return ops.depend(loss, self.optimizer(grads))


class RowSlicer(nn.Cell):
    """Rows ``[i * n, (i + 1) * n)`` of the input, ``n = rows / parts``: a slicer of a class of its own."""

    def __init__(self, parts, accumulation_mark=False):
        super().__init__()
        self.parts = parts
        self.cut = ops.StridedSlice()
        if accumulation_mark:
            self.cut.add_prim_attr("grad_accu_num", parts)

    def construct(self, i, x):
        rows = x.shape[0] // self.parts
        return (self.cut(x, (i * rows, 0), ((i + 1) * rows, x.shape[1]), (1, 1)),)


class SlicingAccumulation(nn.Cell):
    """Gradient accumulation of an unknown class: a list of slicers, one per micro-batch, losses added."""

    def __init__(self, net, parts, accumulation_mark=False):
        super().__init__(auto_prefix=False)
        self.net = net
        self.parts = parts
        self.pieces = nn.CellList([RowSlicer(parts, accumulation_mark) for _ in range(parts)])

    def construct(self, x):
        total = None
        for i in range(self.parts):
            loss = self.net(*self.pieces[i](i, x))
            total = loss if total is None else total + loss
        return total


class LoopingAccumulation(nn.Cell):
    """Micro-batches cut by Python slicing inside the loop: nothing tells how many or which rows."""

    def __init__(self, net, parts):
        super().__init__(auto_prefix=False)
        self.net = net
        self.parts = parts

    def construct(self, x):
        rows = x.shape[0] // self.parts
        total = 0.0
        for i in range(self.parts):
            total = total + self.net(x[i * rows:(i + 1) * rows])
        return total


class TwoModelStep(nn.TrainOneStepCell):
    """A training step that also holds a second model (say an EMA copy): no single child holds what it trains."""

    def __init__(self, network, shadow, optimizer):
        super().__init__(network, optimizer)
        self.shadow = shadow


def two_model_step():
    first, second = mb.make_model(), mb.make_model()
    for param in second.trainable_params():
        param.name = f"shadow.{param.name}"
    params = first.trainable_params() + second.trainable_params()
    return TwoModelStep(first, second, nn.SGD(params, 0.0))


class ScheduledMarked(mb._Scheduled, nn.Cell):  # pylint: disable=protected-access
    """The scheduled stand-in (``micro_batch_net._Scheduled``) as a wrapper of an unknown class built like
    MindFormers' ``GradAccumulationCellWithMultiOutputs`` (``kind`` "accumulation": slicers carrying
    ``grad_accu_num``) or ``PipelineCellWithMultiOutputs`` ("pipeline": a ``pipeline_end`` Add). The capture
    must read the count and schedule from that structure: no ``micro_size`` attribute, no known class."""

    def __init__(self, network, micro_size, order, chunks, kind, folder=""):
        from mindspore.nn.wrap.cell_wrapper import _MicroBatch

        super().__init__(network, micro_size, order, chunks, folder)
        del self.micro_size  # nothing by name: only the slicer list says how many
        self.micro_inputs = nn.CellList()
        for i in range(micro_size):
            slicer = _MicroBatch(micro_size)
            if kind == "accumulation":
                slicer.strided_slice.add_prim_attr("grad_accu_num", micro_size)
            else:
                self.add = ops.Add().add_prim_attr("pipeline_end", i)
            self.micro_inputs.append(slicer)


def set_mode(mode: str) -> None:
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
