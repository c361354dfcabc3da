#!/usr/bin/env python
"""Training-step cost of capture: mf_celldump vs msprobe's own PyNative cell-level (L0) dump.

Model: MindFormers 1.9 legacy ``LlamaForCausalLM`` (batch 2, seq 64, hidden 128, 4 layers,
4 heads, vocab 1000, float32), trained with plain ``mindspore.nn.TrainOneStepCell`` +
``AdamWeightDecay`` in PyNative mode on CPU (no MindFormers wrapper needed). CPU-only
model settings: ``use_rope_slice=True``, ``fused_rms_norm=False``.

Configurations, each in a fresh subprocess (hooks, graphs and msprobe's singleton do not
leak between them), run with the same model, seed and batches:

  baseline          no capture
  mf_tensor         mf_celldump, task tensor, data_mode all (PyNative auto -> tensordump)
  mf_statistics     mf_celldump, task statistics, data_mode all (auto -> device_stats)
  mf_tensor_host    mf_celldump, task tensor, backend host (extra row)
  msprobe_tensor    msprobe 26.2 PrecisionDebugger, level L0, task tensor, data_mode all
  msprobe_statistics  the same, task statistics
  graph_host_tensor       GRAPH_MODE on CPU, mf_celldump backend host, task tensor
  graph_host_statistics   the same, task statistics, float tensors reduced inside the graph
                    (``HostBackend.reduce_in_graph = True``; the default on a device)
  graph_host_statistics_on_host   the same with every tensor handed to the host op and reduced
                    there by numpy (``reduce_in_graph = False``; the default on CPU)
  mf_tensor_fwd, mf_statistics_fwd   as mf_tensor / mf_statistics with data_mode forward:
                    no gradient hooks, to show what the hooks cost

msprobe on CPU: its statistics call ``mint.norm``, which has no CPU kernel in MindSpore 2.9
("The kernel LinalgVectorNorm unregistered"). Inside the msprobe worker processes only,
that one call is replaced by a monkeypatch (see ``_patch_msprobe_norm``); installed files
are not modified.

Every worker builds two networks from the same seed, a plain one and one to capture (attached
for mf_celldump), warms both up (``--warmup`` steps each, then one captured step, excluded),
and runs ``--steps`` rounds (default 30: the samples per side) of three steps in one process:
the plain network, the attached network on an unselected step, the attached network on a
selected step (msprobe's workers have no unselected step). What users pay is measured against
their network without capture: ``unselected_ratio`` = unselected / plain and
``selected_ratio`` = selected / plain, with 95% intervals, and each side's median with its
interval (``plain_median_ms``, ``unselected_median_ms``, ``selected_median_ms``); the load
average is recorded at each worker's start and end. The old ratio, selected / unselected of
the attached network (``interleaved_ratio_95ci``), stays as a breakdown column: in graph mode
before the unselected step ran without capture ops, it hid what attaching cost.
``--unselected-pairs N`` adds, after the rounds, N adjacent pairs of a plain step and an unselected step
far from any selected one, in ABBA order, with their paired ratio (``unselected_run`` in the result).
Both of these unselected ratios carry the build order: the plain network is built and compiled first,
and in one process the first network runs faster (1-5% in graph mode). ``bench/unselected_cost.py``
crosses the order over two processes and is the measure of what an unselected step costs.
mf_celldump workers time the step-path pieces (``_Timers``: backend faces, gradient
hooks, the writer and its thread, ``end_step``) per captured step: the breakdown.
A step's time covers everything the capture adds around it:
``begin_step``/``end_step`` (mf_celldump) or ``start``/``stop``/``step`` (msprobe), the
train step itself and a final synchronisation. Files and bytes written per step are
counted by walking the dump folder after each step, outside the timed region.

A second section (``--section qwen3``, in ``capture_mcore.py``) measures MindFormers' mcore
Qwen3 (same size) in PyNative and Graph mode (host backend), both tasks: in each worker a
network without capture and one with capture run alternately in the same process, and the
ratio of their median step times is reported, with the first step (graph compile) of each.

Usage (from the repository root; runs from a temp dir because importing MindFormers
creates ./output):

    python bench/bench_capture.py            # all configurations, both sections
    python bench/bench_capture.py --section qwen3
    python bench/bench_capture.py --only mf_tensor --profile
    python bench/bench_capture.py --only graph_host_tensor graph_host_statistics --no-micro
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics as stats_mod
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import capture_mcore  # noqa: E402  (the tiny-Qwen3 section, beside this file)

CONFIGS = [
    "baseline",
    "mf_tensor",
    "mf_statistics",
    "mf_tensor_host",
    "msprobe_tensor",
    "msprobe_statistics",
    "graph_host_tensor",
    "graph_host_statistics",
    "graph_host_statistics_on_host",
    "mf_tensor_fwd",
    "mf_statistics_fwd",
]
GRAPH_CONFIGS = ("graph_host_tensor", "graph_host_statistics", "graph_host_statistics_on_host")

MODEL = dict(batch_size=2, seq_length=64, hidden_size=128, num_layers=4, num_heads=4, vocab_size=1000)
# ``--size``: the LLaMA section's model sizes (the same architecture; 16x the bytes per value at "large")
SIZES = {
    "tiny": dict(MODEL),
    "large": dict(batch_size=2, seq_length=256, hidden_size=512, num_layers=4, num_heads=8, vocab_size=1000),
}


def _use_size(name: str) -> None:
    MODEL.clear()
    MODEL.update(SIZES[name])


# ---------------------------------------------------------------------------
# worker side
# ---------------------------------------------------------------------------


def _tree_size(path: str):
    files = 0
    size = 0
    for root, _dirs, names in os.walk(path):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(root, name))
            except OSError:
                continue
            files += 1
    return files, size


def _build(seed: int, graph: bool = False):
    import mindspore as ms
    from mindspore import nn

    ms.set_context(mode=ms.GRAPH_MODE if graph else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(seed)
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        **MODEL,
        use_rope_slice=True,  # CPU: avoids a BatchMatMul broadcast the CPU kernel rejects
        fused_rms_norm=False,  # CPU: fused RmsNorm is Ascend-only
        use_flash_attention=False,
        use_past=False,
        compute_dtype="float32",
        layernorm_compute_type="float32",
        softmax_compute_type="float32",
        rotary_dtype="float32",
        param_init_type="float32",
        checkpoint_name_or_path="",
    )
    net = LlamaForCausalLM(cfg)
    net.set_train(True)
    opt = nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3)
    train = nn.TrainOneStepCell(net, opt)
    train.set_train(True)
    return net, train


def _batches(n: int, seed: int):
    import numpy as np
    from mindspore import Tensor

    rng = np.random.default_rng(seed)
    shape = (MODEL["batch_size"], MODEL["seq_length"] + 1)
    return [Tensor(rng.integers(0, MODEL["vocab_size"], size=shape).astype(np.int32)) for _ in range(n)]


def _sync():
    try:
        from mindspore.graph.api import _pynative_executor  # private, MindSpore 2.9
    except ImportError:
        from mindspore.common.api import _pynative_executor
    _pynative_executor.sync()


def _patch_msprobe_norm():
    """Replace msprobe's ``mint.norm`` statistic with a CPU-capable L2 norm, in this process only.

    msprobe's ``MindsporeDataProcessor.get_stat_info`` looks up
    ``mint.norm if hasattr(mint, "norm") else ops.norm`` through its module's global
    ``mint``; we give that module a proxy of ``mindspore.mint`` whose ``norm`` is
    ``sqrt(sum(x*x))`` (CPU kernels exist for all three ops). Everything else is
    forwarded to the real ``mindspore.mint``.
    """
    from mindspore import mint as real_mint
    from mindspore import ops
    from msprobe.core.dump.data_dump.data_processor import mindspore_processor

    class _MintProxy:
        def __getattr__(self, name):
            return getattr(real_mint, name)

        @staticmethod
        def norm(x, *args, **kwargs):
            return ops.sqrt((x * x).sum())

    mindspore_processor.mint = _MintProxy()
    return "msprobe.core.dump.data_dump.data_processor.mindspore_processor.mint.norm -> ops.sqrt((x*x).sum())"


class _NoCapture:
    def begin(self, step):
        pass

    def end(self):
        pass

    def close(self):
        pass


class _MfCapture:
    def __init__(self, train, dump_path, task, backend=None, steps=None, data_mode="all"):
        import mf_celldump

        config = {"dump_path": dump_path, "task": task, "data_mode": data_mode}
        if backend:
            config["backend"] = backend
        if steps is not None:
            config["steps"] = ",".join(str(step) for step in steps)
        self.dump = mf_celldump.attach(train, config)
        self.backend = self.dump.backend.name
        self.cells = len(self.dump.cells)

    def begin(self, step):
        self.dump.begin_step(step)

    def end(self):
        self.dump.end_step()

    def close(self):
        self.dump.detach()


class _MsprobeCapture:
    def __init__(self, net, dump_path, task, workdir):
        self.patch = _patch_msprobe_norm()
        from msprobe.mindspore import PrecisionDebugger

        config = {
            "task": task,
            "dump_path": dump_path,
            "rank": [],
            "step": [],
            "level": "L0",
            "async_dump": False,
            "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
            "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
        }
        config_path = os.path.join(workdir, "msprobe_config.json")
        with open(config_path, "w") as handle:
            json.dump(config, handle)
        self.debugger = PrecisionDebugger(config_path=config_path)
        self.net = net
        self.backend = "msprobe PrecisionDebugger L0"
        self.cells = None

    def begin(self, step):
        self.debugger.start(model=self.net)

    def end(self):
        self.debugger.stop()
        self.debugger.step()

    def close(self):
        pass


class _Timers:
    """Wall time spent inside chosen functions, summed per step (the breakdown of a captured step).

    Patches class attributes (before attach, so bound methods captured by the wrapper and
    the gradient hooks are the timed ones) and module functions. Nested timed calls are
    counted in both (e.g. ``writer.write_tensor`` inside ``HostBackend._emit``). Calls from
    MindSpore's own threads (graph-mode pyfunc ops) are counted too.
    """

    def __init__(self):
        import threading

        self.totals = {}
        self.calls = {}
        self._lock = threading.Lock()
        self._undo = []

    def wrap(self, owner, attr: str, label: str) -> None:
        import functools

        if not hasattr(owner, attr):  # an older version of the code (before/after comparisons)
            return
        original = getattr(owner, attr)
        timers = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
                with timers._lock:
                    timers.totals[label] = timers.totals.get(label, 0.0) + elapsed
                    timers.calls[label] = timers.calls.get(label, 0) + 1

        setattr(owner, attr, timed)
        self._undo.append((owner, attr, original))

    def take(self) -> dict:
        """Milliseconds and calls per label since the last take."""
        with self._lock:
            out = {label: {"ms": self.totals[label] * 1000.0, "calls": self.calls[label]} for label in self.totals}
            self.totals, self.calls = {}, {}
        return out

    def restore(self) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)


def _install_timers(task: str, graph: bool) -> _Timers:
    """Timers around mf_celldump's step-path pieces (backend faces, hooks, writer, end of step)."""
    from mf_celldump.capture.backends import device_stats, gradient_hooks, host, tensordump
    from mf_celldump.capture.session import CellDump
    from mf_celldump.rawformat import npy_files, writer

    if os.environ.get("BENCH_WRITER_INLINE") == "1":  # compare: every write in the capture op
        writer.RawWriter.background = False
    timers = _Timers()
    timers.wrap(CellDump, "end_step", "end_step (sync, flush, marker)")
    timers.wrap(writer.RawWriter, "write_tensor", "writer.write_tensor (hand-over)")
    timers.wrap(npy_files.NpyFileWriter, "write", "NpyFileWriter.write (open + writev + rename, writer thread)")
    timers.wrap(writer.RawWriter, "append_record", "writer.append_record (hand-over)")
    timers.wrap(writer.RawWriter, "_append_line", "writer._append_line (writer thread)")
    timers.wrap(writer.RawWriter, "_mark_complete", "writer._mark_complete (records closed, marker; writer thread)")
    timers.wrap(writer.RawWriter, "write_tensordump_files", "writer.write_tensordump_files (hand-over, one per flush)")
    timers.wrap(writer.RawWriter, "flush", "writer.flush (wait for the writer thread)")
    timers.wrap(gradient_hooks.GradientHookCache, "apply", "gradient hook applied (forward side)")
    if hasattr(gradient_hooks.GradientHookCache, "apply_many"):  # one hook per call for its inputs
        timers.wrap(gradient_hooks.GradientHookCache, "apply_many", "inputs' gradient hook applied (one per call)")
    if graph or task == "host":
        timers.wrap(host.HostBackend, "_emit", "HostBackend._emit (inside the capture op)")
        timers.wrap(host.HostBackend, "_emit_reduced", "HostBackend._emit_reduced (inside the statistics op)")
        timers.wrap(host, "compute_statistics", "statistics.compute_statistics (inside the capture op)")
        timers.wrap(host.HostPyNative, "forward", "HostPyNative.forward")
    elif task == "tensor":
        timers.wrap(tensordump.TensorDumpPyNative, "forward", "TensorDumpPyNative.forward (queue)")
        timers.wrap(tensordump.TensorDumpPyNative, "_dump_gradient", "gradient hook fired (queue)")
        timers.wrap(tensordump.TensorDumpPyNative, "flush", "TensorDumpPyNative.flush (TensorDump calls)")
    else:
        timers.wrap(device_stats.DeviceStatsPyNative, "forward", "DeviceStatsPyNative.forward (queue)")
        timers.wrap(device_stats.DeviceStatsBackend, "flush", "DeviceStatsBackend.flush (statistics, records)")
    return timers


