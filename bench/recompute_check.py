#!/usr/bin/env python
"""What a captured step records when the decoder layers are recomputed (MindFormers' full recompute).

MindFormers' ``recompute_config: {recompute: true}`` calls ``layer.recompute()`` on every decoder layer
(``LayerSetting.set_recompute``, ``mindformers/parallel_core/training_graph/transformer/utils.py``, 1.9).
This check runs the tiny LLaMA of ``bench_capture.py`` (statistics task, the default backend of each
mode: host in graph mode, device_stats in PyNative), once as built and once with every layer's
``recompute()`` called before attach, and compares what one selected step recorded: records per
direction and slot, the calls numbered per cell and direction, the capture ops run (host backend),
and the losses of the steps. Equal counts mean recompute neither repeats nor loses a capture.

Not a timing: one subprocess per (mode, recompute), the results in ``results/recompute-*.json``.

    python bench/recompute_check.py                  # graph and pynative
    python bench/recompute_check.py --modes graph
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_capture as bc  # noqa: E402  (the model and batches, beside this file)

SELECTED = 1  # steps 0 and 2 unselected


def _records(dump_path: str) -> dict:
    """Counts of the selected step's records: per direction and slot, and the calls seen per cell and direction."""
    folder = os.path.join(dump_path, "_raw", "rank0", f"step{SELECTED}")
    slots, calls = Counter(), {}
    for name in os.listdir(folder):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(folder, name)) as handle:
            for line in handle:
                record = json.loads(line)
                slots[f"{record['dir']}.{record['slot']}"] += 1
                calls.setdefault(f"{record['cell']}.{record['dir']}", set()).add(record.get("call"))
    per_cell = Counter(len(seen) for seen in calls.values())
    return {"records": dict(sorted(slots.items())), "cells_by_calls_seen": dict(sorted(per_cell.items())),
            "calls": {key: sorted(c for c in seen if c is not None) for key, seen in sorted(calls.items())}}


def worker(mode: str, recompute: bool, result_path: str) -> None:
    net, train = bc._build(0, graph=mode == "graph")
    if recompute:
        for layer in net.model.layers:
            layer.recompute()
    dump_path = os.path.join(os.getcwd(), "dump")
    capture = bc._MfCapture(train, dump_path, "statistics", "host" if mode == "graph" else None, steps=[SELECTED])
    batches = bc._batches(3, 0)
    losses, ops_run = [], []
    for step in range(3):
        before = getattr(capture.dump.backend, "ops_run", None)
        capture.begin(step)
        losses.append(float(train(batches[step]).asnumpy()))
        bc._sync()
        capture.end()
        after = getattr(capture.dump.backend, "ops_run", None)
        ops_run.append(None if before is None else after - before)
    capture.close()
    result = {"mode": mode, "recompute": recompute, "backend": capture.backend, "losses": losses,
              "ops_run_per_step": ops_run, **_records(dump_path)}
    with open(result_path, "w") as handle:
        json.dump(result, handle)


def _run(mode: str, recompute: bool) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"recompute-{mode}-")
    out = os.path.join(workdir, "result.json")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), GLOG_v="3")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode] + (["--recompute"] if recompute else [])
    print(f"[recompute] {mode} recompute={recompute} ...", flush=True)
    proc = subprocess.run(cmd + ["--result", out], cwd=workdir, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.exists(out):
        result = {"mode": mode, "recompute": recompute, "error": f"exit {proc.returncode}",
                  "log_tail": (proc.stdout + proc.stderr)[-3000:]}
    else:
        with open(out) as handle:
            result = json.load(handle)
    shutil.rmtree(workdir, ignore_errors=True)
    return result


def _summary(results) -> str:
    lines = ["| mode | recompute | backend | records (dir.slot: count) | cells by calls seen | capture ops run "
             "per step | losses |", "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r['recompute']} | FAILED {r['error']} | | | | |")
            continue
        records = ", ".join(f"{k}: {v}" for k, v in r["records"].items())
        losses = ", ".join(f"{v:.6f}" for v in r["losses"])
        lines.append(f"| {r['mode']} | {r['recompute']} | {r['backend']} | {records} | {r['cells_by_calls_seen']} "
                     f"| {r['ops_run_per_step']} | {losses} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", nargs="+", choices=("graph", "pynative"), default=["graph", "pynative"])
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", choices=("graph", "pynative"), help=argparse.SUPPRESS)
    parser.add_argument("--recompute", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.recompute, args.result)
        return 0
    results = [_run(mode, recompute) for mode in args.modes for recompute in (False, True)]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    text = _summary(results)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"recompute-{stamp}.json"), "w") as handle:
        json.dump({"date": stamp, "results": results}, handle, indent=1)
    with open(os.path.join(args.out, f"recompute-{stamp}.txt"), "w") as handle:
        handle.write(text + "\n")
    print(text)
    for r in results:
        if "error" in r:
            print(f"{r['mode']} recompute={r['recompute']}: {r['log_tail']}")
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
