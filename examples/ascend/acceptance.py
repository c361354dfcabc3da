"""Acceptance check of mf_celldump's Ascend graph-mode capture on a new cluster (1 or 2 NPUs, ~15 minutes).

Two parts, the same flags on an NPU and with ``--emulate`` on CPU, one PASS/FAIL line per
check; every FAIL names the defect it guards against (docs/acceptance.md; exit code 1 if
any FAIL). No missing file is tolerated.

1. The tiny MindFormers LLaMA (``tiny_llama_ascend.yaml``; CPU: ``examples/tiny_llama.yaml``)
   trained by ``examples/run_tiny_llama.py``:

   pynative     PyNative, tensor, 5 steps, steps "1,3" (the reference values)
   o0           graph, jit_level O0, tensor, steps "1,3" (the steps filter mapping), checkpoint
   o1, o2       graph, jit_level O1 and O2 (GE on an NPU), tensor, steps "1,3"
   statistics   graph, jit_level O0, statistics, steps "1,3"
   big          graph, hidden size 1024: ~120 MB in the captured step, with MS_DUMP_SLICE_SIZE/WAIT_TIME
   resumed      graph, resumed from o0's checkpoint at global step 5, steps "6,8"
   past         graph, resumed at step 5, steps "1,3" (all in the past: nothing written)
   dp2          2 ranks (msrun), data parallel, steps "1"
   bf16         graph, compute dtype bfloat16, tensor and statistics (NPU only: CPU has no bf16 MatMul)
   tp2, pp2     2 NPUs: tensor parallel 2 and pipeline parallel 2 (4 micro-batches) (SKIP without 2 NPUs)

2. Small-network scenarios (``acceptance_scenarios.py``), each in a process of its own:
   micro-batch pairing under gradient accumulation, redistribution, 'in'-mode pairing,
   the rest of MindSpore's parallel pass (casts, forward AllReduce, regions), control flow,
   the process-wide step filter, a second capture kind in one process,
   big dumps and slicing, the GE check, the TensorDump channel, the MindSpore < 2.7 refusal,
   bf16 statistics, asynchronous writes racing processing.

    bash examples/ascend/acceptance.sh --workdir /tmp/mf_celldump_acceptance [--npus 2]

``--emulate`` runs the same on CPU with the Ascend primitives emulated
(``tests/support/ascend_emulation.py``); ``tests/test_acceptance_defects.py`` proves that
the checks FAIL, naming the defect, when each defect is put back.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import acceptance_checks as ac  # noqa: E402

RUNNER = os.path.join(REPO, "examples", "run_tiny_llama.py")
EMULATION = os.path.join(REPO, "tests", "support", "ascend_emulation.py")
ASCEND_CONFIG = os.path.join(HERE, "tiny_llama_ascend.yaml")
STEPS, SELECTED = 5, "1,3"
# Exported for the big run and the slicing scenario, as run_ascend.sh does (MindSpore reads them once, when
# the device starts). Sliced, a TensorDump kernel waits for the host writer; the other runs leave MindSpore's
# writer to trail the steps (on CPU the emulator's latency and slow in-place writes): the race processing
# must wait out.
SLICING = {"MS_DUMP_SLICE_SIZE": "256", "MS_DUMP_WAIT_TIME": "600"}
# The only files of the PyNative run a graph run may lack: one forward value nothing uses, which the graph
# compiler prunes with its TensorDump (side_effect_io False, as msprobe's): FreqsMgr's third output, and the
# same tensor where the layers pass it on (freqs_cis[2]).
PRUNED = re.compile(r"Cell\.model\.(freqs_mgr\.FreqsMgr\.forward\.\d+\.output\.2"
                    r"|layers\.\d+\.(LLamaDecodeLayer|attention\.LLamaAttention)\.forward\.\d+\.input\.1\.2"
                    r"|layers\.\d+\.attention\.apply_rotary_emb\.RotaryEmbedding\.forward\.\d+\.input\.2\.2)\.npy$")
# acceptance_scenarios.py's scenarios (listed here: importing it imports MindSpore).
SCENARIO_NAMES = ("steps", "past", "statistics", "statistics_resumed", "bf16", "micro_batches", "redistribution",
                  "in_pairing", "parallel_pass", "control_flow", "step_filter", "second_kind", "slicing", "ge_check",
                  "channel", "version")
CPU_LIMIT = "SKIP (CPU: MindSpore's CPU kernels have no bfloat16 MatMul; the bf16 scenario covers bf16 here)"


@dataclass
class Run:
    name: str
    mode: str
    dump: List[str]
    settings: List[str] = field(default_factory=list)  # run_tiny_llama.py --set DOTTED.KEY=VALUE
    extra: List[str] = field(default_factory=list)
    workers: int = 1
    npus: int = 1  # needed on Ascend
    cpu_skip: str = ""  # why CPU cannot run it ("": it runs with --emulate too)
    env: Dict[str, str] = field(default_factory=dict)
    returncode: Optional[int] = None
    skipped: str = ""

    def out(self, workdir: str) -> str:
        return os.path.join(workdir, self.name)

    def dump_path(self, workdir: str) -> str:
        return os.path.join(self.out(workdir), "celldump")

    def log(self, workdir: str) -> str:
        return os.path.join(workdir, f"{self.name}.log")


def plan(workdir: str) -> List[Run]:
    checkpoint = os.path.join(workdir, "o0", "checkpoint")
    resume = ["--epochs", "2", "--resume-from", checkpoint]
    tensor, statistics = ["task=tensor", f"steps={SELECTED}"], ["task=statistics", f"steps={SELECTED}"]
    jit = "context.jit_config.jit_level="
    bf16 = [f"model.model_config.{k}=bfloat16" for k in ("compute_dtype", "layernorm_compute_type")]
    two = ["parallel_config.data_parallel=1", "parallel.parallel_mode=1"]  # semi-auto parallel
    return [
        Run("pynative", "pynative", tensor),
        Run("o0", "graph", tensor, [jit + "O0"], ["--save-checkpoint"]),
        Run("o1", "graph", tensor, [jit + "O1"]),
        Run("o2", "graph", tensor, [jit + "O2"]),  # GE on an NPU; CPU graphs never compile with GE
        Run("statistics", "graph", statistics, [jit + "O0"]),
        Run("big", "graph", ["task=tensor", "steps=1"], [jit + "O0", "model.model_config.hidden_size=1024"],
            env=dict(SLICING)),
        Run("resumed", "graph", ["task=tensor", "steps=6,8"], [jit + "O0"], resume),
        Run("past", "graph", tensor, [jit + "O0"], resume),
        Run("dp2", "graph", ["task=tensor", "steps=1"], [jit + "O0"], ["--parallel"], workers=2, npus=2),
        Run("bf16", "graph", ["task=tensor", "steps=1"], [jit + "O0", *bf16], cpu_skip=CPU_LIMIT),
        Run("bf16_statistics", "graph", ["task=statistics", "steps=1"], [jit + "O0", *bf16], cpu_skip=CPU_LIMIT),
        Run("tp2", "graph", ["task=tensor", "steps=1"], [jit + "O0", "parallel_config.model_parallel=2", *two],
            ["--parallel"], workers=2, npus=2, cpu_skip="SKIP (needs 2 NPUs: tensor parallel)"),
        Run("pp2", "graph", ["task=tensor", "steps=1"],
            [jit + "O0", "parallel_config.pipeline_stage=2", "parallel_config.micro_batch_num=4", *two],
            ["--parallel"], workers=2, npus=2, cpu_skip="SKIP (needs 2 NPUs: pipeline parallel)"),
    ]


def command(run: Run, workdir: str, emulate: bool, python: str) -> List[str]:
    args = ["--mode", run.mode, "--steps", str(STEPS), "--output-dir", run.out(workdir), *run.extra]
    for item in run.dump:
        args += ["--dump", item]
    for item in run.settings:
        args += ["--set", item]
    if not emulate:
        script = [RUNNER, "--config", ASCEND_CONFIG, *args]
    elif run.mode == "pynative":  # MindSpore's real TensorDump on CPU
        script = [RUNNER, *args]
    else:  # on CPU the automatic backend is the host one; the emulation stands in for Ascend's
        backend = "kbk_statistics" if "task=statistics" in run.dump else "tensordump"
        report = os.path.join(workdir, f"{run.name}.emulator.json")
        script = [EMULATION, "--report", report, "--", *args, "--dump", f"backend={backend}"]
    if run.workers == 1:
        return [python, *script]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return ["msrun", f"--worker_num={run.workers}", f"--local_worker_num={run.workers}", "--master_addr=127.0.0.1",
            f"--master_port={port}", f"--log_dir={run.out(workdir)}/msrun_log", "--join=True", *script]


def train(run: Run, workdir: str, emulate: bool, python: str, npus: int) -> None:
    if emulate and run.cpu_skip:
        run.skipped = run.cpu_skip
    elif not emulate and run.npus > npus:
        run.skipped = f"SKIP (needs {run.npus} NPUs; --npus {npus})"
    if run.skipped:
        print(f"  {run.name}: {run.skipped}", flush=True)
        return
    start = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **run.env)
    bin_dir = os.path.dirname(shutil.which(python) or python)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")  # msrun starts its workers with a bare `python`
    env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    with open(run.log(workdir), "w", encoding="utf-8") as log:
        proc = subprocess.run(command(run, workdir, emulate, python), cwd=workdir, stdout=log,
                              stderr=subprocess.STDOUT, text=True, check=False, env=env)
    run.returncode = proc.returncode
    print(f"  {run.name}: exit code {run.returncode} after {time.monotonic() - start:.0f} s "
          f"(log: {run.log(workdir)})", flush=True)


# -- what a MindFormers run left --------------------------------------------------------------------------
def logs_of(run: Run, workdir: str) -> List[str]:
    found = [run.log(workdir), os.path.join(run.out(workdir), "run_tiny_llama.log")]
    log_dir = os.path.join(run.out(workdir), "msrun_log")
    if os.path.isdir(log_dir):
        found += [os.path.join(log_dir, n) for n in sorted(os.listdir(log_dir))]
    return [path for path in found if os.path.isfile(path)]


def log_text(run: Run, workdir: str) -> str:
    text = []
    for path in logs_of(run, workdir):
        with open(path, encoding="utf-8", errors="replace") as handle:
            text.append(handle.read())
    return "\n".join(text)


def problems(run: Run, workdir: str) -> List[str]:
    """The ``- ...`` lines of the problems list of each rank's mf_celldump summary."""
    found, inside = [], False
    for line in log_text(run, workdir).splitlines():
        if "mf_celldump: rank " in line:
            inside = True
        elif inside and line.startswith("    - "):
            found.append(line.strip()[2:])
        elif inside and not line.startswith("  "):
            inside = False
    return found


