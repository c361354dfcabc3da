#!/usr/bin/env python
"""What an unselected step costs: the attached network against the plain one, with the build order crossed.

A user attaches capture for a long run and selects a few steps; every other step should cost what
the network without capture costs. ``bench_capture.py`` measures this in its rounds, beside selected
steps. This script measures only it, on the same LLaMA as ``bench_capture.py`` (CPU):

* each configuration runs in two processes. Both build a plain network and an attached one from the
  same seed, compile and warm both up, then time ``--pairs`` adjacent pairs of steps (the plain
  network and the attached network on a step that is not selected, far from any selected one) in
  ABBA order. One process builds (and compiles) the plain network first, the other the attached one.
* Why the crossing: in one process, the network built and compiled first runs faster. Two networks
  without capture, built one after the other, differ by 4-6% in graph mode (tiny LLaMA, 200 rounds:
  ``results/unselected-parts-20261207-015138-tiny-statistics.json``, arm ``plain_again``), as much as
  the attached network differed from the plain one when the plain one was always built first. The
  executed graphs are the same kernel for kernel (MindSpore's saved IR and actor set, compared).
* Each build order gives the median of its pairs' ratios (attached / plain); the configuration's ratio
  is the geometric mean of the two, so the build order's effect, which enters one order as a factor
  and the other as its inverse, cancels. The 95% interval is bootstrapped within each order.
  ``--pool`` combines the result files of several runs the same way (the pairs of all processes of
  one order together).

Configurations: ``graph_tensor``, ``graph_statistics`` (reduced on the host, the CPU default) and
``graph_statistics_in_graph`` (reduced in the graph, the default on a device), all with the host
backend; ``pynative_tensor`` and ``pynative_statistics`` (backend ``auto``).

    python bench/unselected_cost.py                               # tiny, every configuration
    python bench/unselected_cost.py --size large --only graph_tensor graph_statistics --pairs 60

Writes ``results/unselected-DATE[-large].json`` and ``.md`` (the table).
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
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CONFIGS = ("graph_tensor", "graph_statistics", "graph_statistics_in_graph", "pynative_tensor", "pynative_statistics")
ORDERS = ("plain_first", "attached_first")
FAR = 10**6  # step numbers of the measured steps: far past the one selected step (0), which never runs


def _worker(config: str, order: str, size: str, pairs: int, warmup: int) -> dict:
    sys.path.insert(0, HERE)
    import bench_capture

    bench_capture._use_size(size)
    graph = config.startswith("graph")
    task = "tensor" if config.endswith("tensor") else "statistics"
    import mf_celldump

    if graph and task == "statistics":
        from mf_celldump.capture.backends.host import HostBackend

        HostBackend.reduce_in_graph = config == "graph_statistics_in_graph"
    batches = bench_capture._batches(8, 0)
    names = ("plain", "attached") if order == "plain_first" else ("attached", "plain")
    nets, dump = {}, None
    for name in names:
        nets[name] = bench_capture._build(0, graph=graph)[1]
        if name == "attached":
            config_dict = {"dump_path": os.path.abspath("dump"), "task": task, "steps": "0"}
            if graph:
                config_dict["backend"] = "host"
            dump = mf_celldump.attach(nets[name], config_dict)

    def step(name: str, number: int) -> float:
        t0 = time.perf_counter()
        if name == "attached":
            dump.begin_step(number)
        nets[name](batches[number % len(batches)]).asnumpy()
        bench_capture._sync()
        if name == "attached":
            dump.end_step()
        return (time.perf_counter() - t0) * 1e3

    first_steps_s = {}
    for name in names:  # compile and warm up, in build order
        t0 = time.perf_counter()
        for i in range(warmup):
            step(name, FAR + i)
        first_steps_s[name] = time.perf_counter() - t0
    times = {"plain": [], "attached": []}
    loadavg_start = os.getloadavg()
    for i in range(pairs):
        order_now = ("plain", "attached") if i % 2 == 0 else ("attached", "plain")
        for name in order_now:
            times[name].append(step(name, FAR + warmup + i))
    dump.detach()
    return {"config": config, "order": order, "size": size, "pairs": pairs, "times_ms": times,
            "backend": dump.backend.name, "first_steps_s": first_steps_s,
            "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg()}


def _run(config: str, order: str, args) -> dict:
    work = tempfile.mkdtemp(prefix=f"unselected-{config}-")
    out = os.path.join(work, "result.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", config, "--order", order, "--size", args.size,
           "--pairs", str(args.pairs or _default_pairs(config, args.size)), "--result", out]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("GLOG_v", "3")
    with open(os.path.join(work, "worker.log"), "w") as log:
        proc = subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not os.path.exists(out):
        with open(os.path.join(work, "worker.log")) as log:
            tail = log.read()[-2000:]
        shutil.rmtree(work, ignore_errors=True)
        return {"config": config, "order": order, "error": f"exit {proc.returncode}", "log_tail": tail}
    with open(out) as handle:
        result = json.load(handle)
    shutil.rmtree(work, ignore_errors=True)
    return result


def _default_pairs(config: str, size: str) -> int:
    if config.startswith("graph"):
        return 200 if size == "tiny" else 60
    return 60 if size == "tiny" else 30


def _combined(runs) -> dict:
    """The geometric mean, over the two build orders, of the median pair ratio of each order (the pairs of
    every process of that order together), with a bootstrap interval resampling within each order."""
    by_order = {}
    for run in runs:
        ratios = np.asarray(run["times_ms"]["attached"]) / np.asarray(run["times_ms"]["plain"])
        by_order.setdefault(run["order"], []).append(ratios)
    groups = {order: np.concatenate(parts) for order, parts in by_order.items()}
    rng = np.random.default_rng(0)
    boot = np.ones(2000)
    for values in groups.values():
        boot *= np.median(values[rng.integers(0, len(values), (2000, len(values)))], axis=1)
    boot **= 1.0 / len(groups)
    per_order = {order: float(np.median(values)) for order, values in groups.items()}
    low, high = np.percentile(boot, [2.5, 97.5])
    return {"unselected_ratio": float(np.prod(list(per_order.values())) ** (1.0 / len(per_order))),
            "unselected_ratio_95ci": (float(low), float(high)), "per_order": per_order,
            "plain_median_ms": float(np.median(np.concatenate([r["times_ms"]["plain"] for r in runs]))),
            "unselected_median_ms": float(np.median(np.concatenate([r["times_ms"]["attached"] for r in runs]))),
            "pairs": int(sum(len(v) for v in groups.values()))}


def _row(config: str, runs) -> dict:
    """A configuration's table row from its processes: the combined ratio and the load they ran under."""
    loads = [r["loadavg_start"][0] for r in runs] + [r["loadavg_end"][0] for r in runs]
    return {"config": config, "backend": runs[0]["backend"], **_combined(runs),
            "load": f"{min(loads):.1f}-{max(loads):.1f}"}


