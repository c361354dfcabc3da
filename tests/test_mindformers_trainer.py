"""Real MindFormers 1.9 training on CPU from the YAML of examples/ (CellDumpCallback in ``callbacks:``).

Each run is a subprocess of ``tests/support/mf_cpu_workarounds.py`` (the example runner plus
test-only injections) in its own temporary working directory.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.support import mf_cpu_workarounds as mfcpu

pytestmark = pytest.mark.slow

WQ_FORWARD = "Cell.model.layers.0.attention.wq.Linear.forward.0"
WQ_BACKWARD = "Cell.model.layers.0.attention.wq.Linear.backward.0"


def _train(tmp_path, runner_args, driver_args=(), expect_ok=True, out="out"):
    proc = mfcpu.run_driver([*driver_args, "--", "--output-dir", out, *runner_args], cwd=str(tmp_path))
    if expect_ok:
        assert proc.returncode == 0, proc.stdout[-6000:]
    return proc, tmp_path / out / "celldump"


def _entries(dump, step, rank_folder="rank"):
    with open(dump / f"step{step}" / rank_folder / "dump.json", encoding="utf-8") as handle:
        data = json.load(handle)
    return data


def _raw_steps(dump):
    return sorted(p.name for p in (dump / "_raw").glob("rank*/step*"))


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_yaml_trainer_run_dumps_selected_steps(tmp_path, mode):
    proc, dump = _train(tmp_path, ["--mode", mode, "--steps", "3", "--dump", "steps=0,2"])
    for step in (0, 2):
        data = _entries(dump, step)
        assert data["task"] == "tensor"  # as set in examples/tiny_llama.yaml
        names = set(data["data"])
        assert WQ_FORWARD in names and WQ_BACKWARD in names, sorted(names)[:20]
        tensor_dir = dump / f"step{step}" / "rank" / "dump_tensor_data"
        assert data["dump_data_dir"] == str(tensor_dir)
        assert (tensor_dir / f"{WQ_FORWARD}.output.0.npy").exists()
        assert any(n.startswith("Cell.model.layers.1.feed_forward.w2.Linear.forward.") for n in names)
        assert not any(n.startswith("Cell.network.") for n in names), "training wrappers must be skipped"
    assert not (dump / "step1").exists()
    assert _raw_steps(dump) == [], "raw files of processed steps must be removed"
    # The runner's closing summary says where the dump is and what is in it.
    assert f"dump: {dump}" in proc.stdout
    assert "step0/rank:" in proc.stdout and "step2/rank:" in proc.stdout


def test_graph_compiled_before_training_is_still_dumped(tmp_path):
    """MindFormers compiles in Model.build before Model.train on some runs; the hook attaches first."""
    proc, dump = _train(tmp_path, ["--mode", "graph", "--steps", "3", "--dump", "steps=0-2"],
                        driver_args=["--precompile"])
    assert "PRECOMPILED" in proc.stdout
    assert "capture attached at Model.build" in proc.stdout
    assert proc.stdout.index("capture attached at Model.build") < proc.stdout.index("PRECOMPILED")
    for step in (0, 1, 2):
        names = set(_entries(dump, step)["data"])
        assert WQ_FORWARD in names and WQ_BACKWARD in names
    assert _raw_steps(dump) == []


def test_resumed_run_numbers_steps_globally_and_continues_its_dump(tmp_path):
    # First run: 3 steps and a checkpoint; it dumps step 1.
    _, dump = _train(tmp_path, ["--mode", "pynative", "--steps", "3", "--save-checkpoint", "--dump", "steps=1,3-4"],
                     out="run")
    checkpoint = tmp_path / "run" / "checkpoint"
    assert list(checkpoint.glob("rank_0/*.ckpt"))
    run_id = _entries(dump, 1)["mf_celldump_run_id"]
    # Second run resumes after 3 steps into the same output folder (MindFormers: initial_step 3,
    # cur_step_num restarts at 1); here the callback is built in Python and given as Trainer(callbacks=[...]).
    proc, dump = _train(tmp_path, ["--mode", "pynative", "--steps", "3", "--epochs", "2", "--python-callback",
                                   "--resume-from", str(checkpoint), "--dump", "steps=1,3-4"], out="run")
    assert "first step 3" in proc.stdout and f"continuing run {run_id}" in proc.stdout
    assert sorted(p.name for p in dump.glob("step*")) == ["step1", "step3", "step4"]
    assert WQ_FORWARD in _entries(dump, 3)["data"]
    assert {_entries(dump, step)["mf_celldump_run_id"] for step in (1, 3, 4)} == {run_id}, "one run"
    assert _raw_steps(dump) == []


def test_failure_mid_training_keeps_completed_and_raw(tmp_path):
    proc, dump = _train(tmp_path, ["--mode", "pynative", "--steps", "3", "--dump", "steps=0-2"],
                        driver_args=["--fail-at-step", "1"], expect_ok=False)
    assert proc.returncode != 0
    assert "RuntimeError: injected failure at step 1" in proc.stdout  # the exception reached the caller
    assert WQ_FORWARD in _entries(dump, 0)["data"]  # the completed step is processed
    assert not (dump / "step1").exists() and not (dump / "step2").exists()
    raw_step1 = dump / "_raw" / "rank0" / "step1"
    assert raw_step1.is_dir() and os.listdir(raw_step1), "the failed step's raw data is kept"
    assert not (raw_step1 / "_step_done.json").exists(), "the failed step must not be marked complete"
    assert "step 1 did not finish" in proc.stdout
