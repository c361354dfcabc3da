"""Processing beside training: the callback hands each captured step to a worker process.

Real training (``Model.train`` with the real ``CellDumpCallback``) runs in a subprocess; a
second callback after ours plays the cluster's part: it blocks the training thread until a
step's output appears (so only another process can have made it), kills or stops the
worker with a signal, and counts the steps that trained. The worker is found the way an
operator would find it: a child process whose command line is
``python -m mf_celldump.processing.worker``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tests.support import formats as fmt
from tests.support.rawdump_builder import RawDumpBuilder, llama_net, write_llama_step

PYTHON = sys.executable
CLI = os.path.join(os.path.dirname(sys.executable), "mf-celldump")
STEPS = 6
WORKER_MODULE = "mf_celldump.processing.worker"

# argv: MODE SCENARIO DUMP_PATH
TRAINING = textwrap.dedent('''
    import json, logging, os, signal, sys, time
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    import mindspore.dataset as ds
    from mindspore.train import Callback, Model
    mode, scenario, dump_path = sys.argv[1:4]
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    from mf_celldump import CellDumpCallback

    STEPS = __STEPS__

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(16, 64)
            self.act = nn.ReLU()
            self.fc2 = nn.Dense(64, 4)
        def construct(self, x):
            return self.fc2(self.act(self.fc1(x)))

    def gen():
        rng = np.random.default_rng(0)
        for _ in range(2 * STEPS):
            yield rng.standard_normal(16).astype(np.float32), rng.standard_normal(4).astype(np.float32)

    def worker_pid(timeout=60.0):
        """Our child running `python -m __MODULE__`, as ps would show it."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry}/stat") as handle:
                        ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
                    with open(f"/proc/{entry}/cmdline", "rb") as handle:
                        argv = handle.read().split(b"\\0")
                except (OSError, ValueError, IndexError):
                    continue
                if ppid == os.getpid() and b"__MODULE__" in argv:
                    return int(entry), [a.decode() for a in argv if a]
            time.sleep(0.05)
        raise AssertionError("no processing worker among the children of the training process")

    class ClusterStandIn(Callback):
        """Runs after CellDumpCallback in every event."""
        def __init__(self):
            self.begun = self.ended = 0
            self.worker = None
        def on_train_step_begin(self, run_context):
            step, self.begun = self.begun, self.begun + 1
            if scenario in ("concurrent", "kill") and step == 3:
                # Steps 0-2 are complete; hold the training thread until step 0's output is in place.
                output = os.path.join(dump_path, "step0", "rank", "dump.json")
                started = time.time()
                while not os.path.exists(output) and time.time() - started < 120:
                    time.sleep(0.05)
            if scenario == "concurrent" and step == 3:
                pid, argv = worker_pid()
                with open(f"/proc/{pid}/maps") as handle:
                    mapped = sorted({line.split()[-1] for line in handle if "mindspore" in line})
                print("DURING_TRAINING", json.dumps({"step0_output": os.path.exists(output), "pid": pid,
                      "argv": argv, "mindspore_files_mapped": mapped}), flush=True)
            if scenario == "kill" and step == 3:
                pid, _ = worker_pid()
                os.kill(pid, signal.SIGKILL)
                # The worker runs SCHED_IDLE: on a busy machine it dies only once it is scheduled again.
                started = time.time()
                while time.time() - started < 120:
                    try:
                        with open(f"/proc/{pid}/stat") as handle:
                            if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                                break
                    except FileNotFoundError:
                        break
                    time.sleep(0.01)
                print("KILLED", pid, flush=True)
            if scenario == "timeout" and step == STEPS - 1:
                self.worker, _ = worker_pid()
                os.kill(self.worker, signal.SIGSTOP)  # hung: it takes no more work and never answers
                print("STOPPED", self.worker, flush=True)
        def on_train_step_end(self, run_context):
            self.ended += 1
        def on_train_end(self, run_context):
            gone = None
            if self.worker is not None:
                try:
                    with open(f"/proc/{self.worker}/stat") as handle:
                        gone = handle.read().rsplit(")", 1)[1].split()[0] == "Z"
                except OSError:
                    gone = True
            print("TRAINED", json.dumps({"steps": self.ended, "stopped_worker_gone": gone}), flush=True)

    keys = dict(dump_path=dump_path, steps="all", task="tensor", layer_mapping=None)
    if scenario == "timeout":
        keys["process_timeout"] = 2
    if scenario == "off":
        keys["process_on_train_end"] = False
    cb = CellDumpCallback(**keys)
    net = Net()
    model = Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), 0.01))
    data = ds.GeneratorDataset(gen, ["x", "y"], shuffle=False).batch(2)
    model.train(1, data, callbacks=[cb, ClusterStandIn()], dataset_sink_mode=False)
    s = cb.summary
    print("SUMMARY", json.dumps({"captured": s.captured_steps, "processed": sorted(s.processed_steps),
                                 "problems": s.problems, "notes": s.notes, "processing": s.processing}))
    def _is_child(entry):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            return int(fields[1]) == os.getpid() and fields[0] != "Z"
        except (OSError, ValueError, IndexError):
            return False
    print("CHILDREN_LEFT", sum(1 for e in os.listdir("/proc") if e.isdigit() and _is_child(e)))
