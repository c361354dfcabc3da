"""Merging tensor-parallel shards without a job: statistics joined exactly, what cannot be merged, bad groups,
and a Megatron-style PyTorch dump (``.pt``, ``Module.*`` names) at TP=2 against its TP=1 run.

The real MindSpore tensor-parallel runs under msrun are in ``test_compare_shards_msrun.py``.
"""

from __future__ import annotations

import io
import json
import math
import os
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

from mf_celldump.analysis.compare.shard_merge import Group, GroupMerger, MergeNotes, plan
from mf_celldump.cli import main as cli_main
from mf_celldump.errors import ShardError
from mf_celldump.layout.reader import DumpJson, RankDump
from mf_celldump.statistics import compute_statistics

STATS = ("max", "min", "mean", "norm")
RNG = np.random.default_rng(3)
X = RNG.normal(size=(2, 3, 4)).astype(np.float32)
W = RNG.normal(size=(6, 4)).astype(np.float32)  # column-parallel: rows split over 2 ranks
W2 = RNG.normal(size=(4, 6)).astype(np.float32)  # row-parallel: columns split


def record(array, data_name=None, task="statistics"):
    out = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": list(array.shape),
           **compute_statistics(array, STATS)}
    if task == "tensor":
        out["data_name"] = data_name
    return out


def write_rank(folder, entries, task="statistics", arrays=None, framework="mindspore"):
    os.makedirs(folder, exist_ok=True)
    data_dir = os.path.join(folder, "dump_tensor_data")
    for name, array in (arrays or {}).items():
        os.makedirs(data_dir, exist_ok=True)
        if name.endswith(".pt"):
            import torch

            torch.save(torch.from_numpy(array), os.path.join(data_dir, name))
        else:
            np.save(os.path.join(data_dir, name), array)
    with open(os.path.join(folder, "dump.json"), "w", encoding="utf-8") as handle:
        json.dump({"task": task, "level": "L0", "framework": framework, "dump_data_dir": None, "data": entries},
                  handle)
    return RankDump(folder, 0, int(os.path.basename(folder)[4:] or 0), os.path.basename(folder))


def linear_entries(prefix, x, w, y):
    return {f"{prefix}.forward.0": {"input_args": [record(x)], "input_kwargs": {}, "output": [record(y)],
                                    "parameters": {"weight": record(w)}}}


def merge(tmp_path, shards, rule):
    notes = MergeNotes()
    merged = GroupMerger(Group(0, 0, shards, str(tmp_path / "merged")), lambda cell, cls: rule, notes).run()
    return dict(DumpJson(merged.dump_json).entries()), notes


def test_statistics_of_joined_parts_equal_the_whole_tensors(tmp_path):
    full = X @ W.T
    halves = [slice(0, 3), slice(3, 6)]
    shards = [write_rank(str(tmp_path / f"rank{r}"),
                         linear_entries("Cell.up.ColumnParallelLinear", X, W[h], full[..., h]))
              for r, h in enumerate(halves)]
    entries, notes = merge(tmp_path, shards, "column")
    body = entries["Cell.up.ColumnParallelLinear.forward.0"]
    for got, whole in ((body["output"][0], full), (body["parameters"]["weight"], W), (body["input_args"][0], X)):
        expected = record(whole)
        assert got["shape"] == expected["shape"]
        for key in ("Max", "Min", "Mean", "Norm"):
            assert got[key] == pytest.approx(expected[key], rel=1e-6), key
    assert notes.rules == {"up": "column"} and not notes.disagreements


def test_partial_sums_of_a_statistics_dump_are_left_out_and_said(tmp_path):
    hidden = X @ W.T
    halves = [slice(0, 3), slice(3, 6)]
    parts = [hidden[..., h] @ W2[:, h].T for h in halves]  # each rank's partial sum
    shards = [write_rank(str(tmp_path / f"rank{r}"),
                         linear_entries("Cell.down.RowParallelLinear", hidden[..., h], W2[:, h], parts[r]))
              for r, h in enumerate(halves)]
    entries, notes = merge(tmp_path, shards, "row")
    body = entries["Cell.down.RowParallelLinear.forward.0"]
    assert body["output"] == [None]  # the position stays, nothing is compared there
    assert notes.dropped == ["Cell.down.RowParallelLinear.forward.0 output.0"]
    assert body["parameters"]["weight"]["shape"] == [4, 6] and body["input_args"][0]["shape"] == [2, 3, 6]


