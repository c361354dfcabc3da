"""The graph probe contract: every backend's probe takes exactly the arguments the wrapper passes.

MindSpore reports a probe called with the wrong arguments only when it compiles the
graph, far from the cause; ``check_probe`` refuses it at attach. A cell given a
``mutable`` scalar reaches the probe through its own path in the wrapper: it must
compile and be recorded in graph mode as in PyNative, on every backend.
"""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, mutable, nn

import mf_celldump
from mf_celldump.capture.backends.base import GradientProbe, GraphProbe, check_probe
from tests.support import formats as fmt
from tests.support.ascend_emulation import AscendEmulator
from tests.support.rawread import raw_steps, read_step


class Scale(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 4)

    def construct(self, x, factor):
        return self.dense(x) * factor


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.scale = Scale()

    def construct(self, x, factor):
        return self.scale(x, factor).sum()


def _train(mode, config, primitives=None, steps=2):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(0)
    net = Net()
    train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=0.1))
    dump = mf_celldump.attach(train, config, primitives=primitives)
    x = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4) / 8)
    losses = []
    for step in range(steps):
        with dump.step(step):
            losses.append(float(train(x, mutable(1.5 + step)).asnumpy()))
    dump.detach()
    return dump, losses


def test_a_probe_with_other_arguments_is_refused_with_the_contract():
    def five(value, head, path, use_in, note):
        return value

    def defaulted(value, head, path, use_in, note, call=-1):
        return value

    for probe in (five, defaulted):
        with pytest.raises(TypeError, match=r"the contract is \(value, head, path, use_in, note, call\)"):
            check_probe(probe, GraphProbe, "test")
    check_probe(lambda value, head, path: value, GradientProbe, "test")


@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_mutable_scalar_compiles_and_is_recorded_as_in_pynative(tmp_path, task):
    recorded = {}
    for mode in ("pynative", "graph"):
        path = str(tmp_path / mode)
        dump, losses = _train(mode, {"dump_path": path, "task": task, "backend": "host"})
        assert np.isfinite(losses).all()
        manifest, steps = raw_steps(path)
        records = read_step(steps[1], manifest)
        recorded[mode] = {key: value["value"] for key, value in records.items()
                          if key[:2] == ("scale", fmt.FORWARD) and isinstance(value, dict) and "value" in value}
    assert recorded["graph"] == recorded["pynative"] == {("scale", fmt.FORWARD, "a", (1,), 0): 2.5}


@pytest.mark.parametrize("backend,task", [("tensordump", "tensor"), ("kbk_statistics", "statistics")])
def test_ascend_graph_backends_compile_a_cell_given_a_mutable_scalar(tmp_path, backend, task):
    emulator = AscendEmulator()
    try:
        dump, losses = _train("graph", {"dump_path": str(tmp_path), "task": task, "backend": backend},
                              emulator.primitives())
        assert np.isfinite(losses).all()
        report = mf_celldump.process_captured(dump, timeout=60)
        assert report.ok, report.summary()
    finally:
        emulator.close()
