"""Permissions, a full disk and empty selections end in a message
that says what and where; the raw data is kept and a re-run finishes the work.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from mf_celldump.processing.driver import process_dump
from tests.support.hostile_dumps import REPO, build_dump, raw_files, run_cli

# Root passes every permission check these tests want to see fail; without the capabilities that
# override file modes (setpriv drops them from the bounding set before exec) it is an ordinary owner.
DROP_OVERRIDES = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
needs_permission_checks = pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None, reason="running as root without setpriv")


def _process_as_user(dump):
    """``mf-celldump process DUMP`` as a user whom file modes apply to."""
    prefix = DROP_OVERRIDES if os.geteuid() == 0 else []
    proc = subprocess.run([*prefix, sys.executable, "-m", "mf_celldump", "process", dump, "--jobs", "1"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    return proc


@pytest.fixture
def dump(tmp_path):
    path = str(tmp_path / "dump")
    yield path
    for folder, dirs, _ in os.walk(path):  # let pytest clean up
        for name in dirs:
            os.chmod(os.path.join(folder, name), 0o755)
    os.chmod(path, 0o755)


@needs_permission_checks
def test_unreadable_step_folder_is_a_problem_of_that_step(dump):
    builder = build_dump(dump)
    step0 = os.path.join(builder.rank_dir, "step0")
    os.chmod(step0, 0)
    proc = _process_as_user(dump)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert re.search(r"step 0: cannot read the raw data or write the output: Permission denied: \S*step0", proc.stdout)
    assert "processed 1 step folder(s): steps 1" in proc.stdout
    os.chmod(step0, 0o750)
    assert _process_as_user(dump).returncode == 0
    assert not os.path.exists(step0) and os.path.isdir(os.path.join(dump, "step0", "rank"))


@needs_permission_checks
def test_an_unreadable_rank_folder_is_named_not_called_a_foreign_folder(dump):
    builder = build_dump(dump)
    os.chmod(builder.rank_dir, 0)
    proc = _process_as_user(dump)
    assert proc.returncode != 0 and "not an mf_celldump capture folder" not in proc.stdout + proc.stderr
    assert f"{builder.rank_dir} cannot be read (permission denied): rank 0 is not processed" in proc.stderr, \
        proc.stdout + proc.stderr
    os.chmod(builder.rank_dir, 0o750)
    assert _process_as_user(dump).returncode == 0


@needs_permission_checks
def test_unwritable_output_keeps_raw_and_rerun_finishes(dump):
    builder = build_dump(dump)
    os.chmod(dump, 0o555)
    proc = _process_as_user(dump)
    assert proc.returncode == 1
    assert proc.stdout.count("Permission denied") == 2 and "the raw data is kept" in proc.stdout
    assert "FAILED, raw data kept: 2 step folder(s)" in proc.stdout
    assert len(raw_files(os.path.join(builder.rank_dir, "step0"))) > 0
    os.chmod(dump, 0o755)
    assert _process_as_user(dump).returncode == 0


@needs_permission_checks
def test_dump_of_another_user_gets_a_message_about_the_lock(dump):
    """Another user's dump, as it looks to us: its rank folder is not writable for us (r-x)."""
    build_dump(dump)
    os.chmod(os.path.join(dump, "_raw", "rank0"), 0o555)
    proc = _process_as_user(dump)
    assert proc.returncode == 1
    assert "cannot create the processing lock: Permission denied" in proc.stdout
    assert "may belong to another user" in proc.stdout


ENOSPC_CODE = textwrap.dedent("""
    import json, os, subprocess, sys
    sys.path.insert(0, {repo!r})
    mnt = {mnt!r}
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], check=True)
    from tests.support.hostile_dumps import build_dump
    from mf_celldump.processing.driver import process_dump
    dump = os.path.join(mnt, "dump")
    build_dump(dump, steps=2, layers=1)
    info = os.statvfs(mnt)
    with open(os.path.join(mnt, "filler"), "wb") as handle:  # leaves 4 KiB free
        handle.write(b"x" * (info.f_bavail * info.f_frsize - 4096))
    first = process_dump(dump, jobs=1)
    raw_left = sorted(os.listdir(os.path.join(dump, "_raw", "rank0")))
    step0 = os.path.join(dump, "step0")
    left_in_output = sorted(os.listdir(step0)) if os.path.isdir(step0) else "no step0 folder"
    os.unlink(os.path.join(mnt, "filler"))
    second = process_dump(dump, jobs=1)
    size = sum(os.path.getsize(os.path.join(dump, "step0", "rank", n)) for n in ("dump.json", "construct.json",
                                                                                  "stack.json"))
    print(json.dumps({{"first": first.all_problems, "status": [o.status for o in first.outcomes],
                      "raw": raw_left, "partial": left_in_output, "second_ok": second.ok,
                      "second": [o.status for o in second.outcomes], "output_bytes": size}}))
""")


