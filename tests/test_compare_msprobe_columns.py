"""msprobe's columns and verdict beside ours, checked against the real ``msprobe compare`` (26.2).

The same pair of dumps goes through ``mf-celldump compare`` and ``msprobe compare``; for
every row msprobe reports, our CSV must hold the same Cosine, EucDist, MaxAbsErr, One
Thousandth and Five Thousandths Err Ratio (tensor task) and the same ``Result``
(``msprobe_result``), in the tensor, statistics and md5 (statistics with CRC-32) modes.
The dumps are made so that each of msprobe's rules fires somewhere: equal inputs with a
scaled output (one-thousandth rule, error), a permuted output (cosine rule, warning), a
Norm that moves by 60% (statistics error) or by 20% (statistics warning), a
different CRC-32 (md5 error), and rows that pass.
"""

from __future__ import annotations

import csv
import glob
import json

import numpy as np
import pytest

from mf_celldump.cli import main as celldump_main
from tests.support.compare_dumps import X, write_dump
from tests.support.msprobe_cli import run_msprobe

pytestmark = pytest.mark.slow
W = np.random.default_rng(1).standard_normal((3, 4))
Y = X @ W.T


def _net(changed: bool):
    noise = np.random.default_rng(2).standard_normal(Y.shape) * 1e-3 if changed else 0.0
    return {
        "Cell.a.Dense.forward.0": {"in": [X], "out": [Y + noise], "params": {"weight": W * (1.001 if changed else 1)}},
        "Cell.b.Dense.forward.0": {"in": [Y], "out": [np.flip(Y, -1) if changed else Y]},  # cosine drops
        "Cell.c.Dense.forward.0": {"in": [Y], "out": [Y * (1.6 if changed else 1.0)]},  # every element off by 60%
        "Cell.d.Dense.forward.0": {"in": [Y], "out": [Y * (1.2 if changed else 1.0)]},  # Norm +20%
        "Cell.a.Dense.backward.0": {"in": [Y], "out": [X]},
        "Cell.a.Dense.parameters_grad.0": {"grads": {"weight": W * 0.1 * (1.001 if changed else 1)}},
    }


def _msprobe_name(row) -> str:
    """msprobe's NPU Name of one of our rows."""
    head, _, name = row["slot"].partition(".")
    if row["kind"] == "weight_grad":
        return f"{row['entry']}.{name}"
    return f"{row['entry']}.parameters.{name}" if head == "param" else f"{row['entry']}.{row['slot']}"


def _both(tmp_path, capsys, task, md5=False):
    write_dump(str(tmp_path / "base"), _net(False), task=task, md5=md5)
    write_dump(str(tmp_path / "run"), _net(True), task=task, md5=md5)
    celldump_main(["compare", str(tmp_path / "run"), str(tmp_path / "base"), "-o", str(tmp_path / "ours"), "--json"])
    result = json.loads(capsys.readouterr().out)
    with open(result["csv"], newline="") as handle:
        ours = {_msprobe_name(r): r for r in csv.DictReader(handle)}
    run_msprobe("compare", "-tp", str(tmp_path / "run" / "step0"), "-gp", str(tmp_path / "base" / "step0"),
                "-o", str(tmp_path / "msprobe"))
    (path,) = glob.glob(str(tmp_path / "msprobe" / "compare_result_*.csv"))
    with open(path, newline="") as handle:
        theirs = list(csv.DictReader(handle))
    assert theirs and all(row["NPU Name"] in ours for row in theirs), sorted(ours)
    for row in theirs:  # msprobe's verdict, row by row
        mine = ours[row["NPU Name"]]
        assert mine["msprobe_result"] == row["Result"], (row["NPU Name"], mine["msprobe_message"], row["Err_message"])
    return ours, theirs, result


_NUMBERS = {
    "Cosine": "cosine",
    "EucDist": "euc_dist",
    "MaxAbsErr": "max_abs_err",
    "One Thousandth Err Ratio": "one_thousandth_ratio",
    "Five Thousandths Err Ratio": "five_thousandths_ratio",
}


def test_tensor_columns_and_verdicts_match_msprobe(tmp_path, capsys):
    ours, theirs, _ = _both(tmp_path, capsys, "tensor")
    for row in theirs:
        mine = ours[row["NPU Name"]]
        for column, key in _NUMBERS.items():
            assert float(mine[key]) == pytest.approx(float(row[column]), rel=1e-5, abs=1e-9), (row["NPU Name"], column)
    results = {row["NPU Name"]: row["Result"] for row in theirs}
    assert results["Cell.b.Dense.forward.0.output.0"] == "warning"
    assert results["Cell.c.Dense.forward.0.output.0"] == "error"
    assert results["Cell.a.Dense.forward.0.output.0"] == "pass"


def test_statistics_verdicts_match_msprobe(tmp_path, capsys):
    _, theirs, _ = _both(tmp_path, capsys, "statistics")
    results = {row["NPU Name"]: row["Result"] for row in theirs}
    assert results["Cell.d.Dense.forward.0.output.0"] == "warning"
    assert results["Cell.c.Dense.forward.0.output.0"] == "error"
    assert results["Cell.a.Dense.forward.0.output.0"] == "pass"


def test_crc_compare_and_md5_verdicts_match_msprobe(tmp_path, capsys):
    ours, theirs, result = _both(tmp_path, capsys, "statistics", md5=True)
    for row in theirs:
        mine = ours[row["NPU Name"]]
        assert mine["crc_match"] == ("yes" if row["NPU MD5"] == row["BENCH MD5"] else "no")
    assert {row["Result"] for row in theirs} == {"pass", "error"}
    same = sum(1 for row in theirs if row["NPU MD5"] == row["BENCH MD5"])
    assert result["crc"]["identical"] == same and result["crc"]["different"] == len(theirs) - same
    assert result["crc"]["first_different"] == "Cell.a.Dense.forward.0 param.weight"
