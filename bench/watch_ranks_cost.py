"""What the watch across ranks adds to a step: one AllGather of a 4-float32 row per rank, on loopback.

    msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port=PORT \
        --log_dir=LOGS --join=True bench/watch_ranks_cost.py --mode graph --steps 2000 --out RESULT.json

Each rank times, after ``--warmup`` calls, ``--steps`` calls of:

* ``gather``: ``watch_ranks.RankTable.gather`` of one row (what every step end adds);
* ``after_step``: ``StepWatch.after_step`` of a step without a firing, its rules plus that gather
  (what the watch costs per step in a distributed run, signals already read);
* ``local_after_step``: the same without the gather (a single-rank run), for the difference;
* ``local_op_sync``: one local ``ops.Add`` of the same row and its ``asnumpy``: what any op followed by a
  host read costs in this mode, collective or not (PyNative: the wait for its asynchronous pipeline).

``mindspore.mint.distributed.all_gather_into_tensor`` is not measured: on CPU (MindSpore 2.9) it
raises "The kernel DistCommAllGatherIntoTensor unregistered"; the ``ops.AllGather`` primitive runs.

Rank 0 writes median, p95 and max (µs) of each rank to ``--out`` (JSON) and prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _timed(call, steps: int, warmup: int) -> list:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    return times


def _stats(times: list) -> dict:
    ordered = sorted(times)
    return {"median_us": round(statistics.median(ordered), 1),
            "p95_us": round(ordered[int(0.95 * (len(ordered) - 1))], 1), "max_us": round(ordered[-1], 1)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import mindspore as ms
    from mindspore.communication import get_group_size, get_rank, init

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    init()
    rank, world = get_rank(), get_group_size()
    from mf_celldump.config import DumpConfig
    from mf_celldump.integrations.watch_ranks import RankTable
    from mf_celldump.integrations.watching import StepWatch
    from mf_celldump.watch import StepSignals

    table = RankTable(rank, world)
    watched = StepWatch(DumpConfig.from_dict({"steps": "anomaly", "watch": True}))
    watched.share_across(table)
    signals = StepSignals(loss=1.0, grad_norm=1.0, overflow=False, loss_scale=1.0)
    steps = iter(range(10**9))
    from mindspore import Tensor, ops

    add, zeros = ops.Add(), Tensor([0.0, 0.0, 0.0, 0.0], ms.float32)
    local = StepWatch(DumpConfig.from_dict({"steps": "anomaly", "watch": True}))
    results = {
        "gather": _timed(lambda: table.gather([0.0, 0.0, 0.0, 0.0]), args.steps, args.warmup),
        "after_step": _timed(lambda: watched.after_step(None, next(steps), signals), args.steps, args.warmup),
        "local_after_step": _timed(lambda: local.after_step(None, next(steps), signals), args.steps, args.warmup),
        "local_op_sync": _timed(lambda: add(zeros, zeros).asnumpy(), args.steps, args.warmup),
    }
    mine = {name: _stats(times) for name, times in results.items()}
    gathered = table.gather([mine[n][k] for n in results for k in ("median_us", "p95_us", "max_us")] + [0.0])
    if rank == 0:
        report = {"mode": args.mode, "world": world, "steps": args.steps, "warmup": args.warmup,
                  "load_average": os.getloadavg(), "mindspore": ms.__version__, "ranks": []}
        for r in range(world):
            values = iter(gathered[r])
            report["ranks"].append({n: {k: round(float(next(values)), 1) for k in ("median_us", "p95_us", "max_us")}
                                    for n in results})
        text = json.dumps(report, indent=1)
        print(text, flush=True)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
