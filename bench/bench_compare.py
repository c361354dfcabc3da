"""Benchmark of ``mf-celldump compare`` beside ``msprobe compare`` on the same pair of dumps.

A pair of LLaMA-shaped tensor dumps in msprobe's layout (``step0/rank/dump.json`` one entry
per line, ``construct.json``, ``stack.json``, ``dump_tensor_data/*.npy`` of 64x64 float32)
is written for each size (number of tensor files per dump); the target differs from the
baseline by a small perturbation from the middle layer on. Each command runs in its own
process, ``--repeat`` times interleaved (the run of median wall time kept; the machine may be
shared); peak RSS is given twice: the largest single process (the command or one of its worker
processes, from getrusage) and the largest sum over the whole process tree (sampled from /proc
every 10 ms; both tools start worker processes).

* ours     ``mf-celldump compare TARGET BASELINE -o OUT --json`` (CSV, PNG and report.html included)
* msprobe  ``msprobe compare -tp TARGET/step0 -gp BASELINE/step0 -o OUT`` (its CSV)
* previous (``--previous CHECKOUT``) the same command run from another checkout of mf_celldump

Run from the repository root; one command gives the table (printed and in
``bench/results/compare-DATE.md``) and the JSON (``compare-DATE.json``, with the load average
before and after):

    python bench/bench_compare.py                                   # 2000, 10000 beside msprobe; 30000, 100000 ours
    python bench/bench_compare.py --previous ../main                # and the code of another checkout, same run
    python bench/bench_compare.py --sizes 2000 --memory-sizes       # quick
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

SHAPE = (64, 64)
TENSORS_PER_ENTRY = 2  # one input, one output
CELLS = (
    "input_layernorm",
    "attention.wq",
    "attention.wk",
    "attention.wv",
    "attention.wo",
    "post_norm",
    "mlp.w1",
    "mlp.w3",
    "mlp.w2",
)
HERE = os.path.dirname(os.path.abspath(__file__))
MSPROBE = (
    "import sys, mindspore\nfrom msprobe.msprobe import main\nsys.argv = ['msprobe'] + sys.argv[1:]\nmain()"
)


def write_pair(root: str, files: int) -> None:
    """Target and baseline dumps with ``files`` tensor files each (forward and backward entries)."""
    entries = files // TENSORS_PER_ENTRY
    layers = max(1, entries // (2 * len(CELLS)))
    rng = np.random.default_rng(0)
    base = rng.standard_normal(SHAPE).astype(np.float32)
    for side in ("baseline", "target"):
        folder = os.path.join(root, side, "step0", "rank")
        data_dir = os.path.join(folder, "dump_tensor_data")
        os.makedirs(data_dir)
        names = []
        with open(os.path.join(folder, "dump.json"), "w", encoding="utf-8") as out:
            out.write(
                f'{{"task": "tensor", "level": "L0", "framework": "mindspore", '
                f'"dump_data_dir": {json.dumps(data_dir)}, "data": {{\n'
            )
            count = 0
            for direction in ("forward", "backward"):
                order = range(layers) if direction == "forward" else reversed(range(layers))
                for layer in order:
                    for cell in CELLS:
                        if count >= entries:
                            break
                        scale = 1.0 + (1e-2 if side == "target" and layer >= layers // 2 else 0.0)
                        name = f"Cell.model.layers.{layer}.{cell}.Linear.{direction}.0"
                        body = _entry(data_dir, name, base * scale, layer)
                        out.write(("," if count else "") + json.dumps(name) + ": " + json.dumps(body) + "\n")
                        names.append(name)
                        count += 1
            out.write("}}\n")
        for file_name, content in (("construct.json", {n: None for n in names}), ("stack.json", {})):
            with open(os.path.join(folder, file_name), "w", encoding="utf-8") as handle:
                json.dump(content, handle)


def _entry(data_dir: str, name: str, array: np.ndarray, layer: int) -> dict:
    body = {"input_args": [], "input_kwargs": {}, "output": []}
    for kind, key in (("input", "input_args"), ("output", "output")):
        value = array + np.float32(layer)
        file_name = f"{name}.{kind}.0.npy"
        np.save(os.path.join(data_dir, file_name), value)
        body[key].append(
            {
                "type": "mindspore.Tensor",
                "dtype": "Float32",
                "shape": list(SHAPE),
                "Max": float(value.max()),
                "Min": float(value.min()),
                "Mean": float(value.mean()),
                "Norm": float(np.linalg.norm(value)),
                "data_name": file_name,
            }
        )
    return body


def run(command, cwd: str, env: Optional[dict] = None) -> dict:
    """Wall time, peak RSS of the largest process (the command or one of its children: getrusage) and the
    peak of the sum over the process tree (sampled every 10 ms from /proc) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env)
        tree_kb = 0
        while proc.poll() is None:
            tree_kb = max(tree_kb, _tree_rss_kb(proc.pid))
            time.sleep(0.01)
        wall = time.perf_counter() - start
        out.seek(0)
        output = out.read()
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{command[:3]} failed ({proc.returncode}): {output[-2000:]}")
    return {
        "wall_s": round(wall, 2),
        "peak_rss_mb": round(max(peak_kb, before) / 1024, 1),
        "tree_rss_mb": round(tree_kb / 1024, 1),
        "rc": proc.returncode,
    }


