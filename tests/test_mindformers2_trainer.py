"""MindFormers 2.1's PyNative trainer (``mindformers.pynative.trainer.Trainer``), real, on CPU, with a tiny
2-layer Qwen3 of 2.1's own and the stand-in ``hyper_parallel`` (``tests/support/hyper_parallel_standin``):
its own loop, ``CallbackHandler``, ``TrainConfig``, ``TrainerState`` and skip-step code run. Each run is a
subprocess (``tests/support/mf21_run.py``). Skipped unless MindFormers 2.x is installed (CI's ms210 venv
has 2.1.0 beside MindSpore 2.10, installed without its dependencies)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import formats as fmt

mindformers = pytest.importorskip("mindformers")
if not str(getattr(mindformers, "__version__", "")).startswith("2."):
    pytest.skip("needs MindFormers 2.x (the PyNative trainer)", allow_module_level=True)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tmp_path, *args, expect_ok=True):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "tests.support.mf21_run", str(work), *args], cwd=REPO,
                          timeout=900, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert (proc.returncode == 0) == expect_ok, proc.stdout[-6000:]
    line = [t for t in proc.stdout.splitlines() if t.startswith("RESULT ")]
    assert line, proc.stdout[-6000:]
    return json.loads(line[-1][len("RESULT "):]), proc.stdout, work


def _entries(dump, step):
    with open(os.path.join(dump, f"step{step}", "rank", fmt.DUMP_JSON), encoding="utf-8") as handle:
        return json.load(handle)["data"]


def _process(dump):
    return subprocess.run([sys.executable, "-m", "mf_celldump", "process", dump], cwd=REPO, timeout=600,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)


def test_yaml_callbacks_entry_captures_beside_the_trainers_own_output(tmp_path):
    """``callbacks:`` with ``auto_register`` builds the callback; the dump goes to 2.1's output root (where it
    writes ``log/``), not to the ``output_dir:`` key that 2.1 itself ignores."""
    result, out, work = _run(tmp_path, "--route", "yaml", "--steps", "2", "--output-dir-key",
                             "--dump", 'steps="0-1"')
    assert result["captured"] == [0, 1] and result["processed"] == [0, 1] and not result["problems"]
    assert result["dump_path"] == str(work / "output" / "celldump")
    assert (work / "output" / "log").is_dir() and not (work / "output_dir_key").exists()
    names = _entries(result["dump_path"], 0)
    assert sorted(names) == sorted(_entries(result["dump_path"], 1))
    layer = "Cell.model.decoder.layers.0.self_attention.linear_qkv.Linear"
    assert f"{layer}.forward.0" in names and f"{layer}.backward.0" in names
    assert f"{layer}.parameters_grad.0" in names
    assert "capture attached at on_train_begin (MindFormers 2.x trainer)" in out


def test_a_run_that_raises_keeps_every_ended_step_whole_and_names_the_cut_one(tmp_path):
    """2.1 calls ``on_train_end`` outside its ``try/finally``: a step that raises ends nothing there. The steps
    that ended are written whole before the process exits, the log says what to run, and ``mf-celldump process``
    names the cut step incomplete (exit 1) and processes the whole ones."""
    result, out, work = _run(tmp_path, "--route", "python", "--steps", "4", "--fail-at-step", "2",
                             "--dump", 'process_on_train_end=false', "--dump", 'task="tensor"', expect_ok=False)
    assert "RuntimeError: injected data failure at step 2" in out
    dump = str(work / "output" / "celldump")
    raw = os.path.join(dump, fmt.RAW_ROOT, "rank0")
    for step in (0, 1):
        assert os.path.isfile(os.path.join(raw, f"step{step}", fmt.STEP_DONE_FILE)), out[-4000:]
    assert "raw data of step(s) 0,1 written whole, step(s) 2 did not finish" in out
    assert f"run `mf-celldump process {dump}`" in out
    assert "raw capture writer failed" not in out
    proc = _process(dump)
    assert proc.returncode == 1 and "INCOMPLETE: step 2 rank 0" in proc.stdout, proc.stdout
    assert sorted(_entries(dump, 0)) == sorted(_entries(dump, 1)) and len(_entries(dump, 1)) > 90


def test_a_skipped_update_is_the_watchs_overflow_and_stop_really_stops(tmp_path):
    """``training.use_skip_step_on_nan``: the trainer skips step 1's update and counts it in
    ``state.skipped_steps``; the watch takes that as the overflow flag, cannot rerun the step (no batch reaches
    ``on_step_end``), says so and captures step 2; ``stop`` then ends the run after step 2 through
    ``state.max_steps``."""
    result, out, work = _run(tmp_path, "--route", "python", "--steps", "6", "--nan-at-step", "1",
                             "--dump", 'steps="anomaly"', "--dump", 'watch={"stop": true}')
    assert result["skipped_steps"] == 1
    assert result["captured"] == [2] and result["processed"] == [2], out[-4000:]
    notes = " ".join(result["notes"])
    assert "the update of step 1 was skipped (overflow) but it is not rerun" in notes
    assert "its update was applied" not in out
    assert result["last_step"] == 3 and result["max_steps"] == 3 and len(result["losses"]) == 3
    assert "training is asked to stop after step 2" in out
    assert "max_steps set to 3" in out


def test_gradient_accumulation_numbers_micro_batches_as_calls_and_sums_weight_gradients(tmp_path):
    """2.1 accumulates in a Python loop (global batch 4, local batch 2: two micro-batches, each with its own
    forward and backward): micro-batch k is call k of every cell, forward and backward, as msprobe numbers
    calls; each weight's ``parameters_grad`` is one entry per step, the sum over the micro-batches (the
    gradient the optimizer applies)."""
    result, _, work = _run(tmp_path, "--route", "python", "--steps", "1", "--accumulate", "2", "--dump", "steps=[0]")
    assert result["processed"] == [0] and not result["problems"]
    names = _entries(result["dump_path"], 0)
    fc1 = "Cell.model.decoder.layers.0.mlp.linear_fc1.Linear"
    assert {f"{fc1}.{d}.{k}" for d in ("forward", "backward") for k in (0, 1)} <= set(names)
    assert f"{fc1}.forward.2" not in names
    assert [n for n in names if n.startswith(f"{fc1}.parameters_grad")] == [f"{fc1}.parameters_grad.0"]


def test_a_resumed_run_continues_the_dump(tmp_path):
    """2.1 resumes from its checkpoint (``checkpoint.load_path``: ``state.global_step`` restored before
    ``on_train_begin``): the dump continues the same run in the same folder, numbering by global step."""
    first, _, work = _run(tmp_path, "--steps", "2", "--checkpoint-every", "2")
    assert first["processed"] == [0, 1]
    second, out, _ = _run(tmp_path, "--steps", "4", "--resume")
    assert second["captured"] == [2, 3] and second["processed"] == [2, 3], out[-4000:]
    assert "first step 2" in out and "continuing run" in out
    dump = first["dump_path"]
    assert second["dump_path"] == dump
    run_ids = set()
    for step in range(4):
        with open(os.path.join(dump, f"step{step}", "rank", fmt.DUMP_JSON), encoding="utf-8") as handle:
            run_ids.add(json.load(handle)["mf_celldump_run_id"])
    assert len(run_ids) == 1
