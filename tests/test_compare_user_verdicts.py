"""Verdicts in the user's terms: a common factor is named as one, weight lines name their step, and the
verdict says what differs (weights, weight gradients or activations) alike in the terminal, the JSON and
report.html.
"""

from __future__ import annotations

import json

import numpy as np

from mf_celldump.cli import main as celldump_main
from tests.support.chromium import Browser, find_chromium
from tests.support.compare_dumps import X, write_dump

CLIP = 0.4827
W = {name: np.linspace(-1.0, 1.0, 12).reshape(3, 4) * k for name, k in (("fc1", 1.0), ("fc2", -0.7), ("fc3", 0.3))}


def _net(grad_scale=None, weight_scale=None, backward_scale=1.0):
    """Three Dense cells with their weights and weight gradients; ``grad_scale``/``weight_scale`` map a cell to
    the factor of its weight gradient / weight; ``backward_scale`` multiplies every backward tensor."""
    out = {}
    for name, w in W.items():
        y = X @ w.T
        out[f"Cell.{name}.Dense.forward.0"] = {"in": [X], "out": [y],
                                               "params": {"weight": w * (weight_scale or {}).get(name, 1.0)}}
        out[f"Cell.{name}.Dense.backward.0"] = {"in": [y * backward_scale], "out": [X * 0.3 * backward_scale]}
        out[f"Cell.{name}.Dense.parameters_grad.0"] = {
            "grads": {"weight": np.cos(w * 7.0) * 0.1 * (grad_scale or {}).get(name, 1.0)}}
    return out


def _compare(capsys, tmp_path, *extra):
    code = celldump_main(["compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o", str(tmp_path / "o"),
                          "--json", *extra])
    result = json.loads(capsys.readouterr().out)
    celldump_main(["compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o", str(tmp_path / "t"), *extra])
    text = capsys.readouterr().out
    return code, result, text


def _page_data(html_path):
    with open(html_path, encoding="utf-8") as handle:
        page = handle.read()
    return json.loads(page.split('<script id="report-data" type="application/json">', 1)[1].split("</script>", 1)[0])


def test_weight_gradients_that_differ_by_one_factor_are_named_with_their_own_exit_code(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), _net())
    write_dump(str(tmp_path / "b"), _net(grad_scale={name: CLIP for name in W}))
    code, result, text = _compare(capsys, tmp_path)
    said = ("weight gradients differ by one factor 0.483 (gradient clipping, a loss scale, or a sum taken for a "
            "mean): 3 of 3 compared")
    assert code == 4 and result["exit_code"] == 4 and result["verdict"] == "common factor"
    assert result["headline"].startswith("COMMON FACTOR: " + said), result["headline"]
    assert "every compared activation and weight is within thresholds" in result["headline"]
    assert said in text and "WEIGHT GRADIENTS DIFFER" not in text
    (factor,) = result["common_factors"]
    assert factor["kind"] == "weight_grad" and abs(factor["factor"] - CLIP) < 1e-6
    assert _page_data(result["html"])["headline"] == result["headline"]


def test_one_gradient_scaled_alone_is_no_common_factor(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), _net())
    write_dump(str(tmp_path / "b"), _net(grad_scale={"fc1": CLIP, "fc2": CLIP}))
    code, result, text = _compare(capsys, tmp_path)
    assert code == 1 and result["verdict"] == "diverged" and not result["common_factors"]
    assert result["headline"].startswith("WEIGHT GRADIENTS DIFFER: 2 of 3 (step 0: 2 of 3 differ)")
    assert "every compared activation and weight is within thresholds" in result["headline"]


def test_a_loss_scale_on_the_backward_pass_is_a_common_factor_not_a_first_divergence(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), _net())
    write_dump(str(tmp_path / "b"), _net(grad_scale={name: 1024.0 for name in W}, backward_scale=1024.0))
    code, result, _ = _compare(capsys, tmp_path)
    assert code == 4, result["headline"]
    assert "backward activations differ by one factor 1.02e+03" in result["headline"]
    assert "weight gradients differ by one factor 1.02e+03" in result["headline"]


def test_only_weight_gradients_differ_and_the_verdict_says_so_everywhere(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), _net())
    rng = np.random.default_rng(1)
    noisy = _net()
    for name in W:
        grads = noisy[f"Cell.{name}.Dense.parameters_grad.0"]["grads"]
        grads["weight"] = grads["weight"] + rng.standard_normal(grads["weight"].shape) * 0.05
    write_dump(str(tmp_path / "b"), noisy)
    code, result, text = _compare(capsys, tmp_path)
    assert code == 1 and result["first_divergence"] is None
    for said in (result["headline"], _page_data(result["html"])["headline"], text):
        assert "WEIGHT GRADIENTS DIFFER: 3 of 3" in said and "WEIGHTS DIFFER" not in said
    assert "weights: 3 compared, all within thresholds" in text
    if find_chromium():
        with Browser() as browser:
            page = browser.open("file://" + result["html"])
            banner = page.evaluate("document.getElementById('verdict').textContent")
    else:
        banner = _page_data(result["html"])["headline"]
    assert "WEIGHT GRADIENTS DIFFER" in banner and "WEIGHTS DIFFER" not in banner


def test_weights_that_differ_only_after_the_optimizer_name_their_steps(tmp_path, capsys):
    for step in range(3):
        write_dump(str(tmp_path / "a"), _net(), step=step)
        later = {name: 1.0 + 0.01 * step for name in W} if step else None
        write_dump(str(tmp_path / "b"), _net(grad_scale={"fc1": 1.5}, weight_scale=later), step=step)
    code, result, text = _compare(capsys, tmp_path)
    assert code == 1
    line = next(x for x in text.splitlines() if x.startswith("WEIGHTS DIFFER"))
    assert line.startswith("WEIGHTS DIFFER only after the optimizer has run on diverged gradients: 6 of 9 at "
                           "steps 1-2; at step 0 all 3 agree"), line
    assert "first fc1 param.weight (step 1;" in line
    timing = result["weight_timing"]
    assert timing["after_optimizer"] and timing["differ"] == [1, 2] and timing["gradients_differ_before"]
    assert "WEIGHTS DIFFER only after the optimizer" in result["headline"]
