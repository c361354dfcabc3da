"""Cell health: the watch reads each selected cell's values inside the step and names the first bad cell.

Training runs (``tests/support/health_train.py``, real MindSpore on CPU) go in subprocesses, one per mode:
a cell that multiplies its output by NaN, followed by a ReLU that turns the NaN into 0, under a training
step that zeroes non-finite gradients and returns only the loss (nothing the step returns shows it); the
same NaN for one step only in a plain loop that nothing can rerun; a spike in one cell; a weight whose
gradient alone is infinite. Both routes: a plain ``attach()`` loop and ``Model.train`` with the callback;
both modes, graph mode's record equal to PyNative's.
The rules themselves and the configuration are checked in process with plain numbers.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest

from mf_celldump.config import DumpConfig
from mf_celldump.errors import AttachError, ConfigError
from mf_celldump.watch import CellReading, Watch, WatchRules, first_in_order

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "health_train.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULT_STEP = 5
SPIKE_STEP = 9  # the last step: the spike's aftermath (large updates) does not muddle what follows
NO_CAPTURE = "100"  # a step the 10-step runs never reach: nothing is captured
MODES = ["pynative", "graph"]


def _train(tmp_path, mode, route, scenario, steps=NO_CAPTURE, data_mode="all", fault_step=FAULT_STEP):
    dump = tmp_path / f"{route}-{scenario}-{mode}-{steps}"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, DRIVER, mode, route, scenario, str(dump), steps, data_mode,
                           str(fault_step)], cwd=tmp_path, env=env, timeout=300, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for line in proc.stdout.splitlines():
        if line.startswith("REFUSED "):
            return {"refused": line[len("REFUSED "):]}, proc.stdout, dump
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(result[-1][len("RESULT "):]), proc.stdout, dump


def _rows(dump):
    with open(dump / "health" / "rank0.csv", encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _first_firing(result, rule):
    return next(f for f in result["firings"] if f"rule {rule} fired" in f)


# -- training runs, both modes ------------------------------------------------------------------------------
@pytest.mark.parametrize("steps", [NO_CAPTURE, "0-9"])
@pytest.mark.parametrize("mode", MODES)
def test_a_silent_nan_is_named_by_cell_at_its_first_step_with_and_without_capture(tmp_path, mode, steps):
    result, _, dump = _train(tmp_path, mode, "attach", "silent", steps)
    assert all(math.isfinite(loss) for loss in result["losses"])  # nothing the step returns shows it
    first = result["firings"][0]
    assert first.startswith(f"mf_celldump watch: step {FAULT_STEP} rank 0: rule nan_inf_cell fired (cell "
                            "net.faulty, forward output 0")
    assert result["captured"] == ([] if steps == NO_CAPTURE else list(range(10)))
    rows = _rows(dump)
    bad = [r for r in rows if int(r["nan"]) or int(r["inf"])]
    assert min(int(r["step"]) for r in bad) == FAULT_STEP
    assert {r["cell"] for r in bad if r["direction"] == "forward"} == {"net.faulty"}  # the ReLU after it hides it
    assert {int(r["step"]) for r in rows} == set(range(10))
    assert all(r["norm"] for r in rows)  # cell_norm: true


@pytest.mark.parametrize("mode", MODES)
def test_the_callback_route_captures_the_step_after_a_cell_fires_and_keeps_the_health_record(tmp_path, mode):
    result, _, dump = _train(tmp_path, mode, "callback", "silent", "anomaly")
    assert _first_firing(result, "nan_inf_cell").startswith(
        f"mf_celldump watch: step {FAULT_STEP} rank 0: rule nan_inf_cell fired (cell net.faulty, forward")
    assert result["captured"] == [FAULT_STEP + 1] and result["processed"] == [FAULT_STEP + 1]
    with open(dump / f"step{FAULT_STEP + 1}" / "rank" / "dump.json", encoding="utf-8") as handle:
        head = json.load(handle)["mf_celldump_watch"]
    assert head == {"rule": "nan_inf_cell", "fired_at_step": FAULT_STEP, "capture": "next_step",
                    "cell": "net.faulty", "direction": "forward"}
    assert any(f"first: step {FAULT_STEP} rank 0 rule nan_inf_cell cell net.faulty forward" in n
               for n in result["notes"])
    assert any("cell health of this rank in" in n for n in result["notes"])


@pytest.mark.parametrize("mode", MODES)
def test_a_one_step_fault_that_nothing_can_rerun_is_still_named_by_cell_and_step(tmp_path, mode):
    result, _, dump = _train(tmp_path, mode, "attach", "transient", "anomaly")
    assert len(result["firings"]) == 1 and f"step {FAULT_STEP} rank 0" in result["firings"][0]
    assert result["captured"] == [FAULT_STEP + 1]  # the step after it: clean again
    bad = {(int(r["step"]), r["cell"]) for r in _rows(dump) if int(r["nan"]) and r["direction"] == "forward"}
    assert (FAULT_STEP, "net.faulty") in bad and all(step == FAULT_STEP for step, _ in bad)


@pytest.mark.parametrize("mode", MODES)
def test_a_spike_in_one_cell_fires_against_its_own_window(tmp_path, mode):
    result, _, _ = _train(tmp_path, mode, "attach", "spike", fault_step=SPIKE_STEP)
    assert len(result["firings"]) == 1
    assert result["firings"][0].startswith(f"mf_celldump watch: step {SPIKE_STEP} rank 0: rule cell_spike fired "
                                           "(cell net.faulty, forward output 0")


@pytest.mark.parametrize("mode", MODES)
def test_a_bad_weight_gradient_names_its_cell_in_the_backward(tmp_path, mode):
    result, _, dump = _train(tmp_path, mode, "attach", "weight_grad")
    assert result["firings"][0].startswith(f"mf_celldump watch: step {FAULT_STEP} rank 0: rule nan_inf_cell fired "
                                           "(cell net.scale, backward weight_grad 0")
    bad = [r for r in _rows(dump) if int(r["inf"]) or int(r["nan"])]
    assert {(r["cell"], r["kind"]) for r in bad if int(r["step"]) == FAULT_STEP} == {("net.scale", "weight_grad")}


@pytest.mark.parametrize("mode", MODES)
def test_forward_only_health_reads_no_gradient_and_each_call_has_its_rows(tmp_path, mode):
    result, _, dump = _train(tmp_path, mode, "attach", "twice", data_mode="forward")
    assert result["firings"] == []
    rows = _rows(dump)
    assert {r["kind"] for r in rows} == {"weight", "output"}
    relu = [(int(r["step"]), r["call"]) for r in rows if r["cell"] == "net.relu"]
    if mode == "pynative":  # each call its own rows (micro-batches are calls)
        assert relu == [(step, call) for step in range(10) for call in ("0", "1")]
    else:  # one compiled construct: the calls of a step fold into one row
        assert relu == [(step, "-1") for step in range(10)]


def test_graph_mode_health_equals_pynative_health(tmp_path):
    _, _, pynative = _train(tmp_path, "pynative", "attach", "clean")
    _, _, graph = _train(tmp_path, "graph", "attach", "clean")

    def values(dump):
        return {(r["step"], r["direction"], r["cell"], r["kind"], r["index"]): (r["nan"], r["inf"], float(r["max_abs"]))
                for r in _rows(dump)}

    expected, got = values(pynative), values(graph)
    assert got.keys() == expected.keys()
    for key, (nan, inf, largest) in expected.items():
        assert got[key][:2] == (nan, inf) and got[key][2] == pytest.approx(largest, rel=1e-5), key


# -- refusals and rules, in process ---------------------------------------------------------------------------
def test_a_plain_attach_with_a_watch_that_can_see_nothing_is_refused_with_the_way_out(tmp_path):
    from mindspore import nn

    import mf_celldump

    with pytest.raises(AttachError, match=r"plain attach\(\) receives no step signals.*watch: \{cells: true\}"):
        mf_celldump.attach(nn.Dense(2, 2), {"dump_path": str(tmp_path / "d"), "watch": True})
    with pytest.raises(AttachError, match="receives no step signals"):
        mf_celldump.attach(nn.Dense(2, 2), {"dump_path": str(tmp_path / "d"), "steps": "anomaly",
                                            "watch": {"loss_spike": 5}})
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("watch, message", [
    ({"cell": True}, r"unknown rule 'cell' \(did you mean 'cells'\?\)"),
    ({"cells_every": 5}, r"watch.cells_every: only means something with cell health on; add watch.cells: true"),
    ({"cells": True, "cells_every": 0}, r"watch.cells_every: invalid value 0; valid: an integer from 1 to"),
    ({"cells": True, "cells_every": True}, r"watch.cells_every: invalid value True"),
    ({"cells": True, "health_max_bytes": -1}, r"watch.health_max_bytes: invalid value -1; valid: an integer >= 0"),
    ({"cells": True, "cell_spike": 0.5}, r"watch.cell_spike: invalid value 0.5; valid: a factor > 1"),
    ({"cells": "yes"}, r"watch.cells: invalid value 'yes'; valid: true or false"),
])
def test_cell_keys_are_validated_with_clear_errors(watch, message):
    with pytest.raises(ConfigError, match=message):
        DumpConfig.from_dict({"watch": watch})


def test_cell_rules_alone_keep_a_watch_alive_and_cells_every_selects_steps():
    rules = WatchRules.parse({"cells": True, "cells_every": 3, "nan_inf_loss": False, "nan_inf_grad_norm": False,
                              "overflow": False, "loss_spike": False, "grad_norm_spike": False})
    assert rules.active_rules() == ["nan_inf_cell", "cell_spike"]
    assert [s for s in range(10) if rules.health_step(s)] == [0, 3, 6, 9]
    with pytest.raises(ConfigError, match="every rule is off"):
        WatchRules.parse({"nan_inf_loss": False, "nan_inf_grad_norm": False, "overflow": False, "loss_spike": False,
                          "grad_norm_spike": False})  # the cell rules are on by default, but see nothing without cells


def _reading(order, direction, cell, nan=0, max_abs=1.0, kind="output"):
    return CellReading(order, direction, cell, kind, 0, 0, nan, 0, max_abs)


def test_the_first_bad_cell_is_forward_before_backward_and_the_innermost_of_a_parent():
    readings = [_reading(0, "backward", "net.a", nan=1), _reading(1, "forward", "net.b", nan=2),
                _reading(2, "forward", "net.b.inner", nan=2), _reading(3, "forward", "net.c", nan=1)]
    assert first_in_order((r.direction, r.cell, r) for r in readings if r.bad).cell == "net.b.inner"
    fired = Watch(WatchRules(cells=True)).check_cells(4, readings)
    assert [(f.rule, f.cell, f.direction) for f in fired] == [("nan_inf_cell", "net.b.inner", "forward")]
    assert math.isnan(fired[0].value)


def test_a_cell_spike_needs_its_own_history_and_weights_do_not_spike():
    watch = Watch(WatchRules(cells=True, cell_spike=4.0))
    for step in range(5):
        assert watch.check_cells(step, [_reading(0, "forward", "net.a"), _reading(1, "forward", "net.b", max_abs=9.0),
                                        _reading(2, "forward", "net.w", kind="weight")]) == []
    fired = watch.check_cells(5, [_reading(0, "forward", "net.a", max_abs=5.0),
                                  _reading(1, "forward", "net.b", max_abs=30.0),
                                  _reading(2, "forward", "net.w", max_abs=100.0, kind="weight")])
    assert [(f.rule, f.cell, f.value, f.reference) for f in fired] == [("cell_spike", "net.a", 5.0, 1.0)]