def _timed_steps(train, batches, capture, first_step, count, dump_path, record, timers=None, stride=1,
                 breakdown=None):
    times = []
    per_step_files = []
    per_step_bytes = []
    losses = []
    for i in range(count):
        step = first_step + i * stride
        before = _tree_size(dump_path) if dump_path else (0, 0)
        if timers is not None:
            timers.take()
        t0 = time.perf_counter()
        capture.begin(step)
        loss = train(batches[step % len(batches)])
        value = float(loss.asnumpy())
        _sync()
        capture.end()
        elapsed = time.perf_counter() - t0
        if timers is not None and breakdown is not None and record:
            breakdown.append(timers.take())
        after = _tree_size(dump_path) if dump_path else (0, 0)
        if record:
            times.append(elapsed * 1000.0)
            per_step_files.append(after[0] - before[0])
            per_step_bytes.append(after[1] - before[1])
            losses.append(value)
    return times, per_step_files, per_step_bytes, losses


def _raw_step_sizes(dump_path: str):
    """(files, bytes) of every raw step folder, once the capture is detached. The writer's thread writes a
    step's files beside the next step, so a count taken right after ``end_step`` would miss some."""
    raw = os.path.join(dump_path, "_raw", "rank0")
    folders = [os.path.join(raw, d) for d in os.listdir(raw) if d.startswith("step")]
    sizes = [_tree_size(folder) for folder in folders]
    return [f for f, _ in sizes], [b for _, b in sizes]


