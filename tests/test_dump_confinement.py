"""Nothing outside the dump is read, created, changed or deleted; only our files go.

``D`` is a raw dump captured with ``attach`` (real MindSpore, PyNative, CPU), copied for
each test; the planted links point into an outside area whose every byte, mode, link
count and time is compared before and after.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from mf_celldump.errors import ProcessingError
from mf_celldump.processing.driver import process_dump
from tests.support import formats as fmt
from tests.support.hostile_dumps import (
    alarm,
    build_dump,
    make_outside,
    raw_files,
    run_cli,
    snapshot,
)


@pytest.fixture
def D(raw_dump):
    """A raw dump captured with attach (two steps, tensor task), this test's own copy."""
    return raw_dump


@pytest.fixture
def outside(tmp_path):
    return make_outside(str(tmp_path / "outside"))


def rank0(dump):
    return os.path.join(dump, fmt.RAW_ROOT, "rank0")


def test_processed_folder_linked_outside_deletes_nothing_there(D, outside):
    """`ln -s $V D/_raw/rank0/_processed` with $V/step99.json: refused, $V untouched, raw kept."""
    before = snapshot(os.path.dirname(outside["dir"]))
    os.symlink(outside["dir"], os.path.join(rank0(D), fmt.PROCESSED_DIR))
    proc = run_cli("process", D, "--jobs", "1")
    assert proc.returncode == 1
    assert f"{rank0(D)}/_processed" in proc.stdout and "refused" in proc.stdout
    assert snapshot(os.path.dirname(outside["dir"])) == before
    assert os.path.isdir(os.path.join(rank0(D), "step0")) and os.path.isdir(os.path.join(rank0(D), "step1"))


@pytest.mark.parametrize("target", ["missing", "file"])
def test_lock_file_linked_outside_creates_and_changes_nothing(D, outside, target):
    """`ln -s $O/new D/_raw/rank0/.processing.lock`: $O/new is not created (nor an existing file changed)."""
    area = os.path.dirname(outside["dir"])
    before = snapshot(area)
    lock = os.path.join(rank0(D), fmt.PROCESSING_LOCK)
    os.symlink(outside[target], lock)
    proc = run_cli("process", D, "--jobs", "1")
    assert proc.returncode == 1 and f"{lock} is a symbolic link" in proc.stdout
    assert snapshot(area) == before and not os.path.exists(outside["missing"])


def test_lock_file_hard_linked_outside_is_refused(D, outside):
    area = os.path.dirname(outside["dir"])
    lock = os.path.join(rank0(D), fmt.PROCESSING_LOCK)
    os.link(outside["file"], lock)
    before = snapshot(area)
    report = process_dump(D, jobs=1)
    assert any(f"{lock} has 2 hard links" in p for p in report.all_problems)
    assert snapshot(area) == before and os.path.exists(lock)  # not ours: not deleted either


def test_raw_file_hard_linked_to_outside_file_keeps_its_mode(D, outside):
    """A raw .npy hard-linked to an outside 0600 file: refused; the file stays 0600 with one extra link."""
    step0 = os.path.join(rank0(D), "step0")
    victim = raw_files(step0)[0]
    os.unlink(os.path.join(step0, victim))
    os.link(outside["file"], os.path.join(step0, victim))
    area = os.path.dirname(outside["dir"])
    before = snapshot(area)
    report = process_dump(D, jobs=1)
    problem = [p for p in report.all_problems if victim in p]
    assert problem and "2 hard links" in problem[0] and "refused" in problem[0]
    assert snapshot(area) == before  # mode 0600, content, and link count (2: no link into the output)
    assert os.stat(outside["file"]).st_mode & 0o777 == 0o600
    assert os.path.isfile(os.path.join(step0, victim)), "a step with a problem keeps its raw data"
    assert [o.status for o in report.outcomes] == ["processed", "processed"] and report.outcomes[1].raw_removed


def test_manifest_linked_outside_is_not_read(D, outside):
    """A manifest symlinked to an outside FIFO: refused without opening it (opening would block)."""
    manifest = os.path.join(rank0(D), fmt.MANIFEST_FILE)
    os.unlink(manifest)
    os.symlink(outside["fifo"], manifest)
    proc = run_cli("process", D, "--jobs", "1", timeout=60)
    assert proc.returncode == 2
    assert f"{manifest} is a symbolic link" in proc.stderr


