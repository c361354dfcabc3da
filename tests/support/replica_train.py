"""A data-parallel training job under msrun, with faults injected on one rank by its arguments.

    msrun ... tests/support/replica_train.py --mode graph --steps 4 --dump-path DIR \
        --dump task=tensor --fault scale:rank=1:step=1:cell=layers.1:factor=1000 \
        --fault weight:rank=1:step=2:cell=layers.0.up --fault nan:rank=1:step=3:cell=layers.2 \
        --die rank=3:step=3

A small residual MLP (``embed``, three ``layers.N`` blocks, ``head``) trained with
``Model.train`` in MindSpore's data-parallel mode (gradients averaged by AllReduce); every
rank reads different data. ``CellDumpCallback`` captures it. Faults:

* ``weight``: at the start of the step, after the previous step's reduced update, the
  cell's weight is changed on that rank only (every later step keeps the change);
* ``scale`` / ``nan``: the block's output is multiplied by ``factor`` / NaN on that rank,
  in that step only, through the block's ``fault`` gate (a cell the dump excludes);
* ``--die``: the rank kills itself (SIGKILL) when that step ends, before the dump's own
  step-end callback runs: it never reaches the end of training.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np
import yaml

HIDDEN = 16
FEATURES = 8
BATCH = 4


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dump-path", required=True)
    parser.add_argument("--dump", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--fault", action="append", default=[], metavar="KIND:rank=R:step=S[:cell=C][:factor=F]")
    parser.add_argument("--die", default=None, metavar="rank=R:step=S")
    parser.add_argument("--die-delay", type=float, default=3.0,
                        help="seconds the dying rank waits first (its earlier steps reach the others)")
    return parser.parse_args(argv)


def parse_fault(text: str) -> dict:
    kind, *items = text.split(":")
    fault = {"kind": kind, "factor": 100.0}
    for item in items:
        key, _, value = item.partition("=")
        fault[key] = value if key == "cell" else (float(value) if key == "factor" else int(value))
    return fault


def build_network():
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn

    def dense(fan_in, fan_out, rng):
        """Weights and biases from a fixed seed: every replica starts equal (MindSpore's default bias
        initialiser is random, and data parallelism does not broadcast parameters)."""
        return nn.Dense(fan_in, fan_out, weight_init=Tensor(rng.normal(0, 0.3, (fan_out, fan_in)), ms.float32),
                        bias_init=Tensor(rng.normal(0, 0.1, (fan_out,)), ms.float32))

    class FaultGate(nn.Cell):
        """Multiplies by a non-trainable scalar: 1 except where a fault is injected."""

        def __init__(self):
            super().__init__()
            self.factor = Parameter(Tensor(1.0, ms.float32), name="factor", requires_grad=False)

        def construct(self, x):
            return x * self.factor

    class Block(nn.Cell):
        def __init__(self, seed: int):
            super().__init__()
            rng = np.random.default_rng(seed)
            self.norm = nn.LayerNorm((HIDDEN,))
            self.up = dense(HIDDEN, 2 * HIDDEN, rng)
            self.act = nn.GELU()
            self.down = dense(2 * HIDDEN, HIDDEN, rng)
            self.fault = FaultGate()

        def construct(self, x):
            return x + self.fault(self.down(self.act(self.up(self.norm(x)))))

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            rng = np.random.default_rng(0)
            self.embed = dense(FEATURES, HIDDEN, rng)
            self.layers = nn.CellList([Block(seed) for seed in range(1, 4)])
            self.head = dense(HIDDEN, 1, rng)

        def construct(self, x):
            h = self.embed(x)
            for layer in self.layers:
                h = layer(h)
            return self.head(h)

    return Net()


def dataset(rank: int, steps: int):
    import mindspore.dataset as ds

    rng = np.random.default_rng(100 + rank)  # every replica sees different data
    x = rng.normal(size=(steps * BATCH, FEATURES)).astype(np.float32)
    y = rng.normal(size=(steps * BATCH, 1)).astype(np.float32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)


def find_cell(net, name: str):
    for cell_name, cell in net.cells_and_names():
        if cell_name == name:
            return cell
    raise SystemExit(f"no cell named {name!r}")


def fault_callback(net, rank: int, faults, die):
    """Faults are written with ``ops.assign`` (in place): in PyNative mode, ``Parameter.set_data`` after a
    training step detaches the parameter from the optimizer (later updates no longer reach what the
    forward reads), which would freeze the weight instead of perturbing it once."""
    import mindspore as ms
    from mindspore import Tensor, ops
    from mindspore.train import Callback

    mine = [f for f in faults if f["rank"] == rank]

    class Faults(Callback):
        def on_train_step_begin(self, run_context):
            step = run_context.original_args().cur_step_num - 1
            for fault in (f for f in mine if f["step"] == step):
                cell = find_cell(net, fault["cell"])
                if fault["kind"] == "weight":
                    value = cell.weight.asnumpy().copy()
                    value[0, 0] += 0.01
                    ops.assign(cell.weight, Tensor(value, ms.float32))
                else:
                    factor = float("nan") if fault["kind"] == "nan" else fault["factor"]
                    ops.assign(cell.fault.factor, Tensor(factor, ms.float32))
                print(f"fault injected: {fault} at step {step}", flush=True)

        def on_train_step_end(self, run_context):
            step = run_context.original_args().cur_step_num - 1
            for fault in (f for f in mine if f["step"] == step and f["kind"] in ("scale", "nan")):
                ops.assign(find_cell(net, fault["cell"]).fault.factor, Tensor(1.0, ms.float32))
            if die and die["rank"] == rank and die["step"] == step:
                print(f"rank {rank} dies at the end of step {step}", flush=True)
                time.sleep(die["delay"])
                os.kill(os.getpid(), signal.SIGKILL)

    return Faults()


def main(argv=None) -> int:
    args = parse_args(argv)
    import mindspore as ms
    from mindspore import nn
    from mindspore.communication import get_group_size, get_rank, init
    from mindspore.train import Model

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    init()
    rank, world = get_rank(), get_group_size()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                 device_num=world)
    from mf_celldump import CellDumpCallback

    keys = {"dump_path": args.dump_path, "exclude": ["*.fault"]}
    for item in args.dump:
        key, _, value = item.partition("=")
        keys[key] = yaml.safe_load(value)
    net = build_network()
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    train = nn.TrainOneStepCell(loss_net, nn.SGD(net.trainable_params(), learning_rate=0.01))
    model = Model(train)
    faults = [parse_fault(f) for f in args.fault]
    die = None
    if args.die:
        die = {k: int(v) for k, v in (item.split("=") for item in args.die.split(":"))}
        die["delay"] = args.die_delay
    callbacks = [fault_callback(net, rank, faults, die), CellDumpCallback(**keys)]
    model.train(1, dataset(rank, args.steps), callbacks=callbacks, dataset_sink_mode=False)
    print(f"rank {rank} finished training", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