def _composition(dump_path: str):
    """What one captured step of mf_celldump held: forward tensors, forward non-tensor values, gradients."""
    from collections import Counter

    raw = os.path.join(dump_path, "_raw", "rank0")
    steps = sorted(
        (d for d in os.listdir(raw) if d.startswith("step")), key=lambda d: int(d[4:].split(".")[0])
    )
    folder = os.path.join(raw, steps[-1])
    counts = Counter()
    for file_name in os.listdir(folder):
        parts = file_name.split(".")
        if file_name.endswith(".npy") and len(parts) > 4:
            counts[f"{parts[1]}.{'tensor' if parts[3] == 't' else 'value'}.file"] += 1
        elif file_name.endswith(".jsonl"):
            with open(os.path.join(folder, file_name)) as handle:
                for line in handle:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    kind = "tensor" if record.get("kind") == "t" else "value"
                    counts[f"{record.get('dir', '?')[0]}.{kind}.record"] += 1
    return dict(sorted(counts.items()))


def _median_breakdown(per_step: list) -> dict:
    """Median milliseconds and calls per label over the measured captured steps."""
    labels = sorted({label for step in per_step for label in step})
    out = {}
    for label in labels:
        values = [step.get(label, {"ms": 0.0, "calls": 0}) for step in per_step]
        out[label] = {"ms": stats_mod.median(v["ms"] for v in values),
                      "calls": stats_mod.median(v["calls"] for v in values)}
    return out


def _worker_capture(name: str, args, net, train, step: int, workdir: str):
    """What worker ``name`` measures with: (capture, dump path or None, timers or None)."""
    dump_path = os.path.join(workdir, "dump")
    if name == "baseline":
        return _NoCapture(), None, None
    task = "tensor" if "tensor" in name else "statistics"
    if not name.startswith("mf_"):
        return _MsprobeCapture(net, dump_path, task, workdir), dump_path, None
    backend = "host" if name.endswith("_host") else None
    timers = _install_timers("host" if backend else task, graph=False)
    # Captured steps alternate with uncaptured ones (selection), so both see the same load.
    selected = [step] + [step + 2 + 2 * i for i in range(args.steps)]
    data_mode = "forward" if name.endswith("_fwd") else "all"
    return _MfCapture(train, dump_path, task, backend, steps=selected, data_mode=data_mode), dump_path, timers


