"""A network whose cells are called with and without their defaulted arguments, dumped by
us (PyNative or graph mode) or by msprobe 26.2's own PyNative L0 dumper, one step.

``Scale`` has int, float and bool defaults, a ``None`` default and a keyword-only float;
``Net`` calls one ``Scale`` leaving everything at its default, then with some, then all
passed, so what each call records depends on what its caller passed.

Run as a script, one dump per process (msprobe's debugger is a process-wide singleton):
``python tests/support/defaults_net.py OUT --tool ours|msprobe [--mode graph] [--task statistics]``.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def build():
    import mindspore as ms
    from mindspore import Tensor, nn

    class Scale(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(4, 4, weight_init=Tensor(np.eye(4, dtype=np.float32) * 0.9))

        def construct(self, x, times=2, factor=0.5, flag=True, mask=None, *, shift=0.0):
            y = self.dense(x)
            for _ in range(times):
                y = y * factor
            if flag:
                y = y + 1.0
            if mask is not None:
                y = y * mask
            return y + shift

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.scale = Scale()
            self.other = Scale()
            self.head = nn.Dense(4, 1)

        def construct(self, x, mask):
            h = self.scale(x)  # every default
            h = self.other(h, 3, 0.25, False, mask, shift=0.125)  # everything passed
            h = self.scale(h, 1, shift=2.0)  # some
            return self.head(h).mean()

    ms.set_seed(3)
    net = Net()
    train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=0.0))
    train.set_train(True)
    return net, train


def batch():
    import mindspore as ms

    rng = np.random.default_rng(5)
    return (ms.Tensor(rng.normal(size=(2, 4)).astype(np.float32)),
            ms.Tensor((rng.random((2, 4)) > 0.3).astype(np.float32)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--tool", choices=("ours", "msprobe"), default="ours")
    parser.add_argument("--mode", choices=("pynative", "graph"), default="pynative")
    parser.add_argument("--task", choices=("tensor", "statistics"), default="tensor")
    args = parser.parse_args(argv)
    import mindspore as ms
    from mindspore.common.api import _pynative_executor

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    net, train = build()
    x, mask = batch()
    if args.tool == "msprobe":
        from tests.support import msprobe_dumpers

        msprobe_dumpers.dump_mindspore_step(net, lambda: float(train(x, mask).asnumpy()), args.out, args.task)
        return 0
    import mf_celldump

    dump = mf_celldump.attach(train, {"dump_path": args.out, "task": args.task, "steps": "0",
                                      "layer_mapping": "none", "process_on_train_end": False})
    dump.begin_step(0)
    float(train(x, mask).asnumpy())
    _pynative_executor.sync()
    dump.end_step()
    dump.detach()
    report = mf_celldump.process_captured(dump)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.exit(main())
