"""statistic.csv as an NPU may write it where the emulation writes one form only (docs/ascend-emulation.md).

The emulation writes one graph folder (``0``), no row for TensorDump's file-name input
(slot 0) and statistic values as Python's ``repr`` of a float32; MindSpore's sources
leave the graph id to the compiled graph, the slot-0 row unsettled and the number format
to ``Tensor::DataToString``. Processing must read every such variant the same, and tell
other TensorDump users' rows from its own.
"""

from __future__ import annotations

import numpy as np
import pytest

from mf_celldump.processing.driver import process_dump
from tests.support import formats as fmt
from tests.support.rawdump_builder import RawDumpBuilder, kbk_rows, numpy_stats, read_output

F, A, OUT = fmt.FORWARD, "a", "o"
X = np.array([[0.5, -1.25, 3.0], [2.0, 0.0, -0.001]], np.float32)
Y = np.array([1.5, -2.5], np.float32)


def _builder(dump):
    builder = RawDumpBuilder(dump, task="statistics", backend="kbk_statistics")
    cell = builder.cell("net.fc", "Dense", ("x",))
    builder.write_manifest()
    return builder, fmt.Key(cell, F, A, fmt.KIND_TENSOR, (0,), None), fmt.Key(cell, F, OUT, fmt.KIND_TENSOR, (0,), None)


def _entry(dump, step=0):
    return read_output(dump, step)["dump"]["data"]["Cell.net.fc.Dense.forward.0"]


def _assert_stats(leaf, array):
    want = numpy_stats(array)
    for stat in ("Max", "Min", "Mean", "Norm"):
        assert leaf[stat] == pytest.approx(want[stat], rel=1e-6, abs=1e-7), stat


def test_rows_of_one_iteration_in_several_graph_folders_make_one_step(tmp_path):
    """DMU GenerateDumpPath puts the root graph id in the path; the emulation always writes graph 0."""
    dump = str(tmp_path / "d")
    builder, kin, kout = _builder(dump)
    builder.kbk_csv(0, kbk_rows(kin, X, timestamp=10), graph="0")
    builder.kbk_csv(0, kbk_rows(kout, Y, timestamp=20), graph="3")
    report = process_dump(dump, jobs=1)
    assert report.ok, report.summary()
    entry = _entry(dump)
    _assert_stats(entry["input_args"][0], X)
    _assert_stats(entry["output"][0], Y)


@pytest.mark.parametrize("slot0", ["with", "without"])
def test_the_file_name_row_changes_nothing(tmp_path, slot0):
    """Whether MindSpore writes a row for TensorDump's string input (slot 0) is not settled from source."""
    dump = str(tmp_path / "d")
    builder, kin, kout = _builder(dump)
    rows = kbk_rows(kin, X, timestamp=10) + kbk_rows(kout, Y, timestamp=20)
    if slot0 == "without":
        rows = [r for r in rows if r["Slot"] != 0]
    builder.kbk_csv(0, rows)
    report = process_dump(dump, jobs=1)
    assert report.ok and not [w for o in report.outcomes for w in o.warnings], report.summary()
    _assert_stats(_entry(dump)["input_args"][0], X)


FORMATS = {
    "repr": repr,
    "fixed": lambda v: f"{v:.6f}",
    "exponent": lambda v: f"{v:.8e}",
    "upper exponent, padded": lambda v: f"  {v:.7E} ",
    "%g": lambda v: f"{v:g}",
}


@pytest.mark.parametrize("style", sorted(FORMATS))
def test_statistic_values_in_any_float_notation(tmp_path, style):
    """The number format of Tensor::DataToString is not in the sources read; any float spelling is read alike."""
    dump = str(tmp_path / "d")
    builder, kin, _ = _builder(dump)
    rows = kbk_rows(kin, X, timestamp=10)
    for column in ("Max Value", "Min Value", "Avg Value", "L2Norm Value"):
        rows[1][column] = FORMATS[style](float(rows[1][column]))
    builder.kbk_csv(0, rows)
    report = process_dump(dump, jobs=1)
    assert report.ok, report.summary()
    leaf = _entry(dump)["input_args"][0]
    want = numpy_stats(X)
    for stat in ("Max", "Min", "Mean", "Norm"):
        assert leaf[stat] == pytest.approx(want[stat], rel=1e-5, abs=1e-6), stat


def _foreign(op_name):
    return {"Op Type": "TensorDump", "Op Name": op_name, "IO": "input", "Slot": 1, "Data Type": "float32",
            "Shape": "(1)", "Max Value": "0.0", "Timestamp": 15}


def test_other_tensordump_users_rows_are_theirs_and_a_broken_one_of_ours_is_a_problem(tmp_path):
    dump = str(tmp_path / "d")
    builder, kin, kout = _builder(dump)
    monitor = _foreign("Default/network-MFTrainOneStepCell/TensorDump-op7")  # no td_flag
    msprobe = _foreign("/data/msprobe/step{step}/rank0/Cell.fc.forward.input.0|Default/TensorDump-op9")
    builder.kbk_csv(0, kbk_rows(kin, X, 10) + [monitor, msprobe] + kbk_rows(kout, Y, 20))
    broken = _foreign(f"{dump}/_raw/rank0/{{step}}/c0-f-a-t|Default/TensorDump-op11")
    builder.kbk_csv(1, kbk_rows(kin, X, 30) + [broken] + kbk_rows(kout, Y, 40))
    report = process_dump(dump, jobs=1)
    step0 = [o for o in report.outcomes if o.step == 0][0]
    assert step0.problems == [] and len(step0.warnings) == 1
    assert "2 statistics rows of TensorDump kernels that are not mf_celldump's" in step0.warnings[0]
    problems = report.all_problems
    assert len(problems) == 1 and "names a file of mf_celldump's raw folder" in problems[0]