def _switch_interval_experiment() -> None:
    """``MF_BENCH_SWITCH_INTERVAL`` (seconds): the interpreter's GIL switch interval for this worker, to see
    how much of the writer thread's time inside a step is waiting for the lock (default 0.005)."""
    if os.environ.get("MF_BENCH_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["MF_BENCH_SWITCH_INTERVAL"]))


def _rounds(args, plain, train, batches, capture, first: int, timers, dump) -> dict:
    """``args.steps`` rounds, each: the plain network, the attached network on an unselected step
    (``first`` + 2i), the attached network on a selected step (``first`` + 2i + 1; under cProfile
    with ``--profile``). Interleaved, so the three sides see the same load."""
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    nocap = _NoCapture()
    got = {"plain": [], "unselected": [], "times": [], "files": [], "nbytes": [], "losses": [], "breakdown": []}
    step = first
    for _ in range(args.steps):
        got["plain"] += _timed_steps(plain, batches, nocap, step, 1, None, True)[0]
        if timers is not None:  # mf_celldump: an unselected step of the attached network
            got["unselected"] += _timed_steps(train, batches, capture, step, 1, dump, True)[0]
        if profiler is not None:
            profiler.enable()
        one = _timed_steps(train, batches, capture, step + 1, 1, dump, True, timers, breakdown=got["breakdown"])
        if profiler is not None:
            profiler.disable()
        for field_name, part in zip(("times", "files", "nbytes", "losses"), one):
            got[field_name] += part
        step += 2
    if profiler is not None:
        profiler.dump_stats(args.profile_out)
    return got


def _median_interval(values, rounds: int = 2000):
    """95% bootstrap interval of the median of ``values`` (None with under 8 of them)."""
    import numpy as np

    if len(values) < 8:
        return None
    rng = np.random.default_rng(0)
    data = np.asarray(values, dtype=float)
    medians = np.median(data[rng.integers(0, len(data), (rounds, len(data)))], axis=1)
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def _what_users_pay(plain, unselected, selected) -> dict:
    """The headline fields: the plain network's, an unselected step's and a selected step's median with
    their intervals, and the two ratios against the plain network (the steps of one process, interleaved)."""
    fields = {}
    for name, values in (("plain", plain), ("unselected", unselected), ("selected", selected)):
        fields[f"{name}_ms"] = values
        fields[f"{name}_median_ms"] = stats_mod.median(values) if values else None
        fields[f"{name}_median_95ci"] = _median_interval(values) if values else None
    for name, values in (("unselected", unselected), ("selected", selected)):
        ok = values and plain
        fields[f"{name}_ratio"] = stats_mod.median(values) / stats_mod.median(plain) if ok else None
        fields[f"{name}_ratio_95ci"] = _ratio_interval(values, plain) if ok else None
    fields["samples_per_side"] = min(len(v) for v in (plain, unselected, selected) if v)
    return fields


def _unselected_run(pairs: int, plain, train, batches, capture, dump_path) -> dict:
    """``pairs`` pairs of steps with no selected step anywhere near: the plain network and the attached
    network on an unselected step, adjacent, in ABBA order (plain first in even pairs, attached first in odd
    ones) so that neither side always follows the other.

    The rounds before it put a selected step right before each plain one, and at the large size the writer
    thread is still writing that step's files when the plain step runs (the plain step is slowed, the
    unselected ratio flattered). Here the raw files are flushed to disk first (``os.sync``) and the step
    numbers are far past every selected one, as the 99,997 unselected steps of a long run are. The ratio is
    paired: the median of each pair's attached / plain, with its bootstrap interval, so that the load's
    drift over minutes, which moves both steps of a pair alike, does not widen it."""
    import numpy as np

    if pairs <= 0:
        return {}
    os.sync()
    time.sleep(2.0)  # the writer thread's last files, and the kernel's writeback of them
    nocap = _NoCapture()
    far = 10**6  # no selected step is near: the selection lists stop at a few hundred
    plain_ms, attached_ms = [], []
    for i in range(pairs):
        step = far + i
        order = ((plain, nocap, plain_ms), (train, capture, attached_ms))
        for net, cap, out in order if i % 2 == 0 else order[::-1]:
            out += _timed_steps(net, batches, cap, step, 1, None, True)[0]
    ratios = np.asarray(attached_ms) / np.asarray(plain_ms)
    return {
        "pairs": pairs,
        "plain_ms": plain_ms,
        "unselected_ms": attached_ms,
        "plain_median_ms": float(np.median(plain_ms)),
        "unselected_median_ms": float(np.median(attached_ms)),
        "paired_ratio": float(np.median(ratios)),
        "paired_ratio_95ci": _median_interval(ratios),
        "ratio_of_medians": float(np.median(attached_ms) / np.median(plain_ms)),
        "ratio_of_medians_95ci": _ratio_interval(attached_ms, plain_ms),
        "loadavg_end": os.getloadavg(),
    }


def worker(args) -> dict:
    """PyNative: a plain network and an attached one built from the same seed, in one process, measured in
    rounds (``_rounds``); msprobe's workers have no unselected step (every step of theirs is captured)."""
    import mindspore  # noqa: F401  -- before msprobe (protobuf descriptor order)

    name = args.worker
    workdir = os.getcwd()
    loadavg_start = os.getloadavg()
    _switch_interval_experiment()
    net, train = _build(args.seed)
    _net_plain, plain = _build(args.seed)
    batches = _batches(args.warmup + 2 * args.steps + 2, args.seed)
    _timed_steps(plain, batches, _NoCapture(), 0, args.warmup, None, False)
    _timed_steps(train, batches, _NoCapture(), 0, args.warmup, None, False)
    step = args.warmup
    capture, dump, timers = _worker_capture(name, args, net, train, step, workdir)
    _timed_steps(train, batches, capture, step, 1, dump, False)  # captured warm-up
    if name == "baseline":  # the plain network against itself: what noise alone gives
        capture, train = _NoCapture(), plain
    got = _rounds(args, plain, train, batches, capture, step + 1, timers, dump)
    far = _unselected_run(args.unselected_pairs, plain, train, batches, capture, dump) if timers else {}
    capture.close()
    if timers is not None:
        timers.restore()
    if name.startswith("mf_"):
        got["files"], got["nbytes"] = _raw_step_sizes(os.path.join(workdir, "dump"))
    times, interleaved = got["times"], got["unselected"]
    result = {
        "config": name,
        "backend": getattr(capture, "backend", None),
        "cells": getattr(capture, "cells", None),
        **_what_users_pay(got["plain"], interleaved, times),
        "step_ms": times,
        "median_ms": stats_mod.median(times),
        "min_ms": min(times),
        "inproc_baseline_ms": got["plain"],
        "inproc_baseline_median_ms": stats_mod.median(got["plain"]),
        "files_per_step": got["files"],
        "bytes_per_step": got["nbytes"],
        "losses": got["losses"],
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
        "captured_per_step": _composition(os.path.join(workdir, "dump")) if name.startswith("mf_") else None,
        "interleaved_uncaptured_ms": interleaved,
        "interleaved_uncaptured_median_ms": stats_mod.median(interleaved) if interleaved else None,
        "breakdown": _median_breakdown(got["breakdown"]),
        "interleaved_ratio_95ci": _ratio_interval(times, interleaved),
        "unselected_run": far,
    }
    if isinstance(capture, _MsprobeCapture):
        result["msprobe_patch"] = capture.patch
    return result


def graph_worker(args) -> dict:
    """Graph mode (CPU, ``backend: host``): a plain compiled network and a captured one, same process.

    Both are built from the same seed and trained on the same batches, in rounds of three
    steps: the plain network, the captured network on an unselected step (the capture ops
    are compiled in and return at once), the captured network on a selected step.
    """
    name = args.worker
    task = "tensor" if "tensor" in name else "statistics"
    dump_path = os.path.join(os.getcwd(), "dump")
    loadavg_start = os.getloadavg()
    _switch_interval_experiment()
    _net_plain, plain = _build(args.seed, graph=True)
    _net_cap, train = _build(args.seed, graph=True)
    batches = _batches(args.warmup + 2 * args.steps + 2, args.seed)
    timers = _install_timers(task, graph=True)
    if task == "statistics":  # where the statistics are reduced (on CPU the default is on the host)
        from mf_celldump.capture.backends.host import HostBackend

        HostBackend.reduce_in_graph = not name.endswith("_on_host")
    first = 1  # the captured network's step 0 is an uncaptured warm-up (compiles the graph)
    selected = [first + 2 * i for i in range(args.steps + 1)]
    capture = _MfCapture(train, dump_path, task, "host", steps=selected)
    nocap = _NoCapture()
    t0 = time.perf_counter()
    _timed_steps(plain, batches, nocap, 0, args.warmup, None, False)
    compile_plain_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _timed_steps(train, batches, capture, 0, 2, dump_path, False)  # step 0 unselected, step 1 captured
    compile_captured_s = time.perf_counter() - t0
    plain_ms, unselected_ms, times, files, nbytes, losses, breakdown = [], [], [], [], [], [], []
    step = 2
    for _ in range(args.steps):
        plain_ms += _timed_steps(plain, batches, nocap, step, 1, None, True)[0]
        unselected_ms += _timed_steps(train, batches, capture, step, 1, dump_path, True)[0]
        one = _timed_steps(train, batches, capture, step + 1, 1, dump_path, True, timers, breakdown=breakdown)
        for total, part in zip((times, files, nbytes, losses), one):
            total += part
        step += 2
    far = _unselected_run(args.unselected_pairs, plain, train, batches, capture, dump_path)
    capture.close()
    timers.restore()
    files, nbytes = _raw_step_sizes(dump_path)
    floor = _write_floor(dump_path) if task == "tensor" else None
    if floor is not None:
        floor["beside_training"] = _write_floor_beside_training(
            dump_path, lambda n: _timed_steps(plain, batches, nocap, n, 1, None, True)[0][0])
    return {
        "write_floor": floor,
        "config": name,
        "backend": capture.backend,
        "cells": capture.cells,
        **_what_users_pay(plain_ms, unselected_ms, times),
        "step_ms": times,
        "median_ms": stats_mod.median(times),
        "min_ms": min(times),
        "inproc_baseline_ms": plain_ms,
        "inproc_baseline_median_ms": stats_mod.median(plain_ms),
        "interleaved_uncaptured_ms": unselected_ms,
        "interleaved_uncaptured_median_ms": stats_mod.median(unselected_ms),
        "interleaved_ratio_95ci": _ratio_interval(times, unselected_ms),
        "files_per_step": files,
        "bytes_per_step": nbytes,
        "losses": losses,
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
        "captured_per_step": _composition(dump_path),
        "breakdown": _median_breakdown(breakdown),
        "unselected_run": far,
        "first_steps_s": {"plain (compile + warm-up)": compile_plain_s,
                          "captured (compile + 1 uncaptured + 1 captured)": compile_captured_s},
    }


def _last_step_arrays(dump_path: str) -> list:
    """The arrays of the last raw step's ``.npy`` files (what one captured step wrote)."""
    import numpy as np

    raw = os.path.join(dump_path, "_raw", "rank0")
    folders = sorted((d for d in os.listdir(raw) if d.startswith("step")), key=lambda d: int(d[4:]))
    folder = os.path.join(raw, folders[-1])
    return [np.load(os.path.join(folder, n)) for n in sorted(os.listdir(folder)) if n.endswith(".npy")]


def _write_floor(dump_path: str, rounds: int = 5) -> dict:
    """The floor of writing one captured step: the same bytes (the last raw step's ``.npy`` files, loaded
    untimed) written by a plain loop of ``np.save`` into new folders of the same dump (same disk), and, in
    the same rounds, by our raw writer alone (nothing else running).

    The folders are kept until every round is done, as a run keeps its raw steps: the first round
    of a few hundred MB goes to free page cache and is several times faster than the rounds after
    it, which pay what a run writing step after step pays (the kernel's writeback). The floor is
    the median of the rounds after the first; the first is reported beside it.
    """
    import numpy as np

    from mf_celldump.rawformat.npy_files import NpyFileWriter, numpy_data, numpy_header

    arrays = _last_step_arrays(dump_path)
    target = os.path.join(dump_path, "floor")
    shutil.rmtree(target, ignore_errors=True)
    ours, saved = [], []
    for r in range(rounds):
        for label, times in (("np.save", saved), ("ours", ours)):
            here = os.path.join(target, f"{label}-{r}")
            os.makedirs(here)
            writer = NpyFileWriter()
            t0 = time.perf_counter()
            for i, array in enumerate(arrays):
                path = os.path.join(here, f"{i}.npy")
                if label == "ours":
                    writer.write(path, [numpy_header(array), numpy_data(array)])
                else:
                    np.save(path, array, allow_pickle=False)
            times.append((time.perf_counter() - t0) * 1000.0)
    shutil.rmtree(target, ignore_errors=True)
    return {"files": len(arrays), "bytes": int(sum(a.nbytes for a in arrays)), "ms": stats_mod.median(saved[1:]),
            "all_ms": saved, "ours_alone_ms": stats_mod.median(ours[1:]), "ours_all_ms": ours}


def _write_floor_beside_training(dump_path: str, plain_step) -> dict:
    """The same bytes written by a plain ``np.save`` loop on a thread while the plain network trains (as the
    writer thread writes beside a captured step, sharing the cores with training): the loop's time, the
    plain steps that ran meanwhile and their median time."""
    import threading

    import numpy as np

    arrays = _last_step_arrays(dump_path)
    target = os.path.join(dump_path, "floor-beside")
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    result = {}

    def save():
        t0 = time.perf_counter()
        for i, array in enumerate(arrays):
            np.save(os.path.join(target, f"{i}.npy"), array, allow_pickle=False)
        result["ms"] = (time.perf_counter() - t0) * 1000.0

    thread = threading.Thread(target=save)
    steps = []
    thread.start()
    while thread.is_alive():
        steps.append(plain_step(len(steps)))
    thread.join()
    shutil.rmtree(target, ignore_errors=True)
    return {"ms": result["ms"], "plain_steps": len(steps), "plain_step_ms": stats_mod.median(steps)}


# ---------------------------------------------------------------------------
# per-call costs (the "micro" worker): where capture time goes per captured value
# ---------------------------------------------------------------------------


HOOK_MODES = (
    "none",
    "DumpGradient (TensorDumpBackend.pynative_backward)",
    "InsertGradientOf(closure) + device stats (DeviceStatsBackend.pynative_backward)",
    "InsertGradientOf(new identity closure per call)",
    "one InsertGradientOf per key, cached across steps, hook keeps grad",
    "Tensor.register_hook(fn) keeping grad",
)


class _Micro:
    """The micro worker's rows (min and median microseconds per call), printed as they come."""

    def __init__(self):
        self.rows = []

    def add(self, label: str, low: float, med: float) -> None:
        self.rows.append({"what": label, "min_us": low, "median_us": med})
        print(f"{label:86s} min {low:9.1f} us  median {med:9.1f} us", flush=True)

    def bench(self, label, fn, n=200, per=1) -> None:
        fn(0)
        _sync()
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t0) * 1e6 / per)
        _sync()
        self.add(label, min(times), stats_mod.median(times))


