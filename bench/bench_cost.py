#!/usr/bin/env python
"""What attaching capture costs beside step time: peak memory, the first steps (compiles), the watch.

``bench_capture.py`` measures step time (plain / unselected / selected, one process). This script
measures what one process cannot: memory and compile time need a process per network, and the
watch needs the same attached network with and without it. The model, batches and seed are
``bench_capture``'s (``--size tiny|large``); each measurement is a fresh subprocess in a temporary
folder (importing MindFormers creates ./output).

**Memory and first steps** (``--part memory``; per mode, ``graph`` = CPU GRAPH_MODE with the host
backend as bench_capture's graph rows, ``pynative`` = the default backend per task):

  mem_plain        the network alone, ``--mem-steps`` steps
  mem_unselected   the same network attached (``steps`` names a step never reached): every step
                   unselected, so in graph mode only the plain graph is ever compiled
  mem_selected     attached, steps 0-2 unselected, then every other step selected from step 3:
                   step 3 is the first selected step (in graph mode the second compile)

Each worker reads its own peak RSS (``VmHWM`` in /proc/self/status, the kernel's high-water mark
of this process alone; ``getrusage(RUSAGE_SELF).ru_maxrss`` beside it) and times every step (the
first one includes the graph compile in graph mode, kernel selection in PyNative). Fields per mode
and task: ``plain_peak_rss_mb``, ``attached_unselected_peak_rss_mb``, ``attached_selected_peak_rss_mb``
and their ratios to the plain run; ``plain_first_step_ms``, ``attached_first_unselected_ms``,
``attached_first_selected_ms``.

**The watch** (``--part watch``; one worker per mode): three networks from the same seed under a
loss-scale training wrapper (MindFormers' wrappers and MindSpore's ``TrainOneStepWithLossScaleCell``
return the loss, the overflow flag and the scale, which the watch reads): the plain network; the
network attached through ``CellDumpCallback`` with nothing selected and no watch; the same with
``watch: true, steps: "anomaly"``. The callbacks are driven as ``Model.train`` drives them (a real
``RunContext`` whose ``cur_step_num``, ``net_outputs`` and ``train_dataset_element`` are set as
Model sets them), in ``--steps`` rounds of one step each, the order rotated every round. The watch's
own host work per step (``StepWatch.before_step``/``after_step``, ``signals_from_outputs``,
``StepSnapshot.take``, the ``StepRerun`` built for a possible rerun) is timed with
``time.perf_counter`` around each call: ``watch_host_ms_per_step`` (median, 95% interval);
``watch_step_ratio`` = step with watch / step without (the same attached network otherwise).

``--cells`` adds two more sides to the watch part: the same network with cell health
(``watch: {cells: true}``, docs/watch.md) every step and every 10th step; ``cells1_step_ratio`` and
``cells10_step_ratio`` are their steps over the attached network without a watch.

Usage (from the repository root):

    python bench/bench_cost.py --size large               # both parts, both modes
    python bench/bench_cost.py --part watch --modes pynative --steps 10
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics as stats_mod
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_capture as bc  # noqa: E402  (the model, batches, capture handle and intervals, beside this file)

NEVER = 10**9  # a step no run reaches: attached, nothing selected
FIRST_SELECTED = 3  # mem_selected: steps 0-2 unselected, then every other step selected
MEM_KINDS = ("mem_plain", "mem_unselected", "mem_selected")


# ---------------------------------------------------------------------------
# worker side
# ---------------------------------------------------------------------------


def _status_mb(key: str) -> float:
    """A ``VmHWM``/``VmRSS`` line of /proc/self/status in MB: this process alone, as the kernel counts it."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"/proc/self/status has no {key} line (Linux only)")


def _one_step(train, batch, capture, step: int) -> float:
    """Milliseconds of one step as ``bench_capture`` times it: begin, train, loss read, sync, end."""
    t0 = time.perf_counter()
    capture.begin(step)
    loss = train(batch)
    float((loss[0] if isinstance(loss, tuple) else loss).asnumpy())
    bc._sync()
    capture.end()
    return (time.perf_counter() - t0) * 1000.0


def _mem_capture(args, train, workdir: str):
    """The worker's capture handle: none (plain), nothing selected, or selected from ``FIRST_SELECTED`` on."""
    if args.worker == "mem_plain":
        return bc._NoCapture(), []
    backend = "host" if args.mode == "graph" else None
    selected = [NEVER] if args.worker == "mem_unselected" else list(range(FIRST_SELECTED, args.mem_steps, 2))
    dump = os.path.join(workdir, "dump")
    return bc._MfCapture(train, dump, args.task, backend, steps=selected), [s for s in selected if s != NEVER]


