"""Gradients of inputs that depend on no parameter, and inputs whose gradient cannot exist,
checked against ``mindspore.grad`` on the network of tests/support/input_grad_net.py.

As msprobe 26.2's L0 dump: the backward ``output.i`` of a call is the gradient w.r.t. its
i-th top-level tensor argument (a tuple argument takes no number); an attention-mask-like
input gets its gradient; a call whose tensor inputs are all integer gets an explicit null
per input and one log line per cell class.
"""

import json
import logging
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

import mf_celldump
from tests.support import formats as fmt
from tests.support import input_grad_net as gn
from tests.support.rawread import read_manifest, read_step

CASES = [("pynative", "tensordump"), ("pynative", "host"), ("pynative", "device_stats"), ("graph", "host")]


def _train(mode, config):
    gn.set_mode(mode)
    net = gn.make_net()
    train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1))
    inputs = gn.make_inputs()
    weights = gn.snapshot(net)
    dump = mf_celldump.attach(train, config)
    with dump.step(0):
        loss = train(*inputs).asnumpy()
    dump.detach()
    return loss, weights, dump


def _records(dump_path):
    rank_dir = os.path.join(dump_path, fmt.RAW_ROOT, fmt.raw_rank_dir_name(0))
    manifest = read_manifest(rank_dir)
    return read_step(os.path.join(rank_dir, fmt.step_dir_name(0)), manifest)


def _expected_gradients(weights):
    """d loss / d (each layer's mask, the head's inputs), by ``mindspore.grad`` of a fresh net."""
    gn.set_mode("pynative")
    net = gn.make_net(weights)
    ids, pair, mask, labels, row_weights = gn.make_inputs()
    other = ms.Tensor(mask.asnumpy().copy())  # a distinct tensor: PyNative autodiff tells inputs apart by object
    masks = ms.grad(lambda m0, m1: net.forward(ids, pair, (m0, m1), labels, row_weights), grad_position=(0, 1))(
        mask, other)
    head_in = net.layers[1](net.layers[0](net.embed(ids) + net.embed2(ids), pair, mask), pair, mask)
    head = ms.grad(lambda h, w: net.head(h, labels, w), grad_position=(0, 1))(head_in, row_weights)
    return {"layers.0": masks[0].asnumpy(), "layers.1": masks[1].asnumpy(),
            "head.0": head[0].asnumpy(), "head.2": head[1].asnumpy()}


@pytest.mark.parametrize("mode,backend", CASES)
def test_mask_gradient_and_int_inputs(tmp_path, caplog, mode, backend):
    config = {"dump_path": str(tmp_path), "task": "tensor" if backend != "device_stats" else "statistics",
              "backend": backend, "parameters": False, "process_on_train_end": False}
    gn.set_mode(mode)
    with caplog.at_level(logging.INFO, logger="mf_celldump"):
        loss, weights, dump = _train(mode, config)
    records = _records(str(tmp_path))
    expected = _expected_gradients(weights)
    for layer in ("layers.0", "layers.1"):
        # (x, pair, mask): the mask is the second top-level tensor argument -> backward slot a (1,)
        assert not any(key[:4] == (layer, "backward", "a", (2,)) for key in records)
        _check(_backward(records, layer, "a", (1,)), expected[layer], backend)
    _check(_backward(records, "head", "a", (0,)), expected["head.0"], backend)
    _check(_backward(records, "head", "a", (2,)), expected["head.2"], backend)
    label = _backward(records, "head", "a", (1,))  # what autodiff gives an int input (msprobe records it too)
    if backend != "device_stats":
        assert label.dtype == np.int32 and not label.any()
    for name in ("embed", "embed2"):  # int input only: an explicit null, no gradient
        assert records[(name, "backward", "a", (0,), 0)]["value"] is None
        assert (name, "forward", "a", (0,), 0) in records
    why = [r.getMessage() for r in caplog.records if "no gradient can exist" in r.getMessage()]
    assert len(why) == 1 and why[0].startswith("Lookup: ") and "Int32" in why[0], why
    nested = [r.getMessage() for r in caplog.records if "inside tuple/list arguments" in r.getMessage()]
    assert len(nested) == 1 and nested[0].startswith("Attend: ")
    # Processed: the null stands at output.0, the mask at output.1, in dump.json.
    mf_celldump.process_captured(dump)
    with open(os.path.join(str(tmp_path), "step0", "rank", "dump.json"), encoding="utf-8") as handle:
        data = json.load(handle)["data"]
    # Graph mode runs nn.TrainOneStepCell's forward twice where the probes keep it from merging the loss's
    # forward with the gradient's; the host backend's call numbers say which call got the gradient.
    backward = {cell: [n for n in data if n.startswith(f"Cell.{cell}.backward.")]
                for cell in ("embed.Lookup", "embed2.Lookup", "layers.0.Attend")}
    assert all(len(names) == 1 for names in backward.values()), backward
    assert data[backward["embed.Lookup"][0]]["output"] == [None]
    attend = data[backward["layers.0.Attend"][0]]["output"]
    assert len(attend) == 2 and attend[1]["shape"] == [gn.ROWS, gn.HIDDEN]
    # The null, written when the call ran forward, does not place the entry: backward entries follow the forward.
    order = list(data)
    for name in (backward["embed.Lookup"][0], backward["embed2.Lookup"][0]):
        assert order.index(name) > order.index("Cell.head.Head.forward.0")