class _MicroSubjects:
    """mf_celldump's real PyNative backends with real writers, and the tensor they are timed on."""

    def __init__(self, root: str):
        import numpy as np
        from mindspore import Tensor

        from mf_celldump.capture.backends.device_stats import DeviceStatsBackend
        from mf_celldump.capture.backends.host import HostBackend
        from mf_celldump.capture.backends.tensordump import TensorDumpBackend

        shape = (MODEL["batch_size"], MODEL["seq_length"], MODEL["hidden_size"])
        self.x = Tensor(np.random.default_rng(0).random(shape).astype(np.float32))
        self.td_raw, self.td, self.writer = self._backend(TensorDumpBackend, "tensor", os.path.join(root, "td"))
        _, self.stats, _ = self._backend(DeviceStatsBackend, "statistics", os.path.join(root, "stats"))
        _, self.host, _ = self._backend(HostBackend, "tensor", os.path.join(root, "host"))
        self.step_dir = self.writer.step_dir(5)
        _sync()

    @staticmethod
    def _backend(cls, task, root):
        from mf_celldump.capture.backends import BackendContext
        from mf_celldump.capture.runtime import CaptureRuntime
        from mf_celldump.config import DumpConfig
        from mf_celldump.rawformat.writer import RawWriter

        config = DumpConfig.coerce({"dump_path": root, "task": task, "data_mode": "all"})
        runtime = CaptureRuntime(rank_selected=True)
        writer = RawWriter(root, 0, "micro")
        writer.prepare_step(5)
        runtime.start_step(5, True)
        backend = cls(BackendContext(config, runtime, writer))
        backend.setup(5)
        return backend, backend.pynative(), writer

    @staticmethod
    def key(i, direction=None, kind=None):
        from mf_celldump.rawformat.keys import FORWARD, KIND_TENSOR, SLOT_OUTPUT, ProbeKey

        return ProbeKey(i % 97, direction or FORWARD, SLOT_OUTPUT, kind or KIND_TENSOR, (0,), i)


def _hook_function(mode: str, subjects: _MicroSubjects, kept: list, per_key: dict):
    """``hook(h, j) -> h``: one way of hooking the gradient of link ``j`` of the chain."""
    from mindspore import ops

    from mf_celldump.rawformat.keys import BACKWARD

    def keep(g):
        kept.append(g)
        return g

    def hook(h, j):
        if mode == HOOK_MODES[1]:
            return subjects.td.backward(h, subjects.key(j, BACKWARD), "out")
        if mode == HOOK_MODES[2]:
            return subjects.stats.backward(h, subjects.key(j, BACKWARD), "out")
        if mode == HOOK_MODES[3]:

            def identity(g):
                return g

            return ops.InsertGradientOf(identity)(h)
        if mode == HOOK_MODES[4]:
            if j not in per_key:
                per_key[j] = ops.InsertGradientOf(keep)
            return per_key[j](h)
        if mode == HOOK_MODES[5]:
            h.register_hook(lambda g: kept.append(g))
        return h

    return hook


