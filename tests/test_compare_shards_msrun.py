"""Shard-aware compare on real tensor-parallel dumps: 2 ranks under msrun against the same net on 1 rank.

``tests/support/tp_train.py``: attention (q, k, v column-parallel, the core on the local heads,
the output projection row-parallel with its partial sums reduced by the parent) and an MLP
(column-parallel up, GELU, row-parallel down reducing inside), graph mode, task tensor,
steps 0-2. On rank 1 only, the first row of a weight is scaled by 1.05 during one step:
``mlp.up`` (column-parallel) in step 1, ``attention.proj`` (row-parallel) in step 2. One
msrun job and one single-rank run, shared by every test here.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from mf_celldump.analysis.compare.shard_merge import Group, GroupMerger, MergeNotes
from mf_celldump.analysis.compare.shards import RuleBook
from mf_celldump.layout.reader import DumpJson, find_rank_dumps
from mf_celldump.mapping import resolve_mapping
from mf_celldump.mapping.baseline_names import MsprobeView
from tests.support.chromium import Browser, find_chromium
from tests.support.msprobe_cli import run_msprobe
from tests.support.msrun import MSRUN, msrun_env, run_job

pytestmark = [pytest.mark.slow, pytest.mark.skipif(MSRUN is None, reason="msrun is not installed next to this Python")]

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "tp_train.py")
RULES = """\
# the core works on each rank's heads, GELU on each rank's features: every activation split
CoreAttention:
  "": CoreAttention(shard=split)