def test_replicated_tensor_that_differs_between_ranks_is_reported(tmp_path):
    norm = np.ones(4, np.float32)
    bad = norm.copy()
    bad[0] = 2.0
    shards = [write_rank(str(tmp_path / f"rank{r}"), linear_entries("Cell.norm.RMSNorm", X, (norm, bad)[r], X))
              for r in (0, 1)]
    entries, notes = merge(tmp_path, shards, "none")
    assert [(d["slot"], d["ranks"], d["reference"]) for d in notes.disagreements] == [("param.weight", [1], 0)]
    assert entries["Cell.norm.RMSNorm.forward.0"]["parameters"]["weight"]["Max"] == 1.0  # rank 0's copy


def test_ranks_that_ran_different_cells_or_shapes_that_do_not_join_are_clear_errors(tmp_path):
    a = write_rank(str(tmp_path / "a" / "rank0"), linear_entries("Cell.up.ColumnParallelLinear", X, W[:3], X))
    b = write_rank(str(tmp_path / "b" / "rank1"), linear_entries("Cell.other.ColumnParallelLinear", X, W[:3], X))
    with pytest.raises(ShardError, match="entry 'Cell.other.ColumnParallelLinear.forward.0' where .* has "
                                         "'Cell.up.ColumnParallelLinear.forward.0'"):
        merge(tmp_path, [a, b], "column")
    c = write_rank(str(tmp_path / "c" / "rank1"), linear_entries("Cell.up.ColumnParallelLinear", X, W[:3].T, X))
    with pytest.raises(ShardError, match=r"param.weight: shard=column joins the ranks' parts along axis 0, but their "
                                         r"shapes \[\[3, 4\], \[4, 3\]\]"):
        merge(tmp_path, [a, c], "column")


def test_plans_of_the_rules():
    assert plan("column", "forward", "output.0", 3) == -1 and plan("column", "forward", "input.0", 3) == "same"
    assert plan("column", "backward", "output.0", 3) == "partial" and plan("column", "backward", "input.0", 3) == -1
    assert plan("row", "forward", "output.0", 3) == "partial" and plan("row", "forward", "param.weight", 2) == 1
    assert plan("row", "forward", "param.bias", 1) == "same" and plan("vocab", "forward", "param.weight", 2) == 0
    assert plan("split", "backward", "input.1", 3) == -1


# -- a Megatron-style PyTorch dump --------------------------------------------------------------
def megatron_rank(folder, rank, tp, fc1_scale=1.0):
    """linear_fc1 (ColumnParallelLinear) then linear_fc2 (RowParallelLinear, reduced inside) as msprobe's
    PyTorch dump records them: ``Module.*`` names, ``.pt`` tensors, backward with ``input``; ``fc1_scale``
    multiplies linear_fc1's whole weight."""
    cols, rows = 6 // tp, 6 // tp
    w = W * fc1_scale
    w1 = w[rank * cols:(rank + 1) * cols]
    w2 = W2[:, rank * rows:(rank + 1) * rows]
    hidden = X @ w.T
    out = hidden @ W2.T  # reduced: the same on every rank
    arrays, entries = {}, {}

    def rec(entry, io, array):
        name = f"{entry}.{io}.pt"
        arrays[name] = np.ascontiguousarray(array)
        r = record(array, name, "tensor")
        r["dtype"] = "torch.float32"
        return r

    fc1 = "Module.decoder.layers.0.mlp.linear_fc1.ColumnParallelLinear.forward.0"
    fc2 = "Module.decoder.layers.0.mlp.linear_fc2.RowParallelLinear.forward.0"
    entries[fc1] = {"input_args": [rec(fc1, "input.0", X)], "input_kwargs": {},
                    "output": [rec(fc1, "output.0", hidden[..., rank * cols:(rank + 1) * cols])],
                    "parameters": {"weight": rec(fc1, "parameters.weight", w1)}}
    entries[fc2] = {"input_args": [rec(fc2, "input.0", hidden[..., rank * rows:(rank + 1) * rows])],
                    "input_kwargs": {}, "output": [rec(fc2, "output.0", out)],
                    "parameters": {"weight": rec(fc2, "parameters.weight", w2)}}
    return write_rank(folder, entries, "tensor", arrays, framework="pytorch")