def _tmpfs_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True)
    return probe.returncode == 0


def _needed_kib(problem: str) -> float:
    match = re.search(r"needs about ([0-9.]+) (KiB|MiB|bytes)", problem)
    assert match, problem
    return float(match.group(1)) * {"bytes": 1 / 1024, "KiB": 1, "MiB": 1024}[match.group(2)]


@pytest.mark.skipif(not _tmpfs_available(), reason="no user namespaces here: see the RLIMIT_FSIZE test")
def test_full_disk_says_how_much_space_where_and_a_rerun_finishes(tmp_path):
    """A real full disk: a 1 MiB tmpfs (mounted in a private user+mount namespace) filled up.

    Both steps fail with the space they need and where; the raw data stays; once the
    filler is deleted, a re-run processes everything.
    """
    mnt = str(tmp_path / "mnt")
    os.makedirs(mnt)
    code = ENOSPC_CODE.format(repo=REPO, mnt=mnt)
    proc = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["status"] == ["failed", "failed"]
    for problem in result["first"]:
        assert "no space left (No space left on device)" in problem and "free now" in problem, problem
        assert f"on the file system of {mnt}/dump" in problem and "the raw data is kept" in problem
    assert result["raw"] == ["manifest.json", "step0", "step1"] and result["partial"] == "no step0 folder"
    assert result["second_ok"] and result["second"] == ["processed", "processed"]
    assert _needed_kib(result["first"][0]) * 1024 >= result["output_bytes"], "the estimate covers the output"


def _fsize_limited(limit: int):
    def apply():
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_file_size_limit_stand_in_for_a_full_disk(tmp_path):
    """A file-system-level stand-in for a full disk that works anywhere: RLIMIT_FSIZE (EFBIG)."""
    dump = str(tmp_path / "dump")
    builder = build_dump(dump)
    proc = run_cli("process", dump, "--jobs", "1", preexec_fn=_fsize_limited(4096))
    assert proc.returncode == 1
    problems = [line for line in proc.stdout.splitlines() if "file-size limit" in line]
    assert len(problems) == 2 and all("needs about" in p and "raw data is kept" in p for p in problems)
    assert sorted(os.listdir(builder.rank_dir)) == ["manifest.json", "step0", "step1"]
    assert sorted(os.listdir(dump)) == ["_raw"], "no partial output and no empty step folder is left"
    assert process_dump(dump, jobs=1).ok


def test_selection_matching_nothing_is_one_sentence_and_exit_2(tmp_path):
    dump = str(tmp_path / "dump")
    build_dump(dump)
    proc = run_cli("process", dump, "--steps", "3-5")
    assert proc.returncode == 2
    assert proc.stdout.splitlines()[1:] == [
        "nothing processed: no step of this dump matches the selection 3-5 (raw steps here: 0-1; processed "
        "steps: none)"]
    proc = run_cli("process", dump, "--ranks", "4")
    assert proc.returncode == 2 and "no rank of this dump matches the selection 4" in proc.stdout
    assert run_cli("process", dump, "--steps", "0").returncode == 0
    again = run_cli("process", dump, "--steps", "0")  # processed already: nothing to do, not an error
    assert again.returncode == 0 and "nothing to do" in again.stdout and "nothing processed" not in again.stdout
    assert run_cli("process", dump, "--steps", "1-100000000000").returncode == 0


def test_a_file_system_without_locks_is_named_not_taken_for_another_process(dump, monkeypatch):
    """flock failing with ENOLCK (NFS without a lock daemon; not reproducible on this machine's disks, so
    the call is made to fail as such a file system makes it fail) is said as such, the raw data kept."""
    import errno
    import fcntl

    from mf_celldump import fsutil

    build_dump(dump)

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fsutil.fcntl, "flock", no_locks)
    report = process_dump(dump, jobs=1)
    monkeypatch.setattr(fsutil.fcntl, "flock", fcntl.flock)
    text = report.summary()
    assert "this file system cannot lock files" in text and "another process" not in text, text
    assert raw_files(os.path.join(dump, "_raw", "rank0", "step0")), "the raw data is kept"