def weight_gradients_refused(run: Run, workdir: str) -> bool:
    """The run said at attach that the optimizer runs under a run-time condition (MindFormers' overflow check),
    where TensorDump is unsupported, so no weight gradient is recorded in graph mode."""
    return "parameters_grad is not recorded" in log_text(run, workdir)


def expected_files(reference: ac.Arrays, refused: bool) -> ac.Arrays:
    """The reference's files a graph run must have: all but pruned forward values (and weight gradients where
    the run said they are refused)."""
    return {n: a for n, a in reference.items() if not PRUNED.match(n)
            and not (refused and ".parameters_grad." in n)}


def _clipped_gradients_off(got: ac.Arrays, want: ac.Arrays, names: List[str], rtol: float, atol: float) -> List[str]:
    """Weight gradients that are not the PyNative ones times one common factor: graph mode records what the
    optimizer receives, after ``use_clip_grad``'s global-norm clipping (a factor <= 1)."""
    pairs = [(n, got[n].ravel().astype(np.float64), want[n].ravel().astype(np.float64)) for n in names]
    ratios = [float(np.dot(g, w) / np.dot(w, w)) for _, g, w in pairs if np.dot(w, w) > 0]
    factor = float(np.median(ratios)) if ratios else 1.0
    return [n for n, g, w in pairs if not np.allclose(g, w * factor, rtol=max(rtol, 1e-3), atol=atol)]


