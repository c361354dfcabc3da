"""Raw data is never lost, and steps or ranks are never mixed: names that only look like
ours, markers and manifests that disagree with their data, one bad step or rank among
healthy ones.

``D`` is a raw dump captured with ``attach`` (real MindSpore, PyNative, CPU, tensor task,
two steps), copied for each test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from mf_celldump.errors import ManifestError
from mf_celldump.processing.driver import process_dump
from tests.support import formats as fmt
from tests.support.hostile_dumps import REPO, build_dump, edit_manifest, limited_python


@pytest.fixture
def D(raw_dump):
    """A raw dump captured with attach (two steps, tensor task), this test's own copy."""
    return raw_dump


def rank0(dump, name="rank0"):
    return os.path.join(dump, fmt.RAW_ROOT, name)


def raw_npys(dump):
    """Relative path -> size of every raw .npy file (what must never be lost)."""
    out = {}
    for folder, _, files in os.walk(os.path.join(dump, fmt.RAW_ROOT)):
        for name in files:
            if name.endswith(".npy"):
                path = os.path.join(folder, name)
                out[os.path.relpath(path, dump)] = os.path.getsize(path)
    return out


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


# -- names must read back to themselves --------------------------------------------------

def test_step_folder_with_a_leading_zero_is_not_taken_for_step_1(D, tmp_path):
    """`step01` holding step 0's data beside a processed step 1: step 1's output stays, step01 stays."""
    shutil.copytree(os.path.join(rank0(D), "step0"), str(tmp_path / "copy"))
    assert process_dump(D, jobs=1).ok
    step1_output = _read(os.path.join(D, "step1", "rank", fmt.DUMP_JSON))
    shutil.copytree(str(tmp_path / "copy"), os.path.join(rank0(D), "step01"))
    planted = raw_npys(D)
    report = process_dump(D, jobs=1)
    assert _read(os.path.join(D, "step1", "rank", fmt.DUMP_JSON)) == step1_output, "step 1 replaced"
    assert raw_npys(D) == planted, "the raw data of step01 is kept"
    assert any("step01" in w and "not a name mf_celldump writes" in w for w in report.warnings), report.warnings


def test_rank_folder_with_a_leading_zero_never_replaces_rank_0(D):
    """`rank00` beside `rank0` (distributed): only rank0 is processed; rank00 keeps every file."""
    edit_manifest(rank0(D), distributed=True)
    shutil.copytree(rank0(D), rank0(D, "rank00"))
    kept = {p: s for p, s in raw_npys(D).items() if p.startswith(os.path.join(fmt.RAW_ROOT, "rank00"))}
    report = process_dump(D, jobs=1)
    assert report.ok and sorted(o.rank for o in report.processed) == [0, 0]
    assert raw_npys(D) == kept, "rank00 is not ours: left whole"
    assert any("rank00" in w and "not a name mf_celldump writes" in w for w in report.warnings), report.warnings


def test_rank_folder_with_a_huge_number_is_named_and_left_whole(D):
    huge = rank0(D, "rank" + "7" * 13)
    shutil.copytree(rank0(D), huge)
    kept = {p for p in raw_npys(D) if p.startswith(os.path.relpath(huge, D))}
    report = process_dump(D, jobs=1)
    assert report.ok and {p for p in raw_npys(D)} == kept
    assert any(os.path.basename(huge) in w for w in report.warnings), report.warnings


def test_file_named_like_a_removal_folder_is_not_deleted(D):
    """A user's file at `.step1.removing` (the name a removal in progress has) is not ours."""
    path = os.path.join(rank0(D), ".step1.removing")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("my notes")
    report = process_dump(D, jobs=1)
    assert _read(path) == b"my notes"
    assert any(".step1.removing" in w and "left in place" in w for w in report.warnings), report.warnings


def test_step_paths_that_are_files_fail_their_step_and_delete_nothing(D):
    """A file at the raw `step1` and at the output `step0`: both named, step 0's raw data kept, files untouched."""
    shutil.rmtree(os.path.join(rank0(D), "step1"))
    for path in (os.path.join(rank0(D), "step1"), os.path.join(D, "step0")):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("a file of yours")
    before = raw_npys(D)
    report = process_dump(D, jobs=1)
    assert [o.status for o in report.outcomes] == ["failed"] and raw_npys(D) == before
    assert any("step1: not a plain folder" in p for p in report.all_problems), report.all_problems
    assert all(_read(p) == b"a file of yours" for p in (os.path.join(rank0(D), "step1"), os.path.join(D, "step0")))


