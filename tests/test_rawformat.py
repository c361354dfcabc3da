"""The raw format has one owner: its document, its names and its version check agree.

The expected names here come from ``tests/support/formats.py`` (literal), not from the package.
"""

import json
import os

import numpy as np
import pytest

from mf_celldump.rawformat import keys, manifest, names, records, spec
from tests.support import formats as fmt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_document_holds_exactly_the_generated_tables():
    with open(os.path.join(REPO, "docs", "raw-format.md"), encoding="utf-8") as handle:
        text = handle.read()
    assert spec.generate() in text, "docs/raw-format.md is stale: run python -m mf_celldump.rawformat.spec --write"


@pytest.mark.parametrize("key", [
    fmt.Key(0, fmt.FORWARD, fmt.SLOT_ARG, fmt.KIND_TENSOR, (0,), None),
    fmt.Key(12, fmt.BACKWARD, fmt.SLOT_OUTPUT, fmt.KIND_TENSOR, (1, 0, 3), 4),
    fmt.Key(3, fmt.FORWARD, fmt.SLOT_KWARG, fmt.KIND_INT, (2,), 0),
])
def test_raw_file_names_match_the_literal_format(key):
    package_key = keys.ProbeKey(*key)
    name = names.raw_tensor_file_name(package_key, "float32", 9)
    assert name == fmt.raw_tensor_file_name(key, "float32", 9)
    parsed = names.parse_raw_tensor_name(fmt.raw_stem(key) + "_in_bfloat16_123.npy")
    assert parsed.key == package_key and parsed.numpy_dtype == "bfloat16" and parsed.seq == 123
    assert parsed.tensordump_in_mode
    assert names.find_kbk_stem("Default/TensorDump-op3|" + fmt.raw_stem(key, "-")) == package_key


@pytest.mark.parametrize("op_name,widened,in_mode", [
    ("/d/_raw/rank0/{step}/c4-b-a-t-nx-p1-wbfloat16|Gradients/Default/TensorDump-op7", "bfloat16", False),
    ("/d/_raw/rank0/{step}/c4-b-a-t-nx-p1-wfloat16_in.npy|Default/TensorDump-op7", "float16", True),
    ("_d__raw_rank0_{step}_c4-b-a-t-nx-p1_in_npy|Default_TensorDump-op7", None, True),  # MindSpore <= 2.7.0
])
def test_kernel_names_carry_the_widened_dtype_and_the_in_suffix(op_name, widened, in_mode):
    """A statistics row of a float32 copy names the value's own dtype (-w...); '_in.npy' marks MindSpore's 'in'
    dump (the parallel pass may have copied it per consumer)."""
    parsed = names.parse_kbk_op_name(op_name)
    assert parsed.key == keys.ProbeKey(4, keys.BACKWARD, keys.SLOT_ARG, keys.KIND_TENSOR, (1,), None)
    assert parsed.widened_from == widened and parsed.tensordump_in_mode == in_mode
    key = keys.ProbeKey(4, keys.BACKWARD, keys.SLOT_ARG, keys.KIND_TENSOR, (1,), None)
    if widened:
        assert names.raw_stem(key, "-", widened) == f"c4-b-a-t-nx-p1-w{widened}"
    with pytest.raises(ValueError):
        names.raw_stem(key, ".", "bfloat16")  # only kernel stems name a widened dtype


@pytest.mark.parametrize("name", [
    "c1.f.a.t.nx.p" + "9" * 30 + "_float32_0.npy",  # an index of 30 digits
    "c1.f.a.t.nx.p" + ".".join(["0"] * 40) + "_float32_0.npy",  # 40 levels deep
    "c1.q.a.t.nx.p0_float32_0.npy",
    "notes.txt",
])
def test_names_outside_the_bounds_are_not_ours(name):
    assert names.parse_raw_tensor_name(name) is None


def test_tree_names_match_the_literal_format():
    assert (names.RAW_ROOT, names.MANIFEST_FILE, names.RECORDS_FILE, names.STEP_DONE_FILE) == (
        fmt.RAW_ROOT, fmt.MANIFEST_FILE, fmt.RECORDS_FILE, fmt.STEP_DONE_FILE)
    assert names.rank_dir_name(7) == fmt.raw_rank_dir_name(7) and names.step_dir_name(5) == fmt.step_dir_name(5)
    assert manifest.FORMAT == fmt.RAW_FORMAT


def _write(tmp_path, data):
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_manifest_version_is_checked_on_read(tmp_path):
    good = {"format": fmt.RAW_FORMAT, "task": "tensor", "rank": 0, "cells": []}
    assert manifest.load_manifest(_write(tmp_path, good), str(tmp_path)).task == "tensor"
    for bad in ("mf_celldump-raw/99", None):
        data = dict(good, format=bad)
        with pytest.raises(manifest.ManifestError, match="not one this mf_celldump reads"):
            manifest.load_manifest(_write(tmp_path, data), str(tmp_path))


