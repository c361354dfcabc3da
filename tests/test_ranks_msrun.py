"""Across ranks in real msrun jobs: the train-end verdict on rank 0 and ``mf-celldump ranks`` on the dumps.

Two jobs, shared by every test of this module (each start costs 10-35 s per rank here):

* 2 ranks, graph mode, task tensor; on rank 1: a weight perturbed after the reduction
  (step 1), an activation scaled x100 (step 2), a NaN (step 3);
* 4 ranks, PyNative, task statistics with md5; a weight perturbed on rank 2 (step 1), an
  activation scaled on rank 1 (step 2), a NaN on rank 2 (step 3); rank 3 runs as a node of its
  own and is killed when step 3 ends, before its end of training: the others must finish
  and rank 0's verdict must name it.

The network and the fault injection are in ``tests/support/replica_train.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.msrun import MSRUN, Job, run_job

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MSRUN is None, reason="msrun is not installed next to this Python")]

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "support", "replica_train.py")
VERDICT = re.compile(r"mf_celldump: ranks: (step \d+: .*)$", re.M)


def _train(tmp_path_factory, name: str, workers: int, args, local_workers=None, done=None):
    root = tmp_path_factory.mktemp(name)
    dump = root / "dump"
    job = run_job(SCRIPT, ["--steps", "4", "--dump-path", str(dump)] + args, workers, str(root / "logs"), str(root),
                  local_workers=local_workers, done=done)
    return root, dump, job


def survivors_finished(job: Job) -> bool:
    """Ranks 0-2 are done: what is left is MindSpore's scheduler waiting out its node timeout for rank 3."""
    return all(f"rank {rank} finished training" in job.log(rank) for rank in (0, 1, 2))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    root, dump, job = _train(tmp_path_factory, "two_ranks", 2, [
        "--mode", "graph", "--dump", "task=tensor", "--dump", "rank_verdict=true",
        "--fault", "weight:rank=1:step=1:cell=layers.0.up",
        "--fault", "scale:rank=1:step=2:cell=layers.1:factor=100",
        "--fault", "nan:rank=1:step=3:cell=layers.2",
    ])
    assert job.returncodes["msrun"] == 0, job.output[-3000:] + job.tails()
    return root, dump, job


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    root, dump, job = _train(tmp_path_factory, "four_ranks", 4, [
        "--mode", "pynative", "--dump", "task=statistics", "--dump", "statistics=[max,min,mean,norm,md5]",
        "--dump", "rank_verdict=true", "--dump", "rank_verdict_timeout=10",
        "--fault", "weight:rank=2:step=1:cell=layers.0.up",
        "--fault", "scale:rank=1:step=2:cell=layers.1:factor=100",
        "--fault", "nan:rank=2:step=3:cell=layers.2",
        "--die", "rank=3:step=3",
    ], local_workers=3, done=survivors_finished)
    return root, dump, job


def verdict_lines(job: Job, rank: int = 0) -> dict:
    return {int(m.group(1).split(":")[0].split()[1]): m.group(1) for m in VERDICT.finditer(job.log(rank))}


