"""Verdicts of ``mf-celldump compare`` and ``anomalies`` that must not mislead, on small hand-written dumps.

Statistics verdicts use every statistic (Mean included), a tensor that cannot be read falls
back to statistics, Inf is not called NaN, weights and weight gradients are compared in their
own section, a verdict needs a minimum coverage, a cell whose inputs already differ says
where to look, options that would give wrong answers are refused, and the outputs (text,
JSON, CSV) say what they hold.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mf_celldump.cli import main as celldump_main
from tests.support.compare_dumps import X, chain, write_dump

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGNS = np.array([3.0, -3.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5]).reshape(2, 4)


def run_json(capsys, *argv):
    code = celldump_main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def compare(capsys, target, baseline, out, *extra):
    return run_json(capsys, "compare", str(target), str(baseline), "-o", str(out), *extra)


def csv_rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


# --- statistics verdicts ------------------------------------------------------------------------------


def _mean_only_chain(flip: bool):
    """block > fc1 > fc2; with ``flip``, fc1's output has one element's sign flipped: Max, Min and
    Norm stay, Mean moves (from 0 to -0.25)."""
    out = SIGNS.copy()
    if flip:
        out[0, 2] = -1.0
    return {
        "Cell.block.Block.forward.0": {"in": [SIGNS], "out": [out * 2]},
        "Cell.block.fc1.Dense.forward.0": {"in": [SIGNS], "out": [out]},
        "Cell.block.fc2.Dense.forward.0": {"in": [out], "out": [out * 2]},
    }


def test_statistics_verdict_uses_the_mean(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), _mean_only_chain(False), task="statistics")
    write_dump(str(tmp_path / "b"), _mean_only_chain(True), task="statistics")
    code, result = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    first = result["first_divergence"]
    assert code == 1 and first["cell"] == "block.fc1", first
    (output,) = [t for t in first["tensors"] if t["slot"] == "output.0"]
    assert output["status"] == "diverged" and output["basis"] == "statistics" and output["stat_rel"] > 0.5


def test_a_mean_near_zero_does_not_turn_rounding_into_a_divergence(tmp_path, capsys):
    base = SIGNS.copy()
    noisy = SIGNS.copy()
    noisy[0, 0] += 3e-7  # Mean moves from 0 to 4e-8: relative to |Mean| that is everything
    write_dump(str(tmp_path / "a"), {"Cell.fc.Dense.forward.0": {"in": [base], "out": [base]}}, task="statistics")
    write_dump(str(tmp_path / "b"), {"Cell.fc.Dense.forward.0": {"in": [base], "out": [noisy]}}, task="statistics")
    code, result = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    assert code == 0 and result["first_divergence"] is None


def test_every_parent_says_why_it_is_not_diverged(tmp_path, capsys):
    # fc1 changes by 1e-2, its parent's output (fc2's, scaled 1e-3 of it) hides it: the parent is ok
    base = {"Cell.block.Block.forward.0": {"in": [X], "out": [X]},
            "Cell.block.fc1.Dense.forward.0": {"in": [X], "out": [X * 2]},
            "Cell.block.fc2.Dense.forward.0": {"in": [X * 2], "out": [X]}}
    changed = json.loads(json.dumps({k: {kk: [a.tolist() for a in vv] for kk, vv in v.items()}
                                     for k, v in base.items()}))
    changed["Cell.block.fc1.Dense.forward.0"]["out"] = [(X * 2 * 1.01).tolist()]
    changed["Cell.block.fc2.Dense.forward.0"]["in"] = [(X * 2 * 1.01).tolist()]
    write_dump(str(tmp_path / "a"), base)
    write_dump(str(tmp_path / "b"), changed)
    code, result = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    first = result["first_divergence"]
    assert code == 1 and first["cell"] == "block.fc1"
    (parent,) = first["parents"]
    assert parent["status"] == "ok" and "within thresholds at input.0, output.0" in parent["why"]
    assert celldump_main(["compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o", str(tmp_path / "o")]) == 1
    text = capsys.readouterr().out
    assert "block: ok - within thresholds at input.0, output.0 (largest rel_err 0 at input.0)" in text


# --- tensors that cannot be read ----------------------------------------------------------------------


def test_a_missing_tensor_file_falls_back_to_statistics(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), chain(1.0))
    folder = write_dump(str(tmp_path / "b"), chain(1.5))
    os.remove(os.path.join(folder, "dump_tensor_data", "Cell.block.fc2.Dense.forward.0.output.0.npy"))
    code, result = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    first = result["first_divergence"]
    assert code == 1 and first["cell"] == "block.fc2", first
    (output,) = [t for t in first["tensors"] if t["slot"] == "output.0"]
    assert output["basis"] == "statistics" and "statistics only: target tensor unreadable" in output["reason"]
    assert "missing" in output["reason"]
    assert result["coverage"]["statistics_fallback"][0]["count"] == 1


_WITHOUT_TORCH = (
    "import sys\nsys.modules['torch'] = None  # as on a machine without torch\n"
    "from mf_celldump.cli import main\nsys.exit(main(sys.argv[1:]))\n"
)


def test_pytorch_tensors_without_torch_are_compared_on_statistics(tmp_path):
    write_dump(str(tmp_path / "ms"), chain(1.0))
    write_dump(str(tmp_path / "pt"), chain(1.0), framework="pytorch")
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH, "compare", str(tmp_path / "ms"), str(tmp_path / "pt"),
         "--mapping", "none", "-o", str(tmp_path / "o"), "--json"],
        capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=REPO),
    )
    result = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert result["verdict"] == "within thresholds" and result["units"][0]["ok"] == 6
    (fallback,) = result["coverage"]["statistics_fallback"]
    assert fallback["count"] == 6 and "needs torch installed" in fallback["reason"]
    assert any("install torch" in item for item in result["advice"])


# --- Inf is not NaN -----------------------------------------------------------------------------------

_INF_RECORD = {"Max": float("inf"), "Min": float("-inf"), "Mean": float("nan"), "Norm": float("inf")}


def test_plus_and_minus_inf_are_inf_not_nan(tmp_path, capsys):
    entries = {"Cell.fc.Dense.forward.0": {"in": [X], "out": [X], "records": {"output.0": dict(_INF_RECORD)}}}
    write_dump(str(tmp_path / "bad"), entries, task="statistics")
    code, result = run_json(capsys, "anomalies", str(tmp_path / "bad"))
    assert code == 1 and result["first"][0]["slots"][0]["kind"] == "inf"
    write_dump(str(tmp_path / "good"), {"Cell.fc.Dense.forward.0": {"in": [X], "out": [X]}}, task="statistics")
    code, result = compare(capsys, tmp_path / "bad", tmp_path / "good", tmp_path / "o")
    (output,) = [t for t in result["first_divergence"]["tensors"] if t["slot"] == "output.0"]
    assert code == 1 and "target Inf, baseline finite" in output["reason"] and "NaN" not in output["reason"]


def test_a_nan_count_is_a_nan_whatever_the_extremes_and_is_shown(tmp_path, capsys):
    entries = {"Cell.fc.Dense.forward.0": {"in": [X], "out": [X], "records": {"output.0": {"nan_count": 3}}}}
    write_dump(str(tmp_path / "d"), entries, task="statistics")
    code, result = run_json(capsys, "anomalies", str(tmp_path / "d"))
    (slot,) = result["first"][0]["slots"]
    assert code == 1 and slot["kind"] == "nan" and slot["nan_count"] == 3
    assert celldump_main(["anomalies", str(tmp_path / "d")]) == 1
    assert "output.0: nan (3 NaN, Max" in capsys.readouterr().out


# --- weights and weight gradients ---------------------------------------------------------------------


def _with_weights(w_scale=1.0, g_scale=1.0):
    w = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
    return {
        "Cell.fc.Dense.forward.0": {"in": [X], "out": [X @ w.T], "params": {"weight": w * w_scale}},
        "Cell.fc.Dense.backward.0": {"in": [X @ w.T], "out": [X]},
        "Cell.fc.Dense.parameters_grad.0": {"grads": {"weight": w * 0.1 * g_scale}},
    }


def test_weights_and_weight_gradients_are_compared_in_their_own_section(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), _with_weights())
    write_dump(str(tmp_path / "b"), _with_weights(w_scale=1.05, g_scale=1.0))
    code, result = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    weights, grads = result["weights"]["weight"], result["weights"]["weight_grad"]
    assert code == 1 and result["first_divergence"] is None  # the activations of this fake agree
    assert (weights["ok"], weights["diverged"]) == (0, 1) and weights["first"]["cell"] == "fc"
    assert weights["first"]["metrics"]["slot"] == "param.weight" and weights["first"]["metrics"]["rel_err"] > 0.04
    assert (grads["ok"], grads["diverged"]) == (1, 0)
    parts = {p["label"]: p for p in result["coverage"]["parts"]}
    assert parts["weights"]["compared"] == 1 and parts["weight gradients"]["compared"] == 1
    assert celldump_main(["compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o", str(tmp_path / "o")]) == 1
    text = capsys.readouterr().out
    assert "WEIGHTS DIFFER at step start: 1 of 1; first fc param.weight" in text
    kinds = {(r["kind"], r["direction"]) for r in csv_rows(result["csv"])}
    assert {("weight", "forward"), ("weight_grad", "backward"), ("activation", "backward")} <= kinds


def test_fused_weights_split_by_rows_like_the_outputs():
    from mf_celldump.analysis.compare import transforms
    from mf_celldump.mapping.compare_rules import parse_rules

    groups, per, dim, hidden = 2, 2, 3, 5
    q, k, v = (np.arange(n * hidden, dtype=float).reshape(n, hidden) + base
               for n, base in ((groups * per * dim, 0), (groups * dim, 1000), (groups * dim, 2000)))
    fused = np.concatenate([np.concatenate([q.reshape(groups, per * dim, hidden)[g], k.reshape(groups, dim, hidden)[g],
                                            v.reshape(groups, dim, hidden)[g]]) for g in range(groups)])
    for part, want in (("q", q), ("k", k), ("v", v)):
        plan = transforms.Plan(parse_rules((("split", f"qkv:{part}"),)), use_split=True, weight=True,
                               qkv_groups=groups)
        np.testing.assert_array_equal(plan.apply(fused, want.shape), want)
    gate_up = np.concatenate([q, q + 1])
    plan = transforms.Plan(parse_rules((("split", "chunk:1/2"), ("act", "silu"))), use_split=True, use_act=True,
                           weight=True)
    np.testing.assert_array_equal(plan.apply(gate_up, q.shape), q + 1)  # the activation is not a weight's
    assert plan.describe() == "split rows chunk:1/2"


# --- coverage -----------------------------------------------------------------------------------------


def _wide(names):
    return {f"Cell.{n}.Dense.forward.0": {"in": [X], "out": [X]} for n in names}


def test_a_verdict_needs_enough_compared(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), _wide(["model.layers.0.a", "other.x"]))
    write_dump(str(tmp_path / "b"), _wide(["model.layers.0.a", *[f"mine.c{i}" for i in range(6)]]))
    code, result = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    (forward,) = result["coverage"]["parts"]
    assert code == 2 and result["verdict"] == "too little compared"
    assert (forward["compared"], forward["target_tensors"], forward["no_partner"]) == (2, 14, 12)
    assert forward["baseline_used"] == 2 and forward["baseline_tensors"] == 4
    assert result["headline"].startswith("NO VERDICT: too little compared (forward 14%")
    assert "mapping check" in result["advice"][0]
    assert result["coverage"]["not_compared"] == [
        {"kind": "activation", "class": "no_partner", "reason": "no baseline cell at the mapped name", "count": 12}
    ]
    code, result = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o", "--min-coverage", "0.1")
    assert code == 0 and result["verdict"] == "within thresholds"


def test_no_plot_says_why(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), _wide(["model"]))
    write_dump(str(tmp_path / "b"), _wide(["model", "model.layers.0.x"]))
    code, result = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o", "--min-coverage", "0")
    assert code == 0 and result["plot"] is None and result["plot_note"].startswith("no plot: ")


# --- a cause that has no partner ----------------------------------------------------------------------


def _with_unpaired(theta: float, keep_rope: bool):
    rotated = X * theta
    entries = {
        "Cell.attn.Attention.forward.0": {"in": [X], "out": [rotated * 2]},
        "Cell.attn.wq.Linear.forward.0": {"in": [X], "out": [X]},
        "Cell.attn.rope.Rotary.forward.0": {"in": [X], "out": [rotated]},
        "Cell.attn.wo.Linear.forward.0": {"in": [rotated], "out": [rotated * 2]},
    }
    if not keep_rope:
        del entries["Cell.attn.rope.Rotary.forward.0"]
    return entries


def test_inputs_that_already_differ_point_upstream(tmp_path, capsys):
    write_dump(str(tmp_path / "base"), _with_unpaired(1.0, keep_rope=False))
    write_dump(str(tmp_path / "run"), _with_unpaired(1.1, keep_rope=True))
    code, result = compare(capsys, tmp_path / "run", tmp_path / "base", tmp_path / "o")
    first = result["first_divergence"]
    assert code == 1 and first["cell"] == "attn.wo" and first["inputs_differ"]
    assert first["last_ok"] == "Cell.attn.wq.Linear.forward.0"
    assert [u["cell"] for u in first["upstream_unpaired"]] == ["attn.rope"]
    assert "cell without a compared partner (attn.rope)" in first["cause"]
    assert celldump_main(["compare", str(tmp_path / "run"), str(tmp_path / "base"), "-o", str(tmp_path / "o")]) == 1
    text = capsys.readouterr().out
    assert "note: its inputs already differ" in text and "not compared in between: Cell.attn.rope" in text


# --- options that would give wrong answers ------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, message",
    [
        ("cosine=nan", "give a finite number"),
        ("cosine=2", "cosine is a similarity between 0 and 1"),
        ("rel_err=-1", "rel_err is an error, 0 or more"),
        ("float8.cosine=0.9", "unknown dtype 'float8'; known: float64, float32, float16, bfloat16"),
    ],
)
def test_thresholds_that_would_change_every_verdict_are_refused(tmp_path, capsys, spec, message):
    write_dump(str(tmp_path / "a"), chain())
    code = celldump_main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "-o", str(tmp_path / "o"),
                          "--threshold", spec])
    assert code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "nan", "0"])
def test_anomalies_refuse_a_magnitude_that_is_not_positive(tmp_path, capsys, value):
    write_dump(str(tmp_path / "a"), chain())
    assert celldump_main(["anomalies", str(tmp_path / "a"), f"--max-abs={value}"]) == 2
    assert "--max-abs" in capsys.readouterr().err


def test_swapped_arguments_are_named(tmp_path, capsys):
    write_dump(str(tmp_path / "ms"), chain())
    write_dump(str(tmp_path / "pt"), chain(), framework="pytorch")
    code = celldump_main(["compare", str(tmp_path / "pt"), str(tmp_path / "ms"), "-o", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and "is a PyTorch dump" in err and f"compare {tmp_path / 'ms'} {tmp_path / 'pt'}" in err


# --- anomalies ----------------------------------------------------------------------------------------


def test_max_abs_leaves_out_token_ids_and_additive_masks(tmp_path, capsys):
    ids = np.array([[1, 50000, 7]])
    mask = np.array([[0.0, -10000.0], [0.0, 0.0]])
    entries = {"Cell.model.Model.forward.0": {"in": [ids], "out": [X], "records": {"input.0": {"dtype": "Int64"}}},
               "Cell.model.attn.Attention.forward.0": {"in": [X, mask], "out": [X]}}
    write_dump(str(tmp_path / "d"), entries, task="statistics")
    assert celldump_main(["anomalies", str(tmp_path / "d"), "--max-abs", "1000"]) == 0
    capsys.readouterr()
    big = dict(entries, **{"Cell.model.attn.Attention.forward.0": {"in": [X, mask], "out": [X * 1e4]}})
    write_dump(str(tmp_path / "e"), big, task="statistics")
    code, result = run_json(capsys, "anomalies", str(tmp_path / "e"), "--max-abs", "1000")
    (slot,) = result["first"][0]["slots"]
    assert code == 1 and (slot["slot"], slot["kind"]) == ("output.0", "large")
    assert result["first"][0]["entry"] == "Cell.model.attn.Attention.forward.0"


@pytest.mark.parametrize("command", ["anomalies", "compare"])
def test_a_closed_pipe_is_not_an_error(tmp_path, command):
    nan = chain()
    nan["Cell.block.fc2.Dense.forward.0"]["out"] = [np.full((2, 2), np.nan)]
    write_dump(str(tmp_path / "d"), nan, task="statistics")
    args = [str(tmp_path / "d")] + ([str(tmp_path / "d"), "-o", str(tmp_path / "o")] if command == "compare" else [])
    proc = subprocess.Popen(
        [sys.executable, "-m", "mf_celldump", command, *args, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=REPO),
    )
    proc.stdout.close()  # the reader goes away before anything is written (`| head` that is done)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == (1 if command == "anomalies" else 0), err
    assert "Broken pipe" not in err and "Traceback" not in err


# --- what the outputs say -----------------------------------------------------------------------------


def test_next_divergent_cells_show_the_statistics_they_rest_on(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), chain(1.0), task="statistics")
    write_dump(str(tmp_path / "b"), chain(1.5), task="statistics")
    code = celldump_main(["compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o", str(tmp_path / "o")])
    text = capsys.readouterr().out
    assert code == 1 and "cosine -" not in text and "rel_err -" not in text
    assert "output.0     DIVERGED stat_rel 0.333 (statistics)" in text


def test_cosine_always_has_six_decimals():
    from mf_celldump.analysis.compare.summary import fmt

    assert fmt(0.98, cosine=True) == "0.980000" and fmt(0.999999123, cosine=True) == "0.999999"
    assert fmt(0.98) == "0.98" and fmt(float("nan")) == "-"


def test_csv_json_and_help_say_what_they_hold(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), chain(1.0))
    write_dump(str(tmp_path / "b"), chain(1.5))
    code, result = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    rows = csv_rows(result["csv"])
    assert {"target_max", "target_min", "target_mean", "target_norm", "baseline_max", "baseline_min",
            "baseline_mean", "baseline_norm", "baseline_transform", "folder", "euc_dist", "one_thousandth_ratio",
            "five_thousandths_ratio", "msprobe_result", "crc_match", "kind", "basis", "score"} <= set(rows[0])
    assert "transform" not in rows[0]
    assert {(r["rank"], r["folder"]) for r in rows} == {("0", "step0/rank")}
    fc2 = next(r for r in rows if r["entry"] == "Cell.block.fc2.Dense.forward.0" and r["slot"] == "output.0")
    assert float(fc2["target_max"]) == pytest.approx(1.5 * float(fc2["baseline_max"]), rel=1e-6)
    assert "not_compared" in result["coverage"] and result["output"] == str(tmp_path / "o")
    with pytest.raises(SystemExit):
        celldump_main(["compare", "--help"])
    assert "(default: ./compare_out)" in capsys.readouterr().out.replace("\n", " ").replace("  ", " ")
    with open(os.path.join(REPO, "docs", "compare.md"), encoding="utf-8") as handle:
        assert "ours records neither" not in handle.read()
