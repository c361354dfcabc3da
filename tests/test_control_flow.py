"""TensorDump inside control flow: MindFormers' layer loop compiles without it; a real graph loop is refused.

MindSpore documents TensorDump as unsupported inside control flow (``debug_func.py``). The
emulation refuses a TensorDump that runs outside the optimized top graph (a loop body, a
branch on a tensor condition: ``ControlFlowCheck``, tests/support/ascend_emulation.py).
MindFormers' layer loop, ``for i in range(self.num_layers): h = self.layers[i](h, ...)``,
has a constant bound, so MindSpore unrolls it (``parse.cc`` ``ParseForUnroll``; control
flow operators only for variable conditions): every layer's probes sit in the top graph
and capture works. A ``while`` on a tensor compiles to a real loop: the Ascend graph
backends cannot capture there, the host backend can. Weight gradients are taken where the
optimizer receives them; a training wrapper that calls it under ``if not overflow``
(MindFormers, ``TrainOneStepWithLossScaleCell``) would put those probes in a branch, so the
Ascend graph backends record no weight gradient there and say why.
"""

from __future__ import annotations

import json
import logging
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn, ops

import mf_celldump
from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives
from tests.support.ascend_emulation import AscendEmulator
from tests.support.processed import read_output

LAYERS = 3


class Layer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.lin = nn.Dense(4, 4)

    def construct(self, x, freqs=None, mask=None, *, scale=1.0):
        return ops.tanh(self.lin(x)) * scale + x


class LayerLoop(nn.Cell):
    """MindFormers' idiom (models/llama/llama.py ``LlamaModel.construct``): a constant-range loop over a CellList."""

    def __init__(self):
        super().__init__()
        self.num_layers = LAYERS
        self.layers = nn.CellList([Layer() for _ in range(LAYERS)])

    def construct(self, x, n):
        h = x
        for i in range(self.num_layers):
            h = self.layers[i](h, None, mask=None, scale=0.5)
        return (h * h).sum()


class TensorLoop(nn.Cell):
    """A real graph loop: its bound is a tensor, so MindSpore compiles a while loop (Switch, body sub-graph)."""

    def __init__(self):
        super().__init__()
        self.layer = Layer()

    def construct(self, x, n):
        i = Tensor(0, ms.int32)
        h = x
        while i < n:
            h = self.layer(h)
            i = i + 1
        return (h * h).sum()


class TensorBranch(nn.Cell):
    """A captured cell in a branch of an ``if`` on a tensor condition."""

    def __init__(self):
        super().__init__()
        self.first = Layer()
        self.maybe = Layer()

    def construct(self, x, n):
        h = self.first(x)
        if h.sum() > n.astype(ms.float32):
            h = self.maybe(h)
        return (h * h).sum()


class CpuLossScaleCell(nn.TrainOneStepWithLossScaleCell):
    """MindSpore's loss-scale training cell (its ``construct``: ``if not overflow: ... self.optimizer(grads)``) with
    an overflow check that runs on CPU (any non-finite gradient)."""

    def start_overflow_check(self, pre_cond, compute_input):
        return Tensor([0] * 8, ms.int32), compute_input

    def get_overflow_status(self, status, compute_output):
        return ops.stack([ops.logical_not(ops.isfinite(grad).all()) for grad in compute_output]).any()


def _capture(tmp_path, network, backend, loss_scale=False):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    emulator = AscendEmulator(latency=0.001) if backend == "tensordump" else None
    config = {"dump_path": str(tmp_path), "backend": backend, "parameters": loss_scale, "process_on_train_end": False}
    with pytest.MonkeyPatch.context() as patch:
        if emulator is not None:
            patch.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
        optimizer = nn.SGD(network.trainable_params(), 0.0)
        if loss_scale:
            train = CpuLossScaleCell(network, optimizer, scale_sense=Tensor(1.0, ms.float32))
        else:
            train = nn.TrainOneStepCell(network, optimizer)
        dump = mf_celldump.attach(train, config)
        try:
            with dump.step(0):
                train(Tensor(np.ones((2, 4), np.float32)), Tensor(2, ms.int32))
        finally:
            dump.detach()
            if emulator is not None:
                emulator.drain()
                emulator.close()
    report = mf_celldump.process_captured(dump)
    assert report.ok, report.summary()
    return read_output(str(tmp_path), 0)


def test_mindformers_layer_loop_unrolls_and_every_layer_is_captured(tmp_path):
    leaves, _ = _capture(tmp_path, LayerLoop(), "tensordump")
    for i in range(LAYERS):
        assert (f"Cell.layers.{i}.Layer.forward.0", "output", 0) in leaves
        assert (f"Cell.layers.{i}.Layer.backward.0", "input", 0) in leaves


