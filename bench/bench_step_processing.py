#!/usr/bin/env python
"""Wall time that processing adds to a captured training step: inline (before) vs the worker (after).

One process trains the tiny LLaMA of ``bench_capture.py`` (PyNative, CPU) through
``--rounds`` rounds of three phases of ``--steps`` measured steps each, then one last
uncaptured phase, all side by side:

  uncaptured   train step only (the control)
  inline       + ``InlineProcessor.submit([step])``: process_dump on the
               training thread, what the callback did before processing moved to a worker
  background   + ``BackgroundProcessor.submit([step])``: what the callback does now; the
               worker process works while the next steps train

After each step's train call, a raw capture of the step (``--mb`` MiB of float32 tensors
in our raw format, LLaMA-like names, written by the package's raw writer: ``synthetic_dump.py``) is
written and marked
complete *outside* the timed region: capture cost is measured by ``bench_capture.py``; here
only processing is. The uncaptured phases write it too and keep it until the phase ends,
so every phase has the same pause between steps (on a loaded machine a process that
pauses gets the cores back sooner) and the same page-cache writeback of 1 GB a step: the
only difference left is processing.

Timed step = train call + loss fetch + sync + the end-of-step processing call. The
background phase ends with the wait at train end (``finish``), reported on its own. A
captured phase's ratio is against the uncaptured phases just before and after it in the
same process. ``os.sync()`` (untimed) before each phase starts each one without dirty
pages.

Usage (from the repository root; about 6 minutes on 2 cores, 5 GB of free disk under --work):

    python bench/bench_step_processing.py          # 1024 MiB per step, 2 rounds of 4 steps per phase
    python bench/bench_step_processing.py --mb 256 --steps 2 --rounds 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

import bench_capture  # noqa: E402  (the bench model: _build, _batches, _sync, MODEL)
import numpy as np  # noqa: E402
import synthetic_dump as syn  # noqa: E402

COLUMNS = 1024
LAYERS = 2  # 27 cells x (forward in/out + backward in/out) = 108 tensors per step


class RawSteps:
    """Writes one complete raw step of about ``mb`` MiB in our raw format (untimed)."""

    def __init__(self, dump_path: str, mb: int):
        self.tree = syn.llama_tree(LAYERS)
        self.dump = syn.SyntheticDump(dump_path, self.tree, task="tensor")
        self.tensors = 4 * len(self.tree.cells)
        rows = max(1, mb * 2**20 // self.tensors // 4 // COLUMNS)
        self.array = (np.arange(rows * COLUMNS, dtype=np.float32).reshape(rows, COLUMNS) % 97) / 97
        self.bytes = self.array.nbytes * self.tensors

    def write(self, step: int) -> None:
        self.dump.write_step(step, syn.call_order(self.tree), lambda value: self.array, explicit_calls=True)

    def remove(self, step: int) -> None:
        self.dump.remove_step(step)


def _remove_outputs(dump_path: str) -> None:
    for name in os.listdir(dump_path):
        if name.startswith("step"):
            shutil.rmtree(os.path.join(dump_path, name))


def _phase(name, train, batches, first, count, raw, processor=None):
    rows = []
    os.sync()
    load = os.getloadavg()
    for i in range(count):
        step = first + i
        t0 = time.perf_counter()
        loss = train(batches[step % len(batches)])
        float(loss.asnumpy())
        bench_capture._sync()
        t_train = time.perf_counter() - t0
        action = 0.0
        raw.write(step)  # the step's capture, in place and marked complete (untimed)
        if processor is not None:
            t1 = time.perf_counter()
            processor.submit([step])
            action = time.perf_counter() - t1
        rows.append({"step": step, "train_s": t_train, "processing_on_step_s": action, "step_s": t_train + action})
    if processor is None:  # the control keeps its raw steps on disk as long as the others do
        for i in range(count):
            raw.remove(first + i)
    print(f"[bench] {name}: median step {statistics.median(r['step_s'] for r in rows):.3f} s", flush=True)
    return {"phase": name, "steps": rows, "loadavg_start": load, "loadavg_end": os.getloadavg()}


def _background_phase(label, train, batches, first, count, raw, dump_path) -> dict:
    from mf_celldump.integrations.background import BackgroundProcessor

    processor = BackgroundProcessor(dump_path, 0, None)
    processor.prepare()  # as the callback does at attach: starts the sender thread
    phase = _phase(label, train, batches, first, count, raw, processor)
    t0 = time.perf_counter()
    result = processor.finish(timeout=3600)  # the wait at train end
    phase.update(wait_at_train_end_s=time.perf_counter() - t0, worker=result.info)
    assert not result.problems, result.problems
    processed = sorted({o.step for r in result.reports for o in r.processed})
    assert processed == list(range(first, first + count)), processed
    return phase


def run(args) -> dict:
    from mf_celldump.integrations.step_processor import InlineProcessor

    _net, train = bench_capture._build(args.seed)
    batches = bench_capture._batches(8, args.seed)
    for i in range(args.warmup):
        train(batches[i % len(batches)])
    bench_capture._sync()
    dump_path = os.path.join(args.work, "dump")
    raw = RawSteps(dump_path, args.mb)
    print(f"[bench] {raw.tensors} tensors, {raw.bytes / 2**20:.0f} MiB per captured step", flush=True)
    n, step, phases = args.steps, 0, []
    for round_ in range(1, args.rounds + 1):
        phases.append(_phase(f"{round_}: uncaptured", train, batches, step, n, raw))
        inline = InlineProcessor(dump_path, 0, None)  # jobs=None as the callback passes them
        phases.append(_phase(f"{round_}: inline", train, batches, step + n, n, raw, inline))
        _remove_outputs(dump_path)
        phases.append(_background_phase(f"{round_}: background", train, batches, step + 2 * n, n, raw, dump_path))
        _remove_outputs(dump_path)
        step += 3 * n
    phases.append(_phase("end: uncaptured", train, batches, step, n, raw))
    return {"mb_per_step": raw.bytes / 2**20, "bytes_per_step": raw.bytes, "tensors_per_step": raw.tensors,
            "rounds": args.rounds, "phases": phases}


def _median(phase, key):
    return statistics.median(r[key] for r in phase["steps"])


def _uncaptured_around(phases, index) -> float:
    """Median uncaptured step of the rounds' uncaptured phases before and after phase ``index``."""
    before = next(p for p in reversed(phases[:index]) if p["phase"].endswith("uncaptured"))
    after = next(p for p in phases[index:] if p["phase"].endswith("uncaptured"))
    return statistics.median([r["step_s"] for p in (before, after) for r in p["steps"]])


