"""A 2-rank msrun job on CPU (data parallel, loopback, mccl) through examples/distributed/run_2ranks.sh.

Each rank must leave a complete ``step{N}/rank{R}`` folder of its own, readable by the
real ``msprobe compare``.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess

import pytest

from tests.support.msrun import msrun_available, msrun_env, open_text

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "examples", "distributed", "run_2ranks.sh")
WQ_FORWARD = "Cell.model.layers.0.attention.wq.Linear.forward.0"


@pytest.mark.skipif(not msrun_available(), reason="msrun is not installed next to this Python")
def test_two_ranks_each_dump_their_own_folder(tmp_path):
    out = tmp_path / "run"
    env = msrun_env()
    proc = subprocess.run(["bash", SCRIPT, str(out), "pynative", "--dump", "steps=0-1",
                           "--dump", "rank_verdict=true"], cwd=tmp_path,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    logs = "".join(open_text(p)[-3000:] for p in glob.glob(str(out / "msrun_log" / "worker_*.log")))
    assert proc.returncode == 0, proc.stdout[-3000:] + logs
    dump = out / "celldump"
    for step in (0, 1):
        assert sorted(p.name for p in (dump / f"step{step}").iterdir()) == ["rank0", "rank1"]
        for rank in (0, 1):
            with open(dump / f"step{step}" / f"rank{rank}" / "dump.json", encoding="utf-8") as handle:
                assert WQ_FORWARD in json.load(handle)["data"]
    # What the script prints: per rank its log, step lines and dump; the verdict; the command to run next.
    # msrun's and the ranks' full output is in files.
    lines = proc.stdout.splitlines()
    assert len(lines) <= 60 and "WARNING" not in proc.stdout, proc.stdout
    for rank in (0, 1):
        assert f"rank {rank}: log {out / 'msrun_log' / f'worker_{rank}.log'}" in lines, lines
    assert [line for line in lines if line.startswith("verdict: ")] == [
        "verdict: step 0: clean (2 replicas)", "verdict: step 1: clean (2 replicas)"], lines
    assert lines[-1].startswith("next: check the ranks' replicas against each other: ") and \
        lines[-1].endswith(f" ranks {dump}"), lines
    assert "unprocessed raw steps" not in proc.stdout  # a rank names only its own raw steps
    assert (out / "msrun.log").is_file()
    ranks = subprocess.run(lines[-1].rsplit(": ", 1)[1].split(), cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
    assert ranks.returncode == 0, ranks.stdout[-3000:] + ranks.stderr[-3000:]
    assert not (dump / "step2").exists()
    assert not list((dump / "_raw").glob("rank*/step*")), "every captured step was processed"
    for rank in (0, 1):
        log = (out / "msrun_log" / f"worker_{rank}.log").read_text(errors="replace")
        assert f"mf_celldump: rank {rank}: captured steps 0,1; processed 0,1" in log
    # the verdict across ranks, switched on: data-parallel replicas of a healthy run
    log = (out / "msrun_log" / "worker_0.log").read_text(errors="replace")
    for step in (0, 1):
        assert f"mf_celldump: ranks: step {step}: clean (2 replicas)" in log

    compare_out = tmp_path / "compare"
    proc = subprocess.run(["msprobe", "compare", "-tp", str(dump / "step1"), "-gp", str(dump / "step0"),
                           "-o", str(compare_out)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    for rank in (0, 1):
        results = glob.glob(str(compare_out / f"compare_result_rank{rank}_*.csv"))
        assert results, proc.stdout[-3000:]
        with open(results[0], encoding="utf-8") as handle:
            rows = handle.read().splitlines()
        assert len(rows) > 50 and any(WQ_FORWARD in row for row in rows)
