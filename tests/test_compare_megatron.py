"""End to end, real parts: Megatron-core GPTModel (msprobe's PyTorch dump) against MindFormers' LLaMA.

One module-scoped fixture builds every dump once (about 40 s on 2 cores):
* ``meg``: a tiny Megatron-core GPTModel on CPU, one step dumped by msprobe's PyTorch dumper
  (tests/support/megatron_gpt.py, CPU remedies on the test side only);
* ``ours/*``: the MindFormers legacy LLaMA with weights converted from it, batch 2, dumped by
  mf_celldump's public API (tests/support/megatron_llama.py): ``clean``, ``clean2`` (a second run),
  ``perturb`` (layer 1's ``wo`` weight x1.05), ``nan`` (one NaN in layer 1's ``w2`` weight),
  ``stats`` / ``nanstats`` (statistics task);
* ``msprobe_ms``: msprobe's own MindSpore L0 dump of the same LLaMA step;
* ``meg_stats``: the Megatron step again, dumped by msprobe with the statistics task.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import subprocess
import sys

import pytest

from mf_celldump.cli import main as celldump_main
from tests.support.msprobe_cli import run_msprobe

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
LAYERS = (0, 1)


def _run(args, cwd, timeout=600):
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("xframework")
    meg = root / "meg"
    meg_out = _run([os.path.join(HERE, "support", "megatron_gpt.py"), str(meg)], cwd=str(root))
    _run(
        [os.path.join(HERE, "support", "megatron_gpt.py"), str(root / "meg_stats"), "--task", "statistics"],
        cwd=str(root),
    )
    runs = [
        "clean",
        "clean2",
        "perturb:perturb",
        "nan:nan",
        "stats:clean:statistics",
        "nanstats:nan:statistics",
    ]
    ours = _run(
        [
            os.path.join(HERE, "support", "megatron_llama.py"),
            str(meg),
            str(root / "ours"),
            *[f"--run={r}" for r in runs],
        ],
        cwd=str(root),
    )
    theirs = _run(
        [
            os.path.join(HERE, "support", "megatron_llama.py"),
            str(meg),
            str(root / "msprobe_ms"),
            "--run=clean",
            "--tool=msprobe",
        ],
        cwd=str(root),
    )
    return {
        "root": root,
        "meg": meg / "dump",
        "meg_stats": root / "meg_stats" / "dump",
        "ours": root / "ours",
        "msprobe_ms": root / "msprobe_ms" / "clean",
        "losses": {
            "megatron": meg_out[0]["loss"],
            **{r["run"]: r["loss"] for r in ours},
            "msprobe_ms": theirs[0]["loss"],
        },
    }


def compare(capsys, target, baseline, out, *extra):
    code = celldump_main(["compare", str(target), str(baseline), "-o", str(out), "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def test_same_function_on_both_sides(dumps):
    losses = dumps["losses"]
    assert abs(losses["clean"] - losses["megatron"]) < 1e-5
    assert losses["clean"] == losses["clean2"] == losses["stats"] == losses["msprobe_ms"]


def _expected_pairs():
    """Our cells that must pair with Megatron's under msprobe compare -lm, and their partners."""
    pairs = {
        "model.tok_embeddings.LlamaEmbedding": "embedding.word_embeddings.VocabParallelEmbedding",
        "model.norm_out.LlamaRMSNorm": "decoder.final_layernorm.RMSNorm",
        "lm_head.Linear": "output_layer.ColumnParallelLinear",
    }
    for i in LAYERS:
        ours, theirs = f"model.layers.{i}.", f"decoder.layers.{i}."
        pairs.update(
            {
                ours + "attention_norm.LlamaRMSNorm": theirs + "input_layernorm.RMSNorm",
                ours + "attention.LLamaAttention": theirs + "self_attention.SelfAttention",
                ours + "ffn_norm.LlamaRMSNorm": theirs + "pre_mlp_layernorm.RMSNorm",
                ours + "feed_forward.LlamaFeedForward": theirs + "mlp.MLP",
                ours + "attention.wo.Linear": theirs + "self_attention.linear_proj.RowParallelLinear",
                ours + "feed_forward.w2.Linear": theirs + "mlp.linear_fc2.RowParallelLinear",
            }
        )
    return pairs