# -- markers and manifests that disagree with the data ------------------------------------

def test_step_folder_whose_marker_names_another_step_is_not_processed(D):
    """Step 0's folder copied to `step1`: its `_step_done.json` says step 0; nothing is replaced or deleted."""
    shutil.rmtree(os.path.join(rank0(D), "step1"))
    shutil.copytree(os.path.join(rank0(D), "step0"), os.path.join(rank0(D), "step1"))
    before = raw_npys(D)
    report = process_dump(D, jobs=1)
    outcome = next(o for o in report.outcomes if o.step == 1)
    assert outcome.status == "failed" and "marks step 0 complete" in outcome.problems[0], outcome.problems
    assert not os.path.exists(os.path.join(D, "step1"))
    assert set(raw_npys(D)) == {p for p in before if "step1" in p}, "step 0 processed, step 1 kept whole"


def test_manifest_task_changed_after_capture_keeps_every_raw_file(D):
    """`task: statistics` written into a tensor capture's manifest: refused, every raw .npy stays."""
    edit_manifest(rank0(D), task="statistics")
    before = raw_npys(D)
    with pytest.raises(ManifestError, match="disagrees with the configuration it records"):
        process_dump(D, jobs=1)
    assert raw_npys(D) == before


def test_manifest_task_and_configuration_changed_are_told_by_the_step_markers(D):
    """Both `task` and `config.task` changed: each step's `_step_done.json` still says tensor."""
    manifest = edit_manifest(rank0(D), task="statistics")
    edit_manifest(rank0(D), config=dict(manifest["config"], task="statistics"))
    before = raw_npys(D)
    report = process_dump(D, jobs=1)
    assert [o.status for o in report.outcomes] == ["failed", "failed"]
    assert all("says task 'tensor'" in o.problems[0] for o in report.outcomes), report.all_problems
    assert raw_npys(D) == before and not os.path.exists(os.path.join(D, "step0"))


def test_step_marker_of_another_run_is_not_processed(D):
    marker = os.path.join(rank0(D), "step1", fmt.STEP_DONE_FILE)
    with open(marker, encoding="utf-8") as handle:
        done = json.load(handle)
    with open(marker, "w", encoding="utf-8") as handle:
        json.dump(dict(done, run_id="another-run"), handle)
    report = process_dump(D, jobs=1)
    outcome = next(o for o in report.outcomes if o.step == 1)
    assert outcome.status == "failed" and "written by run 'another-run'" in outcome.problems[0]
    assert os.path.isfile(marker)


# -- one bad step or rank does not stop the others ---------------------------------------

def test_processed_folder_that_is_a_file_stops_no_step(D):
    """`_raw/rank0/_processed` is a file: both steps get their output, keep their raw data, and say why."""
    path = os.path.join(rank0(D), fmt.PROCESSED_DIR)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("not a folder")
    before = raw_npys(D)
    report = process_dump(D, jobs=1)
    assert sorted(o.step for o in report.processed) == [0, 1]
    assert all(os.path.isfile(os.path.join(D, f"step{s}", "rank", fmt.DUMP_JSON)) for s in (0, 1))
    assert all("_processed is not a plain folder" in o.problems[0] for o in report.outcomes), report.all_problems
    assert raw_npys(D) == before and _read(path) == b"not a folder"


