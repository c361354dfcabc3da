"""Bad raw data is a message naming it, never a traceback,
memory stays bounded, and the other steps (and ranks) are processed.
"""

from __future__ import annotations

import json
import os
import textwrap

import numpy as np
import pytest

from mf_celldump.errors import ManifestError
from mf_celldump.processing.driver import process_dump
from tests.support import formats as fmt
from tests.support.hostile_dumps import REPO, A, F, build_dump, lie_about_shape, limited_python, raw_files, run_cli
from tests.support.rawdump_builder import RawDumpBuilder, kbk_rows


def _step_problem(report, step=0):
    outcome = next(o for o in report.outcomes if o.step == step)
    return outcome, outcome.problems


def _other_step_done(report, builder, step=1):
    outcome = next(o for o in report.outcomes if o.step == step)
    assert outcome.status == "processed" and not outcome.problems and outcome.raw_removed
    assert not os.path.exists(os.path.join(builder.rank_dir, f"step{step}"))


def _save_raw(builder, step, name, array):
    path = os.path.join(builder.rank_dir, f"step{step}", name)
    with open(path, "wb") as handle:
        np.save(handle, array, allow_pickle=True)
    return path


NOT_NUMBERS = {
    "strings": np.array(["abc"]),
    "bytes": np.array([b"abc"]),
    "complex": np.array([1 + 2j]),
    "datetime": np.array(["2024-01-01"], dtype="datetime64[D]"),
    "timedelta": np.array([5], dtype="timedelta64[s]"),
    "objects (pickle)": np.array([{"a": 1}], dtype=object),
    "structured": np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]),
    "void": np.zeros(2, dtype="V4"),
}


@pytest.mark.parametrize("kind", sorted(NOT_NUMBERS))
@pytest.mark.parametrize("value_kind", [fmt.KIND_TENSOR, fmt.KIND_INT])
def test_non_numeric_npy_is_a_problem_and_other_steps_go_on(tmp_path, kind, value_kind):
    """`np.save(f, np.array(["abc"]))` as a raw file (and complex, datetime, pickles, ...)."""
    builder = build_dump(str(tmp_path / "dump"))
    name = f"c0.f.a.{value_kind}.n0.p5_float32_999.npy"
    _save_raw(builder, 0, name, NOT_NUMBERS[kind])
    report = process_dump(builder.dump_path, jobs=1)
    outcome, problems = _step_problem(report)
    assert len(problems) == 1 and name in problems[0], problems
    assert any(word in problems[0] for word in ("values", "objects", "pickle", "not a readable")), problems[0]
    assert outcome.status == "processed" and os.path.isfile(os.path.join(outcome.output and builder.dump_path,
                                                                          "step0", "rank", fmt.DUMP_JSON))
    assert name in os.listdir(os.path.join(builder.rank_dir, "step0")), "raw data of the step is kept"
    _other_step_done(report, builder)


