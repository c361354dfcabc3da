"""bfloat16 and float16 at every cell boundary, both modes, both tasks, every backend that runs here.

What must hold (msprobe saves MindSpore tensors this way): ``dump.json`` names the dtype
(``BFloat16``, ``Float16``); a tensor file holds the exact values (bfloat16 as float32
data); statistics are computed in float32 or wider. The Ascend graph backends run through
the emulation, whose statistics kernels, like MindSpore's, return a bfloat16/float16
input's statistics rounded to that dtype: the statistics backend dumps a float32 copy so
they come out in float32. Values are checked against a PyNative run without capture.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

import mf_celldump
from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives
from tests.support import low_precision_net as lp
from tests.support.ascend_emulation import AscendEmulator
from tests.support.processed import read_output

CASES = [
    ("pynative", "tensordump", "tensor"),
    ("pynative", "host", "tensor"),
    ("pynative", "host", "statistics"),
    ("pynative", "device_stats", "statistics"),
    ("graph", "host", "tensor"),
    ("graph", "host", "statistics"),
    ("graph", "tensordump", "tensor"),  # emulated Ascend
    ("graph", "kbk_statistics", "statistics"),  # emulated Ascend
]
EMULATED = ("tensordump", "kbk_statistics")
STAT_KEYS = ("Max", "Min", "Mean", "Norm")


@pytest.fixture(scope="module")
def reference():
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    return lp.reference(lp.make_net(), lp.make_input())


def _capture(path, mode, backend, task):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    net = lp.make_net()
    train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.0))
    emulator = AscendEmulator() if mode == "graph" and backend in EMULATED else None
    config = {"dump_path": str(path), "task": task, "backend": backend, "parameters": False,
              "process_on_train_end": False}
    with pytest.MonkeyPatch.context() as patch:
        if emulator is not None:
            patch.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
        try:
            dump = mf_celldump.attach(train, config)
            with dump.step(0):
                train(lp.make_input())
            dump.detach()
            if emulator is not None:
                emulator.drain()
        finally:
            if emulator is not None:
                emulator.close()
    report = mf_celldump.process_captured(dump)
    assert report.ok, report.summary()
    return read_output(str(path), 0)


def _bf16_exact(array: np.ndarray) -> bool:
    """Every value is a bfloat16 value (the low half of each float32 is zero)."""
    return array.dtype == np.float32 and not (array.view(np.uint32) & np.uint32(0xFFFF)).any()


def _check_tensor(array, want, dtype):
    if dtype == "BFloat16":
        assert _bf16_exact(array), "bfloat16 data must be saved exactly, as float32"
    else:
        assert array.dtype == {"Float16": np.float16, "Float32": np.float32}[dtype]
    np.testing.assert_array_equal(array.astype(np.float32), want)


def _check_statistics(leaf, want):
    wide = want.astype(np.float64)
    expected = {"Max": wide.max(), "Min": wide.min(), "Mean": wide.mean(), "Norm": np.sqrt((wide * wide).sum())}
    for key in STAT_KEYS:
        # float32 or wider: a statistic rounded to bfloat16/float16 misses this by 1e-3 to 1e-2
        assert leaf[key] == pytest.approx(expected[key], rel=2e-6, abs=1e-6), key


@pytest.mark.parametrize("mode,backend,task", CASES)
def test_low_precision_boundaries_keep_dtype_and_exact_values(tmp_path, reference, mode, backend, task):
    leaves, arrays = _capture(tmp_path, mode, backend, task)
    for key, (dtype, want) in reference.items():
        assert key in leaves, f"{key} not in dump.json"
        leaf = leaves[key]
        assert leaf["dtype"] == dtype and list(leaf["shape"]) == list(want.shape), key
        if task == "tensor":
            _check_tensor(arrays[leaf["data_name"]], want, dtype)
        else:
            _check_statistics(leaf, want)