def check_tensor_run(run: Run, reference: Run, workdir: str, rtol: float) -> List[ac.Check]:
    """Exactly steps 1 and 3, every expected file, nothing else, PyNative's values (weight gradients up to the
    clipping factor)."""
    dump, refused = run.dump_path(workdir), weight_gradients_refused(run, workdir)
    checks = [ac.check_step_folders(dump, [1, 3]), ac.check_no_problem(run.name, problems(run, workdir)),
              ac.check_no_raw_left(dump)]
    for step in (1, 3):
        got = ac.read_step(dump, step)[1]
        want = expected_files(ac.read_step(reference.dump_path(workdir), step)[1], refused)
        if refused:
            grads = [n for n in got if ".parameters_grad." in n]
            checks.append(ac._line(not grads, ac.CONTROL_FLOW, f"{run.name} step{step}: no weight gradient where "
                                   f"the optimizer runs under the overflow check ({len(grads)} recorded)"))
        got_plain = {n: a for n, a in got.items() if ".parameters_grad." not in n}
        want_plain = {n: a for n, a in want.items() if ".parameters_grad." not in n}
        checks += [ac.check_no_missing_file(got, want, step), ac.check_no_foreign_file(got, want, step),
                   ac.check_same_values(got_plain, want_plain, step, rtol, 1e-5)]
        grads = sorted(n for n in set(got) & set(want) if ".parameters_grad." in n)
        off = _clipped_gradients_off(got, want, grads, rtol, 1e-5)
        checks.append(ac._line(not off, ac.STEP_MARKERS, f"step{step}: {len(grads)} weight gradients equal "
                               f"PyNative's up to the clipping factor ({len(off)} off)"))
    return [(ok, f"{run.name}: {text}") for ok, text in checks]


