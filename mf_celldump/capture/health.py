"""Cell health (``watch: {cells: true}``): inside the step, each selected cell's values reduced to a few numbers.

The watch's signals (loss, overflow flag, global norm) only see what a step returns; a cell that turns
its output into NaN, followed by a ReLU that turns the NaN into 0, under a wrapper that zeroes non-finite
gradients, leaves them all clean. Cell health reads, every ``cells_every`` steps, for every call of the
cells capture selects (the same layer selection), the NaN count, the Inf count, the largest finite |x|
and optionally the L2 norm (of the finite elements) of

* each floating forward output (a forward hook on the cell),
* with ``data_mode`` backward or all, its gradient (an ``ops.InsertGradientOf`` on the output, put there
  by the same hook; one built per cell and output, reused every step),
* each of the cell's own weights (queued when the step begins, so before the optimizer's update) and its
  gradient (``Parameter.register_hook``, as ``capture/parameters.py`` records weight gradients).

No value is read on the host while the step runs: each reduction is a handful of device ops whose
result, a vector of four float32, is kept as a tensor; ``end_step`` stacks the step's vectors and reads
them with ONE ``asnumpy`` (one synchronisation per step, where the step's end synchronises anyway). Under
gradient accumulation every micro-batch is a call of its own, so it has its own rows. A step read twice
(the watch's rerun of a skipped update) keeps the health of its first execution only.

Graph mode ignores forward hooks: there ``GraphHealth`` (below) reads the outputs inside the compiled graph
and hands the host one Parameter per step; the weights are reduced by single ops outside the graph when
the step begins, as in PyNative.

The record: ``health/rank{R}.csv`` under ``dump_path``, one block of rows per step, appended with one
``write`` of the whole block (``O_APPEND``: a step's rows are never interleaved with another writer's; a
crash can leave at most the last line cut, which the reader skips), stopping at ``health_max_bytes``
with one warning. Why CSV and not a columnar file: appending a step is one write with the standard
library, nothing new on the training side (a columnar writer such as pyarrow's Parquet needs a row group
per step or a rewrite to append, and pyarrow on every node), and a spreadsheet or ``pandas.read_csv``
opens it; at about 70 bytes a row it stays small (docs/watch.md gives the bound).
"""

from __future__ import annotations

import csv
import io
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from mf_celldump.capture.parameters import own_parameters
from mf_celldump.fsutil import FILE_MODE, ensure_dir, safe_join
from mf_celldump.watch import CellReading, WatchRules

logger = logging.getLogger(__name__)

HEALTH_DIR = "health"
COLUMNS = ("step", "rank", "order", "direction", "cell", "kind", "index", "call", "nan", "inf", "max_abs", "norm")
_FLOATS = ("Float16", "Float32", "Float64", "BFloat16")


def health_file(dump_path: str, rank: int) -> str:
    return safe_join(dump_path, HEALTH_DIR, f"rank{int(rank)}.csv")


def reducer(norm: bool) -> Callable:
    """``reduce(x) -> float32[4]``: NaN count, Inf count, largest finite |x|, L2 norm of the finite elements
    (0 unless ``norm``); device ops only, nothing read on the host."""
    import mindspore as ms
    from mindspore import ops

    float32 = ms.float32

    def reduce(x):
        x = x.astype(float32)
        finite = ops.isfinite(x)
        kept = ops.where(finite, ops.abs(x), ops.zeros_like(x))
        nan = ops.isnan(x).astype(float32).sum()
        inf = ops.isinf(x).astype(float32).sum()
        size = 1
        for d in x.shape:
            size *= d
        largest = kept.max() if size else ops.zeros((), float32)
        l2 = ops.sqrt((kept * kept).sum()) if norm else ops.zeros((), float32)
        return ops.stack((nan, inf, largest, l2))

    return reduce


def _floating(value) -> bool:
    from mindspore import Tensor

    return isinstance(value, Tensor) and str(value.dtype) in _FLOATS


def _leaves(value) -> List[Any]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