def test_rank_with_a_huge_manifest_stops_no_other_rank(tmp_path):
    """Rank 0's manifest lists 1.4 million cells (60 MB, inside the size limit): rank 1 is processed,
    under a 400 MiB address-space limit."""
    dump = str(tmp_path / "dump")
    for rank in (0, 1):
        builder = build_dump(dump, steps=1)
        edit_manifest(builder.rank_dir, rank=rank, distributed=True)
        if rank == 0:
            os.rename(builder.rank_dir, str(tmp_path / "rank0"))
        else:
            os.rename(builder.rank_dir, os.path.join(dump, fmt.RAW_ROOT, "rank1"))
    os.rename(str(tmp_path / "rank0"), rank0(dump))
    path = os.path.join(rank0(dump), fmt.MANIFEST_FILE)
    with open(path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    cells = ",".join(f'{{"id":{i},"name":"m.c{i}","class":"C"}}' for i in range(1_400_000))
    head = json.dumps({k: v for k, v in manifest.items() if k != "cells"})[:-1]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f'{head}, "cells": [{cells}]}}')
    assert 40 << 20 < os.path.getsize(path) < 64 << 20
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {REPO!r})
        from mf_celldump.processing.driver import process_dump
        report = process_dump({dump!r}, jobs=1)
        print("PROCESSED", [(o.rank, o.step) for o in report.processed])
        print("PROBLEMS", report.all_problems)
    """)
    proc = limited_python(code, limit_mb=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "PROCESSED [(1, 0)]" in proc.stdout
    assert "rank 0:" in proc.stdout and "rank not processed" in proc.stdout
    assert os.listdir(os.path.join(rank0(dump), "step0")), "rank 0's raw data is kept"


# -- a run that raises: every step that ended is written whole, a partial step is named ------------

RAISING_RUN = textwrap.dedent('''
    import sys, time
    import mindspore as ms
    import mf_celldump
    from mf_celldump.rawformat import npy_files
    from tests.support import capture_net as cn

    # The disk is slow: each tensor file takes 30 ms, so the raw writer is still busy with the steps that
    # ended when the script raises (the process then ends with capture still attached, as on a trainer
    # whose train-end event sits outside its try/finally).
    slow_write = npy_files.NpyFileWriter.write
    def write(self, path, chunks):
        time.sleep(0.03)
        return slow_write(self, path, chunks)
    npy_files.NpyFileWriter.write = write

    mode, dump_path, cut = sys.argv[1], sys.argv[2], sys.argv[3]
    cn.set_mode(mode)
    net = cn.train_one_step_cell(cn.make_net())
    dump = mf_celldump.attach(net, {"dump_path": dump_path, "task": "tensor", "layer_mapping": None})
    for step in range(2):
        dump.begin_step(step)
        net(cn.make_input())
        dump.end_step()
    if cut == "mid-step":
        dump.begin_step(2)
        net(cn.make_input())
    raise RuntimeError("the data pipeline failed")
''')


def _raising_run(tmp_path, mode, cut):
    script = tmp_path / "raising_run.py"
    script.write_text(RAISING_RUN)
    dump = tmp_path / "dump"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script), mode, str(dump), cut], cwd=REPO, timeout=600, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 1 and "RuntimeError: the data pipeline failed" in proc.stdout, proc.stdout[-4000:]
    return proc.stdout, str(dump)


def _process_cli(dump):
    return subprocess.run([sys.executable, "-m", "mf_celldump", "process", dump], cwd=REPO, timeout=600,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)


def _entries(dump, step):
    with open(os.path.join(dump, f"step{step}", "rank", fmt.DUMP_JSON), encoding="utf-8") as handle:
        return json.load(handle)["data"]


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_a_run_that_raises_after_its_steps_ended_leaves_them_whole_and_says_what_to_run(tmp_path, mode):
    out, dump = _raising_run(tmp_path, mode, "between-steps")
    for step in (0, 1):
        assert os.path.isfile(os.path.join(rank0(dump), f"step{step}", fmt.STEP_DONE_FILE)), out[-4000:]
    assert "raw data of step(s) 0,1 written whole, no step left unfinished" in out
    assert f"run `mf-celldump process {dump}`" in out
    assert "raw capture writer failed" not in out
    proc = _process_cli(dump)
    assert proc.returncode == 0, proc.stdout
    assert "INCOMPLETE" not in proc.stdout
    step0, step1 = _entries(dump, 0), _entries(dump, 1)
    assert sorted(step0) == sorted(step1) and len(step1) > 4
    assert not os.path.exists(os.path.join(rank0(dump), "step1"))


def test_a_step_cut_short_is_named_incomplete_with_its_counts_and_kept_raw(tmp_path):
    out, dump = _raising_run(tmp_path, "pynative", "mid-step")
    assert "step(s) 2 did not finish" in out
    assert not os.path.exists(os.path.join(rank0(dump), "step2", fmt.STEP_DONE_FILE))
    raw = sorted(os.listdir(os.path.join(rank0(dump), "step2")))
    proc = _process_cli(dump)
    assert proc.returncode == 1, proc.stdout  # problems found: never exit 0 over a partial step
    line = [t for t in proc.stdout.splitlines() if "INCOMPLETE: step 2 rank 0" in t]
    assert line and "entries (cell calls)" in line[0] and "it is not the whole step" in line[0], proc.stdout
    assert sorted(os.listdir(os.path.join(rank0(dump), "step2"))) == raw, "the partial step's raw data is kept"
    assert sorted(_entries(dump, 0)) == sorted(_entries(dump, 1))  # the whole steps are processed
    assert not os.path.exists(os.path.join(rank0(dump), "step1"))
    again = _process_cli(dump)  # and every run says so again
    assert again.returncode == 1 and "INCOMPLETE: step 2 rank 0" in again.stdout
