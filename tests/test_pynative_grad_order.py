"""Why PyNative weight gradients can change in the last bits when input gradients are captured.

MindSpore's PyNative autograd (``AutoDiff::BackPropagate``, ``ccsrc/pynative/backward/op_grad/
func_grad.cc``) keeps one running sum per tensor: the gradients of its uses are added one by one
in reverse execution order. When a cell uses its input ``x`` twice (``x * a + x * b``) and the
caller uses ``x`` once more (a residual ``x + cell(x)``), plain PyNative computes
``(g_res + g_b) + g_a``. Capturing the cell's input gradient needs the cell's own sum
``g_a + g_b``, so any identity node on the input (ours, or MindSpore's own
``Cell.register_backward_hook``) makes it ``g_res + (g_a + g_b)``: what Graph mode computes
anyway. Float addition is not associative, so the bits differ. Capturing forward data only
adds no node on the gradient path and keeps every bit.

``g_a = G * a`` and ``g_b = G * b`` are single float32 products, so numpy gives the exact
bits of each grouping. Qwen3's CPU ``FusedRMSNorm`` stand-in is such a cell (``square(x)`` and
``x * rsqrt(...)``, plus the residual); see ``test_mcore_capture.py``'s numerics tests.
"""

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import mf_celldump

RNG = np.random.default_rng(0)
A, B, G, X = (RNG.standard_normal((8, 64)).astype(np.float32) for _ in range(4))


class Inner(nn.Cell):
    """Uses its input twice."""

    def __init__(self):
        super().__init__()
        self.a, self.b = Tensor(A), Tensor(B)

    def construct(self, x):
        return x * self.a + x * self.b


class Residual(nn.Cell):
    """Uses ``x`` once more, outside ``inner``."""

    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.g = Tensor(G)

    def construct(self, x):
        return ((x + self.inner(x)) * self.g).sum()


def _no_change(cell, grad_input, grad_output):
    return None


def _grouping(grad: np.ndarray) -> str:
    ga, gb = G * A, G * B
    sums = {"(res+b)+a": (G + gb) + ga, "(res+a)+b": (G + ga) + gb, "res+(a+b)": G + (ga + gb)}
    found = [name for name, value in sums.items() if value.tobytes() == grad.tobytes()]
    assert len(found) == 1, found
    return found[0]


def _input_grad(tmp_path=None, data_mode=None, cell_hook=False, task="statistics") -> np.ndarray:
    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = Residual()
    if cell_hook:
        net.inner.register_backward_hook(_no_change)
    grad = ms.grad(net)
    if data_mode is None:
        return grad(Tensor(X)).asnumpy()
    dump = mf_celldump.attach(net, {"dump_path": str(tmp_path), "task": task, "data_mode": data_mode})
    try:
        with dump.step(0):
            return grad(Tensor(X)).asnumpy()
    finally:
        dump.detach()


def test_plain_pynative_adds_each_use_in_turn():
    assert _grouping(_input_grad()) == "(res+b)+a"


def test_mindspore_cell_hook_groups_the_cell_first():
    """Not ours: MindSpore's own backward hook on the cell gives the grouping our capture gives."""
    assert _grouping(_input_grad(cell_hook=True)) == "res+(a+b)"


@pytest.mark.parametrize("task", ["tensor", "statistics"])
@pytest.mark.parametrize("data_mode,grouping", [("forward", "(res+b)+a"), ("backward", "res+(a+b)"),
                                                 ("all", "res+(a+b)")])
def test_capture_changes_the_grouping_only_with_gradients(tmp_path, task, data_mode, grouping):
    assert _grouping(_input_grad(tmp_path, data_mode, task=task)) == grouping