@dataclass
class CellHealth:
    """One attached dump's cell health; ``install`` once, then ``begin_step``/``end_step`` around each step."""

    rules: WatchRules
    cells: List[Tuple[str, object]]  # (name, cell) in the capture's selection
    backward: bool  # data_mode backward or all: gradients of outputs and weights too
    path: Optional[str]  # health/rank{R}.csv, or None (health_max_bytes 0)
    rank: int = 0
    step: Optional[int] = None  # the step being read, None when this step reads nothing
    last_step: Optional[int] = None
    _pending: List[tuple] = field(default_factory=list)  # (direction, cell, kind, index, call, device vector)
    _calls: Dict[tuple, int] = field(default_factory=dict)
    _handles: List[Any] = field(default_factory=list)
    _grad_hooks: Dict[tuple, Any] = field(default_factory=dict)
    _weights: List[Tuple[str, int, Any]] = field(default_factory=list)
    _written: int = -1  # bytes in the file; -1 until first looked at
    _full: bool = False
    graph: Optional[GraphHealth] = None  # graph mode: the outputs are read in the graph (session wraps cells)

    def install(self) -> None:
        """PyNative: the hooks; graph mode (``graph`` set): the weights only, the cells' wrappers read the rest."""
        self._reduce = reducer(self.rules.cell_norm)
        for name, cell in self.cells:
            if self.graph is None:
                self._handles.append(cell.register_forward_hook(self._forward_hook(name)))
            for index, (_, param) in enumerate(own_parameters(cell)):
                self._weights.append((name, index, param))
                if self.backward and param.requires_grad:
                    hook = self._weight_grad_hook(name, index) if self.graph is None else \
                        self.graph.weight_hook(name, index)
                    self._handles.append(param.register_hook(hook))

    def restore(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _forward_hook(self, name: str) -> Callable:
        def hook(cell, inputs, output):
            if self.step is None:
                return None
            call = self._next_call(name, "forward")
            leaves = [leaf for leaf in _leaves(output) if _floating(leaf)]
            for index, leaf in enumerate(leaves):
                self._pending.append(("forward", name, "output", index, call, self._reduce(leaf)))
            if not self.backward or not leaves:
                return None
            return self._with_gradient_hooks(name, output, [0])

        return hook

    def _with_gradient_hooks(self, name: str, output, counter: List[int]):
        """``output`` with each floating tensor passed through its cached ``InsertGradientOf``."""
        if isinstance(output, (tuple, list)):
            return type(output)(self._with_gradient_hooks(name, item, counter) for item in output)
        if not _floating(output):
            return output
        index, counter[0] = counter[0], counter[0] + 1
        hook = self._grad_hooks.get((name, index))
        if hook is None:
            from mindspore import ops

            hook = self._grad_hooks[(name, index)] = ops.InsertGradientOf(self._output_grad_function(name, index))
        return hook(output)

    def _output_grad_function(self, name: str, index: int) -> Callable:
        def on_gradient(gradient):
            if self.step is not None and gradient is not None:
                call = self._next_call((name, index), "backward")
                self._pending.append(("backward", name, "output_grad", index, call, self._reduce(gradient)))
            return gradient

        return on_gradient

    def _weight_grad_hook(self, name: str, index: int) -> Callable:
        def hook(gradient):
            if self.step is not None:
                call = self._next_call((name, "w", index), "backward")
                self._pending.append(("backward", name, "weight_grad", index, call, self._reduce(gradient)))
            return gradient

        return hook

    def _next_call(self, key, direction: str) -> int:
        number = self._calls.get((key, direction), 0)
        self._calls[(key, direction)] = number + 1
        return number

    # -- steps ---------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Read ``step`` if ``cells_every`` selects it and it was not read before (a rerun keeps the first)."""
        self._pending.clear()
        self._calls.clear()
        read = self.rules.health_step(step) and (self.last_step is None or step > self.last_step)
        self.step = step if read else None
        if read and self.graph is not None:
            self.graph.reset()
        if read:
            for name, index, param in self._weights:  # queued before the forward: the weights this step reads
                if _floating(param):
                    self._pending.append(("forward", name, "weight", index, 0, self._reduce(param)))

    def abort_step(self) -> None:
        self.step = None
        self._pending.clear()

    def end_step(self) -> Optional[Tuple[int, List[CellReading]]]:
        """``(step, readings)`` of the step that ends (one host read), appended to the record; None when the
        step read nothing."""
        step, pending, self.step = self.step, self._pending, None
        self._pending = []
        if step is None:
            return None
        self.last_step = step
        readings = self._read(pending)
        if self.graph is not None:
            readings = self._graph_readings(readings)
        self._append(step, readings)
        return step, readings

    def _read(self, pending: List[tuple]) -> List[CellReading]:
        if not pending:
            return []
        from mindspore import ops

        values = ops.stack([item[-1] for item in pending]).asnumpy()  # the step's one host read
        norm = self.rules.cell_norm
        return [CellReading(order, direction, cell, kind, index, call, int(row[0]), int(row[1]), float(row[2]),
                            float(row[3]) if norm else None)
                for order, ((direction, cell, kind, index, call, _), row) in enumerate(zip(pending, values))]

    def _graph_readings(self, weights: List[CellReading]) -> List[CellReading]:
        """The weights (read outside the graph), then the graph's slots in their order; ``call`` -1: every call
        of the step folded into one row."""
        norm, out = self.rules.cell_norm, list(weights)
        for direction, cell, kind, index, call, row in self.graph.read():
            out.append(CellReading(len(out), direction, cell, kind, index, call, int(row[0]), int(row[1]),
                                   float(row[2]), float(row[3]) ** 0.5 if norm else None))
        return out

    def _append(self, step: int, readings: List[CellReading]) -> None:
        """One ``write`` of the step's rows (with the header when the file is new), within health_max_bytes."""
        if self.path is None or self._full or not readings:
            return
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        if self._written < 0:
            self._written = os.path.getsize(self.path) if os.path.exists(self.path) else 0
        if self._written == 0:
            writer.writerow(COLUMNS)
        for r in readings:
            writer.writerow((step, self.rank, r.order, r.direction, r.cell, r.kind, r.index, r.call, r.nan, r.inf,
                             repr(r.max_abs), "" if r.norm is None else repr(r.norm)))
        data = text.getvalue().encode("utf-8")
        if self._written + len(data) > self.rules.health_max_bytes:
            self._full = True
            logger.warning("mf_celldump watch: %s reached health_max_bytes=%d at step %d: no more health rows are "
                           "written (the cell rules still run); raise watch.health_max_bytes to keep more",
                           self.path, self.rules.health_max_bytes, step)
            return
        ensure_dir(os.path.dirname(self.path))
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0), FILE_MODE)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        self._written += len(data)