def _backward(records, cell, slot, path):
    """The one backward record of ``cell`` at (slot, path), and the gradients w.r.t. the call's inputs and
    outputs belong to that same call (graph mode may run a forward without backward, see below)."""
    calls = {key[4] for key in records if key[:2] == (cell, "backward") and key[2] in ("a", "o")}
    found = [key for key in records if key[:4] == (cell, "backward", slot, path)]
    assert len(found) == 1 and calls == {found[0][4]}, (found, calls)
    return records[found[0]]


def _check(record, want, backend):
    if backend == "device_stats":
        _check_statistics(record["stats"], want)
    else:
        np.testing.assert_array_equal(record, want)


def _check_statistics(stats, want):
    """Max and Norm (the two a gradient's sign and size show in) against the expected array."""
    np.testing.assert_allclose(stats["Max"], want.max(), rtol=1e-6)
    np.testing.assert_allclose(stats["Norm"], np.linalg.norm(want.astype(np.float64)), rtol=1e-5)


@pytest.mark.parametrize("mode,backend", CASES)
def test_training_is_unchanged(tmp_path, mode, backend):
    """The one op per call changes no number: loss and updated weights bit for bit."""
    gn.set_mode(mode)
    baseline = gn.make_net()
    train = nn.TrainOneStepCell(baseline, nn.SGD(baseline.trainable_params(), 0.1))
    want = train(*gn.make_inputs()).asnumpy()
    config = {"dump_path": str(tmp_path), "task": "tensor" if backend != "device_stats" else "statistics",
              "backend": backend, "process_on_train_end": False}
    loss, _, dump = _train(mode, config)
    np.testing.assert_array_equal(loss, want)


