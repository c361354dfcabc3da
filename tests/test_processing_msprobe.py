"""Processed output read by real tools (msprobe 26.2 compare, graph_visualize) and real TensorDump files.

msprobe is run as a separate process that imports mindspore before msprobe (the other
order fails in one process with protobuf's "Descriptors cannot be created directly";
with this protobuf the plain ``msprobe`` script fails the same way).
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mf_celldump.processing.driver import process_dump
from tests.support import formats as fmt
from tests.support.msprobe_cli import REPO, compare_rows, graph_nodes
from tests.support.rawdump_builder import RawDumpBuilder, llama_net, read_output, write_llama_step

pytest.importorskip("msprobe")

PERTURBED = "model.layers.1.attention.wo"


def build(dump, task="tensor", perturb=None):
    """Two-layer LLaMA-like dump: forward+backward, kwargs, nested outputs and a non-tensor value."""
    b = RawDumpBuilder(dump, task=task)
    net = llama_net(b, 2)
    b.write_manifest()
    rng = np.random.default_rng(0)
    s = b.step(0)
    names = {c.cell_id: c.name for c in b.cells}

    def make(cell, direction, slot, call):
        data = rng.standard_normal((4, 8)).astype(np.float32)
        if perturb is not None and names[cell] == perturb and direction == fmt.FORWARD:
            data = data + np.random.default_rng(99).standard_normal(data.shape).astype(np.float32)
        return data

    write_llama_step(net, s, make, explicit_calls=False, statistics_records=(task == "statistics"))
    layer = [c.cell_id for c in b.cells if c.name == "model.layers.0"][0]
    extra = rng.standard_normal((2, 2)).astype(np.float32)
    if task == "tensor":
        s.tensor(layer, fmt.FORWARD, fmt.SLOT_KWARG, (2,), extra)  # mask=
        s.tensor(layer, fmt.FORWARD, fmt.SLOT_OUTPUT, (1, 0), extra)
    else:
        s.record(layer, fmt.FORWARD, fmt.SLOT_KWARG, (2,), array=extra)
        special = {"Max": float("inf"), "Min": float("-inf"), "Mean": float("nan"), "Norm": float("nan")}
        s.record(layer, fmt.FORWARD, fmt.SLOT_OUTPUT, (2,), array=extra, stats=special)
    s.record(layer, fmt.FORWARD, fmt.SLOT_ARG, (1,), kind=fmt.KIND_INT, value=3)
    s.done(0)
    report = process_dump(dump, jobs=1)
    assert report.ok, report.summary()
    return b


def _compare(tmp_path, task, perturb=None):
    a, g, out = (str(tmp_path / n) for n in ("target", "golden", "out"))
    build(a, task, perturb)
    build(g, task)
    return a, compare_rows(os.path.join(a, "step0"), os.path.join(g, "step0"), out)


def _tensor_leaves(dump):
    data = read_output(dump, 0)["dump"]["data"]
    count = 0

    def walk(node):
        nonlocal count
        if isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict) and node.get("type") == "mindspore.Tensor":
            count += 1
        elif isinstance(node, dict) and "type" not in node:
            for item in node.values():
                walk(item)

    for body in data.values():
        walk(body)
    return count


def test_compare_identical_tensor_dumps(tmp_path):
    dump, rows = _compare(tmp_path, "tensor")
    tensor_rows = [r for r in rows if r["NPU Dtype"] == "Float32"]
    assert len(tensor_rows) == _tensor_leaves(dump) == 2 * 27 * 2 + 2
    assert all(float(r["Cosine"]) == 1.0 and float(r["MaxAbsErr"]) == 0.0 for r in tensor_rows)
    names = {r["NPU Name"] for r in tensor_rows}
    assert "Cell.model.layers.0.LLamaDecodeLayer.forward.0.input.mask" in names
    assert "Cell.model.layers.0.LLamaDecodeLayer.forward.0.output.1.0" in names
    assert "Cell.model.layers.0.LLamaDecodeLayer.backward.0.input.0" in names


def test_compare_flags_exactly_the_perturbed_cell(tmp_path):
    _, rows = _compare(tmp_path, "tensor", perturb=PERTURBED)
    tensor_rows = [r for r in rows if r["NPU Dtype"] == "Float32"]
    bad = {r["NPU Name"] for r in tensor_rows if float(r["Cosine"]) < 0.999 or float(r["MaxAbsErr"]) > 0}
    assert bad == {
        f"Cell.{PERTURBED}.Linear.forward.0.input.0",
        f"Cell.{PERTURBED}.Linear.forward.0.output.0",
    }


def test_compare_identical_statistics_dumps(tmp_path):
    dump, rows = _compare(tmp_path, "statistics")
    tensor_rows = [r for r in rows if r["NPU Dtype"] == "Float32"]
    assert len(tensor_rows) == _tensor_leaves(dump) == 2 * 27 * 2 + 2
    special = "Cell.model.layers.0.LLamaDecodeLayer.forward.0.output.2"
    with open(os.path.join(dump, "step0", "rank", fmt.DUMP_JSON)) as handle:
        assert "NaN" in handle.read()  # written as Python's json (and msprobe) read it back
    by_name = {r["NPU Name"]: r for r in tensor_rows}
    row = by_name[special]
    assert float(row["NPU max"]) == float("inf") and row["NPU mean"].strip().lower() == "nan"
    for column in ("Max diff", "Min diff", "Mean diff", "L2norm diff"):
        assert all(float(r[column]) == 0.0 for r in tensor_rows if r["NPU Name"] != special), column
    assert {r["Result"] for r in tensor_rows if r["NPU Name"] != special} == {"pass"}


def test_graph_visualize_hierarchy_matches_construct(tmp_path):
    dump, out = str(tmp_path / "dump"), str(tmp_path / "vis")
    build(dump)
    nodes = graph_nodes(os.path.join(dump, "step0", "rank"), out)
    construct = read_output(dump, 0)["construct"]
    assert set(construct) <= set(nodes)
    for entry, parent in construct.items():
        if parent is None:
            assert not str(nodes[entry]).startswith("Cell."), entry
        else:
            assert nodes[entry] == parent, entry


TENSORDUMP_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    import mindspore as ms
    from mindspore import Tensor, ops
    from tests.support import formats as fmt
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")
    step_dir = sys.argv[1]
    dump, dump_in = ops.TensorDump(), ops.TensorDump("in")
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) - 5)
    def key(slot, path, kind="t", call=None, direction="forward"):
        return os.path.join(step_dir, fmt.raw_stem(fmt.Key(0, direction, slot, kind, path, call)))
    dump(key("a", (0,)), x)
    dump(key("a", (1, 0)), x.astype(ms.bfloat16))
    dump_in(key("k", (0,)), x.astype(ms.float16))
    dump(key("a", (2,), kind="i"), Tensor(7, ms.int64))
    dump(key("o", (0,)), (x * 2).astype(ms.int32))
    dump(key("o", (0,), direction="backward"), x + 1)
    deadline = time.time() + 30
    while len(os.listdir(step_dir)) < 6 and time.time() < deadline:
        time.sleep(0.05)
    print(sorted(os.listdir(step_dir)))
    """
)


