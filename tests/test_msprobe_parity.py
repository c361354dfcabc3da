"""Our dump against msprobe 26.2's own PyNative L0 dump of the same tiny LLaMA step.

One module-scoped fixture writes random LLaMA weights (Megatron's names, converted by
tests/support/megatron_llama.py as in the cross-framework tests, no torch needed) and a batch,
then dumps the same training step (same weights, data, SGD with learning rate 0) four
times, each in a process of its own: ours (tensor, statistics) and msprobe's
``PrecisionDebugger`` (tensor, statistics). Then:

* every slot both dumps record holds the same value (tensor task: bit-identical arrays;
  statistics: the same numbers up to msprobe's float32 arithmetic), and every entry
  msprobe records for a cell we capture is in ours, including each cell's
  ``parameters`` and ``parameters_grad``;
* ``msprobe compare`` pairs every shared tensor row, the ``parameters`` and
  ``parameters_grad`` rows included, with cosine 1.0;
* ``msprobe graph_visualize`` of ours against msprobe's shows no error node, in both tasks;
* our graph-mode dump of the same step has the same weights and weight gradients (the
  latter up to graph-mode rounding).

Gradients of inputs that depend on no parameter: msprobe records the
gradient of the attention mask (LLamaDecodeLayer, LLamaAttention, 2 layers) and of the
loss's int label and float mask inputs, numbered by rank among the call's top-level
tensor arguments (``LLamaAttention``'s mask is ``backward.0.output.1`` although it is
``input.2``: the ``freqs_cis`` tuple takes no number). We record them the same way and
the test asserts that msprobe has no tensor slot we lack. Where msprobe records no
backward output at all because no tensor input is differentiable (``LlamaEmbedding``'s
int ``input_ids``), we write an explicit ``null``, which ``graph_visualize`` does not
count as an error.
"""

from __future__ import annotations

import glob
import json
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from tests.support.msprobe_cli import compare_rows, run_msprobe

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TENSOR_TYPE = "mindspore.Tensor"
# graph_visualize's precision index at or above which a node is painted as an error.
ERROR_INDEX = 0.6


def _write_inputs(out: str) -> None:
    """Random weights under Megatron's names (tests/support/megatron_llama.py converts them) and a batch."""
    from tests.support.megatron_gpt import TinyGPT, tokens

    cfg = TinyGPT()
    rng = np.random.default_rng(7)
    h, v, f = cfg.hidden_size, cfg.vocab_size, cfg.ffn_hidden_size
    qkv = (cfg.num_heads + 2 * cfg.num_query_groups) * (h // cfg.num_heads)
    weights = {
        "embedding.word_embeddings.weight": rng.normal(0, 0.02, (v, h)),
        "decoder.final_layernorm.weight": 1 + rng.normal(0, 0.1, (h,)),
        "output_layer.weight": rng.normal(0, 0.02, (v, h)),
    }
    for i in range(cfg.num_layers):
        p = f"decoder.layers.{i}."
        weights[p + "self_attention.linear_qkv.weight"] = rng.normal(0, 0.02, (qkv, h))
        weights[p + "self_attention.linear_proj.weight"] = rng.normal(0, 0.02, (h, h))
        weights[p + "mlp.linear_fc1.weight"] = rng.normal(0, 0.02, (2 * f, h))
        weights[p + "mlp.linear_fc2.weight"] = rng.normal(0, 0.02, (h, f))
        weights[p + "input_layernorm.weight"] = 1 + rng.normal(0, 0.1, (h,))
        weights[p + "pre_mlp_layernorm.weight"] = 1 + rng.normal(0, 0.1, (h,))
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, "weights.npz"), **{k: w.astype(np.float32) for k, w in weights.items()})
    np.savez(os.path.join(out, "batch.npz"), tokens=tokens(cfg))