@pytest.mark.parametrize("network", [TensorLoop, TensorBranch])
def test_ascend_tensordump_inside_control_flow_is_refused_at_compile(tmp_path, network):
    with pytest.raises(RuntimeError, match="doesn't support in control flow"):  # raised in the dump, at run
        _capture(tmp_path, network(), "tensordump")


def test_host_backend_captures_inside_a_graph_loop(tmp_path):
    leaves, _ = _capture(tmp_path, TensorLoop(), "host")
    calls = sorted({key[0] for key in leaves if key[0].startswith("Cell.layer.Layer.forward.")})
    assert calls == [f"Cell.layer.Layer.forward.{k}" for k in range(2)]


@pytest.mark.parametrize("backend", ["tensordump", "host"])
def test_weight_gradients_under_the_overflow_branch(tmp_path, caplog, backend):
    """``TrainOneStepWithLossScaleCell`` calls the optimizer under ``if not overflow``; the weight gradients are
    read where autodiff gives them (a hook on each parameter, compiled into the backward graph), outside that
    branch, so every graph backend records them."""
    with caplog.at_level(logging.WARNING, logger="mf_celldump"):
        leaves, _ = _capture(tmp_path, LayerLoop(), backend, loss_scale=True)
    grads = [key for key in leaves if key[1] == "parameters_grad"]
    weights = [key for key in leaves if key[1] == "parameters"]
    assert weights and (leaves[("Cell.layers.0.Layer.backward.0", "input", 0)])
    said = [r.getMessage() for r in caplog.records if "parameters_grad is not recorded" in r.getMessage()]
    assert grads and said == []
    assert _gradient_point(tmp_path) == {"point": "autodiff", "micro_batches": 1}


@pytest.mark.parametrize("backend", ["tensordump", "host"])
def test_without_parameter_hooks_the_optimizer_input_under_the_overflow_branch(tmp_path, caplog, monkeypatch,
                                                                              backend):
    """Where a MindSpore cannot hook a parameter in graph mode (stood in for by a ``register_hook`` that raises,
    as MindSpore's own does for what it cannot hook), the optimizer's input is the fallback: under
    ``if not overflow`` the Ascend graph backends record no weight gradient there (and say why, naming the way
    out); the host backend records them."""
    def cannot_hook(self, hook_fn):
        raise TypeError("hooks are not supported in graph mode here")

    monkeypatch.setattr(ms.Parameter, "register_hook", cannot_hook)
    with caplog.at_level(logging.WARNING, logger="mf_celldump"):
        leaves, _ = _capture(tmp_path, LayerLoop(), backend, loss_scale=True)
    grads = [key for key in leaves if key[1] == "parameters_grad"]
    said = [r.getMessage() for r in caplog.records if "parameters_grad is not recorded" in r.getMessage()]
    assert any("cannot hook a parameter in graph mode" in r.getMessage() for r in caplog.records)
    if backend == "tensordump":
        assert grads == [] and len(said) == 1
        assert "under `if not overflow`" in said[0] and "parameters: false" in said[0] and "PyNative" in said[0]
        assert _gradient_point(tmp_path) is None  # nothing recorded, nothing said
    else:
        assert grads and said == []
        assert _gradient_point(tmp_path) == {"point": "optimizer_input", "micro_batches": 1}


def _gradient_point(dump_path):
    """dump.json's statement of where parameters_grad was read."""
    with open(os.path.join(str(dump_path), "step0", "rank", "dump.json"), encoding="utf-8") as handle:
        return json.load(handle).get("mf_celldump_parameters_grad")


class _Flagged(nn.Cell):
    def __init__(self, inner, flag):
        super().__init__()
        self.inner, self.flag = inner, flag

    def construct(self, x):
        if self.flag:  # a Python flag: folded at compile time
            x = self.inner(x)
        return x


class _Guarded(nn.Cell):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def construct(self, x):
        big = x.sum() > 0
        while big:
            x = self.inner(x)
            big = x.sum() > 0
        return x


def test_conditions_computed_in_the_graph_are_told_from_python_flags():
    from mf_celldump.capture.control_flow import conditional_call

    inner = nn.Dense(2, 2)
    assert conditional_call([_Flagged(inner, True)], inner) is None
    where = conditional_call([_Guarded(inner)], inner)
    assert where.startswith("_Guarded.construct calls self.inner at line ") and "under `while big`" in where
    assert conditional_call([_Guarded(nn.Dense(2, 2))], inner) is None  # holds another cell