# -- graph mode ------------------------------------------------------------------------------------------------
OUTPUTS_PER_CELL = 4  # floating outputs with their own slot; later ones fold into the last
_COLUMNS = 5  # nan, inf, largest finite |x|, sum of squares, calls


class GraphHealth:
    """Graph mode: each selected cell's wrapper (``graph_wrapper.graph_construct`` over ``face()``) reduces its
    floating outputs (and, with gradients, their gradients, in a tap Cell's ``bprop``, and the weights'
    gradients, in a ``Parameter.register_hook`` compiled into the backward graph) and folds them into ONE
    health Parameter of shape (slots, 5) by ``ScatterNdAdd`` (NaN and Inf counts, sum of squares, calls) and
    ``ScatterNdMax`` (largest finite |x|); the host reads that Parameter once per step. A slot is a (cell,
    direction, output) given at compile time in the order the compiler meets the calls, so every call of a
    cell in a step (micro-batches included) folds into one row (``call`` -1). The wrapper is installed
    whether or not capture is, under capture's own wrapper, so the plain graph of ``graph_switch`` holds
    these ops when cells is on (no third graph) and nothing of them when it is off (no wrapper). The ops
    run in every step; ``cells_every`` decides which steps reset the Parameter and read it."""

    def __init__(self, cells: List[Tuple[str, object]], backward: bool):
        import numpy as np
        from mindspore import Parameter, Tensor

        self.names = [name for name, _ in cells]
        self.backward = backward
        weights = sum(len(own_parameters(cell)) for _, cell in cells) if backward else 0
        self.size = max(1, len(cells) * OUTPUTS_PER_CELL * (2 if backward else 1) + weights)
        self._zeros = Tensor(np.zeros((self.size, _COLUMNS), np.float32))
        self.buffer = Parameter(self._zeros.copy(), name="mf_celldump_cell_health", requires_grad=False)
        self.slots: Dict[tuple, int] = {}  # (direction, cell, kind, index) -> slot; outputs' given at compile time
        self._record: Optional[Callable] = None
        # Compile time: whether the graph being compiled carries capture's ops (``GraphSwitch.compiles_captured``,
        # set by the session once capture is wrapped). Such a graph gets no output-gradient tap: with capture's
        # gradient ops (``side_effect_io``) beside the tap's Parameter update in a bprop, MindSpore 2.9 fails the
        # compile ("Graph cycle exists"); that step's output gradients are in its capture instead.
        self.compiles_captured: Callable[[], bool] = lambda: False

    def slot_of(self, direction: str, cell: str, kind: str, index: int) -> int:
        key = (direction, cell, kind, min(index, OUTPUTS_PER_CELL - 1) if kind != "weight_grad" else index)
        if key not in self.slots:
            self.slots[key] = min(len(self.slots), self.size - 1)
        return self.slots[key]

    def reset(self) -> None:
        self.buffer.set_data(self._zeros.copy())

    def read(self) -> List[tuple]:
        """``(direction, cell, kind, index, -1, [nan, inf, max, sumsq])`` of the slots the step ran: forward in
        the compiler's order, then backward in the reverse order (the order gradients flow), weights' last."""
        values = self.buffer.asnumpy()  # the step's one host read
        forward, backward = [], []
        for (direction, cell, kind, index), slot in sorted(self.slots.items(), key=lambda item: item[1]):
            row = values[slot]
            if row[4] > 0:  # else not run in this step
                (forward if direction == "forward" else backward).append((direction, cell, kind, index, -1, row[:4]))
        grads = [r for r in backward if r[2] == "weight_grad"]
        return forward + [r for r in backward if r[2] != "weight_grad"][::-1] + grads

    def face(self):
        from mf_celldump.capture.backends.base import GraphFace

        health = self

        class HealthFace(GraphFace):
            def probe_function(self):
                return health.probe_function()

        return HealthFace()

    def recorder(self) -> Callable:
        """``record(value, index) -> (op, op)``: ``value`` folded into slot ``index`` (an int32 [[slot]]); the
        two ops are what the caller ``depend``s on. Graph-parsable; outside autodiff (``stop_gradient``)."""
        if self._record is not None:
            return self._record
        import mindspore as ms
        from mindspore import ops

        buffer, float32 = self.buffer, ms.float32
        add, largest_of, stop = ops.ScatterNdAdd(), ops.ScatterNdMax(), ops.stop_gradient

        def record(value, index):
            x = stop(value).astype(float32)
            kept = ops.where(ops.isfinite(x), ops.abs(x), ops.zeros_like(x))
            zero = ops.zeros((), float32)
            counts = ops.stack((ops.isnan(x).astype(float32).sum(), ops.isinf(x).astype(float32).sum(), zero,
                                (kept * kept).sum(), ops.ones((), float32))).reshape(1, _COLUMNS)
            most = ops.stack((zero, zero, kept.max(), zero, zero)).reshape(1, _COLUMNS)
            added = add(buffer, index, counts)
            return stop(largest_of(buffer, index, most)), stop(added)

        self._record = record
        return record

    def weight_hook(self, cell: str, index: int) -> Callable:
        """A ``Parameter.register_hook`` function folding the weight's gradient into its slot (graph-parsable)."""
        import mindspore as ms
        from mindspore import Tensor, ops

        record, depend = self.recorder(), ops.depend
        where = Tensor([[self.slot_of("backward", cell, "weight_grad", index)]], ms.int32)

        def hook(grad):
            first, second = record(grad, where)
            return depend(depend(grad, first), second)

        return hook

    def probe_function(self) -> Callable:
        """The ``GraphProbe`` of the health wrappers: outputs only, everything else passed through as it is."""
        import mindspore as ms
        from mindspore import Tensor, nn, ops
        from mindspore.ops.primitive import constexpr

        from mf_celldump.rawformat.keys import SLOT_CODES, SLOT_OUTPUT

        int32, depend, record = ms.int32, ops.depend, self.recorder()
        output_code, health, backward = SLOT_CODES[SLOT_OUTPUT], self, self.backward

        @constexpr
        def slot(head, path, direction):
            if head[1] != output_code:
                return -1
            kind = "output" if direction == "forward" else "output_grad"
            return health.slot_of(direction, health.names[head[0]], kind, path[0] if path else 0)

        @constexpr
        def floating(dtype):
            return str(dtype) in _FLOATS

        @constexpr
        def taps():
            return backward and not health.compiles_captured()

        class GradientHealth(nn.Cell):
            """Identity forward; its bprop folds the gradient into the gradient's slot."""

            def construct(self, x, index):
                return x

            def bprop(self, x, index, out, dout):
                first, second = record(dout, index)
                return depend(depend(dout, first), second), ops.zeros_like(index)

        tap = GradientHealth()

        def probe(value, head, path, use_in, note, call):
            if not isinstance(value, Tensor) or not floating(value.dtype) or slot(head, path, "forward") < 0:
                return value
            first, second = record(value, Tensor([[slot(head, path, "forward")]], int32))
            value = depend(depend(value, first), second)
            if taps():
                return tap(value, Tensor([[slot(head, path, "backward")]], int32))
            return value

        return probe