def _run(args, cwd):
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "support", "megatron_llama.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    inputs = str(root / "inputs")
    _write_inputs(inputs)
    runs = ["--run=tensor", "--run=statistics:clean:statistics"]
    ours = _run([inputs, str(root / "ours"), *runs], str(root))
    ours += _run([inputs, str(root / "ours_graph"), "--mode=graph", *runs], str(root))
    theirs = [_run([inputs, str(root / "msprobe"), f"--run={task}:clean:{task}", "--tool=msprobe"], str(root))[0]
              for task in ("tensor", "statistics")]
    losses = {r["loss"] for r in ours + theirs}
    assert len(losses) == 1, losses  # the same step four times
    return {(tool, task): root / tool / task / "step0" / "rank"
            for tool in ("ours", "ours_graph", "msprobe") for task in ("tensor", "statistics")}


def _data(rank_dir):
    with open(os.path.join(rank_dir, "dump.json"), encoding="utf-8") as handle:
        return json.load(handle)["data"]


def _leaves(value, prefix):
    """(slot name, leaf) of a dump.json value, named as msprobe compare names rows."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{prefix}.{i}")
    elif isinstance(value, dict) and "type" not in value:
        for key, item in value.items():
            yield from _leaves(item, f"{prefix}.{key}")
    else:
        yield prefix, value


def _slots(data, only_captured=False):
    """{entry.io.index: leaf} of every entry; parameters_grad lists become ``{entry}.{weight}.0``."""
    out = {}
    for entry, body in data.items():
        if only_captured and not _captured_by_us(entry):
            continue
        if ".parameters_grad." in entry:
            out.update(_leaves(body, entry))
            continue
        for field, value in body.items():
            io = {"input_args": "input", "input_kwargs": "input", "input": "input"}.get(field, field)
            out.update(_leaves(value, f"{entry}.{io}"))
    return out


def _tensor_slots(slots):
    return {k: v for k, v in slots.items() if isinstance(v, dict) and v.get("type") == TENSOR_TYPE}


def _captured_by_us(entry):
    """Cells we capture: not framework-internal classes (names starting with ``_``, README)."""
    return not entry.split(".")[-3].startswith("_")


def _load(rank_dir, record):
    return np.load(os.path.join(rank_dir, "dump_tensor_data", record["data_name"]), allow_pickle=False)


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_every_shared_slot_is_identical(dumps, task):
    ours_dir, theirs_dir = dumps[("ours", task)], dumps[("msprobe", task)]
    ours, theirs = _data(ours_dir), _data(theirs_dir)
    missing_entries = [e for e in theirs if _captured_by_us(e) and e not in ours]
    assert missing_entries == []
    grads = [e for e in theirs if ".parameters_grad." in e]
    assert len(grads) == 21 and all(e in ours for e in grads)
    our_slots, their_slots = _slots(ours), _slots(theirs)
    shared = sorted(set(_tensor_slots(our_slots)) & set(_tensor_slots(their_slots)))
    assert len(shared) >= 209, len(shared)
    assert sum(".parameters." in s for s in shared) == 21 and sum(".parameters_grad." in s for s in shared) == 21
    for slot in shared:
        mine, msprobe = our_slots[slot], their_slots[slot]
        assert (mine["dtype"], mine["shape"]) == (msprobe["dtype"], msprobe["shape"]), slot
        if task == "tensor":
            np.testing.assert_array_equal(_load(ours_dir, mine), _load(theirs_dir, msprobe), err_msg=slot)
        for stat in ("Max", "Min", "Mean", "Norm"):
            np.testing.assert_allclose(mine[stat], msprobe[stat], rtol=2e-6, atol=1e-9, err_msg=f"{slot} {stat}")
    # No slot msprobe records is missing, the masks' and the int label's gradients included.
    lacking = sorted(set(_tensor_slots(_slots(theirs, only_captured=True))) - set(our_slots))
    assert lacking == []
    masks = [s for s in shared if s.endswith(("LLamaAttention.backward.0.output.1",
                                              "LLamaDecodeLayer.backward.0.output.1",
                                              "CrossEntropyLoss.backward.0.output.1",
                                              "CrossEntropyLoss.backward.0.output.2"))]
    assert len(masks) == 6, masks
    # input_ids (int only): no gradient can exist; an explicit null where msprobe has no output.
    assert ours["Cell.model.tok_embeddings.LlamaEmbedding.backward.0"]["output"] == [None]
    assert theirs["Cell.model.tok_embeddings.LlamaEmbedding.backward.0"]["output"] == []
    # Non-tensor slots both record agree (None is a bare null on both sides).
    for slot in set(our_slots) & set(their_slots):
        if slot not in shared:
            mine, msprobe = our_slots[slot], their_slots[slot]
            assert mine == msprobe or (isinstance(mine, dict) and mine.get("value") == msprobe.get("value")), slot


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_graph_mode_weights_and_gradients_match_msprobe(dumps, task):
    """Our graph-mode dump of the same step: the same weights bit for bit, and the same weight
    gradients up to graph-mode arithmetic (its kernels round differently from PyNative's)."""
    ours_dir, theirs_dir = dumps[("ours_graph", task)], dumps[("msprobe", task)]
    ours, theirs = _slots(_data(ours_dir)), _slots(_data(theirs_dir))
    slots = [s for s in _tensor_slots(theirs) if ".parameters" in s]
    assert len(slots) == 42 and all(s in ours for s in slots)
    for slot in slots:
        mine, msprobe = ours[slot], theirs[slot]
        assert (mine["dtype"], mine["shape"]) == (msprobe["dtype"], msprobe["shape"]), slot
        exact = ".parameters." in slot
        if task == "tensor":
            got, want = _load(ours_dir, mine), _load(theirs_dir, msprobe)
            if exact:
                np.testing.assert_array_equal(got, want, err_msg=slot)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=slot)
        for stat in ("Max", "Min", "Mean", "Norm"):
            np.testing.assert_allclose(mine[stat], msprobe[stat], rtol=2e-6 if exact else 1e-4, atol=1e-8,
                                       err_msg=f"{slot} {stat}")


