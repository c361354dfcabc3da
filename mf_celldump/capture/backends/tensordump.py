"""MindSpore's TensorDump for forward values and DumpGradient for gradients.

PyNative (verified on CPU): the file path holds the step folder and the exact call
index; TensorDump appends ``_{dtype}_{id}.npy`` (``_in_...`` in "in" mode) and writes
synchronously on CPU. Graph mode (Ascend only, from MindSpore's docs): the path holds
MindSpore's ``{step}`` placeholder, so step folders follow the graph's own step
counter; the manifest records the global step at attach as ``graph_step_base`` and
step selection goes through TensorDump's step filter.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable, Optional

import mindspore as ms
from mindspore import Tensor, ops
from mindspore.ops.primitive import constexpr

from mf_celldump.capture.backends.base import BackendContext, CaptureBackend, GraphFace, PyNativeFace
from mf_celldump.capture.backends.gradient_hooks import GradientHookCache
from mf_celldump.rawformat.keys import BACKWARD, CODE_SLOTS, FORWARD, KIND_TENSOR, ProbeKey, kind_of_value
from mf_celldump.rawformat.manifest import NUMBERING_GLOBAL, NUMBERING_GRAPH
from mf_celldump.rawformat.names import raw_stem

logger = logging.getLogger(__name__)


@dataclass
class TensorDumpPrimitives:
    """The MindSpore primitives this backend drives; tests on CPU stand in for them."""

    dump_out: object
    dump_in: object
    dump_gradient: object

    @classmethod
    def from_mindspore(cls) -> TensorDumpPrimitives:
        return cls(ops.TensorDump(), ops.TensorDump("in"), ops.DumpGradient())


class TensorDumpBackend(CaptureBackend):
    name = "tensordump"
    stem_separator = "."

    def __init__(self, context: BackendContext, primitives: Optional[TensorDumpPrimitives] = None):
        super().__init__(context)
        self.primitives = primitives or TensorDumpPrimitives.from_mindspore()
        self.graph_mode = False
        self.graph_step_base = 0

    def manifest_fields(self) -> dict:
        numbering = NUMBERING_GRAPH if self.graph_mode else NUMBERING_GLOBAL
        return {"step_numbering": numbering, "graph_step_base": self.graph_step_base}

    def setup(self, initial_step: int) -> None:
        if ms.get_context("mode") != ms.GRAPH_MODE:
            return
        # Graph mode: folders follow the graph step counter, which starts at 0 in every
        # process; record where the global count stands, and pass the step filter.
        self.graph_mode = True
        self.graph_step_base = initial_step
        steps = self.config.steps
        if not steps.selects_all:
            try:
                from mindspore._c_expression import _tensordump_set_step  # private API, guarded
            except ImportError:
                logger.warning("this MindSpore has no TensorDump step filter; every step will be dumped")
            else:
                graph_steps = [s - initial_step for s in steps.from_value(initial_step, 100_000)]
                _tensordump_set_step(graph_steps)

    def pynative(self) -> PyNativeFace:
        return TensorDumpPyNative(self)

    def graph(self) -> GraphFace:
        return TensorDumpGraph(self)


class TensorDumpPyNative(PyNativeFace):
    def __init__(self, backend: TensorDumpBackend):
        self.backend = backend
        self.context = backend.context
        self.primitives = backend.primitives
        self.forward_enabled = backend.config.captures_forward
        self.gradient_hooks = GradientHookCache(self.context.runtime, self._dump_gradient)

    def _path(self, key: ProbeKey) -> str:
        stem = raw_stem(key, self.backend.stem_separator)
        return os.path.join(self.context.writer.step_dir(self.context.runtime.step), stem)

    def _op(self, mode: str):
        return self.primitives.dump_in if mode == "in" else self.primitives.dump_out

    def forward(self, value, key: ProbeKey, mode: str):
        if not self.forward_enabled:
            return value
        if isinstance(value, Tensor):
            self._op(mode)(self._path(key), value)
            return value
        kind = kind_of_value(value)
        if kind is not None:
            # Non-tensor values travel as scalar tensors so they share TensorDump's order.
            scalar = 0 if value is None else value
            self._op(mode)(self._path(key.with_kind(kind)), Tensor(scalar))
        return value

    def backward(self, tensor, key: ProbeKey, mode: str):
        return self.gradient_hooks.apply(tensor, key, mode)

    def _dump_gradient(self, gradient, key: ProbeKey, mode: str) -> None:
        self._op(mode)(self._path(key), gradient)


class TensorDumpGraph(GraphFace):
    def __init__(self, backend: TensorDumpBackend):
        self.backend = backend

    def probe_function(self) -> Callable:
        primitives = self.backend.primitives
        dump_out, dump_in, grad = primitives.dump_out, primitives.dump_in, primitives.dump_gradient
        depend = ops.depend
        forward_enabled = self.backend.config.captures_forward
        backward_enabled = self.backend.config.captures_backward
        prefix = self.backend.context.writer.placeholder_step_dir() + os.sep
        sep = self.backend.stem_separator
        graph_path = _make_graph_path()

        def graph_probe(value, head, path, use_in):
            if isinstance(value, Tensor):
                if backward_enabled:
                    value = grad(graph_path(prefix, head, "b", path, sep), value, "in" if use_in else "out")
                if forward_enabled:
                    name = graph_path(prefix, head, "f", path, sep)
                    if use_in:  # noqa: SIM108 - statement form: what the graph parser is known to take
                        value = depend(value, dump_in(name, value))
                    else:
                        value = depend(value, dump_out(name, value))
            return value

        return graph_probe


def _make_graph_path():
    @constexpr
    def graph_path(prefix, head, direction_letter, path, sep):
        # Compile-time: builds the TensorDump file path from constants.
        key = ProbeKey(cell_id=head[0], direction=FORWARD if direction_letter == "f" else BACKWARD,
                       slot=CODE_SLOTS[head[1]], kind=KIND_TENSOR, path=tuple(path), call=None)
        return prefix + raw_stem(key, sep)

    return graph_path