def check_statistics_run(run: Run, tensor_run: Run, workdir: str, rtol: float, steps=(1, 3)) -> List[ac.Check]:
    """Forward and backward statistics, named as ours, equal to float64 statistics of the tensor run's files."""
    dump = run.dump_path(workdir)
    checks = [ac.check_step_folders(dump, list(steps)), ac.check_no_problem(run.name, problems(run, workdir),
                                                                              ac.TD_FLAG)]
    for step in steps:
        leaves, arrays = ac.read_step(tensor_run.dump_path(workdir), step)
        want = {k: arrays[leaf["data_name"]] for k, leaf in leaves.items() if leaf.get("data_name") in arrays
                and k[1] != "parameters_grad"}
        got = {k: v for k, v in ac.read_step(dump, step)[0].items() if k[1] != "parameters_grad"}
        checks.append(ac.check_statistics(got, want, rtol, ac.TD_FLAG))
    return [(ok, f"{run.name}: {text}") for ok, text in checks]


def check_complete_run(run: Run, like: Run, workdir: str, step: int, ranks: List[str]) -> List[ac.Check]:
    """Every rank folder of ``step`` has every file name ``like`` has (same model, other sizes or data)."""
    want = expected_files(ac.read_step(like.dump_path(workdir), step)[1], weight_gradients_refused(run, workdir))
    checks = [ac.check_ran(run.name, None if run.returncode == 0 else f"exit code {run.returncode}"),
              ac.check_no_problem(run.name, problems(run, workdir)), ac.check_no_raw_left(run.dump_path(workdir))]
    for rank in ranks:
        got = ac.read_step(run.dump_path(workdir), step, rank)[1]
        checks.append(ac.check_no_missing_file(got, want, step))
        if run.name.startswith("bf16"):
            dtypes = {leaf["dtype"] for leaf in ac.read_step(run.dump_path(workdir), step, rank)[0].values()}
            checks.append(ac._line("BFloat16" in dtypes, ac.BF16, f"{rank}: bfloat16 values recorded as BFloat16 "
                                   f"(dtypes {sorted(dtypes)})"))
    return [(ok, f"{run.name}: {text}") for ok, text in checks]


