"""The watch in a data-parallel msrun job, with a fault on one rank only.

    msrun --worker_num=2 ... tests/support/watch_ranks_train.py MODE DUMP_PATH FAULT_RANK FAULT_STEP [KEY=VALUE ...]

The network, its fault gate and the loss-scale wrapper that skips the update on overflow are those
of ``watch_train.py``, trained by ``Model.train`` in MindSpore's data-parallel mode (gradients
averaged by AllReduce, so a NaN gradient on one rank makes every rank's wrapper skip the update).
Each rank reads different data. On FAULT_RANK only, the gate turns the faulty cell's output NaN
from FAULT_STEP on: only that rank's loss is NaN. ``KEY=VALUE`` arguments (YAML values) go to
``CellDumpCallback`` over the defaults ``steps: anomaly``, ``watch: true``, except ``train=plain``:
``nn.TrainOneStepCell``, which applies every update (a NaN gradient reaches every rank's weights). Each rank prints
``RESULT {json}`` (its rank, summary, losses) and the summary text its log carries anyway.
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # this checkout's mf_celldump, whatever is installed

import mindspore as ms  # noqa: E402
import mindspore.dataset as ds  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402
from mindspore.communication import get_group_size, get_rank, init  # noqa: E402
from mindspore.train import Model  # noqa: E402
from watch_train import CpuLossScaleCell, GateFlip, Net, WithLoss  # noqa: E402  (this folder)

STEPS = 6


def dataset(rank: int):
    rng = np.random.default_rng(10 + rank)  # every rank sees different data
    x = rng.standard_normal((STEPS * 2, 4)).astype(np.float32)
    y = rng.standard_normal((STEPS * 2, 2)).astype(np.float32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(2)


def main():
    mode, dump_path, fault_rank, fault_step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)  # every replica starts from the same weights
    init()
    rank = get_rank()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                 device_num=get_group_size())
    from mf_celldump import CellDumpCallback

    keys = {"dump_path": dump_path, "steps": "anomaly", "watch": True, "layer_mapping": None}
    if mode == "graph":
        keys["backend"] = "host"
    for item in sys.argv[5:]:
        key, _, value = item.partition("=")
        keys[key] = yaml.safe_load(value)
    net = Net()
    if keys.pop("train", None) == "plain":
        train = nn.TrainOneStepCell(WithLoss(net), nn.SGD(net.trainable_params(), 0.01))
    else:
        train = CpuLossScaleCell(WithLoss(net), nn.SGD(net.trainable_params(), 0.01),
                                 scale_sense=Tensor(1024.0, ms.float32))
    flip = GateFlip(net.faulty.gate, fault_step if rank == fault_rank else -1, transient=False)
    cb = CellDumpCallback(**keys)
    Model(train).train(1, dataset(rank), callbacks=[flip, cb], dataset_sink_mode=False)
    s = cb.summary
    print("RESULT " + json.dumps({"rank": rank, "processed": sorted(s.processed_steps), "captured": s.captured_steps,
                                  "problems": s.problems, "notes": s.notes, "losses": flip.losses}), flush=True)
    print(f"rank {rank} finished training", flush=True)


if __name__ == "__main__":
    main()
