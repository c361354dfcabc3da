"""Processing never loses data: killed runs, re-runs, corrupt files, bad input, unsafe paths, CLI."""

import argparse
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mf_celldump.cli import process as cli
from mf_celldump.cli.conventions import ExitCode
from mf_celldump.errors import DumpNotFoundError, EmptyDumpError, NotACaptureDumpError
from mf_celldump.fsutil import FolderLock
from mf_celldump.processing.driver import process_dump
from tests.support import formats as fmt
from tests.support.event_recorder import EventRecorder
from tests.support.rawdump_builder import RawDumpBuilder, llama_net, read_output, snapshot_tree, write_llama_step

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F, A = fmt.FORWARD, fmt.SLOT_ARG


def build_dump(dump, layers=2, steps=2, calls=1, task="tensor"):
    """A deterministic two-step LLaMA-like raw dump with inferred call numbers and a records file."""
    b = RawDumpBuilder(dump, task=task)
    net = llama_net(b, layers)
    b.write_manifest()
    per_step = {}
    for step in range(steps):
        rng = np.random.default_rng(step)
        s = b.step(step)
        per_step[step] = write_llama_step(
            net,
            s,
            lambda *_, rng=rng: rng.standard_normal((2, 8)).astype(np.float32),
            explicit_calls=False,
            calls=calls,
        )
        s.record(net.root, F, A, (1,), kind=fmt.KIND_INT, value=step)
        s.done(step)
    return b, per_step


def run_cli(args):
    parser = argparse.ArgumentParser()
    cli.add_cli(parser.add_subparsers(dest="command"))
    parsed = parser.parse_args(["process", *args])
    return parsed.func(parsed)


def _outputs(dump):
    return {k: v for k, v in snapshot_tree(dump).items() if not k.startswith(fmt.RAW_ROOT)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Output of an uninterrupted run, per dump size (built at the path the crash tests reuse)."""
    refs = {}
    for layers, calls in ((2, 1), (12, 2)):
        dump = str(tmp_path_factory.mktemp(f"ref{layers}") / "dump")
        build_dump(dump, layers=layers, calls=calls)
        recorder = EventRecorder()
        report = process_dump(dump, jobs=1, observer=recorder)
        events = recorder.events
        assert report.ok
        refs[(layers, calls)] = (dump, _outputs(dump), events)
    return refs


KILL_SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {repo!r})
    from mf_celldump.processing import worker_pool
    from mf_celldump.processing.driver import process_dump
    from tests.support.event_recorder import EventRecorder
    worker_pool.MIN_FILES_PER_WORKER = 100  # a pool even on these small dumps when jobs > 1
    def die_at(event, seen=[]):
        seen.append(event)
        if len(seen) == {kill_at}:
            os._exit(9)
    process_dump({dump!r}, jobs={jobs}, observer=EventRecorder(die_at))
    """
)


def _check_nothing_lost(dump, builder, per_step):
    """Each step is either fully raw (every file still there) or fully processed."""
    for step, count in per_step.items():
        raw = os.path.join(builder.rank_dir, fmt.step_dir_name(step))
        output = os.path.join(dump, fmt.step_dir_name(step), "rank", fmt.DUMP_JSON)
        raw_files = len([n for n in os.listdir(raw) if n.endswith(".npy")]) if os.path.isdir(raw) else 0
        assert raw_files == count or os.path.isfile(output), f"step {step}: raw partly gone and no output"
        if raw_files not in (0, count):
            raise AssertionError(f"step {step}: raw folder partly deleted ({raw_files} of {count})")


