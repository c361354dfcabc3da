"""``loss.backward()`` and ``param.grad`` on MindSpore 2.10, for the stand-in's
``platform/mindspore/autograd_compat.enable_mindspore_backward_compat``.

MindFormers 2.1's PyNative trainer (``pynative/trainer/trainer.py``: ``loss.backward(sense)``, then
``param.grad`` read by its clipping and optimizer and set to None after the update) is written for
MindSpore 2.11, whose tensors have that face. MindSpore 2.10 has the engine without the face:
``mindspore._c_expression.run_backward(tensors, grad_tensors, keep_graph, create_graph, inputs)``
accumulates into each leaf's ``_grad`` once the PyNative executor records (``set_grad_flag`` and
``set_enable_grad``, as ``mindspore/common/recompute.py`` switches them). hyper_parallel's file of
that name (``platform/mindspore/autograd_compat``, in the 1.0 release 2.1 pins; not in the master
branch read) adapts the same API; this is ours, over MindSpore's engine, for tests on CPU.
"""

from __future__ import annotations

import numpy as np
from mindspore import Tensor
from mindspore import _c_expression as engine
from mindspore.graph.api import _pynative_executor


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    if gradient is None:
        gradient = Tensor(np.ones(self.shape, dtype=np.float32)).astype(self.dtype)
    elif not isinstance(gradient, Tensor):
        gradient = Tensor(np.full(self.shape, gradient, dtype=np.float32)).astype(self.dtype)
    keep = bool(create_graph if retain_graph is None else retain_graph)
    engine.run_backward((self,), (gradient,), keep, bool(create_graph), tuple(inputs or ()))


def _get_grad(self):
    return self._grad


def _set_grad(self, value):
    self._grad = value


def enable() -> None:
    """Record the PyNative graph for autograd and give tensors ``backward`` and ``grad`` (idempotent)."""
    _pynative_executor.set_grad_flag(True)
    _pynative_executor.set_enable_grad(True)
    if getattr(Tensor, "_standin_backward", False):
        return
    Tensor.backward = _backward
    Tensor.grad = property(_get_grad, _set_grad)
    Tensor._standin_backward = True
