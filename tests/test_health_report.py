"""``mf-celldump health``: the first bad cell per rank and step of a run's cell health, and its heat map page.

One real PyNative training run (``tests/support/health_train.py``: a cell whose output turns NaN at step 5
under a ReLU that hides it, through ``Model.train`` and the callback, every step captured and processed)
gives the health record; the command must name the cell ``mf-celldump anomalies`` names in the processed dump
(one reading of "first bad cell"), and its page must render in headless Chromium. Files written by hand check
a cut last line, a bad row, the disk cap and the merge of steps into columns.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from argparse import Namespace

import pytest

from mf_celldump.analysis.anomalies import MAX_COLUMNS, HeatMap, scan, scan_health
from mf_celldump.capture.health import COLUMNS, CellHealth
from mf_celldump.cli.health import run_health
from mf_celldump.config import IndexSelection
from mf_celldump.watch import CellReading, WatchRules
from tests.support.chromium import Browser, needs_chromium

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "health_train.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULT_STEP = 5


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A processed dump of every step with its health record (PyNative, the callback route)."""
    dump = tmp_path_factory.mktemp("health") / "dump"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, DRIVER, "pynative", "callback", "silent", str(dump), "0-9", "all",
                           str(FAULT_STEP)], env=env, timeout=300, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return dump


def _run(path, *extra):
    args = Namespace(dump=str(path), html=None, steps="all", ranks="all", json=False)
    for key, value in extra:
        setattr(args, key, value)
    out = io.StringIO()
    return run_health(args, out), out.getvalue()


def test_health_names_the_cell_that_anomalies_names_in_the_captured_dump(trained):
    code, text = _run(trained, ("json", True))
    result = json.loads(text)
    assert code == 1
    first = result["first"][0]
    assert (first["step"], first["rank"], first["direction"], first["cell"], first["kind"]) == \
        (FAULT_STEP, 0, "forward", "net.faulty", "output")
    assert [b["step"] for b in result["first_per_step"]] == list(range(FAULT_STEP, 10))
    found = scan(str(trained), IndexSelection(), IndexSelection(), None)["first"]
    assert [(f.step, f.direction, f.cell) for f in found] == [(FAULT_STEP, "forward", "net.faulty")]


def test_health_prints_one_line_per_rank_and_step_and_the_first_across_ranks(trained):
    code, text = _run(trained, ("html", "-"))
    assert code == 1
    assert f"first bad cell: step {FAULT_STEP} rank 0: forward net.faulty output 0 (call 0): 32 NaN, 0 Inf" in text
    assert f"FIRST BAD CELL across ranks: step {FAULT_STEP} rank 0: forward net.faulty" in text
    code, text = _run(trained, ("steps", "0-4"), ("html", "-"))
    assert code == 0 and "no cell held a NaN or an Inf" in text


@needs_chromium
def test_the_heat_map_page_renders_with_the_bad_cell_in_red(trained, tmp_path):
    page_path = tmp_path / "page.html"
    code, _ = _run(trained, ("html", str(page_path)))
    assert code == 1 and oct(page_path.stat().st_mode & 0o777) == "0o640"
    with Browser() as browser:
        page = browser.open("file://" + str(page_path))
        assert page.evaluate("document.title") == "mf_celldump cell health"
        bad = page.evaluate("Array.from(document.querySelectorAll('tr[data-cell] td.bad')).map("
                            "td => td.parentElement.dataset.cell + '@' + td.dataset.step)")
        assert f"net.faulty@{FAULT_STEP}" in bad
        assert min(int(b.split("@")[1]) for b in bad) == FAULT_STEP
        color = page.evaluate("getComputedStyle(document.querySelector('td.bad')).backgroundColor")
        assert color == "rgb(214, 39, 40)"
        rows = page.evaluate("document.querySelectorAll('tr[data-cell]').length")
        lines = (trained / "health" / "rank0.csv").read_text(encoding="utf-8").splitlines()
        assert rows == len({line.split(",")[4] for line in lines[1:]})
        assert page.evaluate("document.querySelectorAll('script, link, img').length") == 0  # self-contained
        assert "net.faulty" in page.evaluate("document.getElementById('first').textContent")
        assert page.errors == []


def _write(path, lines, end="\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([",".join(COLUMNS)] + lines) + end, encoding="utf-8")


def test_a_cut_last_line_and_a_bad_row_are_skipped_and_the_bad_row_is_named(tmp_path):
    rows = ["3,1,0,forward,net.a,output,0,0,0,0,1.0,", "3,1,1,forward,net.b,output,0,0,x,0,1.0,",
            "4,1,0,forward,net.a,output,0,0,2,0,1.0,", "5,1,0,forward,net.a,output,0,0,7,0,1"]
    _write(tmp_path / "health" / "rank1.csv", rows, end="")  # the last row lost its end in a crash
    result = scan_health(str(tmp_path), IndexSelection(), IndexSelection())
    assert [(b.step, b.cell, b.nan) for b in result.first_per_step] == [(4, "net.a", 2)]
    assert len(result.problems) == 1 and "rank1.csv:3: row skipped" in result.problems[0]


def test_not_a_health_folder_is_bad_input_naming_the_way_to_make_one(tmp_path):
    code, _ = _run(tmp_path)
    assert code == 2
    (tmp_path / "health").mkdir()
    (tmp_path / "health" / "rank0.csv").write_text("a,b\n1,2\n")
    code, _ = _run(tmp_path)
    assert code == 2


def test_the_heat_map_keeps_a_bounded_number_of_columns():
    heat = HeatMap()
    for step in range(10 * MAX_COLUMNS):
        heat.add(step, CellReading(0, "forward", "net.a", "output", 0, 0, int(step == 1234), 0, float(step)))
    columns = {c for _, c in heat.values}
    assert len(columns) <= MAX_COLUMNS and heat.width == 16
    assert heat.values[("net.a", 1234 // 16)][0] == 1


def test_the_health_file_stops_at_its_cap_with_one_warning(tmp_path, caplog):
    path = str(tmp_path / "health" / "rank0.csv")
    health = CellHealth(WatchRules(cells=True, health_max_bytes=400), [], False, path)
    readings = [CellReading(i, "forward", "net.a", "output", 0, 0, 0, 0, 1.0) for i in range(3)]
    for step in range(10):
        health._append(step, readings)
    size = os.path.getsize(path)
    assert 0 < size <= 400
    assert sum("reached health_max_bytes=400" in r.getMessage() for r in caplog.records) == 1
    assert oct(os.stat(path).st_mode & 0o777) == "0o640"
