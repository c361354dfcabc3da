"""PyNative capture that defers work to the end of the step records the values of the moment of capture.

The tensordump and device_stats backends queue captured tensors and write them after the
step's synchronisation; the host backend hands arrays to the writer's thread. A
Parameter passed to a cell as an argument is changed in place by the optimizer later in
the same step, so it must be recorded as it was when the cell ran.
"""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

import mf_celldump
from tests.support.rawread import raw_steps, read_step

BEFORE = 2.0


class Scale(nn.Cell):
    def construct(self, x, w):
        return x * w


class ParamNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = Parameter(Tensor(np.full((4,), BEFORE, np.float32)), name="w")
        self.scale = Scale()

    def construct(self, x):
        y = self.scale(x, self.w)
        return (y * y).mean()


@pytest.mark.parametrize("task,backend", [("tensor", "tensordump"), ("statistics", "device_stats"),
                                          ("tensor", "host")])
def test_parameter_argument_recorded_before_the_optimizer_update(tmp_path, task, backend):
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    net = ParamNet()
    train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.5))
    dump = mf_celldump.attach(train, {"dump_path": str(tmp_path), "task": task, "backend": backend})
    x = Tensor(np.arange(1, 5, dtype=np.float32))
    with dump.step(0):
        train(x)
    dump.detach()
    assert not np.allclose(net.w.asnumpy(), BEFORE), "the optimizer must have changed the weight"
    manifest, steps = raw_steps(str(tmp_path))
    captured = read_step(steps[0], manifest)
    weight = captured[("scale", "forward", "a", (1,), 0)]
    output = captured[("scale", "forward", "o", (0,), 0)]
    if task == "tensor":
        np.testing.assert_array_equal(weight, np.full((4,), BEFORE, np.float32))
        np.testing.assert_array_equal(output, BEFORE * x.asnumpy())
    else:
        assert weight["stats"]["Max"] == weight["stats"]["Min"] == BEFORE
        assert output["stats"]["Max"] == pytest.approx(BEFORE * 4)