def test_msprobe_compare_pairs_every_module_with_the_bundled_file(dumps, tmp_path):
    mapping = os.path.join(REPO, "layer_mapping", "llama.yaml")
    run_msprobe(
        "compare",
        "-tp",
        str(dumps["ours"] / "clean" / "step0"),
        "-gp",
        str(dumps["meg"] / "step0"),
        "-o",
        str(tmp_path),
        "-lm",
        mapping,
    )
    (result,) = glob.glob(str(tmp_path / "compare_result_*.csv"))
    with open(result, newline="") as handle:
        rows = {row["NPU Name"]: row["Bench Name"] for row in csv.DictReader(handle)}
    missing = []
    for ours, theirs in _expected_pairs().items():
        for direction, slot in (("forward", "output.0"), ("backward", "input.0")):
            name = f"Cell.{ours}.{direction}.0.{slot}"
            if rows.get(name) != f"Module.{theirs}.{direction}.0.{slot}":
                missing.append((name, rows.get(name)))
    assert not missing, missing
    paired = sum(1 for bench in rows.values() if bench != "N/A")
    assert paired >= 100, paired


def test_no_divergence_against_megatron(dumps, capsys, tmp_path):
    code, result = compare(capsys, dumps["ours"] / "clean", dumps["meg"], tmp_path, "--mapping", "llama")
    assert code == 0 and result["first_divergence"] is None
    with open(result["csv"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    compared = [r for r in rows if r["status"] != "skipped"]
    assert compared and all(float(r["cosine"]) >= 0.99999 for r in compared)
    fused = {
        (r["cell"].rpartition(".")[2], r["direction"], r["slot"])
        for r in compared
        if r["transform"] and "split" in r["transform"]
    }
    for cell in ("wq", "wk", "wv", "w3"):  # forward output and gradient w.r.t. it, split from linear_qkv/fc1
        assert {(cell, "forward", "output.0"), (cell, "backward", "input.0")} <= fused
    assert ("w1", "forward", "output.0") in fused  # after SiLU
    cells = {r["cell"] for r in compared}
    assert {"model", "model.tok_embeddings", "model.norm_out", "lm_head", "model.layers.1"} <= cells
    assert os.path.getsize(result["plot"]) > 10000


def test_perturbed_layer1_weight_is_the_first_divergence(dumps, capsys, tmp_path):
    code, result = compare(capsys, dumps["ours"] / "perturb", dumps["meg"], tmp_path, "--mapping", "llama")
    first = result["first_divergence"]
    assert code == 1 and first["direction"] == "forward"
    assert first["cell"] == "model.layers.1.attention.wo", first
    assert (
        first["baseline"] == "Module.decoder.layers.1.self_attention.linear_proj.RowParallelLinear.forward.0"
    )
    assert [p["cell"] for p in first["parents"]] == ["model.layers.1.attention", "model.layers.1", "model"]
    assert first["next"] and first["metrics"]["slot"] == "output.0" and first["metrics"]["rel_err"] > 0.04
    # the terminal summary says the same
    assert (
        celldump_main(
            [
                "compare",
                str(dumps["ours"] / "perturb"),
                str(dumps["meg"]),
                "-o",
                str(tmp_path),
                "--mapping",
                "llama",
            ]
        )
        == 1
    )
    text = capsys.readouterr().out
    assert (
        "FIRST DIVERGENCE (forward, step 0 rank): Cell.model.layers.1.attention.wo.Linear.forward.0" in text
    )


def test_two_runs_of_ours(dumps, capsys, tmp_path):
    code, result = compare(capsys, dumps["ours"] / "clean2", dumps["ours"] / "clean", tmp_path / "a")
    assert code == 0 and result["first_divergence"] is None and result["mapping"] == []
    assert result["units"][0]["skipped"] == 0 and result["units"][0]["diverged"] == 0
    code, result = compare(capsys, dumps["ours"] / "perturb", dumps["ours"] / "clean", tmp_path / "b")
    assert code == 1 and result["first_divergence"]["cell"] == "model.layers.1.attention.wo"
    assert result["first_divergence"]["direction"] == "forward"


def test_against_msprobe_mindspore_l0_dump(dumps, capsys, tmp_path):
    code, result = compare(capsys, dumps["ours"] / "clean", dumps["msprobe_ms"], tmp_path / "a")
    assert code == 0 and result["first_divergence"] is None
    assert result["units"][0]["ok"] > 150
    code, result = compare(capsys, dumps["ours"] / "perturb", dumps["msprobe_ms"], tmp_path / "b")
    assert code == 1 and result["first_divergence"]["cell"] == "model.layers.1.attention.wo"
    # and the other way round: msprobe's dump (completion order) as the target
    code, result = compare(capsys, dumps["msprobe_ms"], dumps["ours"] / "perturb", tmp_path / "c")
    assert code == 1 and result["first_divergence"]["cell"] == "model.layers.1.attention.wo"


def test_statistics_task_dumps(dumps, capsys, tmp_path):
    code, result = compare(capsys, dumps["ours"] / "stats", dumps["ours"] / "clean", tmp_path / "a")
    assert code == 0 and result["tasks"] == ["statistics", "tensor"]
    code, result = compare(capsys, dumps["ours"] / "perturb", dumps["ours"] / "stats", tmp_path / "b")
    assert code == 1 and result["first_divergence"]["cell"].startswith("model.layers.1.")


def test_anomalies_name_the_poisoned_cell(dumps, capsys):
    for run in ("nan", "nanstats"):
        code = celldump_main(["anomalies", str(dumps["ours"] / run), "--json"])
        result = json.loads(capsys.readouterr().out)
        assert code == 1, run
        (first,) = result["first"]
        assert first["entry"] == "Cell.model.layers.1.feed_forward.w2.Linear.forward.0", (run, first)
        # The NaN is in w2's weight: recorded as a parameter, it is named first.
        slots = [(slot["slot"], slot["kind"]) for slot in first["slots"]]
        assert slots[0] == ("param.weight", "nan"), (run, slots)
        assert ("output.0", "nan") in slots, (run, slots)
    assert celldump_main(["anomalies", str(dumps["ours"] / "clean")]) == 0
    assert "no NaN, Inf" in capsys.readouterr().out
    assert celldump_main(["anomalies", str(dumps["meg"])]) == 0  # msprobe's PyTorch layout too


def test_mapping_check_lists_partners_in_the_megatron_dump(dumps, capsys):
    code = celldump_main(
        [
            "mapping",
            "check",
            "llama",
            "--target",
            str(dumps["ours"] / "clean"),
            "--baseline",
            str(dumps["meg"]),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "model.layers.1.attention.wq (Linear) -> decoder.layers.1.self_attention.linear_qkv" in out
    assert "lm_head (Linear) -> output_layer  [bundled/llama.yaml:" in out and "found" in out
    assert (
        "loss (CrossEntropyLoss) -> loss  [name kept]  NO PARTNER: the baseline has no 'loss' at the top"
        in out
    )
    assert "partners in " in out and "28 of 35 cells" in out


def test_statistics_against_megatron(dumps, capsys, tmp_path):
    """Cross-framework statistics: layout does not change Max/Min/Mean/Norm; fused parts are not compared."""
    code, result = compare(
        capsys, dumps["ours"] / "stats", dumps["meg_stats"], tmp_path / "a", "--mapping", "llama"
    )
    assert code == 0 and result["tasks"] == ["statistics", "statistics"] and result["units"][0]["ok"] > 50
    code, result = compare(
        capsys, dumps["ours"] / "perturb", dumps["meg_stats"], tmp_path / "b", "--mapping", "llama"
    )
    assert code == 1 and result["first_divergence"]["cell"] == "model.layers.1.attention.wo"


# The cell names of a real MindFormers mcore model (tiny Qwen3), written as a statistics dump:
# msprobe's name pairing reads names and classes only, so this checks mcore_gpt.yaml under the
# real `msprobe compare -lm` without training Qwen3 on CPU.
_QWEN3_NAMES_DUMP = """
import json, os, sys
from mf_celldump.mapping.sample_networks import build_builtin
out = sys.argv[1]
net = build_builtin("tiny-qwen3")
record = {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [4], "Max": 1.0, "Min": 0.0,
          "Mean": 0.5, "Norm": 1.0}
data, construct, stack = {}, {}, {}
for name, cell in net.cells_and_names():
    if name and type(cell).__name__ != "CellList":
        for direction in ("forward", "backward"):
            key = f"Cell.{name}.{type(cell).__name__}.{direction}.0"
            data[key] = {"input_args": [record], "input_kwargs": {}, "output": [record]}
            construct[key] = None
            stack[key] = []
folder = os.path.join(out, "step0", "rank")
os.makedirs(folder)
doc = {"task": "statistics", "level": "L0", "framework": "mindspore", "dump_data_dir": None, "data": data}
# msprobe -lm pairs nothing when stack.json or construct.json is empty (get_dump_data_items)
for file_name, content in (("dump.json", doc), ("construct.json", construct), ("stack.json", stack)):
    with open(os.path.join(folder, file_name), "w") as handle:
        json.dump(content, handle)
"""


def test_msprobe_compare_pairs_mcore_names_with_the_bundled_mcore_file(dumps, tmp_path):
    qwen3 = tmp_path / "qwen3_names"
    proc = subprocess.run(
        [sys.executable, "-c", _QWEN3_NAMES_DUMP, str(qwen3)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    mapping = os.path.join(REPO, "layer_mapping", "mcore_gpt.yaml")
    run_msprobe(
        "compare",
        "-tp",
        str(qwen3 / "step0"),
        "-gp",
        str(dumps["meg_stats"] / "step0"),
        "-o",
        str(tmp_path / "out"),
        "-lm",
        mapping,
    )
    (result,) = glob.glob(str(tmp_path / "out" / "compare_result_*.csv"))
    with open(result, newline="") as handle:
        rows = {row["NPU Name"]: row["Bench Name"] for row in csv.DictReader(handle)}
    expected = {
        "model.embedding.word_embeddings.VocabParallelEmbedding": "embedding.word_embeddings",
        "model.decoder.final_layernorm.FusedRMSNorm": "decoder.final_layernorm",
        "model.output_layer.ColumnParallelLinear": "output_layer",
    }
    for i in LAYERS:
        for ours, theirs in (
            ("input_layernorm.FusedRMSNorm", "input_layernorm"),
            ("self_attention.SelfAttention", "self_attention"),
            ("self_attention.linear_qkv.ColumnParallelLinear", "self_attention.linear_qkv"),
            ("self_attention.linear_proj.RowParallelLinear", "self_attention.linear_proj"),
            ("pre_mlp_layernorm.FusedRMSNorm", "pre_mlp_layernorm"),
            ("mlp.MLPInterleaved", "mlp"),
            ("mlp.linear_fc1.ColumnParallelLinear", "mlp.linear_fc1"),
            ("mlp.linear_fc2.RowParallelLinear", "mlp.linear_fc2"),
        ):
            expected[f"model.decoder.layers.{i}.{ours}"] = f"decoder.layers.{i}.{theirs}"
    missing = []
    for ours, theirs in expected.items():
        for direction, slot in (("forward", "output.0"), ("backward", "input.0")):
            bench = rows.get(f"Cell.{ours}.{direction}.0.{slot}", "")
            if not bench.startswith(f"Module.{theirs}.") or not bench.endswith(f".{direction}.0.{slot}"):
                missing.append((ours, direction, bench))
    assert not missing, missing
    # mapping check, from the same cells, resolves as msprobe did and finds the same partners
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mf_celldump.cli.mapping",
            "check",
            "mcore_gpt",
            "--target",
            str(qwen3),
            "--baseline",
            str(dumps["meg"]),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {line.split(" (")[0].strip() for line in proc.stdout.splitlines() if line.endswith("  found")}
    assert {name.rpartition(".")[0] for name in expected} <= found, proc.stdout[-3000:]
