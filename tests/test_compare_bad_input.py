"""Compare never answers silently on input that is not what a dump holds: a clear error or a named warning.

A dump.json without ``data`` would drop its step and leave "no divergence"; a statistic that
is not a number, a shape that is not whole numbers, a call number no dumper writes and a
dtype no framework has were read as if they were fine.
"""

from __future__ import annotations

import json

import numpy as np

from mf_celldump.cli import main as celldump_main
from tests.support.compare_dumps import X, chain, write_dump


def compare(capsys, target, baseline, out):
    code = celldump_main(["compare", str(target), str(baseline), "-o", str(out), "--json"])
    captured = capsys.readouterr()
    return code, (json.loads(captured.out) if captured.out.strip() else None), captured.err


def _edit(folder, change):
    path = folder / "dump.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_a_dump_json_without_data_is_an_error_naming_it(tmp_path, capsys):
    for step in (0, 1):
        write_dump(str(tmp_path / "a"), chain(), step=step)
        write_dump(str(tmp_path / "b"), chain(), step=step)
    broken = tmp_path / "b" / "step1" / "rank"
    _edit(broken, lambda doc: doc.pop("data"))
    code, result, err = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    assert code == 2 and result["exit_code"] == 2
    assert f'{broken / "dump.json"}: no "data" key' in err and "step1/rank" in err


def _statistics_pair(tmp_path, records):
    entries = {"Cell.fc.Dense.forward.0": {"in": [X], "out": [X * 2]}}
    write_dump(str(tmp_path / "a"), entries, task="statistics")
    write_dump(str(tmp_path / "b"), {name: dict(spec, records=records) for name, spec in entries.items()},
               task="statistics")


def test_statistics_that_are_not_numbers_are_named_not_passed(tmp_path, capsys):
    _statistics_pair(tmp_path, {"output.0": {"Max": "NaN?", "Min": "NaN?"}})
    code, result, _ = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    assert result["warnings"] and "Cell.fc.Dense.forward.0 output.0: malformed record: target record Max 'NaN?' " \
        "is not a number; not compared" in result["warnings"][0], result["warnings"]


def test_a_shape_of_a_trillion_by_a_trillion_with_a_nan_max_is_named(tmp_path, capsys):
    _statistics_pair(tmp_path, {"output.0": {"shape": [1e12, 1e12], "Max": "NaN?"}})
    code, result, _ = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    (warning,) = [w for w in result["warnings"] if "malformed record" in w]
    assert "shape [1000000000000.0, 1000000000000.0] is not a list of whole numbers" in warning
    capsys.readouterr()
    celldump_main(["compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o", str(tmp_path / "p")])
    assert "warning: " in capsys.readouterr().out  # the terminal names it too


def test_a_forged_call_number_is_warned(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), chain())
    forged = {name.replace("fc1.Dense.forward.0", "fc1.Dense.forward.999999999"): spec
              for name, spec in chain().items()}
    write_dump(str(tmp_path / "b"), forged)
    code, result, _ = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    assert any("Cell.block.fc1.Dense.forward.999999999: call number 999999999, but it is call 0" in w
               for w in result["warnings"]), result["warnings"]


def test_a_dtype_no_framework_has_is_warned(tmp_path, capsys):
    entries = {"Cell.fc.Dense.forward.0": {"in": [X], "out": [np.ones((2, 3))]}}
    write_dump(str(tmp_path / "a"), entries)
    write_dump(str(tmp_path / "b"), {n: dict(s, records={"output.0": {"dtype": "Quux64"}}) for n, s in entries.items()})
    code, result, _ = compare(capsys, tmp_path / "b", tmp_path / "a", tmp_path / "o")
    assert any("dtype 'Quux64'" in w and "judged with float32's thresholds" in w for w in result["warnings"]), \
        result["warnings"]