''').replace("__STEPS__", str(STEPS)).replace("__MODULE__", WORKER_MODULE)


def _train(tmp_path, scenario, mode="pynative"):
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    dump = tmp_path / "dump"
    started = time.monotonic()
    proc = subprocess.run([PYTHON, str(script), mode, scenario, str(dump)], cwd=tmp_path, timeout=600,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-5000:]
    lines = {}
    for line in proc.stdout.splitlines():
        head, _, rest = line.partition(" ")
        if head in ("SUMMARY", "DURING_TRAINING", "TRAINED", "KILLED", "STOPPED", "CHILDREN_LEFT"):
            lines[head] = rest
    summary = json.loads(lines["SUMMARY"])
    return summary, lines, proc.stdout, dump, time.monotonic() - started


def _raw_steps(dump):
    return sorted(int(p.name[4:]) for p in (dump / "_raw").glob("rank0/step*") if p.name[4:].isdigit())


def _complete_raw_steps(dump):
    return [s for s in _raw_steps(dump) if (dump / "_raw" / "rank0" / f"step{s}" / "_step_done.json").is_file()]


def _processed_steps(dump):
    return sorted(int(p.parent.parent.name[4:]) for p in dump.glob("step*/rank/dump.json"))


def _finish_offline(dump):
    proc = subprocess.run([CLI, "process", str(dump)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_steps_are_processed_by_a_worker_while_training_goes_on(tmp_path, mode):
    summary, lines, out, dump, _ = _train(tmp_path, "concurrent", mode)
    during = json.loads(lines["DURING_TRAINING"])
    # The training thread was held inside a callback: only the worker can have made step 0's output.
    assert during["step0_output"] is True
    assert during["argv"][1:3] == ["-m", WORKER_MODULE]
    assert during["mindspore_files_mapped"] == [], "the worker loaded MindSpore"
    assert json.loads(lines["TRAINED"])["steps"] == STEPS
    assert summary["captured"] == list(range(STEPS))
    assert summary["processed"] == list(range(STEPS))
    assert summary["problems"] == [] and summary["notes"] == []
    processing = summary["processing"]
    assert processing["pid"] == during["pid"] and processing["mindspore_imported"] is False
    assert processing["outcome"] == "done" and processing["exit"] == "exit code 0"
    assert processing["requests"] == STEPS and processing["nice"] >= 10
    # on_train_end waited for the last step and said so; the summary says where processing ran.
    assert "waiting up to 1800 s (process_timeout)" in out
    assert f"processing: background worker pid {during['pid']}" in out
    assert _processed_steps(dump) == list(range(STEPS)) and _raw_steps(dump) == []
    assert lines["CHILDREN_LEFT"] == "0"


def test_a_killed_worker_loses_nothing_and_training_finishes(tmp_path):
    summary, lines, out, dump, _ = _train(tmp_path, "kill")
    assert "KILLED" in lines
    assert json.loads(lines["TRAINED"])["steps"] == STEPS  # training went on to the end
    assert summary["captured"] == list(range(STEPS))
    unprocessed = [s for s in range(STEPS) if s not in summary["processed"]]
    assert {3, 4, 5} <= set(unprocessed)  # killed once step 0's output was in place, before step 3
    assert summary["processing"]["exit"] == "killed by SIGKILL"
    (problem,) = summary["problems"]
    assert "ended unexpectedly (killed by SIGKILL)" in problem and "Training was not affected" in problem
    assert f"mf-celldump process {dump} --steps {','.join(map(str, unprocessed))} --ranks 0" in problem
    assert "cannot take step(s)" in out  # the first step submitted after the kill was noticed
    # Nothing lost: every step not reported is complete raw data, or its output was already in place
    # when the kill cut its transaction short; the command finishes them all.
    assert set(unprocessed) <= set(_complete_raw_steps(dump)) | set(_processed_steps(dump))
    assert {3, 4, 5} <= set(_complete_raw_steps(dump))
    _finish_offline(dump)
    assert _processed_steps(dump) == list(range(STEPS)) and _raw_steps(dump) == []
    assert lines["CHILDREN_LEFT"] == "0"


def test_timeout_at_train_end_is_reported_and_stops_the_worker(tmp_path):
    summary, lines, out, dump, _ = _train(tmp_path, "timeout")
    trained = json.loads(lines["TRAINED"])
    assert trained["steps"] == STEPS and trained["stopped_worker_gone"] is True  # no hung process left behind
    unprocessed = [s for s in range(STEPS) if s not in summary["processed"]]
    assert STEPS - 1 in unprocessed  # submitted to a worker that was already stopped
    listed = ",".join(map(str, unprocessed))
    (problem,) = summary["problems"]
    assert f"processing did not finish within process_timeout=2 s: step(s) {unprocessed} are not processed" in problem
    assert f"mf-celldump process {dump} --steps {listed} --ranks 0" in problem
    assert summary["processing"]["outcome"] == "timeout"
    assert "waiting up to 2 s (process_timeout)" in out
    assert set(unprocessed) <= set(_complete_raw_steps(dump)) | set(_processed_steps(dump))
    _finish_offline(dump)
    assert _processed_steps(dump) == list(range(STEPS)) and _raw_steps(dump) == []


def test_process_on_train_end_false_starts_no_worker(tmp_path):
    summary, lines, out, dump, _ = _train(tmp_path, "off")
    assert summary["processed"] == [] and summary["processing"] == {}
    assert summary["notes"] == [f"process_on_train_end is false: run `mf-celldump process {dump}` to produce "
                                "the msprobe layout"]
    assert "processing worker started" not in out
    assert _complete_raw_steps(dump) == list(range(STEPS))


# ----------------------------------------------------------------------------------------
# The worker on its own, and when the training process dies under it.
def _synthetic_dump(root, steps, shape=(64, 64)):
    builder = RawDumpBuilder(str(root), task="tensor")
    net = llama_net(builder, 2)
    builder.write_manifest()
    array = np.ones(shape, np.float32)
    for step in steps:
        writer = builder.step(step)
        write_llama_step(net, writer, lambda *a: array)
        writer.done(step)
    return root


def test_worker_protocol_and_it_never_imports_mindspore(tmp_path):
    dump = _synthetic_dump(tmp_path / "dump", [0, 1])
    requests = [
        "this is not json",
        json.dumps({"cmd": "process", "id": 0, "dump_path": str(dump), "rank": 0, "steps": "0", "jobs": 1}),
        json.dumps({"cmd": "process", "id": 1, "dump_path": str(dump), "rank": 0, "steps": [0, 1], "jobs": 1}),
        json.dumps({"cmd": "process", "id": 2, "dump_path": str(tmp_path / "nothing"), "rank": 0, "steps": [0],
                    "jobs": 1}),
        json.dumps({"cmd": "stop"}),
    ]
    proc = subprocess.run([PYTHON, "-m", WORKER_MODULE, "--log-level", "WARNING"], input="\n".join(requests) + "\n",
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    kinds = [e["event"] for e in events if e["event"] != "progress"]
    assert kinds == ["ready", "bad_request", "bad_request", "result", "error", "exit"]
    ready, bad_json, bad_steps, result, error, end = [e for e in events if e["event"] != "progress"]
    assert ready["mindspore_imported"] is False and ready["nice"] >= 10
    assert bad_json["line"] == 1 and "not JSON" in bad_json["error"]
    assert bad_steps["line"] == 2 and "key 'steps': '0'" in bad_steps["error"]
    assert result["id"] == 1 and result["steps"] == [0, 1] and result["mindspore_imported"] is False
    outcomes = result["report"]["outcomes"]
    assert [(o["step"], o["status"]) for o in outcomes] == [(0, "processed"), (1, "processed")]
    assert error["id"] == 2 and "does not exist" in error["error"]
    assert end == {"event": "exit", "reason": "stop", "requests": 2}
    assert _processed_steps(dump) == [0, 1]


KILLED_TRAINER = textwrap.dedent('''
    import json, os, signal, sys, time
    from mf_celldump.integrations.background import BackgroundProcessor
    dump, hold_pipe = sys.argv[1], sys.argv[2] == "hold"
    processor = BackgroundProcessor(dump, 0, None)
    processor.submit([0])
    processor.submit([1])
    while processor.pid is None:
        time.sleep(0.01)
    if hold_pipe:
        # A forked helper (as dataset workers are) inherits the pipe to the worker's stdin,
        # so the worker never sees the end of its input; it must notice the trainer's death.
        helper = os.fork()
        if helper == 0:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # only the worker's stdin pipe is held, not the test's output pipes
            os.dup2(devnull, 2)
            time.sleep(60)
            os._exit(0)
        print("HELPER", helper, flush=True)
    print("WORKER", processor.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
''')


def _gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("hold_pipe", [False, True], ids=["pipe-closed", "pipe-held-by-a-forked-child"])
def test_worker_exits_by_itself_when_the_trainer_is_killed(tmp_path, hold_pipe):
    dump = _synthetic_dump(tmp_path / "dump", [0, 1], shape=(512, 1024))  # 2 MiB tensors: 216 MiB a step
    script = tmp_path / "trainer.py"
    script.write_text(KILLED_TRAINER)
    proc = subprocess.run([PYTHON, str(script), str(dump), "hold" if hold_pipe else "close"], capture_output=True,
                          text=True, timeout=120, check=False, start_new_session=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    printed = dict(line.split() for line in proc.stdout.splitlines())
    pid = int(printed["WORKER"])
    deadline = time.monotonic() + 60
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    gone = _gone(pid)
    for leftover in [printed.get("HELPER")] + ([] if gone else [pid]):
        if leftover:
            os.kill(int(leftover), signal.SIGKILL)
    assert gone, "the worker outlived its killed trainer"
    # Whatever it did before it exited, every step is processed or still complete raw data.
    raw = [s for s in (0, 1) if (dump / fmt.RAW_ROOT / "rank0" / f"step{s}" / fmt.STEP_DONE_FILE).is_file()]
    assert sorted(set(raw) | set(_processed_steps(dump))) == [0, 1]
    _finish_offline(dump)
    assert _processed_steps(dump) == [0, 1] and _raw_steps(dump) == []