def test_manifest_hard_linked_outside_is_refused(D, outside, tmp_path):
    manifest = os.path.join(rank0(D), fmt.MANIFEST_FILE)
    copy = str(tmp_path / "outside-manifest.json")
    shutil.move(manifest, copy)
    os.link(copy, manifest)
    proc = run_cli("process", D, "--jobs", "1")
    assert proc.returncode == 2 and f"{manifest} has 2 hard links" in proc.stderr


def test_files_we_did_not_write_stay_and_are_reported(D):
    """`echo n > D/_raw/rank0/step0/NOTES.txt`: reported, kept where it is, not reprocessed later."""
    step0 = os.path.join(rank0(D), "step0")
    notes = os.path.join(step0, "NOTES.txt")
    with open(notes, "w", encoding="utf-8") as handle:
        handle.write("n\n")
    os.makedirs(os.path.join(step0, "my-plots"))
    open(os.path.join(step0, "my-plots", "a.png"), "wb").close()
    proc = run_cli("process", D, "--jobs", "1")
    assert proc.returncode == 0, proc.stdout
    assert "NOTES.txt" in proc.stdout and "left in place" in proc.stdout
    assert sorted(os.listdir(step0)) == ["NOTES.txt", "my-plots"], "only our files were removed"
    with open(notes, encoding="utf-8") as handle:
        assert handle.read() == "n\n"
    assert not os.path.exists(os.path.join(rank0(D), "step1"))
    output = os.path.join(D, "step0", "rank", fmt.DUMP_JSON)
    mtime = os.stat(output).st_mtime_ns
    again = run_cli("process", D, "--jobs", "1")
    assert again.returncode == 0 and "holds no capture data" in again.stdout and "nothing to do" in again.stdout
    assert os.stat(output).st_mtime_ns == mtime and os.path.isfile(notes)


def test_foreign_files_in_a_killed_removal_go_back_to_their_folder(tmp_path):
    """A run killed after renaming step0 to .step0.removing: the next run deletes only our files."""
    dump = str(tmp_path / "dump")
    builder = build_dump(dump, steps=1)
    step0 = os.path.join(builder.rank_dir, "step0")
    open(os.path.join(step0, "NOTES.txt"), "w").close()
    assert process_dump(dump, jobs=1, remove_raw=False).ok
    os.rename(step0, os.path.join(builder.rank_dir, ".step0.removing"))  # where the kill struck
    report = process_dump(dump, jobs=1)
    assert os.listdir(step0) == ["NOTES.txt"]
    assert not os.path.exists(os.path.join(builder.rank_dir, ".step0.removing"))
    assert any("NOTES.txt" in w for w in report.warnings)


def test_files_of_yours_in_an_output_folder_are_never_deleted_with_it(tmp_path):
    """New raw data for a processed step would replace its output: not while that holds your files."""
    dump = str(tmp_path / "dump")
    builder = build_dump(dump, steps=1)
    assert process_dump(dump, jobs=1).ok
    notes = os.path.join(dump, "step0", "rank", "NOTES.txt")
    open(notes, "w").close()
    writer = builder.step(0)
    writer.tensor(0, fmt.FORWARD, fmt.SLOT_ARG, (3,), np.ones(2, np.float32))
    writer.done(0)
    report = process_dump(dump, jobs=1)
    assert [o.status for o in report.outcomes] == ["failed"]
    assert "holds files mf_celldump did not write (NOTES.txt)" in report.all_problems[0]
    assert os.path.isfile(notes) and os.listdir(os.path.join(dump, "step0")) == ["rank"]
    assert raw_files(os.path.join(builder.rank_dir, "step0")), "raw data kept"
    os.unlink(notes)
    assert process_dump(dump, jobs=1).ok


def test_killed_runs_temporary_files_are_cleaned_and_only_those(tmp_path):
    """.tmp-* files of a killed run in _processed/ (mode 0600) go; a file of another name stays."""
    dump = str(tmp_path / "dump")
    builder = build_dump(dump, steps=1)
    processed = os.path.join(builder.rank_dir, fmt.PROCESSED_DIR)
    os.makedirs(processed)
    ours = os.path.join(processed, ".tmp-k3x_9a0q")
    theirs = os.path.join(processed, ".tmp-notes.txt")
    for path in (ours, theirs):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)
    assert process_dump(dump, jobs=1).ok
    assert not os.path.exists(ours) and os.path.exists(theirs)
    os.unlink(theirs)
    assert process_dump(dump, jobs=1).nothing_to_do


def test_successful_run_leaves_no_lock_and_no_empty_processed_folder(D):
    assert process_dump(D, jobs=1).ok
    assert sorted(os.listdir(rank0(D))) == [fmt.MANIFEST_FILE]
    assert sorted(os.listdir(D)) == ["_raw", "step0", "step1"]
    assert sorted(os.listdir(os.path.join(D, "step0"))) == ["rank"]


