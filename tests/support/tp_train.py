"""Tensor parallelism written by hand (as Megatron does it), trained on 1 rank or under msrun on T ranks.

    python tests/support/tp_train.py --dump-path DIR                       # one rank, the whole model
    msrun --worker_num=2 ... tests/support/tp_train.py --tp 2 --dump-path DIR \
        --fault rank=1:step=1:cell=mlp.up

An attention block (q, k, v column-parallel, heads split over the ranks; a core that works
on the local heads; an output projection row-parallel whose partial sums its parent
reduces) and an MLP (column-parallel up, row-parallel down that reduces inside), then a
replicated head. Weights come from one seed for the whole model; each rank slices its
part, so T ranks compute what one rank computes. Megatron's two conjugate operators keep
the gradients right: ``copy_to_tp`` (identity forward, AllReduce backward) before a
column-parallel matmul, ``reduce_from_tp`` (AllReduce forward, identity backward) after a
row-parallel one. Every rank sees the same data.

A fault multiplies the first row of a cell's weight by 1.05 on one rank during one step
(restored when it ends). ``--lr`` sets the optimizer's learning rate; ``--other-batch K``
draws the batch of step K from another seed (another batch, as a reshuffle gives).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import yaml

HIDDEN = 16
HEADS = 4
BATCH, SEQ = 2, 4


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dump-path", required=True)
    parser.add_argument("--dump", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--fault", action="append", default=[], metavar="rank=R:step=S:cell=C")
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--other-batch", type=int, default=None, metavar="STEP")
    return parser.parse_args(argv)


def full_weights():
    rng = np.random.default_rng(7)

    def w(out, inp):
        return rng.normal(0, 0.3, (out, inp)).astype(np.float32), rng.normal(0, 0.1, (out,)).astype(np.float32)

    return {"q": w(HIDDEN, HIDDEN), "k": w(HIDDEN, HIDDEN), "v": w(HIDDEN, HIDDEN), "proj": w(HIDDEN, HIDDEN),
            "up": w(4 * HIDDEN, HIDDEN), "down": w(HIDDEN, 4 * HIDDEN), "head": w(1, HIDDEN)}


class Shard:
    """Which part of the whole model this process holds, and the AllReduce across the group."""

    def __init__(self, rank: int, tp: int):
        from mindspore import ops

        self.rank, self.tp = rank, tp
        self.weights = full_weights()
        self.all_reduce = ops.AllReduce() if tp > 1 else None

    def rows(self, array):
        part = array.shape[0] // self.tp
        return np.ascontiguousarray(array[self.rank * part:(self.rank + 1) * part])

    def columns(self, array):
        part = array.shape[1] // self.tp
        return np.ascontiguousarray(array[:, self.rank * part:(self.rank + 1) * part])


def _cells():
    """The network's cell classes (MindSpore is imported here, in the process that trains)."""
    from mindspore import Parameter, Tensor, nn, ops

    class CopyToTP(nn.Cell):
        def __init__(self, shard):
            super().__init__()
            self.all_reduce = shard.all_reduce

        def construct(self, x):
            return x

        def bprop(self, x, out, dout):
            return (self.all_reduce(dout) if self.all_reduce is not None else dout,)

    class ReduceFromTP(nn.Cell):
        def __init__(self, shard):
            super().__init__()
            self.all_reduce = shard.all_reduce

        def construct(self, x):
            return self.all_reduce(x) if self.all_reduce is not None else x

        def bprop(self, x, out, dout):
            return (dout,)

    class ColumnParallelLinear(nn.Cell):
        """Weight rows (output features) split over the ranks; the input is the same on every rank."""

        def __init__(self, shard, key):
            super().__init__()
            weight, bias = shard.weights[key]
            self.weight = Parameter(Tensor(shard.rows(weight)), name="weight")
            self.bias = Parameter(Tensor(shard.rows(bias)), name="bias")
            self.copy_to_tp = CopyToTP(shard)

        def construct(self, x):
            return ops.matmul(self.copy_to_tp(x), self.weight.T) + self.bias

    class RowParallelLinear(nn.Cell):
        """Weight columns (input features) split; the output is a partial sum unless ``reduce``."""

        def __init__(self, shard, key, reduce: bool):
            super().__init__()
            weight, bias = shard.weights[key]
            self.weight = Parameter(Tensor(shard.columns(weight)), name="weight")
            self.reduce = reduce
            if reduce:
                self.bias = Parameter(Tensor(bias), name="bias")
                self.reduce_from_tp = ReduceFromTP(shard)

        def construct(self, x):
            y = ops.matmul(x, self.weight.T)
            if self.reduce:
                y = self.reduce_from_tp(y) + self.bias
            return y

    return CopyToTP, ReduceFromTP, ColumnParallelLinear, RowParallelLinear