def test_compare_pairs_weights_and_their_gradients_with_cosine_one(dumps, tmp_path):
    rows = compare_rows(str(dumps[("ours", "tensor")].parent), str(dumps[("msprobe", "tensor")].parent),
                        str(tmp_path / "cmp"))
    by_name = {r["NPU Name"]: r for r in rows}
    grads = [r for name, r in by_name.items() if ".parameters_grad." in name]
    weights = [r for name, r in by_name.items() if ".parameters." in name]
    assert len(grads) == 21 and len(weights) == 21
    for row in grads + weights:
        assert row["Bench Name"] == row["NPU Name"]
        assert row["Cosine"] == "1.0" and float(row["MaxAbsErr"]) == 0.0, row
    numeric = [r for r in rows if r["Cosine"] not in ("unsupported", "N/A", "")]
    assert len(numeric) >= 200
    assert all(r["Cosine"] == "1.0" for r in numeric), [r["NPU Name"] for r in numeric if r["Cosine"] != "1.0"]


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_graph_visualize_shows_no_error_node(dumps, tmp_path, task):
    out = tmp_path / "vis"
    run_msprobe("graph_visualize", "-tp", str(dumps[("ours", task)]), "-gp", str(dumps[("msprobe", task)]),
                "-o", str(out))
    (db,) = glob.glob(str(out / "*.vis.db"))
    with sqlite3.connect(db) as con:
        nodes = con.execute("select node_name, precision_index, matched_node_link from tb_nodes "
                            "where data_source = 'NPU'").fetchall()
    errors = [name for name, index, _ in nodes if index is not None and index >= ERROR_INDEX]
    assert errors == []
    grads = [name for name, _, _ in nodes if ".parameters_grad." in name]
    assert len(grads) == 21
    unmatched = [name for name, _, link in nodes if not link or link == "[]"]
    assert unmatched == []