def _micro_hooks(micro: _Micro, subjects: _MicroSubjects, links: int = 50) -> None:
    """Backward: the extra cost per hooked tensor, in a chain of ``links`` multiplications."""
    import mindspore as ms
    import numpy as np
    from mindspore import Parameter, Tensor, nn

    kept, per_key, base = [], {}, None
    hidden = MODEL["hidden_size"]

    class Chain(nn.Cell):
        def __init__(self, hook):
            super().__init__()
            self.hook = hook
            self.w = Parameter(Tensor(np.ones((hidden,), np.float32)), name="w")

        def construct(self, inp):
            h = inp
            for j in range(links):
                h = self.hook(h * self.w, j)
            return h.sum()

    for mode in HOOK_MODES:
        net = Chain(_hook_function(mode, subjects, kept, per_key))
        grad_fn = ms.value_and_grad(net, grad_position=None, weights=net.trainable_params())
        times = []
        for rep in range(12):
            kept.clear()
            t0 = time.perf_counter()
            _loss, grads = grad_fn(subjects.x)
            grads[0].asnumpy()
            _sync()
            if rep >= 2:
                times.append((time.perf_counter() - t0) * 1e6 / links)
        low, med = min(times), stats_mod.median(times)
        if base is None:
            base = low
            micro.add(f"fwd+bwd of a {links}-link chain (mul per link), no hook: per link", low, med)
        else:
            micro.add(f"  + hook per link: {mode}: EXTRA per hooked tensor", low - base, med - base)


def _micro_tensordump_path(micro: _Micro, subjects: _MicroSubjects) -> None:
    """Forward pieces of the tensor task: the writer, queued ops, syncs, TensorDump."""
    from mf_celldump.rawformat.keys import BACKWARD, KIND_NONE

    x, writer, td, step_dir, key = subjects.x, subjects.writer, subjects.td, subjects.step_dir, subjects.key
    dump_out = subjects.td_raw.primitives.dump_out
    micro.bench("writer.step_dir(step) = fsutil.safe_join (2x realpath), once per value", lambda i: writer.step_dir(5))
    micro.bench("x * x queued (pyboost launch only)", lambda i: x * x)
    micro.bench("x * x then _pynative_executor.sync()  (= cost of one sync)", lambda i: (x * x, _sync()), n=100)
    micro.bench("x * x, 200 queued then one sync (amortised per op)",
                lambda i: ([x * x for _ in range(200)], _sync()), n=5, per=200)
    micro.bench("ops.TensorDump()(path, x), x already computed (write only)",
                lambda i: dump_out(os.path.join(step_dir, f"w{i}"), x))
    micro.bench("y = x * x; TensorDump(path, y) (waits for y: sync + write)",
                lambda i: dump_out(os.path.join(step_dir, f"s{i}"), x * x), n=100)
    micro.bench("TensorDumpPyNative.forward(x) [mf_celldump, computed x: queued, dumped at end of step]",
                lambda i: td.forward(x, key(i), "out"))
    micro.bench("TensorDumpPyNative.forward(None) [non-tensor value -> Tensor(0), queued]",
                lambda i: td.forward(None, key(i, kind=KIND_NONE), "out"))
    micro.bench("TensorDumpPyNative.backward(x) fwd side [cached InsertGradientOf per key]",
                lambda i: td.backward(x, key(i, BACKWARD), "out"), n=100)


def _micro_statistics_path(micro: _Micro, subjects: _MicroSubjects) -> None:
    """Forward pieces of the statistics task and of the host backend, with the alternatives they replaced."""
    import io

    import numpy as np
    from mindspore import ops

    from mf_celldump.fsutil import atomic_write_bytes, safe_join
    from mf_celldump.rawformat.keys import BACKWARD
    from mf_celldump.statistics import compute_statistics

    x, stats, host, step_dir, key = subjects.x, subjects.stats, subjects.host, subjects.step_dir, subjects.key
    micro.bench("DeviceStatsPyNative.forward(x) [mf_celldump, computed x: queued]",
                lambda i: stats.forward(x, key(i), "out"))
    micro.bench("  for comparison: ops.stack of 4 computed 0-d tensors (old-style primitive; before the queue)",
                lambda i: ops.stack([x.max(), x.min(), x.mean(), x.sum()]), n=100)
    micro.bench("  for comparison: max,min,mean,sqrt(sum(x*x)) queued (launch only)",
                lambda i: [x.max(), x.min(), x.mean(), ops.sqrt((x * x).sum())])
    micro.bench("  the same 4 reductions, 50 queued then one sync (amortised per tensor)",
                lambda i: ([[x.max(), x.min(), x.mean(), ops.sqrt((x * x).sum())] for _ in range(50)], _sync()),
                n=5, per=50)
    micro.bench("DeviceStatsPyNative.backward(x) fwd side [cached InsertGradientOf per key]",
                lambda i: stats.backward(x, key(i, BACKWARD), "out"), n=100)
    micro.bench("alternative: x.asnumpy() + statistics.compute_statistics (numpy), computed x",
                lambda i: compute_statistics(x.asnumpy(), ("max", "min", "mean", "norm")))
    micro.bench("HostPyNative.forward(x) [pyfunc Custom op, hands the array to the writer thread]",
                lambda i: (host.forward(x, key(i), "out"), _sync()), n=100)

    def save_fsync(i):
        buffer = io.BytesIO()
        np.save(buffer, x.asnumpy(), allow_pickle=False)
        atomic_write_bytes(safe_join(step_dir, f"h{i}.npy"), buffer.getvalue())

    micro.bench("  for comparison: asnumpy + np.save to bytes + atomic_write_bytes with fsync (before the writer "
                "thread)", save_fsync, n=100)
    micro.bench("  compare: np.save(path, x.asnumpy()) (no fsync)",
                lambda i: np.save(os.path.join(step_dir, f"n{i}.npy"), x.asnumpy(), allow_pickle=False), n=100)


def micro_worker(args) -> dict:
    """Per-call cost of each piece of mf_celldump's PyNative capture, on one activation-sized tensor.

    Uses mf_celldump's real backends (TensorDump, device_stats, host) with a real writer,
    plus the MindSpore primitives they call, on a float32 tensor of shape
    (batch 2, seq 64, hidden 128) = 64 KiB. Reports min and median microseconds per call
    (min is the figure least disturbed by other load on the machine).
    """
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    micro = _Micro()
    subjects = _MicroSubjects(os.path.join(os.getcwd(), "micro"))
    _micro_hooks(micro, subjects)
    _micro_tensordump_path(micro, subjects)
    _micro_statistics_path(micro, subjects)
    return {"config": "micro", "rows": micro.rows, "loadavg_end": os.getloadavg()}


# ---------------------------------------------------------------------------
# driver side
# ---------------------------------------------------------------------------


def _versions(python: str) -> dict:
    code = (
        "import json, importlib.metadata as m; print(json.dumps({k: m.version(k) for k in "
        "('mindspore', 'mindformers', 'mindstudio-probe', 'numpy')}))"
    )
    try:
        return json.loads(subprocess.check_output([python, "-c", code], text=True))
    except Exception as err:  # noqa: BLE001 - informational only
        return {"error": str(err)}