def table(out: dict) -> str:
    phases = out["phases"]
    lines = ["| phase | step s (median) | min | train part (median) | processing call on the step (median) "
             "| x uncaptured | added per step s | load avg (1 min) start-end |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    ratios: dict = {"inline": [], "background": []}
    for index, phase in enumerate(phases):
        step = _median(phase, "step_s")
        kind = phase["phase"].split(": ")[1]
        base = _uncaptured_around(phases, index) if kind in ratios else step
        if kind in ratios:
            ratios[kind].append(step / base)
        lines.append(
            f"| {phase['phase']} | {step:.3f} | {min(r['step_s'] for r in phase['steps']):.3f} "
            f"| {_median(phase, 'train_s'):.3f} | {_median(phase, 'processing_on_step_s') * 1000:.3f} ms "
            f"| {step / base:.2f} | {step - base:+.3f} "
            f"| {phase['loadavg_start'][0]:.1f}-{phase['loadavg_end'][0]:.1f} |")
    lines += ["", "x uncaptured: against the uncaptured phases just before and after (same round).",
              "Median over rounds: inline x{:.2f}, background x{:.2f}".format(
                  statistics.median(ratios["inline"]), statistics.median(ratios["background"]))]
    for phase in phases:
        if "worker" not in phase:
            continue
        worker = phase["worker"]
        submits = [r["processing_on_step_s"] * 1e6 for r in phase["steps"]]
        lines.append(
            f"{phase['phase']}: submit per step {', '.join(f'{s:.0f}' for s in submits)} us; worker start call "
            f"{worker.get('start_call_s')} s on the sender thread, ready after "
            f"{worker.get('startup_s')} s of imports, {worker.get('policy')}, nice {worker.get('nice')}, MindSpore "
            f"imported: {worker.get('mindspore_imported')}; {worker.get('requests')} steps in "
            f"{worker.get('worker_seconds')} s of worker time ({worker.get('worker_cpu_seconds')} s CPU); "
            f"wait at train end {phase['wait_at_train_end_s']:.2f} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="MiB of raw tensors per captured step")
    parser.add_argument("--steps", type=int, default=4, help="measured steps per phase")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of uncaptured, inline, background phases")
    parser.add_argument("--warmup", type=int, default=2, help="uncaptured warm-up steps (excluded)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp folder, removed)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for step-processing-*.json|txt")
    args = parser.parse_args(argv)
    started = datetime.datetime.now()
    temporary = args.work is None
    args.work = os.path.abspath(args.work or tempfile.mkdtemp(prefix="bench-step-processing-"))
    os.makedirs(args.work, exist_ok=True)
    cwd = os.getcwd()
    os.chdir(args.work)  # importing MindFormers creates ./output
    try:
        out = run(args)
    finally:
        os.chdir(cwd)
        shutil.rmtree(args.work if temporary else os.path.join(args.work, "dump"), ignore_errors=True)
    out["meta"] = {"date": started.isoformat(timespec="seconds"),
                   "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
                   "command": " ".join([sys.executable] + sys.argv), "steps_per_phase": args.steps,
                   "loadavg_end": os.getloadavg(),
                   "model": dict(bench_capture.MODEL, layers="LlamaForCausalLM (legacy)", dtype="float32"),
                   "total_wall_s": (datetime.datetime.now() - started).total_seconds()}
    text = "\n".join([f"date: {out['meta']['date']}", f"machine: {out['meta']['machine']}",
                      f"command: {out['meta']['command']}",
                      f"raw capture per step: {out['mb_per_step']:.0f} MiB ({out['bytes_per_step'] / 1e9:.2f} GB) "
                      f"in {out['tensors_per_step']} tensors", "", table(out), ""])
    os.makedirs(args.out, exist_ok=True)
    stamp = started.strftime("%Y%m%d-%H%M%S")
    with open(os.path.join(args.out, f"step-processing-{stamp}.json"), "w") as handle:
        json.dump(out, handle, indent=1)
    with open(os.path.join(args.out, f"step-processing-{stamp}.txt"), "w") as handle:
        handle.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