def run_cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli_main(["compare", *map(str, args), "--json"])
    return code, (json.loads(out.getvalue()) if out.getvalue().strip() else None), err.getvalue()


def test_megatron_dump_at_tp2_against_its_tp1_run(tmp_path):
    pytest.importorskip("torch")
    for rank in (0, 1):
        megatron_rank(str(tmp_path / "tp2" / "step0" / f"rank{rank}"), rank, 2)
    megatron_rank(str(tmp_path / "tp1" / "step0" / "rank"), 0, 1)
    code, result, err = run_cli(tmp_path / "tp2", tmp_path / "tp1", "--target-tp", "2", "-o", tmp_path / "out")
    assert code == 0, err
    assert result["shards"]["target"]["rules"] == {"decoder.layers.0.mlp.linear_fc1": "column",
                                                   "decoder.layers.0.mlp.linear_fc2": "row"}
    # 4 activations and the 2 merged weights, all within thresholds
    assert [u["ok"] for u in result["units"]] == [6] and math.isclose(result["units"][0]["diverged"] or 0, 0)
    # the same dump as the baseline, at another TP size than the target
    code, result, err = run_cli(tmp_path / "tp1", tmp_path / "tp2", "--baseline-tp", "2", "-o", tmp_path / "out2")
    assert code == 0 and result["units"][0]["ok"] == 6, err


def test_tensor_parallel_sizes_must_be_positive(tmp_path):
    code, _, err = run_cli(tmp_path, tmp_path, "--target-tp", "0", "-o", tmp_path / "out")
    assert code == 2 and "--target-tp 0" in err


def test_a_tensor_parallel_compare_lists_each_dump_roots_folders_once(tmp_path, monkeypatch):
    """Sizes, rules, merging, inference, the comparison and the rank attribution all work from one listing of
    each side's rank folders."""
    pytest.importorskip("torch")
    from mf_celldump.layout import reader

    for rank in (0, 1):
        megatron_rank(str(tmp_path / "tp2" / "step0" / f"rank{rank}"), rank, 2)
    megatron_rank(str(tmp_path / "tp1" / "step0" / "rank"), 0, 1)
    listed = []
    real = reader._rank_folders
    monkeypatch.setattr(reader, "_rank_folders", lambda folder: listed.append(os.path.abspath(folder)) or real(folder))
    code, result, err = run_cli(tmp_path / "tp2", tmp_path / "tp1", "--target-tp", "2", "-o", tmp_path / "out")
    assert code == 0, err
    roots = [path for path in listed if os.path.basename(path) in ("tp1", "tp2")]
    assert sorted(roots) == [str(tmp_path / "tp1"), str(tmp_path / "tp2")], listed


def test_a_divergence_in_every_ranks_part_names_every_launched_rank(tmp_path):
    """The baseline's linear_fc1 weight scaled as a whole: both ranks' parts diverge, so the first divergence
    names ranks 0 and 1 (``rank`` the first, ``ranks`` both), its merged group apart."""
    pytest.importorskip("torch")
    for rank in (0, 1):
        megatron_rank(str(tmp_path / "tp2" / "step0" / f"rank{rank}"), rank, 2)
    megatron_rank(str(tmp_path / "tp1" / "step0" / "rank"), 0, 1, fc1_scale=1.1)
    code, result, err = run_cli(tmp_path / "tp2", tmp_path / "tp1", "--target-tp", "2", "-o", tmp_path / "out")
    assert code == 1, err
    first = result["first_divergence"]
    assert first["cell"] == "decoder.layers.0.mlp.linear_fc1" and result["shards"]["attribution"]["ranks"] == [0, 1]
    assert (first["rank"], first["ranks"], first["group"], first["folder"]) == (0, [0, 1], 0, "step0/rank0")
    assert "(forward, step 0 ranks 0, 1): " in result["headline"], result["headline"]
    assert [unit["ranks"] for unit in result["units"]] == [[0, 1]]
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        cli_main(["compare", str(tmp_path / "tp2"), str(tmp_path / "tp1"), "--target-tp", "2", "-o",
                  str(tmp_path / "text")])
    lines = out.getvalue().splitlines()
    assert result["headline"] in lines and "FIRST DIVERGENCE ON RANK(S) 0, 1 of [0, 1]: " in out.getvalue()
    assert any(line.startswith("step 0 ranks 0, 1 merged (step0/rank0): ") for line in lines), lines