def memory_worker(args) -> dict:
    """One network, alone in this process: its peak RSS and every step's time, the first ones being the
    compiles (graph mode). Only what this process holds counts, so plain and attached never share one."""
    loadavg_start = os.getloadavg()
    import mindspore  # noqa: F401

    rss_imported = _status_mb("VmRSS")
    _net, train = bc._build(args.seed, graph=args.mode == "graph")
    batches = bc._batches(args.mem_steps, args.seed)
    rss_built = _status_mb("VmRSS")
    t0 = time.perf_counter()
    capture, selected = _mem_capture(args, train, os.getcwd())
    attach_ms = (time.perf_counter() - t0) * 1000.0
    step_ms, rss_after = [], []
    for step in range(args.mem_steps):
        step_ms.append(_one_step(train, batches[step], capture, step))
        rss_after.append(_status_mb("VmRSS"))
    peak_mb = _status_mb("VmHWM")
    maxrss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    capture.close()
    unselected = [ms for i, ms in enumerate(step_ms) if i >= 1 and i not in selected]
    return {
        "config": args.worker, "mode": args.mode, "task": args.task, "selected_steps": selected,
        "peak_rss_mb": peak_mb, "ru_maxrss_mb": maxrss_mb, "peak_rss_after_detach_mb": _status_mb("VmHWM"),
        "rss_imported_mb": rss_imported, "rss_built_mb": rss_built, "rss_after_step_mb": rss_after,
        "attach_ms": attach_ms if args.worker != "mem_plain" else None, "step_ms": step_ms,
        "first_step_ms": step_ms[0],
        "first_selected_ms": step_ms[selected[0]] if selected else None,
        "later_unselected_median_ms": stats_mod.median(unselected) if unselected else None,
        "later_selected_median_ms": stats_mod.median([step_ms[s] for s in selected[1:]]) if selected[1:] else None,
        "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg(),
    }


def _loss_scale_wrapper(net):
    """A ``TrainOneStepWithLossScaleCell`` whose overflow check runs on CPU (any non-finite gradient).

    MindSpore's own check reads the NPU float status (``start_overflow_check``/``get_overflow_status``
    of ``mindspore/nn/wrap/loss_scale.py``); the step still returns (loss, overflow, scale), the
    outputs a MindFormers wrapper returns first, and skips the update on overflow."""
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    class CpuLossScale(nn.TrainOneStepWithLossScaleCell):
        def start_overflow_check(self, pre_cond, compute_input):
            return Tensor([0] * 8, ms.int32), compute_input

        def get_overflow_status(self, status, compute_output):
            return ops.stack([ops.logical_not(ops.isfinite(grad).all()) for grad in compute_output]).any()

    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
    train = CpuLossScale(net, opt, scale_sense=Tensor(1024.0, ms.float32))
    train.set_train(True)
    return train


def _watched_network(args, watch, workdir: str):
    """A loss-scale network attached through ``CellDumpCallback`` (nothing selected; with ``watch`` the
    watch on, ``True`` or a mapping of rules, and ``steps: "anomaly"``), and the ``RunContext`` the callback
    reads, as Model fills it."""
    from mindspore.train.callback import RunContext

    from mf_celldump import CellDumpCallback

    net, _ = bc._build(args.seed, graph=args.mode == "graph")
    train = _loss_scale_wrapper(net)
    name = "nowatch" if not watch else "watch" if watch is True else f"cells{watch['cells_every']}"
    keys = dict(dump_path=os.path.join(workdir, name), task=args.task, layer_mapping=None)
    if watch is True:
        keys.update(steps="anomaly", watch=True)
    else:  # no watch, or cell health alone: nothing is ever captured (a firing only logs)
        keys.update(steps=str(NEVER), **({"watch": watch} if watch else {}))
    if args.mode == "graph":
        keys["backend"] = "host"
    callback = CellDumpCallback(**keys)
    params = {"network": train, "train_network": train, "cur_step_num": 0, "list_callback": [callback],
              "net_outputs": None, "train_dataset_element": None}
    context = RunContext(params)
    callback.on_train_begin(context)
    return {"train": train, "callback": callback, "params": params, "context": context}


