"""Cells under ``Cell.recompute()`` (MindFormers' full recompute) in both modes.

MindSpore runs a recomputed cell's forward again during backward, which would run our capture ops a
second time: an extra forward call per cell and gradients filed under it. Graph mode with the host
backend keeps its capture ops out of the recomputed forward, so the dump equals the dump without
recompute; where that is not done (PyNative, the other graph backends) attach refuses with a message
naming the cells and the workaround, and a selection that leaves them out dumps the other cells as
it would without recompute.
"""

import numpy as np
import pytest

import mf_celldump
from mf_celldump.capture.backends.host import HostBackend
from mf_celldump.capture.session import find_attached
from mf_celldump.errors import AttachError, StepError
from tests.support import capture_net as cn
from tests.support.ascend_emulation import AscendEmulator
from tests.support.ascend_runs import run_training
from tests.support.processed import read_output
from tests.support.rawread import raw_steps, read_step


def _step_records(dump_path):
    """{(cell name, dir, slot, path, call): value} of step 0, forward and backward (``rawread``)."""
    manifest, steps = raw_steps(dump_path)
    out = {}
    for key, value in read_step(steps[0], manifest).items():
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in ("seq", "t", "time")}
        out[key] = value
    return out


def _dump_one_step(mode, config, recompute):
    """Step 0 of the capture net, ``split`` (and so ``split.proj``) under recompute or not; its records."""
    cn.set_mode(mode)
    net = cn.make_net()
    if recompute:
        net.split.recompute()
    train = cn.train_one_step_cell(net)
    dump = mf_celldump.attach(train, config)
    dump.begin_step(0)
    loss = train(cn.make_input()).asnumpy()
    dump.end_step()
    dump.detach()
    return loss, _step_records(config["dump_path"])


def _assert_same_dump(with_recompute, without):
    assert with_recompute.keys() == without.keys()
    for key, value in without.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(with_recompute[key], value, err_msg=str(key))
        else:
            assert with_recompute[key] == value, key


@pytest.mark.parametrize("task, in_graph", [("tensor", None), ("statistics", None), ("statistics", True)])
def test_graph_host_dump_under_recompute_equals_the_dump_without(tmp_path, monkeypatch, task, in_graph):
    """``in_graph``: statistics reduced inside the graph (as on a device) rather than by the host op."""
    monkeypatch.setattr(HostBackend, "reduce_in_graph", in_graph)
    config = {"task": task, "steps": "0", "backend": "host"}
    loss_on, on = _dump_one_step("graph", {**config, "dump_path": str(tmp_path / "on")}, True)
    loss_off, off = _dump_one_step("graph", {**config, "dump_path": str(tmp_path / "off")}, False)
    np.testing.assert_array_equal(loss_on, loss_off)
    # one forward call of the recomputed cells, their gradients under it
    assert {key[4] for key in on if key[0].startswith("split")} == {0}
    assert ("split.proj", "backward", "g", (0,), 0) in on and ("split", "backward", "o", (0,), 0) in on
    _assert_same_dump(on, off)


def _recomputed_net():
    net = cn.make_net()
    net.split.recompute()
    return net


@pytest.mark.parametrize("task, backend", [("tensor", "tensordump"), ("statistics", "kbk_statistics")])
def test_emulated_ascend_graph_dump_under_recompute_equals_the_dump_without(tmp_path, task, backend):
    """The Ascend backends mark TensorDump and DumpGradient ``recompute=False``; the emulation hands the
    attribute to its stand-in kernels, which are graph nodes like MindSpore's, and MindSpore's own recompute
    pass (frontend, the same on Ascend) does the rest: one forward call per cell, its gradients under it."""
    outputs, launched = {}, {}
    for name, factory in (("on", _recomputed_net), ("off", cn.make_net)):
        emulator = AscendEmulator()
        try:
            _, summary = run_training(tmp_path / name, {"task": task, "backend": backend, "steps": "0"}, emulator,
                                      steps=1, net_factory=factory)
            emulator.drain()
        finally:
            emulator.close()
        assert summary.problems == [] and summary.captured_steps == [0]
        outputs[name] = read_output(str(tmp_path / name), 0)
        launched[name] = len(emulator.written_files)
    (leaves_on, arrays_on), (leaves_off, arrays_off) = outputs["on"], outputs["off"]
    assert any(".split." in entry for entry, _, _ in leaves_off)
    split_calls = {entry for entry, _, _ in leaves_on if entry.startswith("Cell.split.") and ".forward." in entry}
    assert split_calls and not any(entry.endswith(".forward.1") for entry in split_calls)  # no second call
    assert leaves_on.keys() == leaves_off.keys() and launched["on"] == launched["off"]
    for key, leaf in leaves_off.items():
        assert {k: v for k, v in leaves_on[key].items()} == leaf, key
    assert arrays_on.keys() == arrays_off.keys()
    for file_name, array in arrays_off.items():
        np.testing.assert_array_equal(arrays_on[file_name], array, err_msg=file_name)