def ranks_command(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mf_celldump", "ranks", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def rank_check(dump, out, *extra):
    proc = ranks_command(dump, "-o", out, "--json", *extra)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr


def by_step(result: dict) -> dict:
    return {item["step"]: item for item in result["steps"]}


# -- the verdict rank 0 logs at train end ---------------------------------------------------------
def test_two_ranks_rank0_logs_one_verdict_line_per_step_naming_each_fault(two_ranks):
    _, _, job = two_ranks
    lines = verdict_lines(job)
    assert sorted(lines) == [0, 1, 2, 3], job.tails()
    assert lines[0] == "step 0: clean (2 replicas)"
    assert "rank 1 departs first at layers.0.up param.weight" in lines[1]
    assert "suspect: rank 1 at layers.1 forward.0 output.0 (Norm x" in lines[2]
    assert lines[3].startswith("step 3: rank 1: first NaN at layers.2 (forward)")
    assert not verdict_lines(job, 1), "only rank 0 logs the verdict"
    assert "rank 1 finished training" in job.log(1)


def test_each_rank_registers_once_with_rank0s_store_and_rank0_logs_no_registration(two_ranks, four_ranks):
    """One client per rank for the whole run (rank 0 reads through its store's process, no client), and the
    store's per-registration warnings stay in its process."""
    for job, ranks in ((two_ranks[2], (1,)), (four_ranks[2], (1, 2, 3))):
        for rank in ranks:
            assert job.log(rank).count("mf_celldump: ranks: registered with rank 0's store at") == 1, job.tails()
        assert "registered with rank 0's store" not in job.log(0)
        assert "ProcessRegister" not in job.log(0)


def test_four_ranks_verdict_names_the_faulty_ranks_and_the_rank_that_died(four_ranks):
    _, _, job = four_ranks
    for rank in (0, 1, 2):
        assert f"rank {rank} finished training" in job.log(rank), job.tails()
    assert "rank 3 dies at the end of step 3" in job.log(3)
    assert job.returncodes["rank3"] != 0  # killed
    lines = verdict_lines(job)
    assert sorted(lines) == [0, 1, 2, 3], job.tails()
    assert lines[0] == "step 0: clean (4 replicas)"
    assert "rank 2 departs first at layers.0.up param.weight (weight not bit-identical; 3 of 4 replicas agree)" \
        in lines[1]
    assert "suspect: rank 1 at layers.1 forward.0 output.0 (Norm x" in lines[2]
    assert lines[3].startswith("step 3: rank 2: first NaN at layers.2 (forward)")
    assert lines[3].endswith("rank 3 missing (no data for this step)")
    assert "rank 3 did not report the end of training within 10 s" in job.log(0)


# -- mf-celldump ranks on the dumps --------------------------------------------------------------
def test_two_ranks_rank_check_names_each_fault_and_draws_the_heat_map(two_ranks, tmp_path):
    _, dump, _ = two_ranks
    code, result, err = rank_check(dump, tmp_path / "out")
    assert code == 1, err
    steps = by_step(result)
    assert steps[0]["first_departure"] is None and not steps[0]["suspects"] and not steps[0]["first_anomaly"]
    assert steps[1]["first_departure"]["cell"] == "layers.0.up" and steps[1]["first_departure"]["ranks"] == [1]
    assert steps[2]["suspects"][0]["rank"] == 1 and steps[2]["suspects"][0]["cell"] == "layers.1"
    assert [(a["rank"], a["cell"], a["direction"]) for a in steps[3]["first_anomaly"]] == [(1, "layers.2", "forward")]
    assert steps[1]["grads_reduced"] is False  # graph mode too: each rank's own gradients, before the AllReduce
    assert result["lines"] == [verdict_lines(two_ranks[2])[s] for s in range(4)]
    for step in range(4):
        with open(tmp_path / "out" / f"ranks_heatmap_step{step}.png", "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "out" / "ranks_findings.csv").read_text()
    assert "departs,1,forward,layers.0.up,param.weight" in table


def test_four_ranks_rank_check_names_faults_and_the_missing_rank(four_ranks, tmp_path):
    _, dump, _ = four_ranks
    code, result, err = rank_check(dump, tmp_path / "out")
    assert code == 1, err
    steps = by_step(result)
    assert steps[1]["first_departure"]["ranks"] == [2] and steps[1]["first_departure"]["majority"] == 3
    assert [s["rank"] for s in steps[2]["suspects"]] == [1]
    assert [(a["rank"], a["cell"]) for a in steps[3]["first_anomaly"]] == [(2, "layers.2")]
    assert steps[3]["missing"] == [3]
    assert steps[1]["grads_reduced"] is False  # PyNative: each rank's gradients before the AllReduce


def test_summaries_made_per_node_and_checked_together_give_the_same_verdict(four_ranks, tmp_path):
    _, dump, _ = four_ranks
    files = []
    for node, ranks in (("node0", "0-2"), ("node1", "3")):
        files.append(str(tmp_path / f"{node}.jsonl.gz"))
        proc = ranks_command(dump, "--ranks", ranks, "--save-summaries", files[-1], "--summaries-only")
        assert proc.returncode == 0, proc.stderr
    whole = rank_check(dump, tmp_path / "whole")[1]
    proc = ranks_command(*files, "-o", tmp_path / "merged", "--json")
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["lines"] == whole["lines"]