def test_killed_run_is_finished_by_the_next_and_leaves_nothing_behind(tmp_path):
    """Killed right after the output is in place (raw linked into it): the rerun accepts our own links."""
    import subprocess
    import sys
    import textwrap

    from tests.support.hostile_dumps import REPO

    dump = str(tmp_path / "dump")
    builder = build_dump(dump, steps=2)
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {REPO!r})
        from mf_celldump.processing.driver import process_dump
        from mf_celldump.processing.observer import ProcessingObserver
        class Die(ProcessingObserver):
            def on_stage(self, rank, step, stage):
                if stage == "output":
                    os._exit(9)
        process_dump({dump!r}, jobs=1, observer=Die())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    raw0 = os.path.join(builder.rank_dir, "step0")
    assert os.stat(os.path.join(raw0, raw_files(raw0)[0])).st_nlink == 2  # linked into the output
    report = process_dump(dump, jobs=1)
    assert report.ok, report.summary()
    assert sorted(os.listdir(builder.rank_dir)) == [fmt.MANIFEST_FILE]
    for step in (0, 1):
        assert os.listdir(os.path.join(dump, f"step{step}")) == ["rank"]


# -- every place a link can be planted ------------------------------------------------------------


def _first_npy(dump):
    step0 = os.path.join(rank0(dump), "step0")
    return os.path.join(step0, raw_files(step0)[0])


def _replace_by_link(path, target, hard=False):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)
    (os.link if hard else os.symlink)(target, path)


def _with_kbk(dump, outside, how):
    from tests.support.rawdump_builder import RawDumpBuilder, kbk_rows

    builder = RawDumpBuilder(dump, rank=0)
    key = fmt.Key(0, fmt.FORWARD, fmt.SLOT_ARG, fmt.KIND_TENSOR, (0,), None)
    csv = builder.kbk_csv(5, kbk_rows(key, np.ones(3, np.float32), 1))
    if how == "csv-symlink":
        _replace_by_link(csv, outside["fifo"])
    elif how == "csv-hardlink":
        shutil.copy(csv, outside["file"])
        _replace_by_link(csv, outside["file"], hard=True)
    else:
        _replace_by_link(os.path.join(rank0(dump), "kbk"), outside["dir"])


def _existing_output(dump, what, outside):
    """Process with raw kept, then plant the link inside the output the next run replaces."""
    assert process_dump(dump, jobs=1, remove_raw=False).ok
    with open(os.path.join(dump, "step0", "rank", fmt.DUMP_JSON), encoding="utf-8") as handle:
        json.load(handle)
    folder = os.path.join(dump, "step0", "rank")
    first_npy = os.path.join(folder, fmt.TENSOR_DIR, sorted(os.listdir(os.path.join(folder, fmt.TENSOR_DIR)))[0])
    if what == "data-dir":
        _replace_by_link(os.path.join(folder, fmt.TENSOR_DIR), outside["dir"])
    elif what == "dump-json":
        _replace_by_link(os.path.join(folder, fmt.DUMP_JSON), outside["fifo"])
    elif what == "dump-json hard link":
        shutil.copy(os.path.join(folder, fmt.DUMP_JSON), outside["file"])
        _replace_by_link(os.path.join(folder, fmt.DUMP_JSON), outside["file"], hard=True)
    elif what == "npy":
        _replace_by_link(first_npy, outside["file"])
    else:
        _replace_by_link(first_npy, outside["file"], hard=True)
    # make the raw step differ from what the marker says, so step0 is processed again
    os.unlink(os.path.join(rank0(dump), fmt.PROCESSED_DIR, "step0.json"))


