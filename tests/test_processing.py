"""Processing of synthetic raw dumps: layout, dump.json contents, construct/stack, call numbering."""

import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

from mf_celldump.processing import npystats
from mf_celldump.processing.driver import process_dump
from tests.support import formats as fmt
from tests.support.rawdump_builder import RawDumpBuilder, kbk_rows, numpy_stats, read_output

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
F, B = fmt.FORWARD, fmt.BACKWARD
A, K, OUT = fmt.SLOT_ARG, fmt.SLOT_KWARG, fmt.SLOT_OUTPUT


def _arr(seed, shape=(3, 4), dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _assert_stats(record, array):
    expected = numpy_stats(array)
    for key in ("Max", "Min", "Mean", "Norm"):
        assert record[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-9), key


@pytest.fixture
def dump(tmp_path):
    return str(tmp_path / "dump")


def test_layout_dtypes_stats_and_data_files(dump):
    b = RawDumpBuilder(dump)
    cell = b.cell("block.fc1", "Dense", ("x", "y", "z", "w", "flag", "bf"))
    b.write_manifest()
    s = b.step(0)
    arrays = {
        0: _arr(1),
        1: _arr(2, dtype=np.float16),
        2: np.arange(6, dtype=np.int64).reshape(2, 3),
        3: np.arange(4, dtype=np.int32),
        4: np.array([True, False, True]),
    }
    for i, array in arrays.items():
        s.tensor(cell, F, A, (i,), array, call=0)
    bf = _arr(5)
    s.tensor(cell, F, A, (5,), bf, call=0, dtype_name="bfloat16")
    out = _arr(6)
    s.tensor(cell, F, OUT, (0,), out, call=0)
    s.done(0)

    report = process_dump(dump, jobs=1)
    assert report.ok and report.entries == 1 and report.files == 7
    result = read_output(dump, 0)
    assert sorted(os.listdir(os.path.join(dump, "step0"))) == ["rank"]
    body = result["dump"]
    assert body["task"] == "tensor" and body["level"] == "L0" and body["framework"] == "mindspore"
    data_dir = os.path.join(os.path.realpath(dump), "step0", "rank", "dump_tensor_data")
    assert body["dump_data_dir"] == data_dir
    entry = body["data"]["Cell.block.fc1.Dense.forward.0"]
    args = entry["input_args"]
    assert [a["dtype"] for a in args] == ["Float32", "Float16", "Int64", "Int32", "Bool", "BFloat16"]
    assert all(a["type"] == "mindspore.Tensor" for a in args)
    assert args[2]["shape"] == [2, 3]
    for i in (0, 1, 2, 3):
        _assert_stats(args[i], arrays[i])
    assert args[4]["Max"] is True and args[4]["Min"] is False
    _assert_stats(args[5], bf)
    assert entry["input_kwargs"] == {}
    _assert_stats(entry["output"][0], out)
    assert entry["output"][0]["data_name"] == "Cell.block.fc1.Dense.forward.0.output.0.npy"
    for i, array in arrays.items():
        name = f"Cell.block.fc1.Dense.forward.0.input.{i}.npy"
        assert args[i]["data_name"] == name
        np.testing.assert_array_equal(np.load(os.path.join(data_dir, name), allow_pickle=False), array)
    mode = os.stat(os.path.join(data_dir, args[0]["data_name"])).st_mode & 0o777
    assert mode == 0o640
    assert os.stat(os.path.join(dump, "step0", "rank")).st_mode & 0o777 == 0o750
    # raw step is gone, the manifest stays
    assert not os.path.exists(os.path.join(b.rank_dir, "step0"))
    assert os.path.exists(os.path.join(b.rank_dir, fmt.MANIFEST_FILE))


def test_numeric_argument_order_kwargs_nesting_and_values(dump):
    b = RawDumpBuilder(dump)
    cell = b.cell("net.input_layernorm", "LayerNorm", ("x", "mask", "scale"))
    b.write_manifest()
    s = b.step(0)
    # 12 positional arguments, written in reverse order: output order must still be 0..11
    for i in reversed(range(12)):
        s.tensor(cell, F, A, (i,), np.full((i + 1,), float(i), np.float32), call=0)
    s.tensor(cell, F, K, (1,), _arr(20), call=0)  # mask
    s.tensor(cell, F, K, (2, 1), _arr(21), call=0)  # scale[1]
    s.tensor(cell, F, K, (2, 0), _arr(22), call=0)  # scale[0]
    s.tensor(cell, F, OUT, (1, 0), _arr(23), call=0)
    s.tensor(cell, F, OUT, (1, 1), _arr(24), call=0)
    s.value_file(cell, F, OUT, (0,), fmt.KIND_INT, 7, call=0)
    s.value_file(cell, F, OUT, (2,), fmt.KIND_FLOAT, 0.5, call=0)
    s.value_file(cell, F, OUT, (3,), fmt.KIND_BOOL, True, call=0)
    s.value_file(cell, F, OUT, (4,), fmt.KIND_NONE, None, call=0)
    s.record(cell, F, OUT, (5,), kind=fmt.KIND_INT, value=42, call=0)
    s.done(0)
    report = process_dump(dump, jobs=1)
    assert report.ok, report.summary()
    entry = read_output(dump, 0)["dump"]["data"]["Cell.net.input_layernorm.LayerNorm.forward.0"]
    assert [a["shape"] for a in entry["input_args"]] == [[i + 1] for i in range(12)]
    assert [a["data_name"].split(".input.")[1] for a in entry["input_args"]] == [
        f"{i}.npy" for i in range(12)
    ]
    kwargs = entry["input_kwargs"]
    assert list(kwargs) == ["mask", "scale"]
    assert kwargs["mask"]["data_name"] == "Cell.net.input_layernorm.LayerNorm.forward.0.input.mask.npy"
    assert [k["data_name"].rsplit(".input.", 1)[1] for k in kwargs["scale"]] == ["scale.0.npy", "scale.1.npy"]
    _assert_stats(kwargs["scale"][0], _arr(22))
    output = entry["output"]
    assert output[0] == {"type": "int", "value": 7}
    assert [o["data_name"].rsplit(".output.", 1)[1] for o in output[1]] == ["1.0.npy", "1.1.npy"]
    assert output[2] == {"type": "float", "value": 0.5}
    assert output[3] == {"type": "bool", "value": True}
    assert output[4] is None  # a None value is a bare null, as msprobe writes it
    assert output[5] == {"type": "int", "value": 42}


def _nested_net(b):
    ids = {}
    for name, cls in [
        ("model", "Model"),
        ("model.layers.0", "Layer"),
        ("model.layers.0.input_layernorm", "RMSNorm"),
        ("model.layers.0.attn", "Attention"),
        ("model.layers.0.attn.core.proj", "Linear"),  # "model.layers.0.attn.core" is not a captured cell
        ("model.layers.1", "Layer"),
        ("model.layers.1.input_layernorm", "RMSNorm"),
        ("head", "Linear"),
    ]:
        ids[name] = b.cell(name, cls, ("x",), line=len(ids) + 1)
    return ids


def _fwd_bwd(s, ids, order, calls=None):
    """Nested forward then reversed backward; ``order`` lists (name, children...) recursively."""

    def fwd(node):
        name, kids = node
        s.tensor(ids[name], F, A, (0,), _arr(len(name)), call=calls)
        for kid in kids:
            fwd(kid)
        s.tensor(ids[name], F, OUT, (0,), _arr(len(name) + 1), call=calls)

    def bwd(node):
        name, kids = node
        s.tensor(ids[name], B, OUT, (0,), _arr(len(name) + 2), call=calls)
        for kid in reversed(kids):
            bwd(kid)
        s.tensor(ids[name], B, A, (0,), _arr(len(name) + 3), call=calls)

    for node in order:
        fwd(node)
    for node in reversed(order):
        bwd(node)


TREE = [
    (
        "model",
        [
            ("model.layers.0", [("model.layers.0.input_layernorm", []), ("model.layers.0.attn", [
                ("model.layers.0.attn.core.proj", [])])]),
            ("model.layers.1", [("model.layers.1.input_layernorm", [])]),
        ],
    ),
    ("head", []),
]  # fmt: skip


def test_construct_nesting_celllist_and_backward_parents(dump):
    b = RawDumpBuilder(dump)
    ids = _nested_net(b)
    b.write_manifest()
    s = b.step(0)
    _fwd_bwd(s, ids, TREE)
    s.done(0)
    assert process_dump(dump, jobs=1).ok
    result = read_output(dump, 0)
    construct = result["construct"]

    def e(name, cls, d="forward", n=0):
        return f"Cell.{name}.{cls}.{d}.{n}"

    for d in ("forward", "backward"):
        assert construct[e("model", "Model", d)] is None
        assert construct[e("head", "Linear", d)] is None
        assert construct[e("model.layers.0", "Layer", d)] == e(
            "model", "Model", d
        )  # CellList member -> owner
        assert construct[e("model.layers.1", "Layer", d)] == e("model", "Model", d)
        assert construct[e("model.layers.0.input_layernorm", "RMSNorm", d)] == e("model.layers.0", "Layer", d)
        assert construct[e("model.layers.0.attn", "Attention", d)] == e("model.layers.0", "Layer", d)
        assert construct[e("model.layers.0.attn.core.proj", "Linear", d)] == e(
            "model.layers.0.attn", "Attention", d
        )
    data = result["dump"]["data"]
    assert list(construct) == list(data) == list(result["stack"])
    # execution order: forward pre-order, then backward (reverse)
    names = list(data)
    assert names[0] == e("model", "Model") and names[7] == e("head", "Linear")
    assert names[8] == e("head", "Linear", "backward") and names[9] == e("model", "Model", "backward")
    # backward: grads w.r.t. forward outputs are backward inputs
    head_b = data[e("head", "Linear", "backward")]
    _assert_stats(head_b["input_args"][0], _arr(len("head") + 2))
    _assert_stats(head_b["output"][0], _arr(len("head") + 3))
    stack = result["stack"][e("model.layers.0.attn", "Attention")]
    assert stack == ["File /src/synthetic_model.py, line 4, in tests.synthetic_model.Attention"]


def _two_nested_forward_calls(s, outer, inner, explicit):
    """Two forward calls of ``outer``, each calling ``inner`` once: inputs 10+k / 20+k, outputs 30+k / 40+k;
    call numbers written (``explicit``) or left to processing."""
    for k in range(2):
        call = k if explicit else None
        s.tensor(outer, F, A, (0,), np.full((2,), 10.0 + k, np.float32), call=call)
        s.tensor(inner, F, A, (0,), np.full((2,), 20.0 + k, np.float32), call=call)
        s.tensor(inner, F, OUT, (0,), np.full((2,), 30.0 + k, np.float32), call=call)
        s.tensor(outer, F, OUT, (0,), np.full((2,), 40.0 + k, np.float32), call=call)


def test_call_inference_forward_and_backward_reverse_rule(dump):
    b = RawDumpBuilder(dump)
    outer = b.cell("outer", "Outer", ("x",))
    inner = b.cell("outer.inner", "Inner", ("x",))
    b.write_manifest()
    s = b.step(0)
    _two_nested_forward_calls(s, outer, inner, explicit=False)  # unknown call numbers ("nx")
    # backward runs in reverse: the gradient of forward call 1 comes first
    for k in (1, 0):
        s.tensor(outer, B, OUT, (0,), np.full((2,), 50.0 + k, np.float32))
        s.tensor(inner, B, OUT, (0,), np.full((2,), 60.0 + k, np.float32))
        s.tensor(inner, B, A, (0,), np.full((2,), 70.0 + k, np.float32))
        s.tensor(outer, B, A, (0,), np.full((2,), 80.0 + k, np.float32))
    s.done(0)
    assert process_dump(dump, jobs=1).ok
    result = read_output(dump, 0)
    data, construct = result["dump"]["data"], result["construct"]
    for k in range(2):
        assert data[f"Cell.outer.Outer.forward.{k}"]["input_args"][0]["Max"] == 10.0 + k
        assert data[f"Cell.outer.inner.Inner.forward.{k}"]["output"][0]["Max"] == 30.0 + k
        assert data[f"Cell.outer.Outer.backward.{k}"]["input_args"][0]["Max"] == 50.0 + k
        assert data[f"Cell.outer.inner.Inner.backward.{k}"]["output"][0]["Max"] == 70.0 + k
        # each inner call hangs under the outer call that was running
        assert construct[f"Cell.outer.inner.Inner.forward.{k}"] == f"Cell.outer.Outer.forward.{k}"
        assert construct[f"Cell.outer.inner.Inner.backward.{k}"] == f"Cell.outer.Outer.backward.{k}"
    assert list(data)[:2] == ["Cell.outer.Outer.forward.0", "Cell.outer.inner.Inner.forward.0"]
    assert list(data)[4] == "Cell.outer.Outer.backward.1"


def test_explicit_calls_and_tensordump_in_mode(dump):
    b = RawDumpBuilder(dump)
    cell = b.cell("c", "C", ("x",))
    b.write_manifest()
    s = b.step(0)
    s.tensor(cell, F, A, (0,), np.ones(2, np.float32), call=3, in_mode=True)
    s.tensor(cell, F, A, (0,), np.zeros(2, np.float32), call=1)
    s.done(0)
    assert process_dump(dump, jobs=1).ok
    data = read_output(dump, 0)["dump"]["data"]
    assert list(data) == ["Cell.c.C.forward.3", "Cell.c.C.forward.1"]
    assert data["Cell.c.C.forward.3"]["input_args"][0]["Max"] == 1.0


def test_distributed_rank_folder_and_graph_step_numbering(dump):
    b = RawDumpBuilder(dump, rank=3, distributed=True, step_numbering="graph", graph_step_base=10)
    cell = b.cell("c", "C")
    b.write_manifest()
    s = b.step(2)
    s.tensor(cell, F, A, (0,), _arr(1))
    s.done(12)  # the marker names the global step: folder step 2 + graph_step_base 10
    b2 = RawDumpBuilder(dump, rank=1, distributed=True, cells=list(b.cells))
    b2.write_manifest()
    s2 = b2.step(12)
    s2.tensor(cell, F, A, (0,), _arr(1))
    s2.done(12)
    report = process_dump(dump, jobs=1)
    assert report.ok
    assert sorted(os.listdir(os.path.join(dump, "step12"))) == ["rank1", "rank3"]
    body = read_output(dump, 12, "rank3")["dump"]
    assert body["dump_data_dir"].endswith(os.path.join("step12", "rank3", "dump_tensor_data"))


def test_statistics_task_records_md5_nan_inf_and_torn_line(dump):
    stats = ("max", "min", "mean", "norm", "md5", "nan_count", "inf_count")
    b = RawDumpBuilder(dump, task="statistics", statistics=stats, backend="host")
    cell = b.cell("c", "C", ("x",))
    b.write_manifest()
    s = b.step(0)
    given = {
        "Max": 1.0,
        "Min": -1.0,
        "Mean": 0.0,
        "Norm": 2.0,
        "md5": "0000abcd",
        "nan_count": 1,
        "inf_count": 0,
    }
    s.record(cell, F, A, (0,), array=_arr(1), stats=given, call=0)
    weird = np.array([1.0, np.nan, np.inf, -2.0], np.float32)
    s.tensor(cell, F, OUT, (0,), weird, call=0)  # a file in a statistics task: statistics only, no data file
    with open(os.path.join(s.path, fmt.RECORDS_FILE), "a") as handle:
        handle.write('{"seq": 99, "cell": 0, "di')  # torn: the run was killed mid-line
    s.done(0)
    report = process_dump(dump, jobs=1)
    assert report.ok, report.summary()
    assert any("torn last line" in w for o in report.outcomes for w in o.warnings)
    result = read_output(dump, 0)
    body = result["dump"]
    assert body["task"] == "statistics" and body["dump_data_dir"] is None
    assert not os.path.exists(os.path.join(result["folder"], fmt.TENSOR_DIR))
    entry = body["data"]["Cell.c.C.forward.0"]
    record = entry["input_args"][0]
    assert record == {"type": "mindspore.Tensor", "dtype": "Float32", "shape": [3, 4], **given}
    out = entry["output"][0]
    assert "data_name" not in out
    assert np.isnan(out["Max"]) and np.isnan(out["Min"]) and out["nan_count"] == 1 and out["inf_count"] == 1
    assert out["md5"] == f"{zlib.crc32(weird.tobytes()):08x}"


def test_md5_of_bfloat16_is_crc_of_float32_bytes(dump):
    b = RawDumpBuilder(dump, statistics=("max", "md5"))
    cell = b.cell("c", "C")
    b.write_manifest()
    s = b.step(0)
    data = _arr(3)
    s.tensor(cell, F, A, (0,), data, call=0, dtype_name="bfloat16")
    s.done(0)
    assert process_dump(dump, jobs=1).ok
    record = read_output(dump, 0)["dump"]["data"]["Cell.c.C.forward.0"]["input_args"][0]
    assert record["dtype"] == "BFloat16"
    assert record["md5"] == f"{zlib.crc32(data.tobytes()):08x}" and len(record["md5"]) == 8
    assert set(record) == {"type", "dtype", "shape", "Max", "md5", "data_name"}


def test_large_tensor_statistics_are_streamed_in_chunks(dump, monkeypatch):
    monkeypatch.setattr(npystats, "CHUNK_BYTES", 4096)
    stats = ("max", "min", "mean", "norm", "md5", "nan_count", "inf_count")
    b = RawDumpBuilder(dump, statistics=stats)
    cell = b.cell("c", "C")
    b.write_manifest()
    s = b.step(0)
    big = _arr(9, shape=(100, 333))
    big[5, 7] = np.inf
    ints = np.arange(50_000, dtype=np.int64) - 7
    s.tensor(cell, F, A, (0,), big, call=0)
    s.tensor(cell, F, A, (1,), ints, call=0)
    s.tensor(cell, F, A, (2,), np.asfortranarray(_arr(4, shape=(300, 50))), call=0)
    s.done(0)
    assert process_dump(dump, jobs=1).ok
    args = read_output(dump, 0)["dump"]["data"]["Cell.c.C.forward.0"]["input_args"]
    assert args[0]["Max"] == np.inf and args[0]["inf_count"] == 1 and args[0]["nan_count"] == 0
    finite = big.astype(np.float64)
    assert args[0]["Min"] == pytest.approx(float(big.min()))
    assert args[0]["Mean"] == np.inf or args[0]["Mean"] == pytest.approx(finite.mean())
    assert args[0]["md5"] == f"{zlib.crc32(big.tobytes()):08x}"
    _assert_stats(args[1], ints)
    assert args[1]["Max"] == 49_992 and isinstance(args[1]["Max"], int)
    assert args[2]["md5"] == f"{zlib.crc32(np.ascontiguousarray(_arr(4, shape=(300, 50))).tobytes()):08x}"
    _assert_stats(args[2], _arr(4, shape=(300, 50)))


def test_kbk_statistic_csv(dump):
    b = RawDumpBuilder(dump, task="statistics", backend="kbk_statistics", graph_step_base=5)
    cell = b.cell("net.fc", "Dense", ("x",))
    b.write_manifest()
    x, y = _arr(1), _arr(2, dtype=np.float16)
    kin = fmt.Key(cell, F, A, fmt.KIND_TENSOR, (0,), None)
    kout = fmt.Key(cell, F, OUT, fmt.KIND_TENSOR, (0,), None)
    other = {"Op Type": "MatMul", "Op Name": "Default/network/MatMul-op3", "IO": "input", "Slot": 0,
             "Data Type": "float32", "Shape": "(3,4)", "Timestamp": 5}  # fmt: skip
    rows = kbk_rows(kout, y, timestamp=300) + [other] + kbk_rows(kin, x, timestamp=100)
    b.kbk_csv(2, rows)
    b.kbk_csv(3, kbk_rows(kin, x, timestamp=100))  # a later iteration: step 8
    report = process_dump(dump, jobs=1, steps=[7])
    assert report.ok, report.summary()
    entry = read_output(dump, 7)["dump"]["data"]["Cell.net.fc.Dense.forward.0"]
    _assert_stats(entry["input_args"][0], x)
    assert entry["input_args"][0]["dtype"] == "Float32" and entry["input_args"][0]["shape"] == [3, 4]
    assert entry["output"][0]["dtype"] == "Float16"
    _assert_stats(entry["output"][0], y)
    kbk = os.path.join(b.rank_dir, fmt.KBK_DIR, "Net", "0")
    assert sorted(os.listdir(kbk)) == ["3"]  # iteration 2 consumed and removed, 3 left (not selected)


def test_selection_and_only_complete(dump):
    b = RawDumpBuilder(dump)
    cell = b.cell("c", "C")
    b.write_manifest()
    for step in range(4):
        s = b.step(step)
        s.tensor(cell, F, A, (0,), _arr(step))
        if step != 3:
            s.done(step)
    report = process_dump(dump, jobs=1, steps=[1, 2, 3], only_complete=True)
    assert sorted(o.step for o in report.processed) == [1, 2]
    assert [o.status for o in report.outcomes if o.step == 3] == ["skipped-incomplete"]
    assert not os.path.exists(os.path.join(dump, "step0"))
    report = process_dump(dump, jobs=1)
    assert sorted(o.step for o in report.processed) == [0, 3]
    step3 = [o for o in report.processed if o.step == 3][0]
    assert not step3.complete and not step3.raw_removed
    # Never a partial step passed off as whole: named, with what it holds, its raw data kept, a problem.
    assert not report.ok
    assert [p for p in report.all_problems if "INCOMPLETE: step 3 rank 0" in p and "1 entry" in p]
    assert "no completion marker" in report.summary()
    assert os.path.isdir(os.path.join(b.rank_dir, "step3"))
    again = process_dump(dump, jobs=1)  # every run says so again; the complete steps are done
    assert [o.step for o in again.processed] == [3] and not again.ok


POOL_SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.DEBUG)
from mf_celldump.processing import worker_pool
from mf_celldump.processing.driver import process_dump
worker_pool.MIN_FILES_PER_WORKER = 100  # use the pool on this small dump
report = process_dump(sys.argv[1], jobs=2)
assert report.ok and report.files == 1000, report.summary()
"""


def test_pool_gives_same_result_as_single_process(tmp_path):
    """jobs=2 forks a pool (in a fresh process: never from one holding MindSpore); same bytes as jobs=1."""
    outputs = []
    for jobs in (1, 2):
        dump = str(tmp_path / f"d{jobs}")
        b = RawDumpBuilder(dump)
        cells = [b.cell(f"m.layers.{i}", "L", ("x",)) for i in range(100)]
        b.write_manifest()
        s = b.step(0)
        for k in range(5):
            for cell in cells:
                s.tensor(cell, F, A, (0,), _arr(cell * 10 + k, shape=(8,)))
                s.tensor(cell, F, OUT, (0,), _arr(cell * 10 + k + 5, shape=(8,)))
        s.done(0)
        if jobs == 1:
            assert process_dump(dump, jobs=1).files == 1000
        else:
            proc = subprocess.run(
                [sys.executable, "-c", POOL_SCRIPT, dump],
                capture_output=True,
                text=True,
                timeout=300,
                cwd=REPO,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert "started 2 worker processes" in proc.stderr
        with open(os.path.join(dump, "step0", "rank", "dump.json")) as handle:
            outputs.append(handle.read().replace(dump, "DUMP"))
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0])["data"]["Cell.m.layers.7.L.forward.4"]["input_args"][0]["shape"] == [8]


@pytest.mark.parametrize("gqa", [True, False])
def test_call_inference_pairs_gradients_by_shape(dump, gqa):
    """A cell applied to two independent tensors (Qwen3's rotary on query, then key) whose gradients arrive
    in call order, not reverse: with different shapes each gradient goes to the call of its shape; with
    equal shapes nothing tells the calls apart and the reverse-order rule stands."""
    b = RawDumpBuilder(dump)
    rotary = b.cell("rotary", "Rotary", ("x",))
    b.write_manifest()
    s = b.step(0)
    shapes = [(2, 4, 8), (2, 2, 8)] if gqa else [(2, 4, 8), (2, 4, 8)]
    for k, shape in enumerate(shapes):
        s.tensor(rotary, F, A, (0,), np.full(shape, 10.0 + k, np.float32))
        s.tensor(rotary, F, OUT, (0,), np.full(shape, 20.0 + k, np.float32))
    for k, shape in enumerate(shapes):  # gradients in call order
        s.tensor(rotary, B, OUT, (0,), np.full(shape, 30.0 + k, np.float32))
        s.tensor(rotary, B, A, (0,), np.full(shape, 40.0 + k, np.float32))
    s.done(0)
    assert process_dump(dump, jobs=1).ok
    data = read_output(dump, 0)["dump"]["data"]
    for k in range(2):
        grad_of = k if gqa else 1 - k  # equal shapes: the k-th gradient counted from the end is call k
        backward, forward = data[f"Cell.rotary.Rotary.backward.{k}"], data[f"Cell.rotary.Rotary.forward.{k}"]
        assert backward["input_args"][0]["Max"] == 30.0 + grad_of
        assert backward["output"][0]["Max"] == 40.0 + grad_of
        assert backward["input_args"][0]["shape"] == forward["output"][0]["shape"]


def test_backward_parents_mirror_the_forward_tree(dump):
    """``child.backward.k`` goes under the backward of the call holding ``child.forward.k``, even when
    graph mode records the parent's gradient after the child's (capture ops with no consumer are
    scheduled freely): order alone would put the child under the parent's other call."""
    b = RawDumpBuilder(dump)
    scale = b.cell("scale", "Scale", ("x",))
    dense = b.cell("scale.dense", "Dense", ("x",))
    b.write_manifest()
    s = b.step(0)
    _two_nested_forward_calls(s, scale, dense, explicit=True)
    # backward as graph mode wrote it: call 1's parent first, then both children, then call 0's parent
    s.tensor(scale, B, OUT, (0,), np.full((2,), 5.0, np.float32), call=1)
    s.tensor(dense, B, OUT, (0,), np.full((2,), 6.0, np.float32), call=1)
    s.tensor(dense, B, OUT, (0,), np.full((2,), 7.0, np.float32), call=0)
    s.tensor(scale, B, OUT, (0,), np.full((2,), 8.0, np.float32), call=0)
    s.done(0)
    assert process_dump(dump, jobs=1).ok
    construct = read_output(dump, 0)["construct"]
    for d in ("forward", "backward"):
        for k in range(2):
            assert construct[f"Cell.scale.dense.Dense.{d}.{k}"] == f"Cell.scale.Scale.{d}.{k}"
            assert construct[f"Cell.scale.Scale.{d}.{k}"] is None
