"""A tiny network trained under cell health (run as a subprocess: the mode is per process).

argv: MODE (graph | pynative) ROUTE (attach | callback) SCENARIO DUMP_PATH STEPS DATA_MODE [FAULT_STEP]. The
network is Dense -> ``Faulty`` -> ``ZeroingRelu`` -> ``Scale`` -> Dense. ``Faulty`` multiplies its Dense's output
by ``gate / gate`` (a Parameter: 1, or 0 for a NaN, so no weight of it is ever NaN) and by ``boost`` (a
Parameter, 1 or 100: a spike of the output; weights are left out of the spike rule); ``ZeroingRelu``
(``where(x > 0, x, 0)``) turns a NaN into 0, so the loss stays finite; ``Scale`` multiplies by ``sqrt(w)``,
whose gradient is infinite at ``w = 0``. ``HidingTrainStep`` sets every non-finite gradient to 0 and returns
the loss alone: no overflow flag reaches anyone. Scenarios (from FAULT_STEP):

* ``silent``: the gate makes the output NaN from FAULT_STEP on (the silent NaN);
* ``transient``: the same in FAULT_STEP only (a plain loop: nothing can rerun it);
* ``spike``: the boost is 100 in FAULT_STEP only;
* ``weight_grad``: ``Scale``'s weight is 0 from FAULT_STEP on: its gradient is Inf/NaN, nothing else is;
* ``clean``: no fault; ``twice``: no fault, the ReLU called twice in each step.

ROUTE ``attach``: ``with dump.step(s): train(x, y)``; ``callback``: ``Model.train`` with ``CellDumpCallback``.
Prints ``RESULT {json}``: the losses, the steps captured, the firings the watch logged (rule, step, cell).
"""

import json
import logging
import sys

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

STEPS = 10
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


class Faulty(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(8, 8)
        self.gate = Parameter(Tensor(np.ones(1, np.float32)), name="gate", requires_grad=False)
        self.boost = Parameter(Tensor(np.ones(1, np.float32)), name="boost", requires_grad=False)

    def construct(self, x):
        return self.dense(x) * (self.gate / self.gate) * self.boost


class ZeroingRelu(nn.Cell):
    def construct(self, x):
        return ops.where(x > 0, x, ops.zeros_like(x))


class Scale(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.ones(1, np.float32)), name="w")

    def construct(self, x):
        return x * ops.sqrt(self.w)


class Net(nn.Cell):
    def __init__(self, twice=False):
        super().__init__()
        self.twice = twice  # the ReLU called twice per step: two calls, each with its own rows
        self.first = nn.Dense(4, 8)
        self.faulty = Faulty()
        self.relu = ZeroingRelu()
        self.scale = Scale()
        self.last = nn.Dense(8, 2)

    def construct(self, x):
        h = self.relu(self.faulty(self.first(x)))
        if self.twice:
            h = self.relu(h)
        return self.last(self.scale(h))


class WithLoss(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.loss = nn.MSELoss()

    def construct(self, x, y):
        return self.loss(self.net(x), y)


class HidingTrainStep(nn.TrainOneStepCell):
    """A training step that sets non-finite gradients to 0 and says nothing (returns the loss only)."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, 1.0)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = tuple(ops.where(ops.isfinite(g), g, ops.zeros_like(g)) for g in grads)
        self.optimizer(grads)
        return loss


def set_fault(net, scenario, fault_step, step):
    gate, w = net.faulty.gate, net.scale.w
    if scenario == "silent" and step >= fault_step or scenario == "transient" and step == fault_step:
        gate.set_data(Tensor(np.zeros(1, np.float32)))
    elif scenario == "transient":
        gate.set_data(Tensor(np.ones(1, np.float32)))
    if scenario == "spike":
        net.faulty.boost.set_data(Tensor(np.full(1, 100.0 if step == fault_step else 1.0, np.float32)))
    if scenario == "weight_grad" and step == fault_step:
        w.set_data(Tensor(np.zeros(1, np.float32)))


class Firings(logging.Handler):
    def __init__(self):
        super().__init__()
        self.seen = []

    def emit(self, record):
        text = record.getMessage()
        if " fired (" in text:
            self.seen.append(text)


def main():
    mode, route, scenario, dump_path, steps, data_mode = sys.argv[1:7]
    fault_step = int(sys.argv[7]) if len(sys.argv) > 7 else 5
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(0)
    np.random.seed(0)
    import mf_celldump

    firings = Firings()
    logging.getLogger("mf_celldump").addHandler(firings)
    net = Net(twice=scenario == "twice")
    train = HidingTrainStep(WithLoss(net), nn.SGD(net.trainable_params(), 0.01))
    config = {"dump_path": dump_path, "steps": steps, "task": "statistics", "data_mode": data_mode,
              "watch": {"cells": True, "cell_norm": True}}
    x = Tensor(np.random.randn(4, 4).astype(np.float32))
    y = Tensor(np.random.randn(4, 2).astype(np.float32))
    losses, captured, processed, notes = [], [], [], []
    if route == "attach":
        try:
            dump = mf_celldump.attach(train, config)
        except mf_celldump.AttachError as err:
            print("REFUSED " + str(err))
            return
        for step in range(STEPS):
            set_fault(net, scenario, fault_step, step)
            with dump.step(step):
                losses.append(float(train(x, y).asnumpy()))
        dump.detach()
        captured = list(dump.captured_steps)
    else:
        import mindspore.dataset as ds
        from mindspore.train import Callback, Model

        class Fault(Callback):
            def on_train_step_begin(self, run_context):
                set_fault(net, scenario, fault_step, run_context.original_args().cur_step_num - 1)

            def on_train_step_end(self, run_context):
                losses.append(float(run_context.original_args().net_outputs.asnumpy()))

        callback = mf_celldump.CellDumpCallback(**config)
        data = ds.NumpySlicesDataset({"x": np.tile(x.asnumpy(), (STEPS, 1, 1)),
                                      "y": np.tile(y.asnumpy(), (STEPS, 1, 1))}, shuffle=False)
        Model(train).train(1, data, callbacks=[Fault(), callback], dataset_sink_mode=False)
        summary = callback.summary
        captured = list(summary.captured_steps)
        processed, notes = sorted(summary.processed_steps), list(summary.notes)
    print("RESULT " + json.dumps({"losses": losses, "captured": captured, "firings": firings.seen,
                                  "processed": processed, "notes": notes}))


if __name__ == "__main__":
    main()
