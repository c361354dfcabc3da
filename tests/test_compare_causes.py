"""Causes found across steps come first, alike in the terminal, the JSON and report.html.

Real MindSpore runs of ``tests/support/tp_train.py`` on one process (attention and MLP, SGD,
task tensor, steps 0-2), each against the same run with one key changed:

* the learning rate: step 0 is identical and every weight differs when step 1 starts, so
  the update of step 0 differs, said before the first cell that computes with a changed
  weight;
* the batch of step 1: the model's inputs differ at step 1, so the data differ, not "code
  between cells".

Graph and PyNative mode, each against its own baseline run (six runs, started together).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mf_celldump.cli import main as celldump_main
from tests.support.chromium import Browser, find_chromium
from tests.support.compare_dumps import X, write_dump

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "tp_train.py")
MODES = ("graph", "pynative")
CHANGES = {"": [], "_lr": ["--lr", "0.003"], "_batch": ["--other-batch", "1"]}
RUNS = {mode + name: (mode, extra) for mode in MODES for name, extra in CHANGES.items()}  # name: (mode, arguments)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("causes")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = {name: subprocess.Popen([sys.executable, SCRIPT, "--mode", mode, "--dump-path", str(root / name),
                                     "--dump", "task=tensor", *extra], cwd=root, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for name, (mode, extra) in RUNS.items()}
    for name, proc in procs.items():
        output = proc.communicate(timeout=900)[0]
        assert proc.returncode == 0, f"{name}: {output[-3000:]}"
    return root


def _page_data(html_path):
    with open(html_path, encoding="utf-8") as handle:
        page = handle.read()
    return json.loads(page.split('<script id="report-data" type="application/json">', 1)[1].split("</script>", 1)[0])


def compare(target, baseline, out):
    """The JSON result and the terminal text of one comparison, with the exit codes of both."""
    argv = [sys.executable, "-m", "mf_celldump", "compare", str(target), str(baseline)]
    as_json = subprocess.run([*argv, "-o", str(out / "json"), "--json"], capture_output=True, text=True, timeout=600)
    as_text = subprocess.run([*argv, "-o", str(out / "text")], capture_output=True, text=True, timeout=600)
    assert as_json.returncode == as_text.returncode, as_text.stderr
    return as_json.returncode, json.loads(as_json.stdout), as_text.stdout


def _said_alike(result, text):
    """The terminal's line, the JSON's headline and report.html's data and banner (drawn by headless Chromium
    where it is installed) are one text."""
    headline = result["headline"]
    assert headline in text.splitlines(), text
    assert _page_data(result["html"])["headline"] == headline
    if find_chromium():
        with Browser() as browser:
            page = browser.open("file://" + result["html"])
            assert headline in page.evaluate("document.getElementById('verdict').textContent")
            if result["first_divergence"]["cause"]:
                assert page.evaluate("document.getElementById('cause').textContent") == \
                    result["first_divergence"]["cause"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_a_learning_rate_change_names_the_update_of_step_0_first(runs, tmp_path, mode):
    code, result, text = compare(runs / f"{mode}_lr", runs / mode, tmp_path)
    assert code == 1
    step0 = next(u for u in result["units"] if u["step"] == 0)
    assert step0["diverged"] == 0 and step0["ok"] == step0["tensors"]  # step 0 identical
    headline = result["headline"]
    assert headline.startswith("THE UPDATE OF STEP 0 DIFFERS: every compared value of step 0 agrees and "), headline
    assert "weights differ at the start of step 1: look at the optimizer (its settings, its state), the " \
           "learning-rate schedule, the loss scale; FIRST DIVERGENCE (forward, step 1 rank 0): " in headline
    assert result["weight_timing"]["update_of"] == 0 and result["weight_timing"]["differ"][0] == 1
    first = result["first_divergence"]
    # the first cell of the forward pass that computes with a changed weight, on inputs that agree
    assert (first["step"], first["direction"], first["cell"]) == (1, "forward", "attention.q")
    assert first["weights_differ"] == ["param.weight", "param.bias"] and not first["inputs_differ"]
    assert "computes with weights that differ at the start of step 1" in first["cause"]
    assert "code between cells" not in text and not first["data_differ"]
    _said_alike(result, text)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_another_batch_at_step_1_says_the_data_differ(runs, tmp_path, mode):
    code, result, text = compare(runs / f"{mode}_batch", runs / mode, tmp_path)
    assert code == 1
    headline = result["headline"]
    assert headline.startswith("DATA DIFFER at step 1: the model's inputs differ (another batch, another shuffle"), \
        headline
    assert "FIRST DIVERGENCE (forward, step 1 rank 0): Cell.attention.q." in headline
    assert "THE UPDATE OF" not in headline and result["weight_timing"]["update_of"] is None
    first = result["first_divergence"]
    assert first["data_differ"] and first["inputs_differ"] and first["step"] == 1
    assert "the data differ" in first["cause"] and "code between cells" not in first["cause"]
    assert "code between cells" not in text and "last cell within thresholds before it" not in text
    _said_alike(result, text)


def _two_cells(w1_scale=1.0, fc2_input_scale=1.0):
    """fc1 then fc2 in one forward pass; fc1's weight scaled with its output left as the baseline's (the
    difference below its output's thresholds), fc2's input (fc1's output as fc2 receives it) scaled."""
    w1, w2 = np.linspace(-1.0, 1.0, 16).reshape(4, 4), np.linspace(0.5, -0.5, 12).reshape(3, 4)
    y = X @ w1.T
    return {
        "Cell.fc1.Dense.forward.0": {"in": [X], "out": [y], "params": {"weight": w1 * w1_scale}},
        "Cell.fc2.Dense.forward.0": {"in": [y * fc2_input_scale], "out": [y * fc2_input_scale @ w2.T],
                                     "params": {"weight": w2}},
    }


def test_a_cell_whose_inputs_differ_after_a_changed_weight_points_to_the_weight(tmp_path, capsys):
    """Dumps written by hand: fc2's inputs differ and fc1, before it, computes with a weight that differs; fc1
    is the first divergence, not "code between cells" before fc2."""
    write_dump(str(tmp_path / "a"), _two_cells())
    write_dump(str(tmp_path / "b"), _two_cells(w1_scale=1.05, fc2_input_scale=1.05))
    code = celldump_main(["compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o", str(tmp_path / "o"), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1
    first = result["first_divergence"]
    assert first["cell"] == "fc1" and first["weights_differ"] == ["param.weight"], first
    assert "computes with weights that differ" in first["cause"] and "code between cells" not in first["cause"]
    assert result["headline"].startswith("FIRST DIVERGENCE (forward, step 0 rank 0): Cell.fc1."), result["headline"]