@pytest.mark.parametrize(
    "layers,calls,jobs,kill_at",
    [
        (2, 1, 1, 1),  # first file
        (2, 1, 1, 60),  # mid step 0
        (2, 1, 1, "output0"),  # output of step 0 in place, marker not yet written
        (2, 1, 1, "marker0"),  # marker written, raw not yet removed
        (2, 1, 1, "removed0"),  # step 0 done, step 1 not started
        (2, 1, 1, "output1"),
        (12, 2, 2, 700),  # worker pool running
    ],
)
def test_killed_run_then_rerun_gives_identical_result(tmp_path, reference, layers, calls, jobs, kill_at):
    ref_dump, ref_outputs, events = reference[(layers, calls)]
    if isinstance(kill_at, str):  # the n-th occurrence of a named event
        name, nth = kill_at[:-1], int(kill_at[-1])
        kill_at = [i for i, e in enumerate(events, 1) if e == name][nth]
    # same absolute path as the reference, so dump_data_dir matches byte for byte
    os.rename(ref_dump, str(tmp_path / "ref-aside"))
    try:
        builder, per_step = build_dump(ref_dump, layers=layers, calls=calls)
        script = KILL_SCRIPT.format(repo=REPO, kill_at=kill_at, dump=ref_dump, jobs=jobs)
        proc = subprocess.run(
            [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 9, proc.stderr[-2000:]
        _check_nothing_lost(ref_dump, builder, per_step)
        report = process_dump(ref_dump, jobs=1)
        assert report.ok, report.summary()
        assert _outputs(ref_dump) == ref_outputs
        assert not any(
            os.path.exists(os.path.join(builder.rank_dir, fmt.step_dir_name(s))) for s in per_step
        )
        leftovers = [n for n in os.listdir(os.path.join(ref_dump, "step0")) if n != "rank"]
        assert leftovers == []
        again = process_dump(ref_dump, jobs=1)
        assert again.nothing_to_do and "nothing to do" in again.summary()
        assert _outputs(ref_dump) == ref_outputs
    finally:
        import shutil

        shutil.rmtree(ref_dump, ignore_errors=True)
        os.rename(str(tmp_path / "ref-aside"), ref_dump)


def test_keep_raw_rerun_is_noop_and_later_removal_does_not_reprocess(tmp_path):
    dump = str(tmp_path / "dump")
    builder, per_step = build_dump(dump)
    first = process_dump(dump, jobs=1, remove_raw=False)
    assert first.ok and len(first.processed) == 2
    before = snapshot_tree(dump)
    mtime = os.stat(os.path.join(dump, "step0", "rank", fmt.DUMP_JSON)).st_mtime_ns
    second = process_dump(dump, jobs=1, remove_raw=False)
    assert second.nothing_to_do and {o.status for o in second.outcomes} == {"already-processed"}
    assert snapshot_tree(dump) == before
    third = process_dump(dump, jobs=1)
    assert {o.status for o in third.outcomes} == {"already-processed"} and all(
        o.raw_removed for o in third.outcomes
    )
    assert os.stat(os.path.join(dump, "step0", "rank", fmt.DUMP_JSON)).st_mtime_ns == mtime
    assert not os.path.exists(os.path.join(builder.rank_dir, "step0"))
    assert not os.path.exists(os.path.join(builder.rank_dir, fmt.PROCESSED_DIR))  # no empty folder left


def test_new_raw_data_replaces_an_older_output(tmp_path):
    dump = str(tmp_path / "dump")
    builder, _ = build_dump(dump, steps=1)
    process_dump(dump, jobs=1, remove_raw=False)
    s = builder.step(0)
    s.seq = 10_000
    s.tensor(0, fmt.BACKWARD, fmt.SLOT_ARG, (3,), np.ones(2, np.float32))
    report = process_dump(dump, jobs=1, remove_raw=False)
    assert [o.status for o in report.outcomes] == ["processed"]
    assert "Cell.model.LlamaModel.backward.0" in read_output(dump, 0)["dump"]["data"]
    assert sorted(os.listdir(os.path.join(dump, "step0"))) == ["rank"]


def test_leftover_removing_folder_is_finished(tmp_path):
    dump = str(tmp_path / "dump")
    builder, _ = build_dump(dump, steps=1)
    leftover = os.path.join(builder.rank_dir, fmt.removing_dir_name("step7"))
    os.makedirs(leftover)
    open(os.path.join(leftover, "x.npy"), "wb").close()
    assert process_dump(dump, jobs=1).ok
    assert not os.path.exists(leftover)


def test_truncated_npy_is_reported_rest_processed_raw_kept(tmp_path, capsys):
    dump = str(tmp_path / "dump")
    builder, per_step = build_dump(dump, steps=1)
    raw = os.path.join(builder.rank_dir, "step0")
    victim = sorted(n for n in os.listdir(raw) if n.endswith(".npy"))[5]
    with open(os.path.join(raw, victim), "r+b") as handle:
        handle.truncate(100)
    report = process_dump(dump, jobs=1)
    assert not report.ok and len(report.all_problems) == 1
    assert victim in report.all_problems[0] and "truncated" in report.all_problems[0]
    assert report.files == per_step[0] - 1
    assert len([n for n in os.listdir(raw) if n.endswith(".npy")]) == per_step[0]
    data = read_output(dump, 0)["dump"]["data"]
    assert len(data) == 2 * (1 + 1 + 2 * 12 + 1)  # every entry is still there
    assert (
        sum(1 for body in data.values() for leaf in body["input_args"] + body["output"] if leaf is None) == 1
    )
    assert not os.path.exists(os.path.join(builder.rank_dir, fmt.PROCESSED_DIR, "step0.json"))
    # the CLI says so and exits 1; the raw data stays for as long as the problem does
    assert run_cli([dump]) == ExitCode.FOUND
    out = capsys.readouterr().out
    assert "PROBLEMS: 1" in out and victim in out
    assert os.path.isdir(raw)


def test_bad_inputs_raise_clear_errors(tmp_path, capsys):
    with pytest.raises(DumpNotFoundError, match="does not exist"):
        process_dump(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EmptyDumpError, match="is empty"):
        process_dump(str(empty))
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("hello")
    with pytest.raises(NotACaptureDumpError, match="_raw/rank\\*/manifest.json"):
        process_dump(str(other))
    manifest_only = str(tmp_path / "manifest_only")
    RawDumpBuilder(manifest_only).write_manifest()
    with pytest.raises(EmptyDumpError, match="no captured step"):
        process_dump(manifest_only)
    assert run_cli([str(tmp_path / "missing")]) == ExitCode.BAD_INPUT
    assert "does not exist" in capsys.readouterr().err
    assert run_cli([str(other)]) == ExitCode.BAD_INPUT
    assert "not an mf_celldump capture folder" in capsys.readouterr().err
    assert run_cli([str(empty), "--steps", "7-2"]) == ExitCode.BAD_INPUT
    assert "reversed" in capsys.readouterr().err


def test_cli_ok_summary_selection_and_second_run(tmp_path, capsys):
    dump = str(tmp_path / "dump")
    build_dump(dump, steps=3)
    assert run_cli([dump, "--steps", "0,2", "--jobs", "1", "--keep-raw"]) == ExitCode.OK
    out = capsys.readouterr().out
    assert "processed 2 step folder(s): steps 0,2, ranks 0" in out and "entries" in out
    assert sorted(os.listdir(dump)) == ["_raw", "step0", "step2"]
    assert run_cli([dump, "--only-complete"]) == ExitCode.OK
    assert run_cli([dump]) == ExitCode.OK
    assert "nothing to do" in capsys.readouterr().out


def test_unsafe_names_and_symlinks_are_refused(tmp_path):
    dump = str(tmp_path / "dump")
    b = RawDumpBuilder(dump)
    b.cell("../../evil", "C")
    b.write_manifest()
    b.step(0).tensor(0, F, A, (0,), np.ones(2, np.float32))
    report = process_dump(dump, jobs=1)  # a problem of that step (other steps and ranks go on)
    assert any("one path component" in p for p in report.all_problems)
    assert os.path.isdir(os.path.join(b.rank_dir, "step0"))

    dump2 = str(tmp_path / "dump2")
    b2 = RawDumpBuilder(dump2)
    b2.cell("ok", "C")
    b2.write_manifest()
    s = b2.step(0)
    s.tensor(0, F, A, (0,), np.ones(2, np.float32))
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), os.path.join(dump2, "step0"))
    report = process_dump(dump2, jobs=1)
    assert [o.status for o in report.outcomes] == ["failed"]
    assert any("not a plain folder" in p for p in report.all_problems)
    assert os.listdir(outside) == []
    os.unlink(os.path.join(dump2, "step0"))
    secret = tmp_path / "secret.npy"
    np.save(secret, np.ones(3))
    os.symlink(str(secret), os.path.join(s.path, "c0.f.a.t.n0.p1_float64_5.npy"))
    report = process_dump(dump2, jobs=1)
    assert any("symlink" in p for p in report.all_problems)
    assert os.path.isdir(s.path)  # a problem keeps the raw data