def test_real_tensordump_file_names_are_parsed(tmp_path):
    dump = str(tmp_path / "dump")
    b = RawDumpBuilder(dump)
    b.cell("block", "Block", ("x", "mask"))
    b.write_manifest()
    step_dir = b.step(0).path
    proc = subprocess.run(
        [sys.executable, "-c", TENSORDUMP_SCRIPT, step_dir],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = sorted(os.listdir(step_dir))
    assert len(names) == 6 and all(fmt.parse_raw_tensor_name(n) is not None for n in names), names
    assert any("_bfloat16_" in n for n in names)
    b.step(0).done(0)  # the capture's completion marker: without it the step is incomplete
    report = process_dump(dump, jobs=1)
    assert report.ok and report.files == 6, report.summary()
    data = read_output(dump, 0)["dump"]["data"]
    assert list(data) == ["Cell.block.Block.forward.0", "Cell.block.Block.backward.0"]
    forward = data["Cell.block.Block.forward.0"]
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    assert forward["input_args"][0]["dtype"] == "Float32" and forward["input_args"][0]["Max"] == 6.0
    assert forward["input_args"][1][0]["dtype"] == "BFloat16"
    assert forward["input_args"][1][0]["Mean"] == pytest.approx(float(x.mean()))
    assert forward["input_args"][2] == {"type": "int", "value": 7}
    assert forward["input_kwargs"]["x"]["dtype"] == "Float16"
    assert forward["output"][0]["dtype"] == "Int32" and forward["output"][0]["Min"] == -10
    backward = data["Cell.block.Block.backward.0"]
    assert backward["input_args"][0]["Max"] == 7.0 and backward["output"] == []
    folder = os.path.join(dump, "step0", "rank", fmt.TENSOR_DIR)
    np.testing.assert_array_equal(np.load(os.path.join(folder, "Cell.block.Block.forward.0.input.0.npy")), x)
    assert read_output(dump, 0)["construct"] == {
        "Cell.block.Block.forward.0": None,
        "Cell.block.Block.backward.0": None,
    }
