"""A tiny network trained by ``Model.train`` under the watch (run as a subprocess: the mode is per process).

argv: MODE (graph | pynative) SCENARIO DUMP_PATH TASK [FAULT_STEP]. The network is Dense ->
``Faulty`` -> Dense; ``Faulty`` multiplies its Dense's output by ``sqrt(gate)``, a Parameter the
``GateFlip`` callback sets to -1 at the fault step (NaN from then on) or for that step only
(``transient``). Scenarios:

* ``nan``: the fault from FAULT_STEP on, under MindSpore's ``TrainOneStepWithLossScaleCell``
  (``CpuLossScaleCell``), which skips the update when its gradients overflow: the weights stay finite;
* ``transient``: the fault in the first execution of FAULT_STEP only (gone when the watch reruns it);
* ``spike``: no fault; the targets of FAULT_STEP are 30 times larger (a loss spike);
* ``clean``: no fault;
* ``plain-transient``: ``transient`` without the callback (the losses training gives untouched);
* ``stop``: as ``nan`` with ``watch: {stop: true}``;
* ``sink``: as ``nan``, trained with ``dataset_sink_mode=True, sink_size=2`` (on CPU MindSpore trains step by
  step all the same).

Prints ``RESULT {json}``: the summary, the steps trained, each step's loss.
"""

import json
import logging
import sys

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.train import Callback, Model

STEPS = 10
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


class Faulty(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(8, 8)
        self.gate = Parameter(Tensor(np.ones(1, np.float32)), name="gate", requires_grad=False)

    def construct(self, x):
        return self.dense(x) * ops.sqrt(self.gate)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.first = nn.Dense(4, 8)
        self.faulty = Faulty()
        self.last = nn.Dense(8, 2)

    def construct(self, x):
        return self.last(self.faulty(self.first(x)))


class WithLoss(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.loss = nn.MSELoss()

    def construct(self, x, y):
        return self.loss(self.net(x), y)


class CpuLossScaleCell(nn.TrainOneStepWithLossScaleCell):
    """MindSpore's loss-scale training cell (skips the update when ``overflow``) with an overflow check that runs
    on CPU: any non-finite gradient (MindSpore's own reads the NPU float status)."""

    def start_overflow_check(self, pre_cond, compute_input):
        return Tensor([0] * 8, ms.int32), compute_input

    def get_overflow_status(self, status, compute_output):
        return ops.stack([ops.logical_not(ops.isfinite(grad).all()) for grad in compute_output]).any()


class GateFlip(Callback):
    """Sets the gate before the fault step (global step = cur_step_num - 1), and back after a transient one."""

    def __init__(self, gate, step, transient):
        self.gate, self.step, self.transient = gate, step, transient
        self.losses = []

    def on_train_step_begin(self, run_context):
        if run_context.original_args().cur_step_num - 1 == self.step:
            self.gate.set_data(Tensor(np.full(1, -1.0, np.float32)))

    def on_train_step_end(self, run_context):
        if self.transient and run_context.original_args().cur_step_num - 1 == self.step:
            self.gate.set_data(Tensor(np.ones(1, np.float32)))  # before the watch's callback: gone for a rerun
        outputs = run_context.original_args().net_outputs
        loss = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        self.losses.append(float(loss.asnumpy()))


def dataset(spike_step):
    def gen():
        rng = np.random.default_rng(0)
        for step in range(STEPS):
            x = rng.standard_normal((2, 4)).astype(np.float32)
            y = rng.standard_normal((2, 2)).astype(np.float32) * (30.0 if step == spike_step else 1.0)
            yield x, y
    return ds.GeneratorDataset(gen, ["x", "y"], shuffle=False)


def main():
    mode, scenario, dump_path, task = sys.argv[1:5]
    fault_step = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    from mf_celldump import CellDumpCallback

    net = Net()
    train = CpuLossScaleCell(WithLoss(net), nn.SGD(net.trainable_params(), 0.01),
                                             scale_sense=Tensor(1024.0, ms.float32))
    watch = {"stop": True} if scenario == "stop" else True
    keys = dict(dump_path=dump_path, task=task, steps="anomaly", watch=watch, layer_mapping=None)
    if mode == "graph":
        keys["backend"] = "host"
    cb = CellDumpCallback(**keys)
    faults = scenario in ("nan", "transient", "stop", "plain-transient", "sink")
    flip = GateFlip(net.faulty.gate, fault_step if faults else -1, scenario.endswith("transient"))
    data = dataset(fault_step if scenario == "spike" else -1)
    if scenario.startswith("plain"):
        cb.close()
        Model(train).train(1, data, callbacks=[flip], dataset_sink_mode=False)
        print("RESULT " + json.dumps({"losses": flip.losses}))
        return
    sink = scenario == "sink"
    Model(train).train(1, data, callbacks=[flip, cb], dataset_sink_mode=sink, sink_size=2 if sink else -1)
    s = cb.summary
    print("RESULT " + json.dumps({"processed": sorted(s.processed_steps), "captured": s.captured_steps,
                                  "problems": s.problems, "notes": s.notes, "losses": flip.losses}))


if __name__ == "__main__":
    main()
