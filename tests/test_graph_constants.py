"""Graph-mode capture keeps compile-time constants constant.

tests/support/constants_net.py compiles only if its non-tensor arguments (``None``, ints, flags,
a tuple mixing them with a tensor, ``**kwargs``) stay constants to MindSpore's compiler.
With capture attached it must compile and train bitwise as without, in every task and
data_mode, and the constants must still be recorded, once per call, with the values and
names PyNative records.
"""

import os

import mindspore as ms
import numpy as np
import pytest

import mf_celldump
from tests.support import constants_net as cnet
from tests.support import formats as fmt
from tests.support.rawread import read_manifest, read_step

STEPS = 2


def _train(mode, config=None):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    net = cnet.Top()
    train = cnet.train_one_step_cell(net)
    dump = mf_celldump.attach(train, config) if config is not None else None
    losses = []
    for step in range(STEPS):
        if dump is not None:
            dump.begin_step(step)
        losses.append(train(cnet.make_input()).asnumpy())
        if dump is not None:
            dump.end_step()
    if dump is not None:
        dump.detach()
    weights = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    return losses, weights


def _records(dump_path, step):
    rank_dir = os.path.join(dump_path, fmt.RAW_ROOT, fmt.raw_rank_dir_name(0))
    manifest = read_manifest(rank_dir)
    return read_step(os.path.join(rank_dir, fmt.step_dir_name(step)), manifest)


@pytest.fixture(scope="module")
def graph_baseline():
    return _train("graph")


@pytest.mark.parametrize("task", ["tensor", "statistics"])
@pytest.mark.parametrize("data_mode", ["forward", "backward", "all"])
def test_graph_capture_compiles_and_trains_bitwise_unchanged(tmp_path, graph_baseline, task, data_mode):
    want_losses, want_weights = graph_baseline
    config = {"dump_path": str(tmp_path), "task": task, "data_mode": data_mode, "backend": "host"}
    losses, weights = _train("graph", config)
    for got, want in zip(losses, want_losses):
        np.testing.assert_array_equal(got, want)
    for name, value in want_weights.items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)
    records = _records(str(tmp_path), 1)
    directions = {key[1] for key in records}
    assert directions == ({"forward", "backward"} if data_mode == "all" else {data_mode})


EXPLICIT_CONSTANTS = {  # what the net passes explicitly: (cell, slot, path, call) -> value
    ("model", "a", (1,), 0): None,
    ("model", "a", (2,), 0): None,
    ("model.block", "a", (2,), 0): None,  # reached through a dict spread by keyword
    ("model.repeat", "a", (1,), 0): 2,
    ("model.repeat", "a", (1,), 1): 1,
    ("model.repeat", "a", (2,), 1): False,
    ("model.pick", "a", (0, 1), 0): None,
    ("model.pick", "a", (0, 2), 0): 3,
}


def _forward_values(records):
    return {(cell, slot, path, call): rec["value"] for (cell, direction, slot, path, call), rec in records.items()
            if direction == "forward" and isinstance(rec, dict)}


def test_graph_records_constants_once_per_call_as_pynative_does(tmp_path):
    dumps = {}
    for mode in ("pynative", "graph"):
        path = str(tmp_path / mode)
        _train(mode, {"dump_path": path, "task": "tensor", "data_mode": "all", "backend": "host"})
        dumps[mode] = _records(path, 1)
    graph_values, pynative_values = _forward_values(dumps["graph"]), _forward_values(dumps["pynative"])
    for key, value in EXPLICIT_CONSTANTS.items():
        assert key in graph_values, f"graph mode did not record {key}"
        assert graph_values[key] == value and type(graph_values[key]) is type(value), key
    assert graph_values == pynative_values
    tensors = {key for key, value in dumps["graph"].items() if not isinstance(value, dict)}
    assert tensors == {key for key, value in dumps["pynative"].items() if not isinstance(value, dict)}
    for key in tensors:
        np.testing.assert_array_equal(dumps["graph"][key], dumps["pynative"][key], err_msg=str(key))


_QUIET_SCRIPT = """
import sys, tempfile, glob, os
sys.path.insert(0, {root!r})
import mindspore as ms
import mf_celldump
from tests.support import constants_net as cnet
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
net = cnet.Top()
train = cnet.train_one_step_cell(net)
dump = mf_celldump.attach(train, {{"dump_path": {dump!r}, "task": "statistics"}})
dump.begin_step(0)
train(cnet.make_input())
dump.end_step()
print("DURING", sorted(os.listdir(tempfile.gettempdir())))
dump.detach()
print("AFTER", sorted(os.listdir(tempfile.gettempdir())))
"""


def test_compiling_wrappers_logs_no_missing_source_file_errors(tmp_path):
    """MindSpore reads each function's source file for debug info; a generated wrapper without
    a real file made it log "Get realpath failed" (ERROR) twice per compiled node."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = _QUIET_SCRIPT.format(root=root, dump=str(tmp_path / "dump"))
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, TMPDIR=str(temp))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "Get realpath failed" not in output
    assert "may not exists" not in output
    during = [line for line in proc.stdout.splitlines() if line.startswith("DURING")][0]
    assert "mf_celldump-constructs-" in during  # the generated sources are real files while attached
    assert "AFTER []" in proc.stdout  # and are removed at detach