def build(rank: int, tp: int):
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops

    shard = Shard(rank, tp)
    _, ReduceFromTP, ColumnParallelLinear, RowParallelLinear = _cells()

    class CoreAttention(nn.Cell):
        """Softmax attention over this rank's heads: inputs and output split on the last axis."""

        def construct(self, q, k, v):
            heads, size = HEADS // tp, HIDDEN // HEADS
            q, k, v = (t.reshape(BATCH, SEQ, heads, size).transpose(0, 2, 1, 3) for t in (q, k, v))
            scores = ops.softmax(ops.matmul(q, k.transpose(0, 1, 3, 2)) / float(np.sqrt(size)), axis=-1)
            return ops.matmul(scores, v).transpose(0, 2, 1, 3).reshape(BATCH, SEQ, heads * size)

    class ParallelAttention(nn.Cell):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (ColumnParallelLinear(shard, key) for key in ("q", "k", "v"))
            self.core = CoreAttention()
            self.proj = RowParallelLinear(shard, "proj", reduce=False)
            self.proj_bias = Parameter(Tensor(shard.weights["proj"][1]), name="proj_bias")
            self.reduce_from_tp = ReduceFromTP(shard)

        def construct(self, x):
            context = self.core(self.q(x), self.k(x), self.v(x))
            return self.reduce_from_tp(self.proj(context)) + self.proj_bias

    class ParallelMLP(nn.Cell):
        def __init__(self):
            super().__init__()
            self.up = ColumnParallelLinear(shard, "up")
            self.act = nn.GELU()
            self.down = RowParallelLinear(shard, "down", reduce=True)

        def construct(self, x):
            return self.down(self.act(self.up(x)))

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.attention = ParallelAttention()
            self.mlp = ParallelMLP()
            weight, bias = shard.weights["head"]
            self.head = nn.Dense(HIDDEN, 1, weight_init=Tensor(weight), bias_init=Tensor(bias))

        def construct(self, x):
            h = x + self.attention(x)
            h = h + self.mlp(h)
            return self.head(h)

    ms.set_seed(0)
    return Net()


def dataset(steps: int, other_batch=None):
    import mindspore.dataset as ds

    rng = np.random.default_rng(11)  # the same data on every rank
    x = rng.normal(size=(steps * BATCH, SEQ, HIDDEN)).astype(np.float32)
    y = rng.normal(size=(steps * BATCH, SEQ, 1)).astype(np.float32)
    if other_batch is not None:
        other = np.random.default_rng(12)
        x[other_batch * BATCH:(other_batch + 1) * BATCH] = other.normal(size=(BATCH, SEQ, HIDDEN))
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)


def fault_callback(net, rank: int, faults):
    import mindspore as ms
    from mindspore import Tensor, ops
    from mindspore.train import Callback

    cells = dict(net.cells_and_names())
    mine = [f for f in faults if f["rank"] == rank]

    class Faults(Callback):
        saved = {}

        def on_train_step_begin(self, run_context):
            step = run_context.original_args().cur_step_num - 1
            for fault in (f for f in mine if f["step"] == step):
                weight = cells[fault["cell"]].weight
                value = weight.asnumpy().copy()
                self.saved[fault["cell"]] = value.copy()
                value[0] *= 1.05
                ops.assign(weight, Tensor(value, ms.float32))  # in place: see replica_train.py
                print(f"fault injected: {fault}", flush=True)

        def on_train_step_end(self, run_context):
            for name, value in self.saved.items():
                ops.assign(cells[name].weight, Tensor(value, ms.float32))
            self.saved.clear()

    return Faults()


def main(argv=None) -> int:
    args = parse_args(argv)
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    rank = 0
    if args.tp > 1:
        from mindspore.communication import get_group_size, get_rank, init

        init()
        rank = get_rank()
        assert get_group_size() == args.tp, "one rank per tensor-parallel part"
    from mf_celldump import CellDumpCallback

    keys = {"dump_path": args.dump_path, "exclude": ["*.copy_to_tp", "*.reduce_from_tp"]}
    for item in args.dump:
        key, _, value = item.partition("=")
        keys[key] = yaml.safe_load(value)
    net = build(rank, args.tp)
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), args.lr))
    faults = [{k: (v if k == "cell" else int(v)) for k, v in (i.split("=") for i in f.split(":"))} for f in args.fault]
    callbacks = [fault_callback(net, rank, faults), CellDumpCallback(**keys)]
    Model(train).train(1, dataset(args.steps, args.other_batch), callbacks=callbacks,
                       dataset_sink_mode=False)
    print(f"rank {rank} finished training", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