@pytest.mark.parametrize("name", ["c0.f.a.t.n0.p5_float32_999.npy", "c0.f.a.i.n0.p5_int64_999.npy"])
@pytest.mark.parametrize("shape", ["(1000000000000,)", "(1000000, 1000000, 1000000)", "(0, 1000000000000)"])
def test_header_claiming_a_trillion_elements_costs_no_memory(tmp_path, name, shape):
    builder = build_dump(str(tmp_path / "dump"))
    path = _save_raw(builder, 0, name, np.zeros(1, np.int64))
    lie_about_shape(path, shape)
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {REPO!r})
        from mf_celldump.processing.driver import process_dump
        report = process_dump({builder.dump_path!r}, jobs=1)
        print("PROBLEMS", report.all_problems)
        print("STATUS", [o.status for o in report.outcomes])
    """)
    proc = limited_python(code, limit_mb=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "out of memory" not in proc.stdout and "MemoryError" not in proc.stdout
    assert name in proc.stdout and ("truncated" in proc.stdout or "bytes after" in proc.stdout
                                    or "single value" in proc.stdout)
    assert "STATUS ['processed', 'processed']" in proc.stdout


def test_header_smaller_than_its_data_is_refused(tmp_path):
    builder = build_dump(str(tmp_path / "dump"))
    name = "c0.f.a.t.n0.p5_float32_999.npy"
    path = _save_raw(builder, 0, name, np.ones(8, np.float32))
    lie_about_shape(path, "(4,)")
    report = process_dump(builder.dump_path, jobs=1)
    _, problems = _step_problem(report)
    assert problems == [f"{path}: 16 bytes after the 16 data bytes its header declares; not written by a capture"]
    _other_step_done(report, builder)


@pytest.mark.parametrize("field", ["path", "cell", "call", "seq", "deep path"])
def test_raw_name_with_huge_numbers_is_left_alone(tmp_path, field):
    """A path index of 30 digits (and the same for cell, call, seq, or 40 levels deep) in a raw name."""
    builder = build_dump(str(tmp_path / "dump"))
    big = "1" * 30
    name = {"path": f"c0.f.a.t.n0.p{big}_float32_1.npy", "cell": f"c{big}.f.a.t.n0.p0_float32_1.npy",
            "call": f"c0.f.a.t.n{big}.p0_float32_1.npy", "seq": f"c0.f.a.t.n0.p0_float32_{big}.npy",
            "deep path": "c0.f.a.t.n0.p" + ".".join(["1"] * 40) + "_float32_1.npy"}[field]
    _save_raw(builder, 0, name, np.ones(2, np.float32))
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {REPO!r})
        from mf_celldump.processing.driver import process_dump
        report = process_dump({builder.dump_path!r}, jobs=1)
        print("OK", report.ok, [o.status for o in report.outcomes])
        print("\\n".join(report.warnings + [w for o in report.outcomes for w in o.warnings]))
    """)
    proc = limited_python(code, limit_mb=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "OK True ['processed', 'processed']" in proc.stdout
    assert "out of the raw format's range" in proc.stdout and name in proc.stdout
    assert os.listdir(os.path.join(builder.rank_dir, "step0")) == [name], "left where it is"


def test_index_paths_that_would_need_millions_of_gaps_are_refused(tmp_path):
    """p999999.999999...: within the name's bounds, but nesting it would build lists of millions of nulls."""
    builder = build_dump(str(tmp_path / "dump"))
    name = "c0.f.a.t.n0.p" + ".".join(["999999"] * 32) + "_float32_7.npy"
    _save_raw(builder, 0, name, np.ones(2, np.float32))
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {REPO!r})
        from mf_celldump.processing.driver import process_dump
        report = process_dump({builder.dump_path!r}, jobs=1)
        print("PROBLEMS", report.all_problems)
    """)
    proc = limited_python(code, limit_mb=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "empty positions" in proc.stdout and "out of memory" not in proc.stdout


def test_a_slot_named_both_a_tensor_and_a_list_is_refused_by_name_and_its_raw_files_kept(tmp_path):
    """p0 beside p0.0 in one call's inputs: nesting would drop the real tensor from dump.json while its
    .npy is written; the entry is refused instead, naming both files, and the step's raw data is kept."""
    builder = build_dump(str(tmp_path / "dump"), steps=1)
    step_dir = os.path.join(builder.rank_dir, "step0")
    _save_raw(builder, 0, "c0.f.a.t.nx.p0.0_float32_80.npy", np.ones(2, np.float32))
    before = sorted(os.listdir(step_dir))
    report = process_dump(builder.dump_path, jobs=1)
    problems = " ".join(report.all_problems)
    assert not report.ok and "is both a tensor (c0.f.a.t.nx.p0_float32_0.npy) and a list " \
        "(c0.f.a.t.nx.p0.0_float32_80.npy)" in problems, report.all_problems
    assert sorted(os.listdir(step_dir)) == before, "every raw file kept"


RECORD_LINES = {
    "100000 levels deep": b"[" * 100_000 + b"]" * 100_000,
    "2 MB line": b'{"seq": 1, "pad": "' + b"x" * (2 << 20) + b'"}',
    "not JSON": b"\x00\xff\xfe garbage",
    "not an object": b"[1, 2, 3]",
    "huge integer": b'{"seq": ' + b"9" * 5000 + b"}",
    "NaN seq": b'{"seq": NaN, "cell": 0}',
    "bad fields": b'{"seq": 1, "cell": -1, "dir": "sideways", "slot": "a", "kind": "t", "path": [0]}',
    "path too deep": b'{"seq": 1, "cell": 0, "dir": "forward", "slot": "a", "kind": "i", "call": 0, "path": ['
                     + b",".join([b"0"] * 40) + b'], "value": 1}',
    "huge shape list": b'{"seq": 1, "cell": 0, "dir": "forward", "slot": "a", "kind": "t", "call": 0, "path": [0],'
                       b' "dtype": "Float32", "shape": [' + b",".join([b"1"] * 100) + b'], "stats": {}}',
}


@pytest.mark.parametrize("case", sorted(RECORD_LINES))
def test_bad_records_lines_are_problems(tmp_path, case):
    """A records.jsonl line nested 100,000 levels deep (and other lines capture never writes)."""
    builder = build_dump(str(tmp_path / "dump"))
    records = os.path.join(builder.rank_dir, "step0", fmt.RECORDS_FILE)
    with open(records, "ab") as handle:
        handle.write(RECORD_LINES[case] + b"\n")
    report = process_dump(builder.dump_path, jobs=1)
    _, problems = _step_problem(report)
    assert len(problems) == 1 and f"{records}:2: unusable record" in problems[0], problems
    assert len(problems[0]) < 600
    _other_step_done(report, builder)


def test_torn_last_records_line_is_a_warning(tmp_path):
    builder = build_dump(str(tmp_path / "dump"))
    with open(os.path.join(builder.rank_dir, "step0", fmt.RECORDS_FILE), "ab") as handle:
        handle.write(b'{"seq": 9, "cell": 0, "di')
    report = process_dump(builder.dump_path, jobs=1)
    assert report.ok and any("torn last line" in w for o in report.outcomes for w in o.warnings)