@pytest.mark.parametrize("mode, backend", [("pynative", None), ("graph", "device_stats")])
def test_attach_refuses_cells_under_recompute_and_says_how_to_dump(tmp_path, mode, backend):
    cn.set_mode(mode)
    net = cn.make_net()
    net.split.recompute()
    train = cn.train_one_step_cell(net)
    plain_construct = net.split.construct
    config = {"dump_path": str(tmp_path), "task": "statistics", "steps": "0"}
    if backend:
        config["backend"] = backend
    with pytest.raises(AttachError) as caught:
        mf_celldump.attach(train, config)
    message = str(caught.value)
    assert "2 selected cells run under recompute ('split', 'split.proj'" in message
    assert "recompute() was called on 'split'" in message
    assert ("graph mode the device_stats backend's capture ops" if mode == "graph" else "PyNative") in message
    assert "second forward call" in message
    assert "Turn recompute off for the dumped run" in message and "recompute: false" in message
    # nothing stays attached: the cells are as built and the network trains
    assert find_attached(train) is None
    assert net.split.construct == plain_construct
    assert train(cn.make_input()).asnumpy().shape == ()


def test_pynative_dump_leaving_recomputed_cells_out_equals_the_dump_without_recompute(tmp_path):
    config = {"task": "statistics", "steps": "0", "exclude": ["split", "split.*"]}
    _, on = _dump_one_step("pynative", {**config, "dump_path": str(tmp_path / "on")}, True)
    _, off = _dump_one_step("pynative", {**config, "dump_path": str(tmp_path / "off")}, False)
    assert not any(key[0].startswith("split") for key in off)
    assert {key[1] for key in off} == {"forward", "backward"}
    _assert_same_dump(on, off)


def test_pynative_recompute_set_after_attach_refuses_the_selected_step(tmp_path):
    cn.set_mode("pynative")
    net = cn.make_net()
    train = cn.train_one_step_cell(net)
    dump = mf_celldump.attach(train, {"dump_path": str(tmp_path), "task": "statistics", "steps": "1"})
    net.split.recompute()
    dump.begin_step(0)  # not selected: runs as usual
    train(cn.make_input())
    with pytest.raises(StepError, match=r"step 1 is not captured: 2 selected cells run under recompute "
                                        r"\('split', 'split.proj'.*Turn recompute off"):
        dump.begin_step(1)
    dump.detach()


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_attach_refuses_cells_inside_a_checkpoint_wrapper_before_training(tmp_path, mode):
    """MindFormers 2.x recomputes through hyper_parallel's CheckpointWrapper (the layer held as
    ``_ckpt_wrapped_module``, run with ``mindspore.recompute``): under it a second forward would be recorded,
    and select recompute crashed training with hooks inside. Attach refuses, naming the cells and wrapper, and
    leaves the network as built: it trains."""
    from mindspore import nn

    class CheckpointWrapper(nn.Cell):
        """Holds the wrapped cell as hyper_parallel's wrapper does (what attach finds it by)."""

        def __init__(self, module):
            super().__init__()
            self._ckpt_wrapped_module = module

        def construct(self, x):
            return self._ckpt_wrapped_module(x)

    cn.set_mode(mode)
    net = cn.make_net()
    net.split = CheckpointWrapper(net.split)
    train = cn.train_one_step_cell(net)
    with pytest.raises(AttachError) as caught:
        mf_celldump.attach(train, {"dump_path": str(tmp_path), "task": "statistics", "steps": "0"})
    message = str(caught.value)
    assert "run inside hyper_parallel's CheckpointWrapper" in message and "wrappers: 'split'" in message
    assert "'split._ckpt_wrapped_module.proj'" in message or "'split._ckpt_wrapped_module'" in message
    assert "Stack input_args_info_stack_ is empty" in message and "recompute: {mode: None}" in message
    assert find_attached(train) is None
    assert train(cn.make_input()).asnumpy().shape == ()
    dump = mf_celldump.attach(train, {"dump_path": str(tmp_path / "other"), "task": "statistics", "steps": "0",
                                      "exclude": ["split", "split.*"]})
    dump.detach()