def _run_worker(name: str, args) -> dict:
    workdir = tempfile.mkdtemp(prefix=f"bench-capture-{name}-")
    out_json = os.path.join(workdir, "result.json")
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        name,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--unselected-pairs",
        str(args.unselected_pairs),
        "--seed",
        str(args.seed),
        "--size",
        args.size,
        "--result",
        out_json,
    ]
    if args.profile and name != "micro":
        profile_dir = os.path.join(tempfile.gettempdir(), "bench-capture-profiles")
        os.makedirs(profile_dir, exist_ok=True)
        profile_out = os.path.join(profile_dir, f"{name}.prof")
        cmd += ["--profile", "--profile-out", profile_out]
        print(f"[bench] cProfile of {name}'s measured steps -> {profile_out}", flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("GLOG_v", "3")  # MindSpore: errors only
    log_path = os.path.join(workdir, "worker.log")
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not os.path.exists(out_json):
        with open(log_path) as log:
            tail = log.read()[-3000:]
        result = {"config": name, "error": f"exit {proc.returncode}", "log_tail": tail}
    else:
        with open(out_json) as handle:
            result = json.load(handle)
    result["wall_s"] = wall
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        result["workdir"] = workdir
    return result


def _ratio_interval(captured, uncaptured, rounds: int = 2000):
    """95% bootstrap interval of median(captured) / median(uncaptured), or None with under 8 steps each.

    Step times on 2 cores vary by a factor of two within a run, so a ratio of two medians
    is only worth its interval; a fixed seed keeps the same data giving the same figures."""
    import numpy as np

    if len(captured) < 8 or len(uncaptured) < 8:
        return None
    rng = np.random.default_rng(0)
    cap, unc = np.asarray(captured, dtype=float), np.asarray(uncaptured, dtype=float)
    cap_picks = rng.integers(0, len(cap), (rounds, len(cap)))
    unc_picks = rng.integers(0, len(unc), (rounds, len(unc)))
    ratios = np.median(cap[cap_picks], axis=1) / np.median(unc[unc_picks], axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return float(low), float(high)


def _ratio_text(ratio, interval) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.2f}" + (f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else "")


def _table(results, base_ms) -> str:
    """What users pay: unselected / plain and selected / plain, the plain network's steps run in the same
    process, interleaved with the attached network's (95% intervals). Breakdown column: selected / unselected
    (the old headline ratio); x no-capture: against the ``baseline`` worker (another process)."""
    head = (
        "| configuration | backend | plain ms | unselected ms | selected ms | unselected / plain (95%) "
        "| selected / plain (95%) | samples/side | load avg start-end | old ratio: selected / unselected (95%) "
        "| x no-capture | files/step | MB/step |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for res in results:
        if "error" in res:
            lines.append(f"| {res['config']} | FAILED: {res['error']} |" + " |" * 11)
            continue
        med = res["median_ms"]
        graph = res["config"] in GRAPH_CONFIGS
        ratio = f"{med / base_ms:.2f}" if base_ms and not graph else "-"
        inter = res.get("interleaved_uncaptured_median_ms")
        old = _ratio_text(med / inter if inter else None, res.get("interleaved_ratio_95ci"))
        files = stats_mod.median(res["files_per_step"]) if res["files_per_step"] else 0
        mb = stats_mod.median(res["bytes_per_step"]) / 1e6 if res["bytes_per_step"] else 0
        ms = [f"{res[k]:.0f}" if res.get(k) is not None else "-"
              for k in ("plain_median_ms", "unselected_median_ms", "selected_median_ms")]
        load = f"{res['loadavg_start'][0]:.1f}-{res['loadavg_end'][0]:.1f}" if res.get("loadavg_start") else "-"
        lines.append(
            f"| {res['config']} | {res.get('backend') or '-'} | {' | '.join(ms)} "
            f"| {_ratio_text(res.get('unselected_ratio'), res.get('unselected_ratio_95ci'))} "
            f"| {_ratio_text(res.get('selected_ratio'), res.get('selected_ratio_95ci'))} "
            f"| {res.get('samples_per_side', '-')} | {load} | {old} | {ratio} | {files:.0f} | {mb:.2f} |"
        )
    return "\n".join(lines)


def _run_section(names, args) -> list:
    results = []
    for name in names:
        print(f"[bench] {name} ...", flush=True)
        res = _run_worker(name, args)
        results.append(res)
        if "error" in res:
            print(f"[bench] {name} FAILED: {res['error']}\n{res['log_tail']}", flush=True)
        elif name in capture_mcore.CONFIGS:
            print(f"[bench] {name}: {res['captured_median_ms']:.0f} ms/step with capture, "
                  f"{res['plain_median_ms']:.0f} without (x{res['ratio']:.2f}), wall {res['wall_s']:.0f} s", flush=True)
        else:
            print(
                f"[bench] {name}: median {res['median_ms']:.0f} ms/step "
                f"(plain {res.get('plain_median_ms') or 0:.0f} ms, unselected "
                f"{res.get('unselected_median_ms') or 0:.0f} ms), "
                f"{stats_mod.median(res['files_per_step']) if res['files_per_step'] else 0:.0f} files/step, "
                f"wall {res['wall_s']:.0f} s",
                flush=True,
            )
    return results


def _floor_text(results) -> str:
    """Graph tensor task: the writer thread's file writing per step against the np.save floor of the same bytes."""
    lines = []
    for res in results:
        floor = res.get("write_floor")
        if not floor:
            continue
        label = "NpyFileWriter.write (open + writev + rename, writer thread)"
        ours = (res.get("breakdown") or {}).get(label, {}).get("ms")
        ratio = f", x{ours / floor['ms']:.2f} the floor" if ours else ""
        lines.append(f"{res['config']}: writing floor (plain np.save loop of the last step's {floor['files']} files, "
                     f"{floor['bytes'] / 1e6:.1f} MB, same disk, median of rounds 2-{len(floor['all_ms'])}; the first "
                     f"{floor['all_ms'][0]:.1f} ms): {floor['ms']:.1f} ms; "
                     f"the writer thread's writes per captured step (median): {ours or float('nan'):.1f} ms{ratio}")
        beside = floor.get("beside_training")
        if beside:
            lines.append(f"{res['config']}: the same np.save loop on a thread while the plain network trains: "
                         f"{beside['ms']:.1f} ms ({beside['plain_steps']} plain steps meanwhile, median "
                         f"{beside['plain_step_ms']:.1f} ms)")
        alone = floor.get("ours_alone_ms")
        if alone:
            lines.append(f"{res['config']}: the raw writer alone on the same files, in the same rounds (nothing else "
                         f"running): {alone:.1f} ms, x{alone / floor['ms']:.2f} the floor")
    return "\n".join(lines) + ("\n" if lines else "")


def _unselected_text(results) -> str:
    """The unselected-only run of each configuration that has one: the paired ratio and its interval."""
    rows = [r for r in results if (r.get("unselected_run") or {}).get("pairs")]
    if not rows:
        return ""
    lines = ["unselected steps far from any selected one, paired with plain steps (ABBA order):", "",
             "| configuration | pairs | plain ms | unselected ms | unselected / plain, paired (95%) "
             "| ratio of medians (95%) | load avg end |", "|---|---:|---:|---:|---:|---:|---:|"]
    for res in rows:
        run = res["unselected_run"]
        lines.append(
            f"| {res['config']} | {run['pairs']} | {run['plain_median_ms']:.1f} | {run['unselected_median_ms']:.1f} "
            f"| {_ratio_text(run['paired_ratio'], run['paired_ratio_95ci'])} "
            f"| {_ratio_text(run['ratio_of_medians'], run['ratio_of_medians_95ci'])} "
            f"| {run['loadavg_end'][0]:.1f} |")
    return "\n".join(lines) + "\n"


def _breakdown_text(results) -> str:
    """Per configuration: median ms per captured step inside each timed piece (nested pieces overlap)."""
    parts = []
    for res in results:
        rows = res.get("breakdown")
        if not rows:
            continue
        inter = res.get("interleaved_uncaptured_median_ms") or res.get("inproc_baseline_median_ms")
        added = res["median_ms"] - inter if inter else float("nan")
        parts.append(f"{res['config']}: captured {res['median_ms']:.0f} ms, uncaptured {inter:.0f} ms, "
                     f"added {added:.0f} ms per step; timed pieces (median per captured step):")
        parts.append("| piece | ms/step | calls/step |\n|---|---:|---:|")
        for label, row in sorted(rows.items(), key=lambda item: -item[1]["ms"]):
            parts.append(f"| {label} | {row['ms']:.1f} | {row['calls']:.0f} |")
        parts.append("")
    return "\n".join(parts)


def driver(args) -> int:
    os.makedirs(args.out, exist_ok=True)
    names = [n for n in (args.only or CONFIGS) if n in CONFIGS and args.section in ("all", "llama")]
    mcore_names = [n for n in (args.only or capture_mcore.CONFIGS)
                   if n in capture_mcore.CONFIGS and args.section in ("all", "qwen3")]
    started = datetime.datetime.now()
    meta = {
        "date": started.isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, CPU only, {platform.platform()}",
        "python": sys.version.split()[0],
        "versions": _versions(sys.executable),
        "model": dict(MODEL, layers="LlamaForCausalLM (legacy)", dtype="float32"),
        "steps": args.steps,
        "warmup": args.warmup,
        "command": " ".join([sys.executable] + sys.argv),
        "loadavg_start": os.getloadavg(),
    }
    results = _run_section(names, args)
    mcore_results = _run_section(mcore_names, args)
    micro = None
    if names and not args.no_micro:
        print("[bench] micro (per-call costs) ...", flush=True)
        micro = _run_worker("micro", args)
        if "error" in micro:
            print(f"[bench] micro FAILED: {micro['error']}\n{micro['log_tail']}", flush=True)
    meta["loadavg_end"] = os.getloadavg()
    meta["total_wall_s"] = (datetime.datetime.now() - started).total_seconds()
    base = next((r for r in results if r["config"] == "baseline" and "error" not in r), None)
    base_ms = base["median_ms"] if base else None
    table = _table(results, base_ms) if results else "(LLaMA section not run)"
    if mcore_results:
        meta["qwen3_model"] = dict(capture_mcore.MODEL, batch=capture_mcore.BATCH,
                                   layers="TrainingQwen3ForCausalLM (mcore)", dtype="float32")
        table += ("\n\ntiny Qwen3 (mcore), capture vs no capture in the same process "
                  f"({args.steps} alternating steps after the first):\n\n" + capture_mcore.table(mcore_results))
    stamp = started.strftime("%Y%m%d-%H%M%S") + ("" if args.size == "tiny" else f"-{args.size}")
    with open(os.path.join(args.out, f"capture-{stamp}.json"), "w") as handle:
        json.dump({"meta": meta, "results": results, "qwen3": mcore_results, "micro": micro}, handle, indent=1)
    text = "\n".join(
        [
            f"date: {meta['date']}",
            f"machine: {meta['machine']}",
            f"versions: {meta['versions']}",
            f"command: {meta['command']}",
            f"steps measured: {args.steps}" + (f" (LLaMA: after {args.warmup} uncaptured + 1 captured warm-up)"
                                               if results else " (after the first step of each network)"),
            f"load average start/end: {meta['loadavg_start']} / {meta['loadavg_end']}",
            f"total wall: {meta['total_wall_s']:.0f} s",
            "",
            table,
            "",
            _unselected_text(results),
            _breakdown_text(results),
            _floor_text(results),
            "captured per step (mf_celldump): "
            + "; ".join(
                f"{r['config']}: {r.get('captured_per_step')}" for r in results if r.get("captured_per_step")
            ),
            "",
        ]
    )
    if micro and "rows" in micro:
        text += "\nper-call costs (micro worker; float32 tensor (2, 64, 128) = 64 KiB), microseconds:\n\n"
        text += "| what | min us | median us |\n|---|---:|---:|\n"
        text += (
            "\n".join(
                f"| {row['what']} | {row['min_us']:.0f} | {row['median_us']:.0f} |" for row in micro["rows"]
            )
            + "\n"
        )
    with open(os.path.join(args.out, f"capture-{stamp}.txt"), "w") as handle:
        handle.write(text)
    print(text)
    return 0 if all("error" not in r for r in results + mcore_results) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30,
                        help="rounds per configuration, each one plain, one unselected and one selected step "
                             "(the samples per side; lower it only for quick runs)")
    parser.add_argument("--unselected-pairs", type=int, default=0,
                        help="after the rounds, this many adjacent pairs (plain step, unselected step of the "
                             "attached network; ABBA order) far from any selected step: the paired "
                             "unselected / plain ratio (mf_celldump workers; 0: none)")
    parser.add_argument("--warmup", type=int, default=2, help="uncaptured warm-up steps (excluded)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=tuple(SIZES), default="tiny",
                        help="LLaMA section: tiny (hidden 128, seq 64) or large (hidden 512, seq 256, 8 heads)")
    parser.add_argument("--only", nargs="+", choices=CONFIGS + capture_mcore.CONFIGS,
                        help="run only these configurations")
    parser.add_argument("--section", choices=("all", "llama", "qwen3"), default="all",
                        help="the legacy-LLaMA configurations, the mcore-Qwen3 ones, or both")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for capture-*.json|txt")
    parser.add_argument("--keep", action="store_true", help="keep the workers' temp folders (dumps, logs)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the measured captured steps (to $TMPDIR/bench-capture-profiles/NAME.prof)",
    )
    parser.add_argument(
        "--no-micro",
        action="store_true",
        help="skip the per-call cost measurements (the 'micro' worker, ~1 min)",
    )
    parser.add_argument("--worker", choices=CONFIGS + capture_mcore.CONFIGS + ["micro"], help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    _use_size(args.size)
    if args.worker:
        if args.worker == "micro":
            result = micro_worker(args)
        elif args.worker in capture_mcore.CONFIGS:
            result = capture_mcore.worker(args.worker, args.steps, args.seed, _sync, _tree_size)
        elif args.worker in GRAPH_CONFIGS:
            result = graph_worker(args)
        else:
            result = worker(args)
        with open(args.result, "w") as handle:
            json.dump(result, handle)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