MANIFESTS = {
    "not JSON": b"{",
    "not an object": b"[]",
    "unknown format": json.dumps({"format": "mf_celldump-raw/99"}).encode(),
    "deeply nested": b'{"format": "mf_celldump-raw/1", "cells": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "cells not a list": json.dumps({"format": fmt.RAW_FORMAT, "task": "tensor", "rank": 1, "cells": 5}).encode(),
    "bad cell": json.dumps({"format": fmt.RAW_FORMAT, "task": "tensor", "rank": 1,
                            "cells": [{"id": "x" * 10_000}]}).encode(),
    "empty": b"",
}


@pytest.mark.parametrize("case", sorted(MANIFESTS))
def test_bad_manifest_of_one_rank_stops_only_that_rank(tmp_path, case):
    dump = str(tmp_path / "dump")
    good = build_dump(dump, steps=1)
    good.distributed = True
    good.write_manifest()
    bad = RawDumpBuilder(dump, rank=1, distributed=True)
    bad.cell("model", "M")
    bad.write_manifest()
    bad.step(0).tensor(0, F, A, (0,), np.ones(2, np.float32))
    manifest = os.path.join(bad.rank_dir, fmt.MANIFEST_FILE)
    with open(manifest, "wb") as handle:
        handle.write(MANIFESTS[case])
    report = process_dump(dump, jobs=1)
    assert [(o.rank, o.status) for o in report.outcomes] == [(0, "processed")]
    assert len(report.problems) == 1 and report.problems[0].startswith(f"rank 1: {manifest}")
    assert len(report.problems[0]) < 600
    with pytest.raises(ManifestError, match="rank 1"):
        process_dump(dump, ranks=[1], jobs=1)
    proc = run_cli("process", dump, "--ranks", "1")
    assert proc.returncode == 2 and manifest in proc.stderr


KBK_ROWS = {
    "missing columns": [{"Op Name": "x"}],
    "inf for an int value": [{"Max Value": "inf"}],
    "nan for an int value": [{"Max Value": "nan"}],
    "5000-digit shape": [{"Shape": "(" + "9" * 5000 + ")"}],
    "100-dim shape": [{"Shape": "(" + ",".join(["1"] * 100) + ")"}],
    # csv refuses fields over 128 KiB, unless a library imported earlier raised csv.field_size_limit
    "field over the csv limit": [{"Data Type": "x" * 200_000}],
    "NUL bytes": [{"Data Type": "float\x0032"}],  # read as an odd dtype name: no problem, no traceback
}


@pytest.mark.parametrize("case", sorted(KBK_ROWS))
def test_bad_statistic_csv_rows_are_problems(tmp_path, case):
    dump = str(tmp_path / "dump")
    builder = RawDumpBuilder(dump, task="statistics", backend="kbk_statistics")
    builder.cell("model", "M")
    builder.write_manifest()
    kind = fmt.KIND_INT if "value" in case else fmt.KIND_TENSOR
    key = fmt.Key(0, F, A, kind, (0,), None)
    rows = kbk_rows(key, np.ones(3, np.float32), 1)
    path = builder.kbk_csv(0, rows)
    builder.kbk_csv(1, kbk_rows(key, np.ones(3, np.float32), 2))
    if case == "missing columns":
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("Op Name\nx\n")
    else:
        rows[1].update(KBK_ROWS[case][0])
        builder.kbk_csv(0, rows)
    report = process_dump(dump, jobs=1)
    problems = report.all_problems
    assert (problems or case in ("NUL bytes", "field over the csv limit")) and all(path in p for p in problems)
    assert all(len(p) < 600 for p in problems)
    assert [o.status for o in report.outcomes if o.step == 1] in (["processed"], [])


def test_many_hostile_inputs_at_once_stay_within_400_mb(tmp_path):
    """Everything above in one dump, processed under an address-space limit (RLIMIT_AS)."""
    builder = build_dump(str(tmp_path / "dump"), steps=3)
    lie_about_shape(_save_raw(builder, 0, "c0.f.a.t.n0.p5_float32_999.npy", np.zeros(1, np.float32)),
                  "(1000000000000,)")
    _save_raw(builder, 0, "c0.f.a.t.n0.p" + "1" * 30 + "_float32_1.npy", np.ones(2, np.float32))
    _save_raw(builder, 0, "c1.f.a.t.n0.p" + ".".join(["999999"] * 32) + "_float32_7.npy", np.ones(2, np.float32))
    with open(os.path.join(builder.rank_dir, "step1", fmt.RECORDS_FILE), "ab") as handle:
        for line in RECORD_LINES.values():
            handle.write(line + b"\n")
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {REPO!r})
        from mf_celldump.processing.driver import process_dump
        report = process_dump({builder.dump_path!r}, jobs=1)
        print("STATUS", [o.status for o in report.outcomes], len(report.all_problems))
        print("\\n".join(report.all_problems))
    """)
    proc = limited_python(code, limit_mb=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "STATUS ['processed', 'processed', 'processed'] 11" in proc.stdout, proc.stdout[-3000:]
    assert "out of memory" not in proc.stdout
    assert raw_files(os.path.join(builder.rank_dir, "step0"))