def check_parallel_run(run: Run, workdir: str) -> List[ac.Check]:
    """Two ranks, each with its own complete step 1 folder, forward and backward."""
    checks = [ac.check_no_problem(run.name, problems(run, workdir)), ac.check_no_raw_left(run.dump_path(workdir))]
    for rank in ("rank0", "rank1"):
        names = ac.read_step(run.dump_path(workdir), 1, rank)[1]
        both = any(".forward." in n for n in names) and any(".backward." in n for n in names)
        checks.append(ac._line(both, ac.REDISTRIBUTION if run.name == "tp2" else ac.MICRO_BATCHES,
                               f"{rank}: step1 has {len(names)} tensor files, forward and backward"))
    return [(ok, f"{run.name}: {text}") for ok, text in checks]


def evaluate(runs: Dict[str, Run], workdir: str, emulate: bool) -> List[ac.Check]:
    rtol = 1e-4 if emulate else 2e-3  # graph vs PyNative kernels on an NPU may differ slightly
    done = [run for run in runs.values() if not run.skipped]
    checks = [ac.check_ran(run.name, None if run.returncode == 0 else f"exit code {run.returncode}") for run in done]
    pynative = runs["pynative"]
    checks += [(ok, f"pynative: {text}") for ok, text in (ac.check_step_folders(pynative.dump_path(workdir), [1, 3]),
                                                         ac.check_no_problem("pynative", problems(pynative, workdir)))]
    checks += check_tensor_run(runs["o0"], pynative, workdir, rtol)
    checks += check_tensor_run(runs["o1"], pynative, workdir, rtol)
    checks += check_tensor_run(runs["o2"], pynative, workdir, rtol)
    checks += check_statistics_run(runs["statistics"], runs["o0"], workdir, rtol)
    checks += check_complete_run(runs["big"], runs["o0"], workdir, 1, ["rank"])
    checks.append(ac.check_step_folders(runs["resumed"].dump_path(workdir), [6, 8]))
    checks.append(ac.check_nothing_written(runs["past"].dump_path(workdir)))
    checks += check_complete_run(runs["dp2"], runs["o0"], workdir, 1, ["rank0", "rank1"])
    for name in ("bf16", "bf16_statistics", "tp2", "pp2"):
        run = runs[name]
        if run.skipped:
            checks.append((None, f"{name}: {run.skipped}"))
        elif name == "bf16":
            checks += check_complete_run(run, runs["o0"], workdir, 1, ["rank"])
        elif name == "bf16_statistics":
            checks += check_statistics_run(run, runs["bf16"], workdir, 2e-6, steps=(1,))
        else:
            checks += check_parallel_run(run, workdir)
    return checks


# -- the small-network scenarios ----------------------------------------------------------------------------
def scenario_command(name: str, workdir: str, emulate: bool, python: str) -> List[str]:
    args = [os.path.abspath(__file__), "--scenario", name, "--workdir", os.path.join(workdir, "scenarios", name)]
    args += ["--emulate"] if emulate else []
    if name == "micro_batches" and not emulate:  # semi-auto parallel needs a communication group: msrun
        return ["msrun", "--worker_num=1", "--local_worker_num=1", "--master_addr=127.0.0.1", "--master_port=8128",
                f"--log_dir={workdir}/scenarios/msrun_log", "--join=True", *args]
    return [python, *args]


