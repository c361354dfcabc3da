"""Benchmark of processing: ours vs msprobe 26.2's own post-processing vs a read-once floor.

For each size a LLaMA-like raw dump (forward and backward, inferred call numbers, ~16 KB
float32 tensors) is written twice: in our raw format, by the package's own raw writer
(``synthetic_dump.py``), and in the raw format msprobe's static-graph cell dump leaves
behind (TensorDump names ``Cell.{name}.{Class}.{dir}.{io}.{i}_{dtype}_{id}.npy`` under
``step{N}/rank0/dump_tensor_data``). Processing consumes its input, so each of our runs
gets a fresh copy of the raw dump (copied, untimed; a hard-linked copy is refused by
processing, which accepts only files with one name). Every measurement runs in its own
process, ``--repeat`` times interleaved (the fastest is reported: the machine may be
shared); wall time and peak RSS (VmHWM of the process; ru_maxrss of its worker children)
are reported.

A last run measures memory against the size of ``records.jsonl``: a statistics dump
whose records file is its valid lines repeated until it holds ``--records-mb`` MB
(``--records-mb 0`` skips it), processed once; its peak RSS against the file's size.

* ours      ``process_dump`` with ``jobs`` = CPU count (and with jobs=1)
* floor     one process: ``np.load`` every raw file once + max/min/mean/norm, nothing else
* msprobe   the phases of ``msprobe.mindspore.dump.dump_processor.cell_dump_process.process_step``
            (rename_filename, generate_construct, generate_dump_info, generate_stack_info), called
            directly to leave out its fixed 0.5 s completion poll

Run:  python bench/bench_processing.py            (default, about 10 min on 2 cores)
      python bench/bench_processing.py --sizes 1000 --large 0 --records-mb 0 --work /tmp/x
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import synthetic_dump as syn  # noqa: E402  (beside this file)

from mf_celldump.rawformat.keys import BACKWARD, SLOT_ARG  # noqa: E402

SMALL_SHAPE = (64, 64)  # 16 KiB of float32


# ---------------------------------------------------------------------------
# building the raw dumps
# ---------------------------------------------------------------------------


def plan(files: int):
    """(layers, calls) of the LLaMA-like net giving about ``files`` raw files (4 per cell and call)."""
    for calls in (1, 2, 4, 8, 16, 32, 64):
        layers = round((files / (4 * calls) - 3) / 12)
        if layers <= 80:
            return max(1, layers), calls
    return 80, max(1, round(files / (4 * (3 + 80 * 12))))


class MsprobeWriter:
    """Writes the same values under the names msprobe's TensorDump wrapper produces."""

    def __init__(self, dump_path: str, cells):
        self.dir = os.path.join(dump_path, "step0", "rank0", "dump_tensor_data")
        os.makedirs(self.dir, exist_ok=True)
        self.cells = {c.cell_id: c for c in cells}
        self.seq = 0

    def write(self, cell: int, direction: str, slot: str, array: np.ndarray):
        c = self.cells[cell]
        is_input = (slot == SLOT_ARG) != (direction == BACKWARD)
        io = "input" if is_input else "output"
        name = f"Cell.{c.name}.{c.class_name}.{direction}.{io}.0_{array.dtype.name}_{self.seq}.npy"
        self.seq += 1
        np.save(os.path.join(self.dir, name), array)


def build(workdir: str, files: int, shape=SMALL_SHAPE, with_msprobe: bool = True, flat: bool = False) -> dict:
    """Write the raw dump(s); ``flat`` = ``files`` cells with one forward input each (large tensors)."""
    if flat:
        tree, calls, layers = syn.flat_tree(files), 1, files
        order = list(syn.flat_order(tree))
        arrays = [np.random.default_rng(0).standard_normal(shape).astype(np.float32)]
    else:
        layers, calls = plan(files)
        tree = syn.llama_tree(layers)
        order = list(syn.call_order(tree, calls))
        rng = np.random.default_rng(0)
        arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(32)]
    ours = os.path.join(workdir, "ours")
    dump = syn.SyntheticDump(ours, tree, task="tensor")
    counter = iter(range(len(order)))
    written = dump.write_step(0, order, lambda value: arrays[next(counter) % len(arrays)])
    dump.close()
    info = {"files": written, "layers": layers, "calls": calls, "ours": ours, "bytes": written * arrays[0].nbytes}
    if with_msprobe:
        writer = MsprobeWriter(os.path.join(workdir, "msprobe"), tree.cells)
        for n, (cell, direction, slot, _call) in enumerate(order):
            writer.write(cell, direction, slot, arrays[n % len(arrays)])
        info["msprobe"] = os.path.join(workdir, "msprobe")
    return info


