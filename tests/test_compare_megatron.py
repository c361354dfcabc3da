"""End to end, real parts: Megatron-core GPTModel (msprobe's PyTorch dump) against MindFormers' LLaMA.

One module-scoped fixture builds every dump once (about 1 minute on an idle 2-core machine, 2-3 under load):
* ``meg``: a tiny Megatron-core GPTModel on CPU, one step dumped by msprobe's PyTorch dumper
  (tests/support/megatron_gpt.py, CPU remedies on the test side only);
* ``ours/*``: the MindFormers legacy LLaMA with weights converted from it, batch 2, dumped by
  mf_celldump's public API (tests/support/megatron_llama.py): ``clean``, ``clean2`` (a second run),
  ``perturb`` (layer 1's ``wo`` weight x1.05), ``nan`` (one NaN in layer 1's ``w2`` weight),
  ``w3`` (one element of layer 1's ``w3`` weight changed: its output's Mean moves by 2.4%, Max,
  Min and Norm by less than 1e-5), ``rope`` (RoPE theta 5000 on our side),
  ``stats`` / ``nanstats`` / ``w3stats`` (statistics task);
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
from tests.support.chromium import Browser, needs_chromium
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
        "w3:w3",
        "w3stats:w3:statistics",
        "rope:rope",
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


def test_msprobe_compare_pairs_every_module_with_the_bundled_file(dumps, capsys, tmp_path):
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
        table = list(csv.DictReader(handle))
    rows = {row["NPU Name"]: row["Bench Name"] for row in table}
    missing = []
    for ours, theirs in _expected_pairs().items():
        for direction, slot in (("forward", "output.0"), ("backward", "input.0")):
            name = f"Cell.{ours}.{direction}.0.{slot}"
            if rows.get(name) != f"Module.{theirs}.{direction}.0.{slot}":
                missing.append((name, rows.get(name)))
    assert not missing, missing
    paired = sum(1 for bench in rows.values() if bench != "N/A")
    assert paired >= 100, paired
    # where we pair the same two tensors, our msprobe_result is msprobe's Result (every cross-framework
    # row is an error there: Float32 against torch.float32, [b, s, h] against [s, b, h])
    _, ours = compare(capsys, dumps["ours"] / "clean", dumps["meg"], tmp_path / "ours", "--mapping", "llama")
    with open(ours["csv"], newline="") as handle:
        mine = {(f"{r['entry']}.{r['slot']}", f"{r['baseline_entry']}.{r['baseline_slot']}"): r
                for r in csv.DictReader(handle) if r["kind"] == "activation" and r["status"] != "skipped"}
    same = [(row, mine[(row["NPU Name"], row["Bench Name"])]) for row in table
            if (row["NPU Name"], row["Bench Name"]) in mine]
    assert len(same) > 50 and all(r["msprobe_result"] == row["Result"] == "error" for row, r in same)


def test_no_divergence_against_megatron(dumps, capsys, tmp_path):
    code, result = compare(capsys, dumps["ours"] / "clean", dumps["meg"], tmp_path, "--mapping", "llama")
    assert code == 0 and result["first_divergence"] is None
    with open(result["csv"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    compared = [r for r in rows if r["status"] != "skipped"]
    assert compared and all(float(r["cosine"]) >= 0.99999 for r in compared)
    fused = {
        (r["cell"].rpartition(".")[2], r["kind"], r["direction"], r["slot"])
        for r in compared
        if r["baseline_transform"] and "split" in r["baseline_transform"]
    }
    for cell in ("wq", "wk", "wv", "w3", "w1"):  # split from linear_qkv / linear_fc1, weights by rows
        assert {(cell, "weight", "forward", "param.weight"), (cell, "weight_grad", "backward", "param.weight")} <= fused
    for cell in ("wq", "wk", "wv", "w3"):  # forward output and gradient w.r.t. it
        assert {(cell, "activation", "forward", "output.0"), (cell, "activation", "backward", "input.0")} <= fused
    assert ("w1", "activation", "forward", "output.0") in fused  # after SiLU
    cells = {r["cell"] for r in compared}
    assert {"model", "model.tok_embeddings", "model.norm_out", "lm_head", "model.layers.1"} <= cells
    assert os.path.getsize(result["plot"]) > 10000
    # every weight and weight gradient is compared, the embedding's whatever its name
    for kind in ("weight", "weight_grad"):
        assert (result["weights"][kind]["ok"], result["weights"][kind]["diverged"]) == (21, 0), kind
    embedding = next(r for r in compared if r["cell"] == "model.tok_embeddings" and r["kind"] == "weight")
    assert (embedding["slot"], embedding["baseline_slot"]) == ("param.embedding_weight", "param.weight")
    parts = {p["label"]: p for p in result["coverage"]["parts"]}
    assert parts["forward"]["comparable_fraction"] > 0.6 and parts["backward"]["comparable_fraction"] > 0.6
    assert result["verdict"] == "within thresholds" and os.path.isfile(result["html"])


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
    assert not first["inputs_differ"]
    weights = result["weights"]["weight"]  # the scaled weight, in its own section
    assert weights["diverged"] == 1 and weights["first"]["cell"] == "model.layers.1.attention.wo"
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
        "FIRST DIVERGENCE (forward, step 0 rank 0): Cell.model.layers.1.attention.wo.Linear.forward.0" in text
    )
    assert "WEIGHTS DIFFER at step start: 1 of 21; first model.layers.1.attention.wo param.weight" in text


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


# --- verdicts that must not mislead, on the real pair -------------------------------------------------


def test_one_weight_element_on_a_statistics_dump_names_w3(dumps, capsys, tmp_path):
    """The w3 output's Mean moves by 2.4%, its Max/Min/Norm by less than 1e-5: named w3, not w2."""
    cases = {"megatron": (dumps["meg"], "--mapping", "llama"), "ours": (dumps["ours"] / "stats",),
             "tensor": (dumps["meg"], "--mapping", "llama")}
    for name, (baseline, *extra) in cases.items():
        target = dumps["ours"] / ("w3" if name == "tensor" else "w3stats")
        code, result = compare(capsys, target, baseline, tmp_path / name, *extra)
        first = result["first_divergence"]
        assert code == 1 and first["cell"] == "model.layers.1.feed_forward.w3", (name, first)
        (output,) = [t for t in first["tensors"] if t["slot"] == "output.0"]
        assert output["status"] == "diverged" and output["basis"] == ("tensor" if name == "tensor" else "statistics")
        assert not first["inputs_differ"] and all(p["why"] for p in first["parents"])
        assert result["weights"]["weight"]["first"]["cell"] == "model.layers.1.feed_forward.w3", name
    # statistics on both sides of the fused linear_fc1: w3 cannot be compared, and the report says so
    code, result = compare(capsys, dumps["ours"] / "w3stats", dumps["meg_stats"], tmp_path / "s", "--mapping", "llama")
    first = result["first_divergence"]
    assert code == 1 and first["cell"] == "model.layers.1.feed_forward.w2" and first["inputs_differ"]
    unpaired = {u["cell"]: u["reason"] for u in first["upstream_unpaired"]}
    assert "statistics of a part of a fused tensor" in unpaired["model.layers.1.feed_forward.w3"]