PLANTS = {
    # name: (plant(dump, outside), the run must refuse and name something); the three that are not refused
    # are links under names only processing gives, in folders it deletes: the link is unlinked, its target
    # untouched (docs/robustness.md)
    "_raw folder": (lambda d, o: _replace_by_link(os.path.join(d, "_raw"), o["dir"]), True),
    "rank folder": (lambda d, o: _replace_by_link(rank0(d), o["dir"]), True),
    "manifest -> fifo": (lambda d, o: _replace_by_link(os.path.join(rank0(d), "manifest.json"), o["fifo"]), True),
    "raw step folder": (lambda d, o: _replace_by_link(os.path.join(rank0(d), "step0"), o["dir"]), True),
    "records -> fifo": (lambda d, o: _replace_by_link(os.path.join(rank0(d), "step0", "records.jsonl"), o["fifo"]),
                        True),
    "records hard link": (lambda d, o: _replace_by_link(os.path.join(rank0(d), "step0", "records.jsonl"), o["file"],
                                                         hard=True), True),
    "npy -> fifo": (lambda d, o: _replace_by_link(_first_npy(d), o["fifo"]), True),
    "npy -> file": (lambda d, o: _replace_by_link(_first_npy(d), o["file"]), True),
    "npy hard link": (lambda d, o: _replace_by_link(_first_npy(d), o["file"], hard=True), True),
    "step-done -> fifo": (lambda d, o: _replace_by_link(os.path.join(rank0(d), "step0", "_step_done.json"),
                                                         o["fifo"]), True),
    "_processed folder": (lambda d, o: _replace_by_link(os.path.join(rank0(d), "_processed"), o["dir"]), True),
    "marker -> fifo": (lambda d, o: (os.makedirs(os.path.join(rank0(d), "_processed")),
                                     os.symlink(o["fifo"], os.path.join(rank0(d), "_processed", "step0.json"))),
                       True),
    "marker -> file": (lambda d, o: (os.makedirs(os.path.join(rank0(d), "_processed")),
                                     os.symlink(o["file"], os.path.join(rank0(d), "_processed", "step0.json"))),
                       True),
    "temp file -> file": (lambda d, o: (os.makedirs(os.path.join(rank0(d), "_processed")),
                                        os.symlink(o["file"], os.path.join(rank0(d), "_processed", ".tmp-abcd1234"))),
                          False),
    "lock -> missing": (lambda d, o: os.symlink(o["missing"], os.path.join(rank0(d), ".processing.lock")), True),
    "lock -> fifo": (lambda d, o: os.symlink(o["fifo"], os.path.join(rank0(d), ".processing.lock")), True),
    "lock hard link": (lambda d, o: os.link(o["file"], os.path.join(rank0(d), ".processing.lock")), True),
    "removing folder -> dir": (lambda d, o: os.symlink(o["dir"], os.path.join(rank0(d), ".step7.removing")), False),
    "removing folder holding a link": (lambda d, o: (os.makedirs(os.path.join(rank0(d), ".step7.removing")),
                                                     os.symlink(o["file"], os.path.join(
                                                         rank0(d), ".step7.removing", "c0.f.a.t.n0.p0_float32_1.npy"))),
                                       False),
    "kbk folder": (lambda d, o: _with_kbk(d, o, "dir"), True),
    "statistic.csv -> fifo": (lambda d, o: _with_kbk(d, o, "csv-symlink"), True),
    "statistic.csv hard link": (lambda d, o: _with_kbk(d, o, "csv-hardlink"), True),
    "output step folder": (lambda d, o: os.symlink(o["dir"], os.path.join(d, "step0")), True),
    "output rank folder": (lambda d, o: (os.makedirs(os.path.join(d, "step0")),
                                         os.symlink(o["dir"], os.path.join(d, "step0", "rank"))), True),
    "partial folder": (lambda d, o: (os.makedirs(os.path.join(d, "step0")),
                                     os.symlink(o["dir"], os.path.join(d, "step0", ".rank.partial"))), True),
    "retired folder": (lambda d, o: (os.makedirs(os.path.join(d, "step0")),
                                     os.symlink(o["dir"], os.path.join(d, "step0", ".rank.retired"))), True),
    "output data folder": (lambda d, o: _existing_output(d, "data-dir", o), True),
    "output dump.json -> fifo": (lambda d, o: _existing_output(d, "dump-json", o), True),
    "output dump.json hard link": (lambda d, o: _existing_output(d, "dump-json hard link", o), True),
    "output npy -> file": (lambda d, o: _existing_output(d, "npy", o), True),
    "output npy hard link": (lambda d, o: _existing_output(d, "npy hard link", o), True),
}


@pytest.mark.parametrize("place", sorted(PLANTS))
def test_no_link_in_the_dump_reaches_outside(tmp_path, place):
    dump = str(tmp_path / "dump")
    build_dump(dump, steps=1)
    outside = make_outside(str(tmp_path / "outside"))
    plant, refused = PLANTS[place]
    plant(dump, outside)
    before = snapshot(str(tmp_path / "outside"))
    with alarm(60):
        try:
            report = process_dump(dump, jobs=1)
            text = report.summary()
        except ProcessingError as err:  # bad input for the whole dump (the CLI prints it, exit 2)
            text = str(err)
    assert snapshot(str(tmp_path / "outside")) == before, text
    if refused:
        assert "refused" in text or "not a plain" in text, text
