"""Rerun a step whose update the training wrapper skipped, with capture on.

A loss-scale training wrapper (MindSpore's ``nn.TrainOneStepWithLossScaleCell``, MindFormers'
``MFTrainOneStepCell``) computes the loss and the gradients scaled by its loss scale, and calls the
optimizer only ``if not overflow`` (``construct`` of ``mindspore/nn/wrap/loss_scale.py`` and
``mindformers/wrapper/wrapper.py``, MindSpore 2.9 / MindFormers 1.9). After an overflow the weights
are those the step started from, so the step can run again on the same batch and weights. What
else changes between executions is put back:

* the loss scale: a dynamic one was lowered by the overflow (``process_loss_scale``); the rerun uses
  a copy of ``scale_sense`` taken when the step began, and leaves the wrapper's own alone;
* the random state: MindSpore's default generator (``mindspore.get_rng_state``/``set_rng_state``,
  which the functional random ops draw from) is set to its state at step begin for the rerun, and
  back afterwards, so training draws the same numbers as without the rerun (``nn.DropoutExt`` and
  ``ops.dropout_ext`` draw from it). ``nn.Dropout`` holds an ``ops.Dropout`` primitive with its own
  seeds (``mindspore/nn/layer/basic.py``), whose kernel keeps its state: that cannot be put back, so
  with such a cell in training mode the rerun is not exact, and says so.

The rerun is forward and backward only (``ForwardBackward``: the wrapper's network under
``GradOperation`` with the wrapper's weights and the step's loss scale as sensitivity, as the
wrapper computes them), never the optimizer: training goes on exactly as if there had been no rerun.
It is one more compile in graph mode (a new top cell, compiled in a captured step so it holds the
capture ops, see ``capture.graph_switch``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from mindspore import nn, ops

logger = logging.getLogger(__name__)


def rerun_problem(wrapper: Any) -> Optional[str]:
    """Why a step of ``wrapper`` cannot be rerun (None: it can): the wrapper must hold what it computes
    a step from, found by what it holds (a network cell, its weights, a loss-scale Parameter)."""
    if wrapper is None:
        return "the trainer gave no training network"
    missing = [name for name in ("network", "weights", "scale_sense") if getattr(wrapper, name, None) is None]
    if missing:
        return (f"{type(wrapper).__name__} holds no {', '.join(missing)} (a loss-scale training wrapper holds its "
                "network, weights and scale_sense)")
    if not isinstance(wrapper.network, nn.Cell):
        return f"{type(wrapper).__name__}.network is not a Cell"
    return None


def _has_dropout(network: nn.Cell) -> bool:
    """True when a cell draws from a random kernel with its own state (``nn.Dropout`` that drops in training)."""
    return any(isinstance(cell, nn.Dropout) and cell.training
               and not (cell.keep_prob == 1 or cell.p == 0)  # as its construct tests
               for _, cell in network.cells_and_names())


class ForwardBackward(nn.Cell):
    """The wrapper's forward and backward without its optimizer: (loss, whether every gradient is finite)."""

    def __init__(self, network: nn.Cell, weights):
        super().__init__(auto_prefix=False)  # the network's parameters keep their names
        self.network = network
        self.weights = weights
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)

    def construct(self, inputs, scale):
        loss = self.network(*inputs)
        sens = ops.ones_like(loss) * ops.cast(scale, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        finite = ops.stack([ops.isfinite(grad).all() for grad in grads]).all()
        return loss, finite


@dataclass
class StepSnapshot:
    """What a rerun needs from the start of a step: the loss scale (a host copy: one scalar read, where a device
    ``Tensor.copy`` costs about 11 ms on CPU) and the random state (``get_rng_state`` returns a copy)."""

    loss_scale: Any
    rng_state: Any

    @classmethod
    def take(cls, wrapper) -> Optional[StepSnapshot]:
        """None when the wrapper cannot be rerun (no loss scale to copy)."""
        if rerun_problem(wrapper) is not None:
            return None
        import mindspore as ms

        return cls(wrapper.scale_sense.asnumpy().copy(), ms.get_rng_state())


@dataclass(frozen=True)
class RerunResult:
    loss: float
    finite: bool  # loss and every gradient finite: the fault did not come back
    exact: bool
    inexact_reason: str = ""

    @property
    def verdict(self) -> str:
        return "transient" if self.finite else "persistent"


@dataclass
class StepRerun:
    """One rerun: the training wrapper, the step's batch and the snapshot taken when the step began."""

    wrapper: Any
    inputs: Tuple[Any, ...]
    snapshot: StepSnapshot

    def run(self) -> RerunResult:
        import mindspore as ms

        scale = ms.Tensor(self.snapshot.loss_scale)
        after = ms.get_rng_state()
        ms.set_rng_state(self.snapshot.rng_state)
        try:
            loss, finite = ForwardBackward(self.wrapper.network, self.wrapper.weights)(
                tuple(self.inputs), scale)
            loss_value = float(loss.asnumpy().mean())
            finite_value = bool(finite.asnumpy()) and loss_value == loss_value and abs(loss_value) != float("inf")
        finally:
            ms.set_rng_state(after)
        if _has_dropout(self.wrapper.network):
            return RerunResult(loss_value, finite_value, False,
                               "the network holds nn.Dropout cells, whose kernels keep their own random state, "
                               "which cannot be put back")
        return RerunResult(loss_value, finite_value, True)