def build_records(workdir: str, layers: int, mb: int, distinct: bool = False) -> dict:
    """A statistics dump of a LLaMA-like step whose records file is its valid lines repeated up to ``mb`` MB;
    ``distinct``: as many calls (micro-batches) as make ``mb`` MB of lines, every line a value of its own."""
    path = os.path.join(workdir, "records")
    tree = syn.llama_tree(layers)
    array = np.random.default_rng(0).standard_normal(SMALL_SHAPE).astype(np.float32)
    calls = 1
    if distinct:
        probe = syn.SyntheticDump(os.path.join(workdir, "probe"), tree, task="statistics")
        probe.write_step(0, syn.call_order(tree), lambda value: array)
        probe.close()
        calls = max(1, round(mb * 10**6 / os.path.getsize(syn.records_path(os.path.join(workdir, "probe")))))
        shutil.rmtree(os.path.join(workdir, "probe"))
    dump = syn.SyntheticDump(path, tree, task="statistics")
    values = dump.write_step(0, syn.call_order(tree, calls), lambda value: array)
    dump.close()
    records = syn.records_path(path)
    with open(records, "rb") as handle:
        lines = handle.read()
    with open(records, "ab") as handle:
        while handle.tell() < mb * 10**6:
            handle.write(lines)
    return {"path": path, "values": values, "records_bytes": os.path.getsize(records),
            "lines": os.path.getsize(records) // len(lines) * values}


# ---------------------------------------------------------------------------
# the measured jobs (each runs in a fresh process: "child" mode)
# ---------------------------------------------------------------------------


def child_ours(path: str, jobs: int, must_be_ok: bool = True) -> dict:
    from mf_celldump.processing.driver import process_dump

    start = time.perf_counter()
    report = process_dump(path, jobs=jobs)
    elapsed = time.perf_counter() - start
    assert report.ok or not must_be_ok, report.summary()
    return {"seconds": elapsed, "entries": report.entries, "files": report.files,
            "problems": len(report.all_problems), "problem_sample": report.all_problems[:3]}


def child_floor(path: str) -> dict:
    step_dir = os.path.join(path, "_raw", "rank0", "step0")
    start = time.perf_counter()
    count = 0
    for entry in os.scandir(step_dir):
        if not entry.name.endswith(".npy"):
            continue
        array = np.load(entry.path, allow_pickle=False)
        wide = array.astype(np.float64).ravel()
        _ = (array.max(), array.min(), wide.mean(), float(np.sqrt(np.dot(wide, wide))))
        count += 1
    return {"seconds": time.perf_counter() - start, "files": count}


def child_msprobe(path: str) -> dict:
    import mindspore  # noqa: F401  (msprobe needs mindspore imported first)
    from msprobe.mindspore.dump.dump_processor import cell_dump_process as msp

    npy_path = os.path.join(path, "step0", "rank0", "dump_tensor_data")
    start = time.perf_counter()
    msp.dump_task = "tensor"
    msp.rename_filename(path=npy_path)
    msp.generate_construct(npy_path)
    msp.generate_dump_info(npy_path)
    msp.generate_stack_info(npy_path)
    elapsed = time.perf_counter() - start
    with open(os.path.join(path, "step0", "rank0", "dump.json")) as handle:
        entries = len(json.load(handle)["data"])
    return {"seconds": elapsed, "entries": entries}


def peak_rss_mib() -> float:
    """Peak RSS of this process since exec (VmHWM); ru_maxrss would include the forking parent's."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(mode: str, *args, timeout: float = 3600) -> dict:
    """Run one measurement in a fresh interpreter; returns its result plus peak RSS in MiB."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, *map(str, args)]
    os.sync()  # no write-back of freshly written files competes with the measurement
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_process"] = wall
    return result


def child_main(mode: str, args) -> None:
    if mode == "ours":
        result = child_ours(args[0], int(args[1]))
    elif mode == "ours_records":
        result = child_ours(args[0], int(args[1]), must_be_ok=False)
    elif mode == "floor":
        result = child_floor(args[0])
    elif mode == "msprobe":
        result = child_msprobe(args[0])
    else:
        raise SystemExit(f"unknown mode {mode}")
    own = peak_rss_mib()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    result.update({"rss_mib": own, "children_rss_mib": kids})
    print(json.dumps(result))


# ---------------------------------------------------------------------------
# the benchmark
# ---------------------------------------------------------------------------


def fresh_copy(src: str, dst: str) -> str:
    """A copy of a raw dump for one run (processing consumes its input; a hard-linked copy is refused)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def best(results: list) -> dict:
    """The fastest of repeated runs (least disturbed by other load), with the highest RSS seen."""
    fastest = dict(min(results, key=lambda r: r["seconds"]))
    fastest["rss_mib"] = max(r["rss_mib"] for r in results)
    fastest["children_rss_mib"] = max(r["children_rss_mib"] for r in results)
    fastest["all_seconds"] = [round(r["seconds"], 3) for r in results]
    return fastest


def measure(
    label: str, workdir: str, files: int, shape, msprobe_max: int, jobs: int, repeat: int, flat=False
):
    info = build(workdir, files, shape, with_msprobe=files <= msprobe_max, flat=flat)
    n = info["files"]
    row = {
        "label": label,
        "files": n,
        "layers": info["layers"],
        "calls": info["calls"],
        "mib": info["bytes"] / 2**20,
    }
    runs: dict = {"floor": []}
    if n > 20000:
        repeat = min(repeat, 3)  # a 100k run takes ~10 s per mode; small runs are repeated more
    for _ in range(repeat):  # interleaved, so a burst of outside load hits every mode alike
        runs["floor"].append(run_child("floor", info["ours"]))
        for j in sorted({1, jobs}):
            run_dir = fresh_copy(info["ours"], os.path.join(workdir, f"ours-run{j}"))
            runs.setdefault(f"ours_j{j}", []).append(run_child("ours", run_dir, j))
            shutil.rmtree(run_dir, ignore_errors=True)
    row.update({mode: best(results) for mode, results in runs.items()})
    if "msprobe" in info:
        row["msprobe"] = run_child("msprobe", info["msprobe"])
    shutil.rmtree(workdir, ignore_errors=True)
    return row


def measure_records(workdir: str, mb: int, layers: int, jobs: int) -> dict:
    """Peak RSS of processing a step whose records file holds its lines once, then repeated up to ``mb`` MB."""
    row = {"label": f"records.jsonl repeated to {mb} MB", "layers": layers}
    for label, size, distinct in (("once", 0, False), ("repeated", mb, False), ("distinct", mb, True)):
        info = build_records(os.path.join(workdir, label), layers, size, distinct)
        run = run_child("ours_records", fresh_copy(info["path"], os.path.join(workdir, f"{label}-run")), jobs)
        row[label] = dict(run, records_mib=info["records_bytes"] / 2**20, lines=info["lines"], values=info["values"])
        shutil.rmtree(os.path.join(workdir, label), ignore_errors=True)
        shutil.rmtree(os.path.join(workdir, f"{label}-run"), ignore_errors=True)
    return row


def records_table(row: dict) -> list:
    lines = ["| records.jsonl | lines | values | seconds | problems | peak RSS | RSS / file |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for label in ("once", "repeated", "distinct"):
        r = row[label]
        lines.append(f"| {r['records_mib']:.1f} MiB ({label}) | {r['lines']} | {r['values']} | {r['seconds']:.2f} "
                     f"| {r['problems']} | {r['rss_mib']:.0f} MiB | {r['rss_mib'] / r['records_mib']:.2f} |")
    return lines


def _cell(r: dict, n: int, floor: float) -> str:
    """``seconds (µs/file) ×floor, RSS main/worker MiB``."""
    rss = (
        f"{r['rss_mib']:.0f}/{r['children_rss_mib']:.0f}" if r["children_rss_mib"] else f"{r['rss_mib']:.0f}"
    )
    return f"{r['seconds']:.2f} ({r['seconds'] / n * 1e6:.0f}) ×{r['seconds'] / floor:.2f}, {rss} MiB"


def fmt_row(row: dict, jobs: int) -> str:
    n = row["files"]
    floor = row["floor"]["seconds"]
    cells = [row["label"], f"{n}", f"{row['mib']:.0f}", f"{floor:.2f} ({floor / n * 1e6:.0f})"]
    for j in sorted({1, jobs}):
        cells.append(_cell(row[f"ours_j{j}"], n, floor))
    if "msprobe" in row:
        cells.append(_cell(row["msprobe"], n, floor))
    else:
        cells.append("skipped (quadratic; see notes)")
    cells.append(f"{max(row['floor']['rss_mib'], 0):.0f} MiB")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="1000,10000,30000", help="file counts of the small-tensor runs")
    parser.add_argument("--msprobe-max", type=int, default=10000, help="largest size msprobe is run on")
    parser.add_argument("--large", type=int, default=4, help="files of the large-tensor run (0: skip)")
    parser.add_argument("--large-mib", type=int, default=256, help="size of each large tensor in MiB")
    parser.add_argument("--records-mb", type=int, default=490,
                        help="memory run: records.jsonl repeated up to this many MB (0: skip)")
    parser.add_argument("--records-layers", type=int, default=20, help="layers of the memory run's network")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="runs per mode (at most 3 above 20k files); the fastest is reported",
    )
    parser.add_argument("--work", default="/tmp/mf_celldump_bench")
    parser.add_argument(
        "--save", default=os.path.join(REPO, "bench", "results"), help="folder for the results"
    )
    args = parser.parse_args()
    if args.child:
        child_main(args.child[0], args.child[1:])
        return
    os.makedirs(args.work, exist_ok=True)
    load_start = os.getloadavg()
    rows = []
    for size in (int(s) for s in args.sizes.split(",") if s):
        print(f"... {size} small files", file=sys.stderr, flush=True)
        label = f"{size // 1000}k x 16 KiB"
        work = os.path.join(args.work, f"s{size}")
        rows.append(measure(label, work, size, SMALL_SHAPE, args.msprobe_max, args.jobs, args.repeat))
    if args.large:
        elements = args.large_mib * 2**20 // 4
        print(f"... {args.large} large files", file=sys.stderr, flush=True)
        large = measure(f"large: {args.large} x {args.large_mib} MiB", os.path.join(args.work, "large"),
                        args.large, (elements,), 10**9, args.jobs, args.repeat, flat=True)  # fmt: skip
        rows.append(large)
    lines = table(rows, args.jobs)
    if args.records_mb:
        print(f"... records.jsonl of {args.records_mb} MB", file=sys.stderr, flush=True)
        records = measure_records(os.path.join(args.work, "records"), args.records_mb, args.records_layers, args.jobs)
        rows.append(records)
        lines += ["", *records_table(records)]
    lines.insert(0, f"date: {time.strftime('%Y-%m-%d %H:%M:%S')}, command: {' '.join([sys.executable] + sys.argv)}, "
                    f"load average at the start: {load_start[0]:.2f} (1 min), {load_start[1]:.2f} (5 min)")
    print("\n".join(lines))
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        stem = os.path.join(args.save, time.strftime("processing-%Y%m%d-%H%M%S"))
        with open(stem + ".txt", "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        with open(stem + ".json", "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)
        print(f"saved {stem}.txt and .json", file=sys.stderr)


def table(rows: list, jobs: int) -> list:
    jobs_cols = " | ".join(
        f"ours jobs={j}: s (µs/file) ×floor, peak RSS main/workers" for j in sorted({1, jobs})
    )
    head = f"| run | files | MiB | floor s (µs/file) | {jobs_cols} "
    head += "| msprobe 26.2: s (µs/file) ×floor, RSS main/pool"
    lines = [head + " | floor RSS |", "|" + "---|" * (6 + len({1, jobs}))]
    lines.extend(fmt_row(row, jobs) for row in rows)
    load = os.getloadavg()
    lines.append(f"load average at the end: {load[0]:.2f} (1 min), {load[1]:.2f} (5 min)")
    return lines


if __name__ == "__main__":
    main()
