"""Graph-mode statistics reduced inside the graph give the host path's numbers.

The host backend reduces float tensors by graph ops (float32 accumulation) and hands the
host a few numbers (the default on a device; forced here on CPU); the host path hands numpy
every tensor (float64 accumulation, the default on CPU). Both
run here on one network with float32, float16, NaN, integer and weight-gradient values:
the records must name the same values with the same dtypes and shapes, equal max/min
and counts, and mean/norm within float32 rounding. bfloat16 (which the host op cannot
receive on MindSpore 2.9) is checked against numpy directly.
"""

import json
import math
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import mf_celldump
from mf_celldump.capture.backends.host import HostBackend
from tests.support import formats as fmt

STATS = ["max", "min", "mean", "norm", "nan_count", "inf_count"]
X = np.array([[1.0, -2.0, 3.0, 0.5], [0.25, 4.0, -1.0, 2.0]], np.float32)


class Widths(nn.Cell):
    """The same values in float16, with a NaN (log of a negative number), and as integers."""

    def construct(self, x):
        half = ops.cast(x, ms.float16) * 2
        odd = ops.log(x - 3.0)
        count = (x > 3.0).astype(ms.int32)
        return half, odd, count


class Brain(nn.Cell):
    def construct(self, x):
        return ops.cast(x, ms.bfloat16) * 3


class Net(nn.Cell):
    def __init__(self, with_bfloat16: bool):
        super().__init__()
        self.lin = nn.Dense(4, 4, weight_init="ones", bias_init="zeros")
        self.widths = Widths()
        self.brain = Brain() if with_bfloat16 else None

    def construct(self, x):
        h = self.lin(x)
        half, odd, count = self.widths(h)
        loss = ops.cast(half, ms.float32).mean() + (h * h).mean()
        if self.brain is not None:
            loss = loss + ops.cast(self.brain(h), ms.float32).mean()
        return loss


def _records(tmp_path, name: str, reduce_in_graph: bool, with_bfloat16: bool = False) -> dict:
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    HostBackend.reduce_in_graph = reduce_in_graph
    try:
        net = Net(with_bfloat16)
        train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.01))
        dump_path = str(tmp_path / name)
        dump = mf_celldump.attach(train, {"dump_path": dump_path, "task": "statistics", "statistics": STATS})
        with dump.step(0):
            train(Tensor(X))
        dump.detach()
    finally:
        HostBackend.reduce_in_graph = None
    folder = os.path.join(dump_path, fmt.RAW_ROOT, "rank0", "step0")
    out = {}
    with open(os.path.join(folder, fmt.RECORDS_FILE)) as handle:
        for line in handle:
            rec = json.loads(line)
            out[(rec["cell"], rec["dir"], rec["slot"], rec["kind"], tuple(rec["path"]), rec["call"])] = rec
    return out


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def test_reduced_in_graph_equal_host_numpy(tmp_path):
    in_graph = _records(tmp_path, "graph", True)
    on_host = _records(tmp_path, "host", False)
    assert set(in_graph) == set(on_host)
    assert any(r.get("dtype") == "Float16" for r in in_graph.values())
    assert any(r.get("stats", {}).get("nan_count") for r in in_graph.values()), "the NaN case is covered"
    for key, want in on_host.items():
        got = in_graph[key]
        if want["kind"] != fmt.KIND_TENSOR:
            assert got["value"] == want["value"]
            continue
        assert (got["dtype"], got["shape"]) == (want["dtype"], want["shape"]), key
        for name in ("Max", "Min", "nan_count", "inf_count"):
            assert _same(got["stats"][name], want["stats"][name]), (key, name, got["stats"], want["stats"])
        for name in ("Mean", "Norm"):
            if math.isnan(want["stats"][name]):
                assert math.isnan(got["stats"][name])
            else:
                assert got["stats"][name] == pytest.approx(want["stats"][name], rel=1e-5, abs=1e-7), (key, name)


def test_bfloat16_is_reduced_in_float32(tmp_path):
    """bfloat16 values (exact in float32 here) and their gradients: the numbers numpy gives."""
    records = _records(tmp_path, "bf16", True, with_bfloat16=True)
    brain = {r["dir"]: r for r in records.values() if r.get("dtype") == "BFloat16"}
    h = X @ np.ones((4, 4), np.float32).T  # the Dense of ones with a zero bias
    values = (h * 3).astype(np.float64)  # 7.5 and 15.75: exact in bfloat16
    forward = brain["forward"]["stats"]
    assert brain["forward"]["shape"] == [2, 4]
    assert (forward["Max"], forward["Min"], forward["nan_count"]) == (15.75, 7.5, 0)
    assert forward["Mean"] == pytest.approx(values.mean(), rel=1e-6)
    assert forward["Norm"] == pytest.approx(np.linalg.norm(values), rel=1e-6)
    gradient = brain["backward"]["stats"]  # d mean(x) / dx = 1/8 everywhere
    assert (gradient["Max"], gradient["Min"], gradient["Mean"]) == (0.125, 0.125, 0.125)
    assert gradient["Norm"] == pytest.approx(math.sqrt(8) * 0.125)