@pytest.mark.parametrize("backend", ["tensordump", "kbk_statistics"])
def test_ascend_graph_backends_record_mask_gradients_and_nulls(tmp_path, caplog, backend):
    """Ascend graph mode through the CPU emulation (tests/support/ascend_emulation.py): input gradients go
    through DumpGradient, numbered as msprobe, behind one tie per call that keeps a mask's record
    alive, so the mask that depends on no parameter gets its gradient (equal to ``mindspore.grad``);
    an int-only call gets its explicit null."""
    from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives
    from mf_celldump.config import DumpConfig
    from mf_celldump.integrations.run import TrainingRun
    from tests.support.ascend_emulation import AscendEmulator

    gn.set_mode("graph")
    net = gn.make_net()
    weights = gn.snapshot(net)
    train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1))
    task = "tensor" if backend == "tensordump" else "statistics"
    emulator = AscendEmulator()
    run = TrainingRun(DumpConfig.coerce({"dump_path": str(tmp_path), "task": task, "backend": backend,
                                         "parameters": False}))
    try:
        with pytest.MonkeyPatch.context() as patch, caplog.at_level(logging.INFO, logger="mf_celldump"):
            patch.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
            run.ensure_attached(train)
            run.begin_step(0)
            train(*gn.make_inputs())
            run.end_step()
            summary = run.finish()
    finally:
        emulator.close()
    assert summary.problems == [], summary.text()
    with open(os.path.join(str(tmp_path), "step0", "rank", "dump.json"), encoding="utf-8") as handle:
        data = json.load(handle)["data"]
    expected = _expected_gradients(weights)
    for layer in ("layers.0", "layers.1"):
        attend = data[f"Cell.{layer}.Attend.backward.0"]["output"]
        assert len(attend) == 2 and attend[0]["shape"] == attend[1]["shape"] == [gn.ROWS, gn.HIDDEN]
        _check_processed(attend[1], expected[layer], str(tmp_path))
    head = data["Cell.head.Head.backward.0"]["output"]
    assert len(head) == 3 and head[0]["shape"] == [gn.ROWS, gn.HIDDEN]
    _check_processed(head[0], expected["head.0"], str(tmp_path))
    _check_processed(head[2], expected["head.2"], str(tmp_path))
    assert head[1]["dtype"] == "Int32" and head[1]["Max"] == 0  # the int label: what autodiff gives it
    assert data["Cell.embed.Lookup.backward.0"]["output"] == [None]
    assert not any("DumpGradient" in r.getMessage() and r.levelname == "WARNING" for r in caplog.records)
    assert len([r for r in caplog.records if "no gradient can exist" in r.getMessage()]) == 1


def _check_processed(entry, want, dump_path):
    """A processed dump.json tensor entry against the expected array: its file when saved, else its statistics."""
    if entry.get("data_name"):
        array = np.load(os.path.join(dump_path, "step0", "rank", "dump_tensor_data", entry["data_name"]),
                        allow_pickle=False)
        np.testing.assert_array_equal(array, want)
        return
    _check_statistics(entry, want)


class Carry(nn.Cell):
    """A layer in MindFormers' shape: ``(x, extra, carried)`` -> ``(y, extra + loss term, carried)``."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Dense(gn.HIDDEN, gn.HIDDEN)

    def construct(self, x, extra, carried):
        y = self.proj(x)
        return y, extra + y.sum() * 0.5, carried


class ConstantStart(nn.Cell):
    """The first layer gets constant tensors (like ``init_extra_loss``); one passes through every layer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Dense(gn.HIDDEN, gn.HIDDEN)
        self.layers = nn.CellList([Carry(), Carry()])
        self.extra = ms.Tensor([0.0], ms.float32)
        self.carried = ms.Tensor([0.0], ms.float32)

    def construct(self, x):
        x, extra, carried = self.embed(x), self.extra, self.carried
        for index in range(2):
            x, extra, carried = self.layers[index](x, extra, carried)
        return x.sum() + extra.sum() + carried.sum() * 2.0


def _constant_start_records(tmp_path, mode):
    gn.set_mode(mode)
    net = ConstantStart()
    for index, param in enumerate(net.trainable_params()):
        param.set_data(ms.Tensor(np.random.RandomState(index).randn(*param.shape).astype(np.float32)))
    train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.1))
    dump = mf_celldump.attach(train, {"dump_path": str(tmp_path), "task": "tensor", "backend": "host",
                                      "parameters": False, "process_on_train_end": False})
    with dump.step(0):
        train(ms.Tensor(np.random.RandomState(7).randn(gn.ROWS, gn.HIDDEN).astype(np.float32)))
    dump.detach()
    return {key: value for key, value in _records(str(tmp_path)).items() if isinstance(value, np.ndarray)}


def test_graph_records_gradients_of_constant_tensor_arguments(tmp_path):
    """Graph mode records what PyNative records when a call's tensor argument is a compile-time constant:
    its gradient, and the gradient of the output that passes it on, equal to PyNative's."""
    pynative = _constant_start_records(tmp_path / "pynative", "pynative")
    graph = _constant_start_records(tmp_path / "graph", "graph")
    for rank in (1, 2):
        assert ("layers.0", "backward", "a", (rank,), 0) in graph
    assert ("layers.0", "backward", "o", (2,), 0) in graph
    assert sorted(graph, key=str) == sorted(pynative, key=str)
    for key, value in pynative.items():
        np.testing.assert_allclose(graph[key], value, rtol=1e-6, err_msg=str(key))