def _watched_step(side, batch) -> float:
    """One step as ``Model._train_process`` runs it with the callback (MindSpore 2.9, ``train/model.py``): the
    step count and the batch set before the step begins, the outputs before it ends."""
    params, context, callback = side["params"], side["context"], side["callback"]
    t0 = time.perf_counter()
    params["cur_step_num"] += 1
    params["train_dataset_element"] = [batch]
    callback.on_train_step_begin(context)
    outputs = side["train"](batch)
    float(outputs[0].asnumpy())
    bc._sync()
    params["net_outputs"] = outputs
    callback.on_train_step_end(context)
    return (time.perf_counter() - t0) * 1000.0


def _plain_step(train, batch) -> float:
    t0 = time.perf_counter()
    outputs = train(batch)
    float(outputs[0].asnumpy())
    bc._sync()
    return (time.perf_counter() - t0) * 1000.0


def _watch_timers():
    """Timers around every piece of the watch's per-step work (the trainer adapter's names, as it calls them)."""
    from mf_celldump.integrations import mindspore_callback, rerun, watching

    timers = bc._Timers()
    timers.wrap(watching.StepWatch, "before_step", "StepWatch.before_step")
    timers.wrap(watching.StepWatch, "after_step", "StepWatch.after_step (rules)")
    timers.wrap(mindspore_callback, "signals_from_outputs", "signals_from_outputs (host reads)")
    timers.wrap(rerun.StepSnapshot, "take", "StepSnapshot.take (loss scale, random state)")
    timers.wrap(rerun.StepRerun, "__init__", "StepRerun built")
    return timers


def _watch_rounds(args, plain, sides, batches, timers) -> dict:
    """``args.steps`` rounds of one step per network, the order rotated each round (no side always first)."""
    names = ["plain", *sides]
    got = {**{name: [] for name in names}, "watch_host_ms": [], "watch_parts": []}
    for i in range(args.steps):
        batch = batches[i % len(batches)]
        for name in names[i % len(names):] + names[:i % len(names)]:
            if name == "plain":
                got["plain"].append(_plain_step(plain, batch))
                continue
            timers.take()
            got[name].append(_watched_step(sides[name], batch))
            if name == "watch":
                parts = timers.take()
                got["watch_parts"].append(parts)
                got["watch_host_ms"].append(sum(p["ms"] for p in parts.values()))
    return got


def watch_worker(args) -> dict:
    """Plain, attached and attached-with-watch networks in one process, interleaved (see the module docstring)."""
    loadavg_start = os.getloadavg()
    workdir = os.getcwd()
    net, _ = bc._build(args.seed, graph=args.mode == "graph")
    plain = _loss_scale_wrapper(net)
    sides = {"nowatch": _watched_network(args, False, workdir), "watch": _watched_network(args, True, workdir)}
    if args.cells:  # cell health (docs/watch.md, "Cell health"): every step, and every 10th
        for every in (1, 10):
            sides[f"cells{every}"] = _watched_network(args, {"cells": True, "cells_every": every}, workdir)
    batches = bc._batches(max(args.steps, 4), args.seed)
    for i in range(args.warmup):  # after both attaches: compiles, and recompiles of the hook version
        _plain_step(plain, batches[i])
        for side in sides.values():
            _watched_step(side, batches[i])
    timers = _watch_timers()
    got = _watch_rounds(args, plain, sides, batches, timers)
    timers.restore()
    watch_run = sides["watch"]["callback"]._run
    fired = [f"step {f.step}: {f.rule}" for f in watch_run.watching.watch.fired]
    for side in sides.values():
        side["callback"].on_train_end(side["context"])
    return {"config": "watch", "mode": args.mode, "task": args.task, **_watch_fields(got),
            "fired": fired, "captured_steps": list(watch_run.watching.captured),
            "loadavg_start": loadavg_start, "loadavg_end": os.getloadavg()}


