"""The fault campaign's fixed sample: every kind of fault a user or a bug makes gets its expected answer.

``bench/fault_campaign.py`` draws faults over tiny LLaMA, Qwen3 and DeepSeek-V3 (MindFormers 1.9
on CPU) and writes each one's expected answer (first cell, step, direction, cause words) before
it runs; the benchmark runs 300 of them over both modes and tasks. Here its fixed sample
(``SAMPLE``: 27 faults, every kind that can be made on these models at least once) trains in
PyNative with the tensor task, each model's faults against one shared baseline, two steps
each, and compare must give every expected answer. The same run twice, in each group, flags
nothing. The campaign widens the faults of tests/test_compare_noise_bound.py (a scaled weight
element, epsilon, the softmax scale, rotary) to embeddings, the output layer, the router,
an expert, the optimizer, the loss scale, the data, a layer's initialisation and dtypes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("fault_campaign", os.path.join(REPO, "bench", "fault_campaign.py"))
campaign = sys.modules.setdefault("fault_campaign", importlib.util.module_from_spec(_spec))
if not hasattr(campaign, "KINDS"):  # its dataclasses look their module up in sys.modules
    _spec.loader.exec_module(campaign)

# What compare answered when the expected answer was not given: such a case is an expected failure that shows
# today's answer, and fails once the answer is right, so its line goes.
WRONG_TODAY = {
    ("llama", "softmax_scale"): "names attention.wo (its input differs), not the attention that scales its scores",
    ("qwen3", "weight_decay"): "names core_attention's backward at step 1: no forward cell, no 'update of step 0'",
    ("qwen3", "dtype_cell"): "names the float16 norm's backward: its forward stays within the float32 bound",
    ("deepseek3", "router_topk"): "names the experts after the router (the router's outputs change shape)",
    ("deepseek3", "dtype_model"): "says DTYPE CHANGES first, then names core_attention's backward, no forward cell",
    ("deepseek3", "softmax_scale"): "names core_attention's backward: its forward stays within the bound",
}
CASES = [(model, kind) for model, kinds in campaign.SAMPLE.items() for kind in kinds]


def _case(model, kind):
    return pytest.param(model, kind, id=f"{model}-{kind}")


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("campaign"))
    groups = [(model, "pynative", "tensor") for model in campaign.SAMPLE]
    for status in campaign.run_groups(out, groups, count=0, seed=0, jobs=1, sample=True):
        with open(status["log"], encoding="utf-8") as handle:
            assert status["exit"] == 0, handle.read()[-3000:]
    faults, nulls = campaign.load_results(out)
    return out, {(r["fault"]["model"], r["fault"]["kind"]): r for r in faults}, nulls


def test_the_sample_spreads_over_every_kind_that_can_be_made():
    made = {kind for kinds in campaign.SAMPLE.values() for kind in kinds}
    assert len(CASES) >= 24
    assert made == {k.name for k in campaign.KINDS if k.models}
    for model, kinds in campaign.SAMPLE.items():
        assert set(kinds) <= set(campaign.kinds_on(model)), model


@pytest.mark.slow
@pytest.mark.parametrize("model, kind", [_case(m, k) for m, k in CASES])
def test_each_sample_fault_gets_its_expected_answer(sample, model, kind):
    record = sample[1][(model, kind)]
    fault = record["fault"]
    expected = (fault["expect_cells"][:3], fault["expect_step"], fault["expect_direction"], fault["expect_words"])
    answered = (record.get("cell"), record.get("step"), record.get("direction"), record.get("headline"))
    known = WRONG_TODAY.get((model, kind))
    if known and record["outcome"] != "right":  # a known wrong answer, shown as compare gives it now
        pytest.xfail(f"{known}; answered {record['outcome']}: {answered[:3]} {str(answered[3])[:300]}")
    assert not known, f"now answered right: take ({model!r}, {kind!r}) out of WRONG_TODAY"
    assert record["outcome"] == "right", (fault["target"], fault["magnitude"], expected, answered,
                                          record.get("wrong_in"), record.get("error"))


@pytest.mark.slow
def test_the_same_run_twice_flags_nothing(sample):
    _, _, nulls = sample
    assert len(nulls) == len(campaign.SAMPLE)
    assert all(r["outcome"] == "clean" for r in nulls), [(r["model"], r["headline"]) for r in nulls]


@pytest.mark.slow
def test_expected_answers_are_written_before_the_runs_and_the_table_counts_every_fault(sample):
    out, faults, _ = sample
    for model in campaign.SAMPLE:
        with open(os.path.join(out, f"{model}-pynative-tensor", "plan.json"), encoding="utf-8") as handle:
            plan = json.load(handle)["faults"]
        assert [f["kind"] for f in plan] == campaign.SAMPLE[model]
        assert all(faults[(model, f["kind"])]["fault"] == f and f["expect_cells"] for f in plan)
    table = campaign.tables(out)
    by_kind = table.split("\n\n")[0].splitlines()[2:]  # the first table: one row per fault kind and cell kind
    counted = sum(int(line.split("|")[4]) for line in by_kind)
    assert counted == len(CASES), table