def run_scenarios(workdir: str, emulate: bool, python: str) -> List[ac.Check]:
    checks: List[ac.Check] = []
    for name in SCENARIO_NAMES:
        os.makedirs(os.path.join(workdir, "scenarios", name), exist_ok=True)
        log = os.path.join(workdir, "scenarios", f"{name}.log")
        with open(log, "w", encoding="utf-8") as handle:
            proc = subprocess.run(scenario_command(name, workdir, emulate, python), cwd=workdir, stdout=handle,
                                  stderr=subprocess.STDOUT, text=True, check=False,
                                  env=dict(os.environ, PYTHONUNBUFFERED="1", **(SLICING if name == "slicing" else {})))
        with open(log, encoding="utf-8", errors="replace") as handle:
            lines = [line.rstrip("\n") for line in handle if line.startswith(("PASS ", "FAIL ", "SKIP "))]
        found = [(None if line.startswith("SKIP") else line.startswith("PASS"), f"{name}: {line[5:]}")
                 for line in lines]
        if proc.returncode not in (0, 1) or not found:
            found.append((False, f"{name}: the scenario did not finish (exit code {proc.returncode}; log {log})"))
        checks += found
    return checks


def one_scenario(name: str, workdir: str, emulate: bool) -> int:
    """Run one scenario in this process and print its lines (what run_scenarios reads)."""
    import acceptance_scenarios as sc

    os.makedirs(workdir, exist_ok=True)
    failed = 0
    for ok, text in sc.SCENARIOS[name](workdir, emulate):
        skip = text.startswith(sc.SKIP)
        print(text if skip else ("PASS " if ok else "FAIL ") + text, flush=True)
        failed += 0 if ok or skip else 1
    return 1 if failed else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", default="./mf_celldump_acceptance", help="where runs and logs go (a new folder)")
    parser.add_argument("--emulate", action="store_true", help="CPU with emulated Ascend primitives (tests)")
    parser.add_argument("--python", default=sys.executable, help="the Python of the MindFormers environment")
    parser.add_argument("--npus", type=int, default=1, help="NPUs this host gives the check (2: tp2, pp2, dp2)")
    parser.add_argument("--only", choices=("runs", "scenarios"), help="run one part only")
    parser.add_argument("--scenario", help=argparse.SUPPRESS)  # one scenario, in this process
    args = parser.parse_args(argv)
    workdir = os.path.abspath(args.workdir)
    if args.scenario:
        return one_scenario(args.scenario, workdir, args.emulate)
    if os.path.exists(workdir) and os.listdir(workdir):
        parser.error(f"--workdir {workdir} is not empty; give a new folder")
    os.makedirs(workdir, exist_ok=True)
    if shutil.which("msrun", path=os.path.dirname(args.python) + os.pathsep + os.environ.get("PATH", "")) is None:
        print("msrun not found next to --python or on PATH: the 2-rank runs will fail", flush=True)
    checks: List[ac.Check] = []
    if args.only != "scenarios":
        runs = {run.name: run for run in plan(workdir)}
        where = "CPU emulation" if args.emulate else "Ascend"
        print(f"mf_celldump acceptance ({where}): {len(runs)} runs in {workdir}", flush=True)
        for run in runs.values():
            train(run, workdir, args.emulate, args.python, 2 if args.emulate else args.npus)
        checks += evaluate(runs, workdir, args.emulate)
    if args.only != "runs":
        checks += run_scenarios(workdir, args.emulate, args.python)
    return report(checks, workdir)


def report(checks: List[ac.Check], workdir: str) -> int:
    for ok, text in checks:
        print(("SKIP " if ok is None else "PASS " if ok else "FAIL ") + text.replace(": SKIP ", ": ").rstrip())
    failed = sum(1 for ok, _ in checks if ok is False)
    skipped = sum(1 for ok, _ in checks if ok is None)
    passed = len(checks) - failed - skipped
    print(f"{passed} passed, {failed} failed, {skipped} skipped" + ("" if not failed else f"; logs in {workdir}"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