def _watch_fields(got) -> dict:
    """Medians, intervals and ratios of the watch rounds; the per-piece medians of the watch's host time."""
    fields = {f"{name}_ms": got[name] for name in ("plain", "nowatch", "watch", "watch_host_ms", "cells1", "cells10")
              if name in got}
    for name in ("plain", "nowatch", "watch"):
        fields[f"{name}_median_ms"] = stats_mod.median(got[name])
        fields[f"{name}_median_95ci"] = bc._median_interval(got[name])
    fields["watch_host_ms_per_step"] = stats_mod.median(got["watch_host_ms"])
    fields["watch_host_ms_per_step_95ci"] = bc._median_interval(got["watch_host_ms"])
    fields["watch_host_ms_max"] = max(got["watch_host_ms"])
    fields["watch_step_ratio"] = fields["watch_median_ms"] / fields["nowatch_median_ms"]
    fields["watch_step_ratio_95ci"] = bc._ratio_interval(got["watch"], got["nowatch"])
    fields["nowatch_vs_plain_ratio"] = fields["nowatch_median_ms"] / fields["plain_median_ms"]
    fields["nowatch_vs_plain_ratio_95ci"] = bc._ratio_interval(got["nowatch"], got["plain"])
    fields["watch_vs_plain_ratio"] = fields["watch_median_ms"] / fields["plain_median_ms"]
    fields["watch_vs_plain_ratio_95ci"] = bc._ratio_interval(got["watch"], got["plain"])
    fields["watch_parts"] = bc._median_breakdown(got["watch_parts"])
    fields["samples_per_side"] = len(got["watch"])
    for name in ("cells1", "cells10"):  # cell health beside the same attached network without a watch
        if got.get(name):
            fields[f"{name}_median_ms"] = stats_mod.median(got[name])
            fields[f"{name}_step_ratio"] = fields[f"{name}_median_ms"] / fields["nowatch_median_ms"]
            fields[f"{name}_step_ratio_95ci"] = bc._ratio_interval(got[name], got["nowatch"])
    return fields


# ---------------------------------------------------------------------------
# driver side
# ---------------------------------------------------------------------------


