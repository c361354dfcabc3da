"""``--target-tp N`` alone merges a tensor-parallel dump: cells no rule names get the rule their ranks' tensors
show (reported), communication-region cells have rules of their own, and a rule in a mapping file wins.

Hand-made two-rank MindSpore dumps of a row-parallel projection written by hand (no class default), an
activation on each rank's features, the all-reduce after the projection (a cell of its own, as hand-written
tensor-parallel code has it) and MindFormers' ``ReduceFromModelParallelRegion``, against the same cells on one
rank. The real msrun run is in ``test_compare_shards_msrun.py``.
"""

from __future__ import annotations

import numpy as np

from tests.test_compare_shards import record, run_cli, write_rank

RNG = np.random.default_rng(5)
X = RNG.normal(size=(2, 3, 6)).astype(np.float32)
W = RNG.normal(size=(4, 6)).astype(np.float32)  # projection: input features (columns) split over the ranks


def _rank(folder, rank, tp, task="tensor"):
    part = 6 // tp
    x = np.tanh(X[..., rank * part:(rank + 1) * part])
    w = np.ascontiguousarray(W[:, rank * part:(rank + 1) * part])
    partial = x @ w.T
    whole = np.tanh(X) @ W.T
    arrays, entries = {}, {}

    def rec(entry, slot, array):
        name = f"{entry}.{slot}.npy"
        arrays[name] = np.ascontiguousarray(array, dtype=np.float32)
        return record(arrays[name], name, task)

    def add(entry, inputs, outputs, weights=None):
        body = {"input_args": [rec(entry, f"input.{i}", a) for i, a in enumerate(inputs)], "input_kwargs": {},
                "output": [rec(entry, f"output.{i}", a) for i, a in enumerate(outputs)]}
        if weights:
            body["parameters"] = {k: rec(entry, f"parameters.{k}", a) for k, a in weights.items()}
        entries[entry] = body

    add("Cell.act.Tanh.forward.0", [X[..., rank * part:(rank + 1) * part]], [x])
    add("Cell.proj.Proj.forward.0", [x], [partial], {"weight": w})
    add("Cell.reduce.ReduceFromTP.forward.0", [partial], [whole])
    add("Cell.region.ReduceFromModelParallelRegion.forward.0", [partial], [whole])
    add("Cell.head.Dense.forward.0", [whole], [whole * 2.0])
    return write_rank(folder, entries, task, arrays if task == "tensor" else None)


def _dumps(tmp_path, task="tensor"):
    for rank in (0, 1):
        _rank(str(tmp_path / "tp2" / "step0" / f"rank{rank}"), rank, 2, task)
    _rank(str(tmp_path / "tp1" / "step0" / "rank"), 0, 1, task)


def test_rules_no_one_gave_are_inferred_from_the_ranks_tensors_and_reported(tmp_path):
    _dumps(tmp_path)
    code, result, err = run_cli(tmp_path / "tp2", tmp_path / "tp1", "--target-tp", "2", "-o", tmp_path / "out")
    assert code == 0, err
    target = result["shards"]["target"]
    assert target["inferred"] == {"act": "split", "proj": "row", "reduce": "reduce"}
    assert target["rules"]["region"] == "reduce"  # MindFormers' region class: its rule by default, not inferred
    assert "region" not in target["inferred"] and "head" not in target["rules"]
    assert result["units"][0]["diverged"] == 0 and result["units"][0]["ok"] == 11


def test_a_rule_in_the_mapping_file_wins_over_inference(tmp_path):
    _dumps(tmp_path)
    rules = tmp_path / "rules.yaml"
    rules.write_text('Tanh:\n  "": Tanh(shard=none)\n')
    code, result, err = run_cli(tmp_path / "tp2", tmp_path / "tp1", "--target-tp", "2", "--mapping", rules,
                                "-o", tmp_path / "out")
    assert code == 2 and "target cell act (shard=none" in err, err


def test_a_statistics_dump_says_it_cannot_show_a_layout(tmp_path):
    _dumps(tmp_path, task="statistics")
    code, result, err = run_cli(tmp_path / "tp2", tmp_path / "tp1", "--target-tp", "2", "-o", tmp_path / "out")
    said = result["shards"]["target"]["inference_note"] if result else err
    assert "a statistics dump cannot show a cell's layout" in said, (code, err)


def test_the_tensor_parallel_size_capture_records(tmp_path, monkeypatch):
    """replica_groups' model_parallel first, else MindFormers' config on the model; MindSpore's auto-parallel
    mode beside it; nothing known: nothing recorded."""
    monkeypatch.chdir(tmp_path)  # MindFormers writes its log folder into the working folder
    from mindformers.parallel_core.transformer_config import TransformerConfig

    from mf_celldump.capture.parallel_layout import parallel_layout

    class Holder:  # what capture reads of a MindFormers model: its ``config``
        config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, tensor_model_parallel_size=2)

    assert parallel_layout(1, Holder(), "semi_auto_parallel") == {
        "tensor_parallel": 2, "source": "MindFormers parallel_config", "parallel_mode": "semi_auto_parallel"}
    assert parallel_layout(4, Holder(), "stand_alone") == {"tensor_parallel": 4, "source": "replica_groups"}
    assert parallel_layout(1, object(), "stand_alone") is None