ParallelMLP:
  act: act(shard=split)
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    single = subprocess.Popen([sys.executable, SCRIPT, "--dump-path", str(root / "single"), "--dump", "task=tensor"],
                              cwd=root, env=msrun_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    job = run_job(SCRIPT, ["--tp", "2", "--dump-path", str(root / "tp2"), "--dump", "task=tensor",
                           "--dump", "replica_groups=model_parallel=2",
                           "--fault", "rank=1:step=1:cell=mlp.up", "--fault", "rank=1:step=2:cell=attention.proj"],
                  2, str(root / "logs"), str(root))
    output = single.communicate(timeout=900)[0]
    assert single.returncode == 0, output[-3000:]
    assert job.returncodes["msrun"] == 0, job.output[-3000:] + job.tails()
    regions = ["--steps", "1", "--dump", "task=tensor", "--dump", "exclude=[]"]
    single = subprocess.Popen([sys.executable, SCRIPT, "--dump-path", str(root / "single_regions"), *regions],
                              cwd=root, env=msrun_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    job = run_job(SCRIPT, ["--tp", "2", "--dump-path", str(root / "tp2_regions"), *regions,
                           "--dump", "replica_groups=model_parallel=2"], 2, str(root / "logs_regions"), str(root))
    output = single.communicate(timeout=900)[0]
    assert single.returncode == 0, output[-3000:]
    assert job.returncodes["msrun"] == 0, job.output[-3000:] + job.tails()
    (root / "tp_rules.yaml").write_text(RULES)
    return root


def compare(root, out, *args):
    """No threshold given: the rounding noise of the ranks' other summation order (the key projection's bias
    gradient, zero in exact arithmetic) is within each pair's noise bound (docs/compare.md, "Rounding noise")."""
    proc = subprocess.run([sys.executable, "-m", "mf_celldump", "compare", *map(str, args),
                           "-o", str(out), "--json"], capture_output=True, text=True, timeout=600)
    return proc.returncode, (json.loads(proc.stdout) if proc.stdout.strip() else None), proc.stderr


def test_identical_step_every_merged_pair_is_within_thresholds(runs, tmp_path):
    code, result, err = compare(runs, tmp_path, runs / "tp2", runs / "single", "--target-tp", "2", "--steps", "0",
                                "--mapping", runs / "tp_rules.yaml")
    assert code == 0, err
    table = pd.read_csv(result["csv"])
    # 44 activations, 14 weights and 14 weight gradients
    assert len(table) == 72 and set(table.status) == {"ok"}, table[table.status != "ok"].to_string()
    rules = result["shards"]["target"]["rules"]
    assert rules["mlp.up"] == "column" and rules["attention.proj"] == "row" and rules["mlp.down"] == "row"
    assert rules["attention.core"] == "split" and rules["mlp.act"] == "split"  # from the mapping file
    assert result["shards"]["target"]["disagreements"] == []


def test_column_parallel_weight_perturbed_on_rank1_names_the_cell_and_rank1(runs, tmp_path):
    code, result, err = compare(runs, tmp_path, runs / "tp2", runs / "single", "--target-tp", "2", "--steps", "1",
                                "--mapping", runs / "tp_rules.yaml")
    assert code == 1, err
    assert result["first_divergence"]["cell"] == "mlp.up"
    found = result["shards"]["attribution"]
    assert found["cell"] == "mlp.up" and found["ranks"] == [1]
    evidence = {e["slot"]: e for e in found["evidence"]}
    assert evidence["output.0"]["diverged"] == [1] and evidence["output.0"]["within"] == [0]
    assert evidence["param.weight"]["diverged"] == [1]
    _one_answer_for_the_rank(result, rank=1, group=0, folder="step1/rank0")


def _page_data(html_path):
    with open(html_path, encoding="utf-8") as handle:
        page = handle.read()
    return json.loads(page.split('<script id="report-data" type="application/json">', 1)[1].split("</script>", 1)[0])


def _one_answer_for_the_rank(result, rank, group, folder):
    """The rank the user launched, named alike by the JSON, the headline, the attribution and report.html; the
    merged group's index and rank folder apart."""
    first = result["first_divergence"]
    assert (first["rank"], first["ranks"], first["group"], first["folder"]) == (rank, [rank], group, folder)
    assert result["shards"]["attribution"]["ranks"] == [rank]
    assert f" rank {rank}): " in result["headline"], result["headline"]
    page = _page_data(result["html"])
    assert page["headline"] == result["headline"]
    assert (page["first"]["rank"], page["first"]["group"], page["first"]["rank_text"]) == (rank, group, f"rank {rank}")
    if find_chromium():
        with Browser() as browser:
            drawn = browser.open("file://" + result["html"])
            assert result["headline"] in drawn.evaluate("document.getElementById('verdict').textContent")
            assert f", rank {rank}, {folder})" in drawn.evaluate("document.getElementById('first-text').textContent")


def test_row_parallel_weight_perturbed_on_rank1_is_found_through_its_weight(runs, tmp_path):
    code, result, err = compare(runs, tmp_path, runs / "tp2", runs / "single", "--target-tp", "2", "--steps", "2",
                                "--mapping", runs / "tp_rules.yaml")
    assert code == 1, err
    found = result["shards"]["attribution"]
    assert (found["cell"], found["rule"], found["ranks"]) == ("attention.proj", "row", [1])
    # its output is the sum of both ranks' parts: only the weight tells the ranks apart
    assert [e["slot"] for e in found["evidence"] if e["diverged"]] == ["param.weight"]
    _one_answer_for_the_rank(result, rank=1, group=0, folder="step2/rank0")


def test_sharded_baseline_and_both_sides_sharded_compare_clean(runs, tmp_path):
    code, result, err = compare(runs, tmp_path / "a", runs / "single", runs / "tp2", "--baseline-tp", "2",
                                "--steps", "0", "--mapping", runs / "tp_rules.yaml")
    assert code == 0, err
    assert set(pd.read_csv(result["csv"]).status) == {"ok"}
    code, result, err = compare(runs, tmp_path / "b", runs / "tp2", runs / "tp2", "--target-tp", "2",
                                "--baseline-tp", "2", "--mapping", runs / "tp_rules.yaml")
    assert code == 0, err
    assert len(result["units"]) == 3


def test_without_a_mapping_the_rules_are_inferred_from_the_ranks_and_reported(runs, tmp_path):
    code, result, err = compare(runs, tmp_path, runs / "tp2", runs / "single", "--target-tp", "2", "--steps", "0")
    assert code == 0, err
    target = result["shards"]["target"]
    assert target["inferred"] == {"attention.core": "split", "mlp.act": "split"}
    assert set(pd.read_csv(result["csv"]).status) == {"ok"}


def test_communication_region_cells_are_merged_by_their_inferred_rules(runs, tmp_path):
    """The all-reduce cells dumped too (as hand-written tensor-parallel code has them): the one after the
    row-parallel projection takes partial sums in and gives the reduced value out. The copy before a
    column-parallel layer is the identity forward, and graph mode records no backward entry for a cell with its
    own bprop: replicated, nothing to infer."""
    code, result, err = compare(runs, tmp_path, runs / "tp2_regions", runs / "single_regions", "--target-tp", "2")
    assert code == 0, err
    inferred = result["shards"]["target"]["inferred"]
    assert inferred["attention.reduce_from_tp"] == inferred["mlp.down.reduce_from_tp"] == "reduce", inferred
    assert "mlp.up.copy_to_tp" not in inferred and "mlp.up.copy_to_tp" not in result["shards"]["target"]["rules"]
    assert result["first_divergence"] is None


def test_a_rule_that_does_not_fit_the_cell_is_a_clear_error(runs, tmp_path):
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(RULES + "  up: up(shard=row)\n")  # mlp.up is column-parallel
    code, _, err = compare(runs, tmp_path, runs / "tp2", runs / "single", "--target-tp", "2", "--steps", "0",
                           "--mapping", wrong)
    assert code == 2 and "target cell mlp.up (shard=row)" in err and "against" in err, err


def test_weights_and_weight_gradients_merge_into_the_single_rank_ones(runs, tmp_path):
    shards = [d for d in find_rank_dumps(str(runs / "tp2")) if d.step == 0]
    view = MsprobeView(resolve_mapping((str(runs / "tp_rules.yaml"),), set()))
    classes = {}
    for name, _ in DumpJson(shards[0].dump_json).entries():
        parts = name.split(".")
        classes[".".join(parts[1:-3])] = parts[-3]
    merged = GroupMerger(Group(0, 0, shards, str(tmp_path / "rank0")), RuleBook(view, classes).rule_of,
                         MergeNotes()).run()
    single = find_rank_dumps(str(runs / "single" / "step0"))[0]
    ours = dict(DumpJson(merged.dump_json).entries())
    theirs = dict(DumpJson(single.dump_json).entries())
    checked = 0
    for name, body in theirs.items():
        records = [(r, ours[name].get("parameters", {}).get(k)) for k, r in body.get("parameters", {}).items()]
        if name.endswith(".parameters_grad.0"):
            records = [(r[0], ours[name][k][0]) for k, r in body.items()]
        for their, our in records:
            a = np.load(os.path.join(merged.data_dir, our["data_name"]))
            b = np.load(os.path.join(single.data_dir, their["data_name"]))
            assert a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-6), name
            checked += 1
    assert checked == 28  # the 14 weights of the model and their 14 gradients


def test_the_layout_recorded_at_capture_needs_no_target_tp(runs, tmp_path):
    """The run set replica_groups=model_parallel=2: capture records it, processing copies it into dump.json,
    and compare merges the ranks without --target-tp (and without a mapping: the rest is inferred)."""
    head = DumpJson(find_rank_dumps(str(runs / "tp2"))[0].dump_json).header
    assert head["mf_celldump_parallel"]["tensor_parallel"] == 2
    assert head["mf_celldump_parallel"]["source"] == "replica_groups"
    code, result, err = compare(runs, tmp_path, runs / "tp2", runs / "single", "--steps", "0")
    assert code == 0, err
    assert result["shards"]["target"]["tp"] == 2 and result["shards"]["baseline"]["tp"] == 1
    # msprobe reads the head with the layout in it: one result per rank
    run_msprobe("compare", "-tp", str(runs / "tp2" / "step1"), "-gp", str(runs / "tp2" / "step0"),
                "-o", str(tmp_path / "msprobe"))
    assert len(glob.glob(str(tmp_path / "msprobe" / "compare_result_rank*.csv"))) == 2