def test_rope_theta_names_the_unpaired_cause_upstream(dumps, capsys, tmp_path):
    code, result = compare(capsys, dumps["ours"] / "rope", dumps["meg"], tmp_path, "--mapping", "llama")
    first = result["first_divergence"]
    assert code == 1 and first["cell"] == "model.layers.0.attention.wo" and first["inputs_differ"]
    assert first["last_ok"] == "Cell.model.layers.0.attention.wv.Linear.forward.0"
    assert [u["cell"] for u in first["upstream_unpaired"]] == ["model.layers.0.attention.apply_rotary_emb"]
    assert "without a compared partner (model.layers.0.attention.apply_rotary_emb)" in first["cause"]
    assert result["weights"]["weight"]["diverged"] == 0  # the weights are the same: a computation differs


def test_a_wrong_qkv_groups_is_refused(dumps, capsys, tmp_path):
    argv = ["compare", str(dumps["ours"] / "clean"), str(dumps["meg"]), "-o", str(tmp_path), "--mapping", "llama"]
    assert celldump_main([*argv, "--qkv-groups", "2"]) == 2
    err = capsys.readouterr().err
    assert "--qkv-groups 2 does not match the baseline" in err and "has 4 query groups" in err
    assert celldump_main([*argv, "--qkv-groups", "4"]) == 0


_WITHOUT_TORCH = (
    "import sys\nsys.modules['torch'] = None  # as on a machine without torch\n"
    "from mf_celldump.cli import main\nsys.exit(main(sys.argv[1:]))\n"
)


def test_without_torch_the_megatron_dump_is_compared_on_statistics(dumps, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, "compare", str(dumps["ours"] / "perturb"), str(dumps["meg"]),
         "--mapping", "llama", "-o", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=REPO),
    )
    result = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert result["first_divergence"]["cell"] == "model.layers.1.attention.wo"
    fallback = {r["kind"]: r for r in result["coverage"]["statistics_fallback"]}
    assert fallback["activation"]["count"] > 50 and "needs torch installed" in fallback["activation"]["reason"]
    assert result["weights"]["weight"]["first"]["cell"] == "model.layers.1.attention.wo"


def test_a_mapping_that_pairs_little_gives_no_verdict(dumps, capsys, tmp_path):
    mapping = tmp_path / "head_only.yaml"
    mapping.write_text("TopLayer:\n  lm_head: output_layer([in], [out], layout=sbh)\n")
    code, result = compare(capsys, dumps["ours"] / "clean", dumps["meg"], tmp_path / "o", "--mapping", str(mapping))
    assert code == 2 and result["verdict"] == "too little compared" and result["first_divergence"] is None
    assert result["headline"].startswith("NO VERDICT: too little compared (forward ")
    assert result["coverage"]["not_compared"][0]["reason"] == "no baseline cell at the mapped name"


@needs_chromium
def test_the_html_report_of_the_w3_case_in_chromium(dumps, capsys, tmp_path):
    import io

    import matplotlib.image
    import numpy as np

    code, result = compare(capsys, dumps["ours"] / "w3", dumps["meg"], tmp_path, "--mapping", "llama")
    assert code == 1
    with Browser() as browser:
        page = browser.open("file://" + result["html"])
        assert page.errors == []
        assert page.evaluate("document.getElementById('headline').textContent") == (
            "FIRST DIVERGENCE (forward, step 0 rank 0): Cell.model.layers.1.feed_forward.w3.Linear.forward.0")
        verdict = page.evaluate("document.getElementById('verdict').textContent")
        assert "WEIGHTS DIFFER at step start: 1 of 21" in verdict
        page.evaluate("var k = document.getElementById('kind-filter'); k.value = 'weight';"
                      "var f = document.getElementById('filter'); f.value = 'w3 diverged';"
                      "f.dispatchEvent(new Event('input'))")
        rows = page.evaluate("Array.from(document.querySelectorAll('#pairs-body tr')).map(r => r.textContent)")
        assert len(rows) == 1 and "param.weight" in rows[0]
        pixels = matplotlib.image.imread(io.BytesIO(page.screenshot()), format="png")
        assert float(pixels[..., :3].std()) > 0.05 and len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50
