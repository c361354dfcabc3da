"""A step that is not captured runs the network as if nothing were attached.

Graph mode: an unselected step runs a compiled graph without capture ops (``graph_switch``),
so the host backend's counter of capture ops run stays still; a selected step, whether
``steps`` named it or ``select_step`` chose it while training ran, runs the graph with them.
PyNative: an unselected step calls each wrapped cell's original after one flag test and
registers no parameter hook. In both modes training gives bit-identical losses and weights
with and without the dump.
"""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import mf_celldump
from mf_celldump.errors import AttachError
from tests.support.rawread import raw_steps, read_step

STEPS = 7


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(8, 8)

    def construct(self, x, scale=2.0):
        return self.dense(x) * scale


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.first = Block()
        self.second = Block()

    def construct(self, x):
        return (self.second(self.first(x)) ** 2).mean()


def _train_cell(mode):
    ms.set_context(mode=mode, device_target="CPU")
    ms.set_seed(1)
    net = Net()
    return nn.TrainOneStepCell(net, nn.Adam(net.trainable_params(), 1e-2))


def _batches():
    return [Tensor(np.random.default_rng(i).normal(size=(4, 8)).astype(np.float32)) for i in range(STEPS)]


def _plain_run(mode):
    train = _train_cell(mode)
    losses = [train(x).asnumpy() for x in _batches()]
    return losses, [p.asnumpy() for p in train.trainable_params()]


def _attached_run(mode, dump_path, task, steps, chosen=(), attach_to_model=False):
    """Losses, weights and, per step, (captured, capture ops run); ``chosen`` selected at run time."""
    train = _train_cell(mode)
    dump = mf_celldump.attach(train.network if attach_to_model else train,
                              {"dump_path": str(dump_path), "task": task, "steps": steps, "backend": "host"})
    losses, per_step = [], []
    for step, x in enumerate(_batches()):
        if step in chosen:
            dump.select_step(step)
        before = dump.backend.ops_run
        dump.begin_step(step)
        losses.append(train(x).asnumpy())
        ended = dump.end_step()
        per_step.append((ended.captured, dump.backend.ops_run - before))
    dump.detach()
    return losses, [p.asnumpy() for p in train.trainable_params()], per_step


def _bitwise_equal(first, second):
    return len(first) == len(second) and all(np.array_equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_unselected_steps_run_no_capture_op_and_train_as_without_the_dump(tmp_path, mode, task):
    losses, weights = _plain_run(mode)
    got_losses, got_weights, per_step = _attached_run(mode, tmp_path / "dump", task, "2,4")
    assert _bitwise_equal(got_losses, losses)
    assert _bitwise_equal(got_weights, weights)
    assert [captured for captured, _ in per_step] == [step in (2, 4) for step in range(STEPS)]
    for captured, ops_run in per_step:
        assert (ops_run > 0) == captured
    assert sorted(raw_steps(tmp_path / "dump")[1]) == [2, 4]


@pytest.mark.parametrize("mode", [ms.GRAPH_MODE, ms.PYNATIVE_MODE], ids=["graph", "pynative"])
def test_a_step_chosen_while_training_is_captured_as_a_configured_step(tmp_path, mode):
    losses, weights = _plain_run(mode)
    got_losses, got_weights, per_step = _attached_run(mode, tmp_path / "dump", "statistics", "2", chosen=(5,))
    assert _bitwise_equal(got_losses, losses) and _bitwise_equal(got_weights, weights)
    assert [step for step, (captured, _) in enumerate(per_step) if captured] == [2, 5]
    assert per_step[5][1] == per_step[2][1] > 0
    manifest, steps = raw_steps(tmp_path / "dump")
    configured, chosen = read_step(steps[2], manifest), read_step(steps[5], manifest)
    assert sorted(chosen) == sorted(configured)


def test_graph_first_call_in_a_selected_step_is_captured_and_later_unselected_steps_run_no_capture_op(tmp_path):
    # Attached to the model inside the wrapper training calls: the wrapper is first met at step 0, selected.
    losses, weights = _plain_run(ms.GRAPH_MODE)
    got_losses, got_weights, per_step = _attached_run(ms.GRAPH_MODE, tmp_path / "dump", "statistics", "0,3",
                                                      attach_to_model=True)
    assert _bitwise_equal(got_losses, losses) and _bitwise_equal(got_weights, weights)
    assert [captured for captured, _ in per_step] == [step in (0, 3) for step in range(STEPS)]
    for captured, ops_run in per_step:
        assert (ops_run > 0) == captured
    assert sorted(raw_steps(tmp_path / "dump")[1]) == [0, 3]


def test_pynative_parameter_hooks_stay_from_attach_to_detach_and_record_only_selected_steps(tmp_path):
    # Hooks registered per step would move MindSpore's hook version, part of every jit compile key: the
    # jit-compiled optimizer would be compiled again, and kept, at each selected step.
    from mindspore.common.hook_handle import _hook_version

    train = _train_cell(ms.PYNATIVE_MODE)
    dump = mf_celldump.attach(train, {"dump_path": str(tmp_path / "dump"), "steps": "1,2"})
    version = _hook_version()
    hooked = []
    for step, x in enumerate(_batches()[:4]):
        dump.begin_step(step)
        train(x)
        dump.end_step()
        hooked.append(len(dump._parameters.hook_handles))
    assert hooked == [4, 4, 4, 4]  # two Dense cells, weight and bias each
    assert _hook_version() == version
    dump.detach()
    assert _hook_version() != version and not dump._parameters.hook_handles
    manifest, steps = raw_steps(tmp_path / "dump")
    assert sorted(steps) == [1, 2]
    for step in (1, 2):  # the hooks recorded the weight gradients of the selected steps only
        assert sum(key[2] == "g" for key in read_step(steps[step], manifest)) == 4


def test_select_step_on_a_detached_dump_says_to_attach_again(tmp_path):
    train = _train_cell(ms.PYNATIVE_MODE)
    dump = mf_celldump.attach(train, {"dump_path": str(tmp_path / "dump"), "steps": "1"})
    dump.detach()
    with pytest.raises(AttachError, match="detached; attach again"):
        dump.select_step(3)


def test_select_step_where_nothing_is_captured_names_the_ranks_and_steps(tmp_path):
    train = _train_cell(ms.PYNATIVE_MODE)
    dump = mf_celldump.attach(train, {"dump_path": str(tmp_path / "dump"), "steps": "1", "ranks": "1"}, rank=0)
    with pytest.raises(AttachError, match="nothing is captured on rank 0"):
        dump.select_step(3)
    dump.detach()


def test_select_step_with_the_ascend_graph_tensor_backend_says_to_name_the_step_in_steps(tmp_path):
    from tests.support import capture_net as cn
    from tests.support.ascend_emulation import AscendEmulator

    cn.set_mode("graph")
    emulator = AscendEmulator()
    try:
        dump = mf_celldump.attach(cn.train_one_step_cell(cn.make_net()),
                                  {"dump_path": str(tmp_path / "dump"), "task": "tensor", "backend": "tensordump",
                                   "steps": "1"}, primitives=emulator.primitives())
        with pytest.raises(AttachError, match="name the step in steps, or use backend host"):
            dump.select_step(3)
        dump.detach()
    finally:
        emulator.close()