def _table(rows) -> str:
    lines = ["| configuration | backend | pairs | plain ms | unselected ms | unselected / plain (95%) "
             "| plain built first | attached built first | load avg |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['config']} | FAILED: {row['error']} | | | | | | | |")
            continue
        low, high = row["unselected_ratio_95ci"]
        lines.append(
            f"| {row['config']} | {row['backend']} | {row['pairs']} | {row['plain_median_ms']:.1f} "
            f"| {row['unselected_median_ms']:.1f} | **{row['unselected_ratio']:.3f}** ({low:.3f}-{high:.3f}) "
            f"| {row['per_order']['plain_first']:.3f} | {row['per_order']['attached_first']:.3f} "
            f"| {row['load']} |")
    return "\n".join(lines)


def driver(args) -> int:
    started = datetime.datetime.now()
    rows = []
    for config in args.only or CONFIGS:
        runs = []
        for order in ORDERS:
            print(f"[unselected] {config} ({args.size}, {order}) ...", flush=True)
            runs.append(_run(config, order, args))
        failed = [r for r in runs if "error" in r]
        if failed:
            print(failed[0]["log_tail"], flush=True)
            rows.append({"config": config, "error": failed[0]["error"], "runs": runs})
            continue
        row = dict(_row(config, runs), runs=runs)
        rows.append(row)
        print(_table([row]).splitlines()[-1], flush=True)
    stamp = started.strftime("%Y%m%d-%H%M%S") + ("" if args.size == "tiny" else f"-{args.size}")
    os.makedirs(args.out, exist_ok=True)
    meta = {"date": started.isoformat(timespec="seconds"), "command": " ".join([sys.executable] + sys.argv),
            "cpus": os.cpu_count(), "size": args.size, "wall_s": (datetime.datetime.now() - started).total_seconds()}
    with open(os.path.join(args.out, f"unselected-{stamp}.json"), "w") as handle:
        json.dump({"meta": meta, "rows": rows}, handle, indent=1)
    text = f"{meta}\n\n{_table(rows)}\n"
    with open(os.path.join(args.out, f"unselected-{stamp}.md"), "w") as handle:
        handle.write(text)
    print(text)
    return 0 if all("error" not in r for r in rows) else 1


def pool(paths, out: str) -> int:
    """Combine the runs of several result files, configuration by configuration (each file holds one
    process of each build order per configuration, so the orders stay balanced)."""
    runs, size = {}, None
    for path in paths:
        with open(path) as handle:
            data = json.load(handle)
        size = size or data["meta"]["size"]
        if data["meta"]["size"] != size:
            raise SystemExit(f"{path}: size {data['meta']['size']}, the others {size}: pool one size at a time")
        for row in data["rows"]:
            if "error" not in row:
                runs.setdefault(row["config"], []).extend(row["runs"])
    rows = [dict(_row(config, config_runs), processes=len(config_runs)) for config, config_runs in runs.items()]
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + ("" if size == "tiny" else f"-{size}")
    counts = ", ".join(f"{row['config']} {row['processes']}" for row in rows)
    text = (f"pooled from {', '.join(os.path.basename(p) for p in paths)}; "
            f"processes per configuration: {counts}\n\n{_table(rows)}\n")
    with open(os.path.join(out, f"unselected-pooled-{stamp}.md"), "w") as handle:
        handle.write(text)
    print(text)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("tiny", "large"), default="tiny")
    parser.add_argument("--only", nargs="+", choices=CONFIGS)
    parser.add_argument("--pairs", type=int, help="pairs per process (default: 200/60 graph, 60/30 PyNative)")
    parser.add_argument("--warmup", type=int, default=3, help="steps of each network before the pairs")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--pool", nargs="+", metavar="RESULT_JSON",
                        help="combine the runs of these result files (one size) instead of measuring")
    parser.add_argument("--worker", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--order", choices=ORDERS, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = _worker(args.worker, args.order, args.size, args.pairs, args.warmup)
        with open(args.result, "w") as handle:
            json.dump(result, handle)
        return 0
    if args.pool:
        return pool(args.pool, args.out)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
