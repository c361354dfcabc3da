"""PyNative tensor task on CPU: the raw writer's thread writes exactly what MindSpore's TensorDump wrote.

On CPU TensorDump writes each file synchronously on the training thread; capture now hands
the tensors to the raw writer's thread, which writes TensorDump's name, header and bytes
itself (``rawformat.npy_files``). The same training is captured both ways, each in a fresh
process as a user's run would be (the old path forced by ``backend.host_files = False``):
every raw file has the same name and bytes, and the processed msprobe output is the same
byte for byte.
"""

import os
import re
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn, ops

import mf_celldump
from mf_celldump.layout.naming import RUN_ID_KEY
from mf_celldump.rawformat.npy_files import tensordump_header
from tests.support import capture_net as cn

_ID = re.compile(r"_(\d+)\.npy$")


class Widths(nn.Cell):
    """float16, bfloat16 (TensorDump writes it as float32 data), a transposed view and an int output."""

    def construct(self, x, w):
        return ops.cast(x, ms.float16) * 2, ops.cast(x * w, ms.bfloat16), x.T, (x > 0).astype(ms.int32)


class MixedNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.full((4,), 2.0, np.float32)), name="w")  # passed as an argument
        self.widths = Widths()
        self.inner = cn.make_net()  # deterministic weights: the two runs train alike

    def construct(self, x):
        half, brain, flipped, count = self.widths(x[:, :4], self.w)
        loss = self.inner(x[:, :4])
        return loss + ops.cast(half, ms.float32).mean() + ops.cast(brain, ms.float32).mean() + flipped.mean()


def _capture(path: str, host_files: bool) -> None:
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    net = MixedNet()
    train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1))
    dump = mf_celldump.attach(train, {"dump_path": path, "task": "tensor", "backend": "tensordump"})
    assert dump.backend.host_files, "MindSpore's TensorDump on CPU: the writer thread writes its files"
    dump.backend.host_files = host_files
    x = Tensor(np.random.RandomState(7).randn(2, 4).astype(np.float32))
    for step in range(2):
        with dump.step(step):
            train(x)
    dump.detach()


def _raw_files(path: str) -> dict:
    """step folder -> [(name without its id, id, bytes)] sorted by id."""
    out = {}
    rank = os.path.join(path, "_raw", "rank0")
    for step in sorted(d for d in os.listdir(rank) if d.startswith("step")):
        files = []
        for name in os.listdir(os.path.join(rank, step)):
            match = _ID.search(name)
            if match is None:
                continue
            with open(os.path.join(rank, step, name), "rb") as handle:
                files.append((name[:match.start()], int(match.group(1)), handle.read()))
        out[step] = sorted(files, key=lambda item: (item[1], item[0]))
    return out


def _output(path: str) -> dict:
    """Relative path -> bytes of every processed file (the dump folder's own path written as DUMP, each
    run's own id in ``dump.json`` written as RUN)."""
    out = {}
    for folder, _, names in os.walk(path):
        if "_raw" in os.path.relpath(folder, path).split(os.sep):
            continue
        for name in names:
            full = os.path.join(folder, name)
            with open(full, "rb") as handle:
                data = handle.read().replace(os.path.realpath(path).encode(), b"DUMP")
            data = re.sub(rb'("%s": )"[^"]*"' % RUN_ID_KEY.encode(), rb'\1"RUN"', data)
            out[os.path.relpath(full, path)] = (data, oct(os.stat(full).st_mode & 0o777))
    return out


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """Both captures, each in a fresh process (TensorDump's id counter is per process, from 0)."""
    root = tmp_path_factory.mktemp("tensordump_host_files")
    dumps = {}
    env = dict(os.environ, PYTHONPATH=REPO, GLOG_v="3")
    for label, host_files in (("tensordump", "0"), ("writer", "1")):
        path = str(root / label)
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), path, host_files], cwd=str(root), env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        dumps[label] = (path, _raw_files(path))
    return dumps


def test_raw_files_are_the_bytes_tensordump_wrote(both):
    old, new = both["tensordump"][1], both["writer"][1]
    assert old.keys() == new.keys() == {"step0", "step1"}
    for step in old:
        assert new[step] == old[step], step
    stems = {stem for stem, _, _ in old["step0"]}
    assert any(stem.endswith("_bfloat16") for stem in stems) and any(stem.endswith("_float16") for stem in stems)


def test_processed_output_is_byte_identical(both):
    outputs = {}
    for label, (path, _) in both.items():
        report = mf_celldump.process_dump(path, jobs=1)
        assert report.ok, report.summary()
        outputs[label] = _output(path)
    assert outputs["writer"] == outputs["tensordump"]
    assert sum(1 for name in outputs["writer"] if name.endswith(".npy")) > 100


def test_tensordump_header_matches_the_op(tmp_path):
    """MindSpore's own header spelling (``(2,3,)``, 64-byte padding) for the shapes and dtypes capture meets."""
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    dump = ops.TensorDump()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(dtype) for shape in [(), (3,), (2, 3), (2, 64, 128), (1, 1, 1, 7)]
              for dtype in (np.float32, np.float16, np.float64)]
    arrays += [np.array([[True, False]]), np.arange(6, dtype=np.int64).reshape(3, 2), np.arange(3, dtype=np.uint8)]
    for i, array in enumerate(arrays):
        dump(str(tmp_path / f"a{i}"), Tensor(array))
    for i, array in enumerate(arrays):
        [name] = [n for n in os.listdir(tmp_path) if n.startswith(f"a{i}_")]
        with open(tmp_path / name, "rb") as handle:
            assert handle.read() == tensordump_header(array) + np.ascontiguousarray(array).tobytes(), name


if __name__ == "__main__":  # one capture, in this fresh process: python <this file> DUMP_PATH 0|1
    _capture(sys.argv[1], sys.argv[2] == "1")