def _run_worker(kind: str, mode: str, task: str, args) -> dict:
    """One worker in a fresh interpreter and temp folder; its result, or its error with the log's tail."""
    workdir = tempfile.mkdtemp(prefix=f"bench-cost-{kind}-{mode}-")
    out_json = os.path.join(workdir, "result.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--mode", mode, "--task", task,
           "--size", args.size, "--steps", str(args.steps), "--mem-steps", str(args.mem_steps),
           "--warmup", str(args.warmup), "--seed", str(args.seed), "--result", out_json,
           *(["--cells"] if args.cells else [])]
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("GLOG_v", "3")  # MindSpore: errors only
    log_path = os.path.join(workdir, "worker.log")
    print(f"[cost] {kind} {mode} {task} ...", flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not os.path.exists(out_json):
        with open(log_path) as log:
            result = {"config": kind, "mode": mode, "task": task, "error": f"exit {proc.returncode}",
                      "log_tail": log.read()[-3000:]}
        print(f"[cost] {kind} {mode} {task} FAILED\n{result['log_tail']}", flush=True)
    else:
        with open(out_json) as handle:
            result = json.load(handle)
    result["wall_s"] = time.perf_counter() - t0
    if args.keep:
        result["workdir"] = workdir
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def _median_of(runs, key):
    values = [r[key] for r in runs if "error" not in r and r.get(key) is not None]
    return stats_mod.median(values) if values else None


def _memory_fields(runs) -> dict:
    """The headline fields of one mode and task from its workers (medians over ``--repeat`` runs)."""
    by = {kind: [r for r in runs if r["config"] == kind] for kind in MEM_KINDS}
    plain = _median_of(by["mem_plain"], "peak_rss_mb")
    fields = {
        "plain_peak_rss_mb": plain,
        "attached_unselected_peak_rss_mb": _median_of(by["mem_unselected"], "peak_rss_mb"),
        "attached_selected_peak_rss_mb": _median_of(by["mem_selected"], "peak_rss_mb"),
        "plain_first_step_ms": _median_of(by["mem_plain"], "first_step_ms"),
        "attached_first_unselected_ms": _median_of(by["mem_unselected"], "first_step_ms"),
        "attached_first_unselected_ms_in_selected_run": _median_of(by["mem_selected"], "first_step_ms"),
        "attached_first_selected_ms": _median_of(by["mem_selected"], "first_selected_ms"),
        "plain_later_step_ms": _median_of(by["mem_plain"], "later_unselected_median_ms"),
        "attached_later_unselected_ms": _median_of(by["mem_unselected"], "later_unselected_median_ms"),
        "attached_later_selected_ms": _median_of(by["mem_selected"], "later_selected_median_ms"),
        "attach_ms": _median_of(by["mem_unselected"], "attach_ms"),
        "peak_rss_runs_mb": {kind: [r.get("peak_rss_mb") for r in by[kind]] for kind in MEM_KINDS},
    }
    for side in ("unselected", "selected"):
        value = fields[f"attached_{side}_peak_rss_mb"]
        fields[f"{side}_rss_ratio"] = value / plain if value and plain else None
    fields["ratio"] = fields["unselected_rss_ratio"]  # the 5% target: an attached run that captures nothing
    return fields


def memory_part(args) -> tuple:
    """Every memory worker, ``--repeat`` times, interleaved (plain, unselected, selected per task, per mode)."""
    runs = []
    for _ in range(args.repeat):
        for mode in args.modes:
            runs.append(_run_worker("mem_plain", mode, "statistics", args))
            runs.append(_run_worker("mem_unselected", mode, "statistics", args))
            runs += [_run_worker("mem_selected", mode, task, args) for task in args.tasks]
    summary = {}
    for mode in args.modes:
        for task in args.tasks:
            shared = [r for r in runs if r["mode"] == mode and r["config"] != "mem_selected"]
            own = [r for r in runs if r["mode"] == mode and r["config"] == "mem_selected" and r["task"] == task]
            summary[f"{mode} {task}"] = _memory_fields(shared + own)
    return runs, summary


def _num(value, digits=0, suffix="") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def _ci(interval, digits=2) -> str:
    return f" ({interval[0]:.{digits}f}-{interval[1]:.{digits}f})" if interval else ""


def _memory_table(summary) -> str:
    """Peak RSS per run (ratios to the plain run) and the first steps, one row per mode and selected task."""
    lines = ["| mode, task of the selected run | plain peak RSS MB | attached, unselected MB (x plain) "
             "| attached, selected MB (x plain) | plain first step ms | attached first (unselected) step ms "
             "| first selected step ms | later steps ms: plain / unselected / selected | attach ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key, f in summary.items():
        later = " / ".join(_num(f[k]) for k in ("plain_later_step_ms", "attached_later_unselected_ms",
                                                "attached_later_selected_ms"))
        lines.append(
            f"| {key} | {_num(f['plain_peak_rss_mb'])} "
            f"| {_num(f['attached_unselected_peak_rss_mb'])} (x{_num(f['unselected_rss_ratio'], 3)}) "
            f"| {_num(f['attached_selected_peak_rss_mb'])} (x{_num(f['selected_rss_ratio'], 3)}) "
            f"| {_num(f['plain_first_step_ms'])} | {_num(f['attached_first_unselected_ms'])} "
            f"| {_num(f['attached_first_selected_ms'])} | {later} | {_num(f['attach_ms'])} |")
    return "\n".join(lines)


def _watch_table(results) -> str:
    """The watch against the same attached network without it, and the watch's own host time per step."""
    lines = ["| mode | plain ms | attached, no watch ms | attached, watch ms | watch / no watch (95%) "
             "| no watch / plain (95%) | watch host ms/step, median (95%) | max | samples/side | load start-end "
             "| fired |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['mode']} | FAILED: {r['error']} |" + " |" * 9)
            continue
        load = f"{r['loadavg_start'][0]:.1f}-{r['loadavg_end'][0]:.1f}"
        lines.append(
            f"| {r['mode']} | {r['plain_median_ms']:.1f} | {r['nowatch_median_ms']:.1f} | {r['watch_median_ms']:.1f} "
            f"| {r['watch_step_ratio']:.3f}{_ci(r['watch_step_ratio_95ci'], 3)} "
            f"| {r['nowatch_vs_plain_ratio']:.3f}{_ci(r['nowatch_vs_plain_ratio_95ci'], 3)} "
            f"| {r['watch_host_ms_per_step']:.3f}{_ci(r['watch_host_ms_per_step_95ci'], 3)} "
            f"| {r['watch_host_ms_max']:.3f} | {r['samples_per_side']} | {load} | {', '.join(r['fired']) or 'none'} |")
    cells = [r for r in results if "cells1_step_ratio" in r]
    if cells:
        lines += ["", "| mode | cells every step / no watch (95%) | cells every 10th / no watch (95%) |",
                  "|---|---:|---:|"]
        lines += [f"| {r['mode']} | {r['cells1_step_ratio']:.3f}{_ci(r['cells1_step_ratio_95ci'], 3)} "
                  f"| {r['cells10_step_ratio']:.3f}{_ci(r['cells10_step_ratio_95ci'], 3)} |" for r in cells]
    parts = []
    for r in results:
        for label, row in sorted((r.get("watch_parts") or {}).items(), key=lambda item: -item[1]["ms"]):
            parts.append(f"| {r['mode']} | {label} | {row['ms']:.3f} | {row['calls']:.0f} |")
    if parts:
        lines += ["", "The watch's host time per step by piece (median per step):", "",
                  "| mode | piece | ms/step | calls/step |", "|---|---|---:|---:|"] + parts
    return "\n".join(lines)


def _meta(args) -> dict:
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, CPU only, {platform.platform()}",
        "python": sys.version.split()[0], "versions": bc._versions(sys.executable),
        "model": dict(bc.MODEL, layers="LlamaForCausalLM (legacy)", dtype="float32"), "size": args.size,
        "command": " ".join([sys.executable] + sys.argv), "loadavg_start": os.getloadavg(),
    }


def driver(args) -> int:
    os.makedirs(args.out, exist_ok=True)
    started = datetime.datetime.now()
    meta = _meta(args)
    memory_runs, memory = memory_part(args) if "memory" in args.parts else ([], {})
    watch = [_run_worker("watch", mode, args.task, args) for mode in args.modes] if "watch" in args.parts else []
    meta["loadavg_end"] = os.getloadavg()
    meta["total_wall_s"] = (datetime.datetime.now() - started).total_seconds()
    stamp = started.strftime("%Y%m%d-%H%M%S") + ("" if args.size == "tiny" else f"-{args.size}")
    with open(os.path.join(args.out, f"cost-{stamp}.json"), "w") as handle:
        json.dump({"meta": meta, "memory": memory, "memory_runs": memory_runs, "watch": watch}, handle, indent=1)
    loads = [f"{r['config']} {r['mode']} {r['task']}: {r['loadavg_start'][0]:.1f}-{r['loadavg_end'][0]:.1f}"
             for r in memory_runs if "error" not in r]
    text = "\n".join([
        f"date: {meta['date']}", f"machine: {meta['machine']}", f"versions: {meta['versions']}",
        f"command: {meta['command']}", f"model: {meta['model']}",
        f"load average start/end: {meta['loadavg_start']} / {meta['loadavg_end']}",
        f"total wall: {meta['total_wall_s']:.0f} s", "",
        f"Peak RSS and first steps ({args.mem_steps} steps per run, {args.repeat} run(s) each, one process per run):",
        "", _memory_table(memory) if memory else "(not run)", "",
        "load average (1 min) per memory run, start-end: " + "; ".join(loads), "",
        f"The watch ({args.steps} rounds after {args.warmup} warm-up steps per network):", "",
        _watch_table(watch) if watch else "(not run)", ""])
    with open(os.path.join(args.out, f"cost-{stamp}.txt"), "w") as handle:
        handle.write(text)
    print(text)
    failed = [r for r in memory_runs + watch if "error" in r]
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=tuple(bc.SIZES), default="tiny")
    parser.add_argument("--modes", nargs="+", choices=("graph", "pynative"), default=["graph", "pynative"])
    parser.add_argument("--parts", nargs="+", choices=("memory", "watch"), default=["memory", "watch"])
    parser.add_argument("--tasks", nargs="+", choices=("statistics", "tensor"), default=["statistics", "tensor"],
                        help="memory: the task of the selected runs (the plain and unselected runs are shared)")
    parser.add_argument("--task", choices=("statistics", "tensor"), default="statistics", help="watch: the task")
    parser.add_argument("--mem-steps", type=int, default=10, help="memory: steps per run (at least 5)")
    parser.add_argument("--repeat", type=int, default=1, help="memory: runs of each worker, interleaved")
    parser.add_argument("--steps", type=int, default=30, help="watch: rounds (the samples per side)")
    parser.add_argument("--warmup", type=int, default=2, help="watch: steps per network before the rounds")
    parser.add_argument("--cells", action="store_true",
                        help="watch: also cell health (watch: {cells: true}), every step and every 10th")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for cost-*.json|txt")
    parser.add_argument("--keep", action="store_true", help="keep the workers' temp folders (dumps, logs)")
    parser.add_argument("--worker", choices=MEM_KINDS + ("watch",), help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=("graph", "pynative"), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mem_steps < FIRST_SELECTED + 2:
        parser.error(f"--mem-steps {args.mem_steps}: at least {FIRST_SELECTED + 2} (a first and a later selected "
                     "step)")
    bc._use_size(args.size)
    if not args.worker:
        return driver(args)
    result = watch_worker(args) if args.worker == "watch" else memory_worker(args)
    with open(args.result, "w") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