def test_concurrent_run_on_same_rank_is_refused(tmp_path):
    dump = str(tmp_path / "dump")
    builder, _ = build_dump(dump, steps=1)
    lock = FolderLock(os.path.join(builder.rank_dir, fmt.PROCESSING_LOCK))
    assert lock.acquire()
    try:
        report = process_dump(dump, jobs=1)
        assert not report.ok and "another process" in report.all_problems[0]
        assert os.path.isdir(os.path.join(builder.rank_dir, "step0"))
    finally:
        lock.release()
    assert process_dump(dump, jobs=1).ok


def test_incomplete_step_still_being_written_keeps_raw(tmp_path):
    dump = str(tmp_path / "dump")
    builder, _ = build_dump(dump, steps=1)
    os.unlink(os.path.join(builder.rank_dir, "step0", fmt.STEP_DONE_FILE))
    late = []

    def write_late_file(event):
        if event == "output" and not late:  # capture writes one more file meanwhile
            s = builder.step(0)
            s.seq = 50_000
            late.append(s.tensor(0, fmt.BACKWARD, fmt.SLOT_ARG, (4,), np.ones(2, np.float32)))

    report = process_dump(dump, jobs=1, observer=EventRecorder(write_late_file))
    assert not report.ok and not report.processed[0].raw_removed
    assert "INCOMPLETE: step 0 rank 0" in report.all_problems[0]
    assert os.path.isfile(late[0])
    builder.step(0).done(0)  # the capture finishes the step
    again = process_dump(dump, jobs=1)  # the new file is picked up, then raw goes
    assert [o.status for o in again.outcomes] == ["processed"] and again.processed[0].raw_removed
    data = read_output(dump, 0)["dump"]["data"]
    assert data["Cell.model.LlamaModel.backward.0"]["output"][4]["shape"] == [2]
