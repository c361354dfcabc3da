"""The watch across ranks: a rule that fires on one rank makes every rank act on the same step.

Real 2-rank msrun jobs on loopback (each start costs 10-35 s here), of the data-parallel job in
``tests/support/watch_ranks_train.py``, whose faulty cell turns NaN on rank 1 only from step 2 on:

* graph mode, shared by most tests: ``watch: {overflow: false, stop: true}`` (so only rank 1's NaN
  loss fires: the overflow flag, reduced across ranks, is set on both) and the rank verdict on;
* PyNative, a wrapper that applies every update: no rerun, every rank captures the next step;
* PyNative, the update skipped (the overflow rule fires on both ranks), ``anomaly_max_bytes: 1``: every
  rank refuses the rerun's capture together.

The decisions themselves (which rank fired, whether every rank can rerun) are checked in process
over gathered tables.
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest

from mf_celldump.integrations.watch_ranks import firings_of, rerun_agreement, step_row
from mf_celldump.userinput import IndexSelection
from mf_celldump.watch import Firing
from tests.support.msrun import MSRUN, run_job

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "support", "watch_ranks_train.py")
FAULT_RANK, FAULT_STEP = 1, 2
RESULT = re.compile(r"^RESULT (\{.*\})$", re.M)

msrun_only = pytest.mark.skipif(MSRUN is None, reason="msrun is not installed next to this Python")


def _job(root, mode: str, *keys: str):
    dump = root / "dump"
    job = run_job(SCRIPT, [mode, str(dump), str(FAULT_RANK), str(FAULT_STEP), *keys], 2, str(root / "logs"),
                  str(root), timeout=600)
    assert job.returncodes["msrun"] == 0, job.output[-3000:] + job.tails()
    results = {}
    for rank in (0, 1):
        found = RESULT.findall(job.log(rank))
        assert found, job.tails()
        results[rank] = json.loads(found[-1])
    return dump, job, results


@pytest.fixture(scope="module")
def nan_on_rank1(tmp_path_factory):
    return _job(tmp_path_factory.mktemp("watch_ranks_graph"), "graph", "watch={overflow: false, stop: true}",
                "rank_verdict=true")


@pytest.fixture(scope="module")
def nan_on_rank1_applied(tmp_path_factory):
    return _job(tmp_path_factory.mktemp("watch_ranks_pynative"), "pynative", "train=plain", "watch={stop: true}")


def _watch_head(dump, step, rank):
    with open(dump / f"step{step}" / f"rank{rank}" / "dump.json", encoding="utf-8") as handle:
        return json.load(handle).get("mf_celldump_watch")


# -- the 2-rank job ----------------------------------------------------------------------------------------
@pytest.mark.slow
@msrun_only
def test_a_rule_firing_on_one_rank_makes_every_rank_rerun_and_capture_that_step(nan_on_rank1):
    dump, job, results = nan_on_rank1
    assert f"watch: step {FAULT_STEP} rank 1: rule nan_inf_loss fired (value nan)" in job.log(1)
    assert f"step {FAULT_STEP} rank 0: rule nan_inf_loss fired (" not in job.log(0)  # not on rank 0 itself ...
    assert f"step {FAULT_STEP} rank 0: rule nan_inf_loss fired on rank 1 (value nan); every rank acts on it" \
        in job.log(0)  # ... but it learned of rank 1's firing in the same step
    for rank in (0, 1):
        assert results[rank]["captured"] == [FAULT_STEP] and results[rank]["processed"] == [FAULT_STEP]
        assert results[rank]["problems"] == []
        assert any(f"step {FAULT_STEP} rerun on every rank on the same batch and weights" in n
                   and "came back on rank 1: persistent" in n for n in results[rank]["notes"]), results[rank]
        assert _watch_head(dump, FAULT_STEP, rank) == {
            "rule": "nan_inf_loss", "fired_at_step": FAULT_STEP, "capture": "rerun", "fault": "persistent",
            "exact": True, "fired_on_ranks": [1], "came_back_on_ranks": [1]}
    assert sorted(p.name for p in dump.iterdir() if p.name.startswith("step")) == [f"step{FAULT_STEP}"]
    from mf_celldump.analysis.anomalies import scan

    first = scan(str(dump), IndexSelection(), IndexSelection(), None)["first"]
    assert [(f.step, f.rank, f.direction, f.cell) for f in first] == [(FAULT_STEP, 1, "forward", "net.faulty")]


@pytest.mark.slow
@msrun_only
def test_stop_ends_training_on_every_rank_after_the_same_step_and_each_still_processes(nan_on_rank1):
    _, job, results = nan_on_rank1
    for rank in (0, 1):
        assert len(results[rank]["losses"]) == FAULT_STEP + 1, results[rank]  # the rerun is inside step 2's end
        assert f"rank {rank} finished training" in job.log(rank)
        assert f"mf_celldump: rank {rank}: captured steps {FAULT_STEP}; processed {FAULT_STEP}" in job.log(rank)
    assert math.isnan(results[1]["losses"][FAULT_STEP]) and math.isfinite(results[0]["losses"][FAULT_STEP])


@pytest.mark.slow
@msrun_only
def test_rank0s_train_end_summary_names_the_first_rank_and_step_that_fired(nan_on_rank1):
    _, job, results = nan_on_rank1
    line = f"watch: first firing across ranks: step {FAULT_STEP} rank 1 rule nan_inf_loss (value nan)"
    assert line in results[0]["notes"]
    assert f"note: {line}" in job.log(0)  # in the summary rank 0 logs at train end
    assert "watch: no rule fired" in results[0]["notes"]  # its own rules never fired
    verdict = re.search(rf"mf_celldump: ranks: step {FAULT_STEP}: (.*)$", job.log(0), re.M)
    assert verdict and "rank 1: first NaN at net.faulty" in verdict.group(1), job.tails()


@pytest.mark.slow
@msrun_only
def test_where_the_update_was_applied_every_rank_captures_the_step_after_the_firing(nan_on_rank1_applied):
    dump, job, results = nan_on_rank1_applied
    step = FAULT_STEP + 1
    for rank in (0, 1):
        assert results[rank]["captured"] == [step] and results[rank]["processed"] == [step], results[rank]
        assert any(f"rule nan_inf_loss fired at step {FAULT_STEP} on rank 1: capturing step {step}, the step after "
                   f"it (step {FAULT_STEP} is not rerun: the update was applied on ranks 0, 1" in n
                   for n in results[rank]["notes"]), results[rank]
        assert _watch_head(dump, step, rank) == {"rule": "nan_inf_loss", "fired_at_step": FAULT_STEP,
                                                 "capture": "next_step", "fired_on_ranks": [1]}
        assert len(results[rank]["losses"]) == step + 1  # stopped after the captured step, on both ranks
    assert sorted(p.name for p in dump.iterdir() if p.name.startswith("step")) == [f"step{step}"]


@pytest.fixture(scope="module")
def nan_on_rank1_no_room(tmp_path_factory):
    return _job(tmp_path_factory.mktemp("watch_ranks_bytes"), "pynative", "anomaly_max_bytes=1")


@pytest.mark.slow
@msrun_only
def test_a_rerun_that_would_pass_anomaly_max_bytes_is_refused_on_every_rank_and_training_goes_on(
        nan_on_rank1_no_room):
    dump, job, results = nan_on_rank1_no_room
    for rank in (0, 1):
        assert results[rank]["captured"] == [] and results[rank]["processed"] == [], results[rank]
        assert any(f"fired at step {FAULT_STEP}: its rerun is not captured: dump_path holds" in n
                   and "would pass anomaly_max_bytes=1" in n for n in results[rank]["notes"]), results[rank]
        assert len(results[rank]["losses"]) == 6  # every step trained: nobody waited on a rank that reran
        assert f"rank {rank} finished training" in job.log(rank)
    assert not [p for p in dump.iterdir() if p.name.startswith("step")]


# -- the decisions over a gathered table -------------------------------------------------------------------
def test_a_gathered_table_names_each_ranks_rules_lowest_rank_first():
    table = np.array([step_row([], True, True),
                      step_row([Firing(4, 1, "nan_inf_loss", float("nan")), Firing(4, 1, "overflow", True)], True,
                               True),
                      step_row([Firing(4, 2, "loss_spike", 12.5, 3.0)], False, True)], dtype=np.float32)
    found = firings_of(4, table)
    assert [(f.rank, f.rule) for f in found] == [(1, "nan_inf_loss"), (1, "overflow"), (2, "loss_spike")]
    assert math.isnan(found[0].value) and found[1].value is None and found[2].value == 12.5
    assert firings_of(4, np.array([step_row([], True, True)] * 2, dtype=np.float32)) == []


def test_every_rank_reruns_only_when_every_wrapper_skipped_the_update_and_every_rank_can_rerun():
    assert rerun_agreement(np.array([[1, 0, 1, 1], [0, 0, 1, 1]], dtype=np.float32)).together
    applied = rerun_agreement(np.array([[1, 0, 1, 1], [0, 0, 0, 1]], dtype=np.float32))
    assert not applied.together and not applied.skipped
    assert applied.why_not == "the update was applied on rank 1, so its weights are gone"
    unable = rerun_agreement(np.array([[1, 0, 1, 0], [0, 0, 1, 1], [0, 0, 1, 0]], dtype=np.float32))
    assert not unable.together and unable.skipped and "but ranks 0, 2 gave no batch" in unable.why_not