def _tree_rss_kb(pid: int) -> int:
    """RSS of a process and all its descendants now (0 for those gone meanwhile)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/status", encoding="ascii") as handle:
                total += next((int(line.split()[1]) for line in handle if line.startswith("VmRSS:")), 0)
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as handle:
                    todo.extend(int(child) for child in handle.read().split())
        except (OSError, ValueError):
            continue
    return total


def commands(root: str, with_msprobe: bool, previous: Optional[str]) -> Dict[str, Tuple[list, Optional[dict]]]:
    """tool -> (command, environment); ``previous``: a checkout of mf_celldump run as tool ``previous``."""
    target, baseline = os.path.join(root, "target"), os.path.join(root, "baseline")
    ours = [sys.executable, "-m", "mf_celldump", "compare", target, baseline, "--json", "-o"]
    out = {"ours": ([*ours, os.path.join(root, "out_ours")], None)}
    if previous:
        env = dict(os.environ, PYTHONPATH=os.path.abspath(previous))
        out["previous"] = ([*ours, os.path.join(root, "out_previous")], env)
    if with_msprobe:
        out["msprobe"] = (
            [sys.executable, "-c", MSPROBE, "compare", "-tp", os.path.join(target, "step0"),
             "-gp", os.path.join(baseline, "step0"), "-o", os.path.join(root, "out_msprobe")],
            None,
        )
    return out


def measure(root: str, size: int, repeat: int, with_msprobe: bool, previous: Optional[str] = None) -> dict:
    """Each tool's run of median wall time (of ``repeat`` interleaved runs) and its peak RSS."""
    runs: Dict[str, List[dict]] = {}
    for _ in range(repeat):  # interleaved, so a load change hits every tool alike
        for tool, (command, env) in commands(root, with_msprobe, previous).items():
            # one measuring process per command: RUSAGE_CHILDREN is the largest child of a parent
            result = json.loads(
                subprocess.run(
                    [sys.executable, __file__, "--one", json.dumps([command, env])],
                    capture_output=True,
                    text=True,
                    cwd=root,
                    check=True,
                ).stdout
            )
            runs.setdefault(tool, []).append(result)
            shutil.rmtree(os.path.join(root, f"out_{tool}"), ignore_errors=True)
    best = {tool: sorted(results, key=lambda r: r["wall_s"])[len(results) // 2] for tool, results in runs.items()}
    row = {
        "files_per_dump": size,
        **{f"{k}_{m}": v.get(m) for k, v in best.items() for m in ("wall_s", "peak_rss_mb", "tree_rss_mb")},
    }
    if "msprobe" in best:
        row["speedup"] = round(best["msprobe"]["wall_s"] / best["ours"]["wall_s"], 2)
    if "previous" in best:
        row["ours_vs_previous"] = round(best["ours"]["wall_s"] / best["previous"]["wall_s"], 2)
    return row


def machine() -> dict:
    import platform

    versions = {}
    for name in ("mindstudio-probe", "numpy", "pandas", "matplotlib"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": platform.machine(), "cpus": os.cpu_count(),
            "load_average": os.getloadavg(), "versions": versions}


def table(rows: List[dict]) -> str:
    """The rows as the markdown table of bench/README.md."""
    lines = ["| files per dump | ours (s) | msprobe (s) | **msprobe / ours** | ours peak RSS (MB): largest "
             "process / all | msprobe peak RSS (MB): largest process / all | previous (s) | ours / previous |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        speedup = f"**{r['speedup']}x**" if "speedup" in r else "-"
        theirs = (f"{r['msprobe_peak_rss_mb']:.0f} / {r['msprobe_tree_rss_mb']:.0f}" if "msprobe_peak_rss_mb" in r
                  else "-")
        lines.append(
            f"| {r['files_per_dump']:,} | {r['ours_wall_s']} | {r.get('msprobe_wall_s', '-')} | {speedup} | "
            f"{r['ours_peak_rss_mb']:.0f} / {r['ours_tree_rss_mb']:.0f} | {theirs} | "
            f"{r.get('previous_wall_s', '-')} | {r.get('ours_vs_previous', '-')} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="*", default=[2000, 10000],
                        help="files per dump compared beside msprobe (default: 2000 10000)")
    parser.add_argument("--memory-sizes", type=int, nargs="*", default=[30000, 100000],
                        help="files per dump for ours alone, the memory bound (default: 30000 100000)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-msprobe", action="store_true")
    parser.add_argument("--previous", metavar="CHECKOUT", default=None,
                        help="also time another checkout of mf_celldump (e.g. main) in the same run")
    parser.add_argument("--results", default=os.path.join(HERE, "results"),
                        help="folder for compare-DATE.json and .md (default: bench/results)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        command, env = json.loads(args.one)
        print(json.dumps(run(command, os.getcwd(), env)))
        return 0
    report = {"before": machine(), "rows": []}
    plan = [(size, not args.no_msprobe, args.repeat) for size in args.sizes]
    plan += [(size, False, 1) for size in args.memory_sizes]
    for size, with_msprobe, repeat in plan:
        work = tempfile.mkdtemp(prefix="bench_compare_", dir=args.work)
        try:
            start = time.perf_counter()
            write_pair(work, size)
            print(f"wrote 2 x {size} files in {time.perf_counter() - start:.0f} s", file=sys.stderr)
            report["rows"].append(measure(work, size, repeat, with_msprobe, args.previous))
            print(json.dumps(report["rows"][-1]), flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    report["after"] = machine()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    os.makedirs(args.results, exist_ok=True)
    with open(os.path.join(args.results, f"compare-{stamp}.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
    text = table(report["rows"])
    with open(os.path.join(args.results, f"compare-{stamp}.md"), "w", encoding="utf-8") as handle:
        handle.write(f"{report['before']}\n\n{text}\n\n{report['after']}\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
