"""Scale of the rank check: time and peak memory of ``mf-celldump ranks`` against the number of ranks.

Synthetic statistics dumps (``ranks_synthetic.py``: 2 steps x about 1,000 entries per rank,
a weight perturbed, an activation scaled and a NaN on three ranks) for each rank count;
each measurement runs in a fresh interpreter and reports its own wall time and peak RSS
(``ru_maxrss``). Beside each check, in the same run: plain ``json.load`` of every
``dump.json`` (the least any reader of these files does) and the check of the same ranks
from per-node summary files (``--save-summaries``, made once per rank count).

    python bench/bench_ranks.py                          # 64, 256, 1024 ranks
    python bench/bench_ranks.py --ranks 16 64 --work /tmp/ranks-bench

Writes the table to stdout and ``bench/results/ranks-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ranks_synthetic import Fault, write_dump  # noqa: E402  (beside this file)

STEPS = (0, 1)

RUNNER = r"""
import json, os, resource, sys, time
mode, args = sys.argv[1], sys.argv[2:]
start = time.perf_counter()
if mode == "check":
    from mf_celldump.cli import main
    code = main(args)
elif mode == "json_load":
    code = 0
    for root, _, files in os.walk(args[0]):
        if "dump.json" in files:
            with open(os.path.join(root, "dump.json"), encoding="utf-8") as handle:
                json.load(handle)
seconds = time.perf_counter() - start
print("RESULT " + json.dumps({"seconds": seconds, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                              / 1024.0, "code": code}))
"""


def measure(mode: str, args) -> dict:
    proc = subprocess.run([sys.executable, "-c", RUNNER, mode, *args], capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{mode} {args}: no result\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def faults(ranks: int):
    return [Fault("weight", ranks // 3, 0, "model.layers.5.attention.wq"),
            Fault("scale", ranks // 2, 1, "model.layers.7.feed_forward.w2"),
            Fault("nan", ranks - 1, 1, "model.layers.9.attention.wk")]


def prepare(work: str, ranks: int, entries: int) -> str:
    root = os.path.join(work, f"dump-{ranks}")
    if not os.path.isfile(os.path.join(root, f"step{STEPS[-1]}", f"rank{ranks - 1}", "dump.json")):
        write_dump(root, ranks, STEPS, entries, faults(ranks))
    return root


def run_one(work: str, ranks: int, entries: int) -> dict:
    root = prepare(work, ranks, entries)
    out = os.path.join(work, f"out-{ranks}")
    row = {"ranks": ranks, "steps": len(STEPS), "entries": entries}
    row["json_load"] = measure("json_load", [root])
    row["check"] = measure("check", ["ranks", root, "-o", out, "--json"])
    half = ranks // 2
    nodes = [os.path.join(work, f"node{i}-{ranks}.jsonl.gz") for i in (0, 1)]
    for path, selection in zip(nodes, (f"0-{half - 1}", f"{half}-{ranks - 1}")):
        if not os.path.isfile(path):
            measure("check", ["ranks", root, "--ranks", selection, "--save-summaries", path, "--summaries-only"])
    row["check_from_summaries"] = measure("check", ["ranks", *nodes, "-o", out + "-merged", "--json"])
    row["summary_file_bytes"] = sum(os.path.getsize(p) for p in nodes)
    return row


def table(rows) -> str:
    lines = ["| ranks | check s | per rank-step | peak RSS MB | json.load s | x json.load | from summaries s | "
             "summaries peak MB | summary KB per rank-step |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        check, base, merged = row["check"], row["json_load"], row["check_from_summaries"]
        per = row["ranks"] * row["steps"]
        lines.append(f"| {row['ranks']} | {check['seconds']:.1f} | {check['seconds'] / per * 1000:.1f} ms | "
                     f"{check['peak_rss_mb']:.0f} | {base['seconds']:.1f} | {check['seconds'] / base['seconds']:.2f} | "
                     f"{merged['seconds']:.1f} | {merged['peak_rss_mb']:.0f} | "
                     f"{row['summary_file_bytes'] / per / 1024:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--work", default=None, help="where the synthetic dumps go (kept for re-runs)")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="bench-ranks-")
    rows = []
    for ranks in args.ranks:
        started = time.perf_counter()
        rows.append(run_one(work, ranks, args.entries))
        print(f"{ranks} ranks done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(table(rows))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    path = os.path.join(HERE, "results", f"ranks-{stamp}.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump({"rows": rows, "machine": platform.platform(), "cpus": os.cpu_count(), "work": work,
                   "load": os.getloadavg()}, handle, indent=1)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