def test_manifest_written_by_the_package_reads_back(tmp_path):
    cell = manifest.CellRecord(0, "model.layers.0", "Layer", params=("x", "mask"), weights=("weight", "bias"))
    written = manifest.Manifest(rank=2, distributed=True, task="statistics", cells={0: cell},
                                step_numbering=manifest.NUMBERING_GRAPH, graph_step_base=100, parameters=True)
    path = str(tmp_path / "manifest.json")
    manifest.write_manifest(path, written)
    read = manifest.load_manifest(path, str(tmp_path))
    assert read.cells == written.cells and read.global_step(3) == 103 and read.folder_step(103) == 3
    assert read.parameters is True
    with open(path) as handle:
        cells = json.load(handle)["cells"]
    assert cells[0] == {
        "id": 0, "name": "model.layers.0", "class": "Layer", "module": "", "file": "", "line": None,
        "params": ["x", "mask"], "weights": ["weight", "bias"]}


@pytest.mark.parametrize("earlier", ["mf_celldump-raw/1", "mf_celldump-raw/2"])
def test_manifest_of_an_earlier_format_is_refused_naming_the_file_and_both_versions(tmp_path, earlier):
    path = _write(tmp_path, {"format": earlier, "task": "tensor", "rank": 0, "cells": []})
    with pytest.raises(manifest.ManifestError) as err:
        manifest.load_manifest(path, str(tmp_path))
    assert path in str(err.value) and repr(earlier) in str(err.value) and repr(fmt.RAW_FORMAT) in str(err.value)


@pytest.mark.parametrize("slot", [keys.SLOT_WEIGHT, keys.SLOT_WEIGHT_GRAD])
def test_weight_slots_round_trip_through_file_names_and_codes(slot):
    direction = keys.FORWARD if slot == keys.SLOT_WEIGHT else keys.BACKWARD
    key = keys.ProbeKey(4, direction, slot, keys.KIND_TENSOR, (1,))
    parsed = names.parse_raw_tensor_name(names.raw_tensor_file_name(key, "float32", 9))
    assert parsed.key == key
    assert keys.ProbeKey.from_codes(key.to_codes(), direction) == key


def test_records_round_trip_and_refuse_what_is_not_ours():
    key = keys.ProbeKey(1, keys.FORWARD, keys.SLOT_ARG, keys.KIND_TENSOR, (0, 2), None)
    line = records.encode_record(key, 5, dtype="Float32", shape=[2], stats={"Max": 1.0})
    assert json.loads(line) == {"seq": 5, "cell": 1, "dir": "forward", "slot": "a", "kind": "t", "call": None,
                                "path": [0, 2], "dtype": "Float32", "shape": [2], "stats": {"Max": 1.0}}
    deep = b"[" * 100_000 + b"]" * 100_000
    read = records.read_records(line.encode() + deep + b"\n" + b'{"seq": 1}\n', "r.jsonl", 0)
    assert len(read.captures) == 1 and read.captures[0].key == key
    assert len(read.problems) == 2 and "r.jsonl:2" in read.problems[0]


def test_records_written_in_batches_keep_every_line_in_order_before_the_step_marker(tmp_path):
    """Records go to the writer thread a batch at a time; a tensor, a completed step or a flush hands over
    what is pending first, so nothing is lost or reordered and the marker follows the step's last line."""
    from mf_celldump.rawformat.keys import ProbeKey
    from mf_celldump.rawformat.writer import RECORD_BATCH, RawWriter

    writer = RawWriter(str(tmp_path), 0, "run")
    seen_marker_with = []
    real_mark = writer._mark_complete

    def mark(step, path, extra):
        with open(os.path.join(path, names.RECORDS_FILE)) as handle:  # the step's lines, as the marker sees them
            seen_marker_with.append(sum(1 for _ in handle))
        real_mark(step, path, extra)

    writer._mark_complete = mark
    key = ProbeKey(0, "forward", "o", "i", (0,))
    count = RECORD_BATCH * 2 + 5
    for step in (0, 1):
        writer.prepare_step(step)
        for seq in range(count):
            writer.append_record(step, key, seq, value=seq)
            if seq == RECORD_BATCH + 3:
                writer.write_tensor(step, key.with_kind("t"), np.zeros(2, np.float32), "float32", 10_000 + seq)
        writer.complete_step(step)
    writer.flush()
    writer.close()
    assert seen_marker_with == [count, count]
    for step in (0, 1):
        folder = writer.step_dir(step)
        with open(os.path.join(folder, names.RECORDS_FILE)) as handle:
            assert [json.loads(line)["seq"] for line in handle] == list(range(count))
        assert os.path.exists(os.path.join(folder, names.STEP_DONE_FILE))


def test_a_record_that_cannot_be_written_costs_only_itself_and_the_step_marker(tmp_path):
    from mf_celldump.rawformat.keys import ProbeKey
    from mf_celldump.rawformat.writer import RawWriter

    writer = RawWriter(str(tmp_path), 0, "run")
    writer.prepare_step(0)
    key = ProbeKey(0, "forward", "o", "i", (0,))
    writer.append_record(0, key, 0, value=1)
    writer.append_record(0, key, 1, value=object())  # not JSON
    writer.append_record(0, key, 2, value=3)
    writer.complete_step(0)
    with pytest.raises(TypeError):
        writer.flush()
    writer.close()
    folder = writer.step_dir(0)
    with open(os.path.join(folder, names.RECORDS_FILE)) as handle:
        assert [json.loads(line)["seq"] for line in handle] == [0, 2]
    assert not os.path.exists(os.path.join(folder, names.STEP_DONE_FILE))

