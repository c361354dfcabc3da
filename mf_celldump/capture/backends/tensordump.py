"""MindSpore's TensorDump for forward values and DumpGradient for gradients.

PyNative (verified on CPU): the file path holds the step folder and the exact call
index; TensorDump appends ``_{dtype}_{id}.npy`` and writes synchronously, waiting for
the value (and so for every op queued before it). The step path therefore only queues
(key, tensor) pairs; they are dumped in capture order after one synchronisation at the
end of the step, or earlier when the queue holds more than ``pending_limit_bytes``.
Parameters are dumped at once: the optimizer updates them in place later in the step.
On CPU with MindSpore's own TensorDump, where it writes each file on the training thread,
the raw writer's thread writes the same files instead (TensorDump's name, header and
bytes, ``rawformat.npy_files``), so the step ends without waiting for the disk. The ids
count this capture's files from 0, as TensorDump's own counter counts every TensorDump
call of the process from 0: the same numbers unless something else in the process called
TensorDump first (processing only compares them with the ids of the same step's files and
with the raw writer's sequence numbers of the weights).

Graph mode (Ascend; proven on CPU by the emulation in ``tests/support/ascend_emulation.py``):
file paths hold MindSpore's ``{step}`` placeholder and MindSpore writes the files
asynchronously, after the step, from one writer thread. At the end of every step the
backend synchronises the device, sends a step-done marker for a captured step through
the same FIFO channel (when MindSpore has written it, every file of the step is
complete), then the update marker that moves ``{step}`` on (see ``tensordump_steps``).
Sources, MindSpore repository: TDC ``mindspore/ccsrc/tools/tensor_dump/tensordump.cc``,
MBUF ``.../mbuf_manager/mbuf_receive_manager.cc``, PTD
``mindspore/ccsrc/frontend/parallel/graph_util/parallel_tensordump.cc``.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import Callable, List, Optional, Sequence, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, ops
from mindspore.ops.primitive import constexpr

from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives
from mf_celldump.capture.backends.base import (
    BackendContext,
    CaptureBackend,
    GraphFace,
    InputTie,
    PyNativeFace,
    joined_gradients,
)
from mf_celldump.capture.backends.gradient_hooks import GradientHookCache, ParameterAliases
from mf_celldump.capture.backends.tensordump_process import (
    advise_slicing,
    check_channel,
    check_tensordump_can_write,
    foreign_users,
)
from mf_celldump.capture.backends.tensordump_steps import GraphStepMap
from mf_celldump.capture.micro_batches import SEMI_AUTO_MODES, ParallelSettings
from mf_celldump.dtypes import numpy_dtype_name
from mf_celldump.errors import BackendSetupError
from mf_celldump.rawformat.keys import (
    BACKWARD,
    CODE_SLOTS,
    FORWARD,
    KIND_NONE,
    KIND_TENSOR,
    SLOT_ARG,
    ProbeKey,
    kind_of_value,
)
from mf_celldump.rawformat.manifest import COMPLETION_TENSORDUMP, NUMBERING_GLOBAL, NUMBERING_GRAPH
from mf_celldump.rawformat.names import raw_stem, td_done_stem, td_skip_stem

logger = logging.getLogger(__name__)

class TensorDumpBackend(CaptureBackend):
    name = "tensordump"
    graph_recompute_safe = True  # its dump primitives are marked recompute=False (_mark_forward_primitives)
    stem_separator = "."
    # Statistics backends dump a float32 copy of a bfloat16/float16 value (names.WIDENED_DTYPES):
    # MindSpore's device statistics kernels allocate their result in the input's dtype
    # (statistic_kernel.cc, GetOutputDeviceAddress(input->dtype_id())).
    widens_low_precision = False

    def __init__(self, context: BackendContext, primitives: Optional[AscendPrimitives] = None):
        super().__init__(context)
        self._given = primitives or context.primitives
        self.primitives: Optional[AscendPrimitives] = self._given
        self.graph_mode = False
        self.host_files = False  # PyNative on CPU: the raw writer writes TensorDump's files (module docstring)
        self.steps: Optional[GraphStepMap] = None
        self._send_failed = False
        self._next_step: Optional[int] = None  # the step the previous one leads to
        self.shared = False  # another TensorDump user needs every step: the filter stays open
        self._last_unselected: Optional[int] = None
        self._face: Optional[TensorDumpPyNative] = None

    @property
    def writes_later(self) -> bool:
        return self.graph_mode

    @property
    def writes_unselected(self) -> bool:
        return self.shared and not self.context.unselected_steps_plain

    @property
    def steps_fixed_at_attach(self) -> bool:
        return self.graph_mode

    @property
    def last_unselected_step(self) -> Optional[int]:
        return self._last_unselected

    @property
    def pairs_backward_by_order(self) -> bool:
        return self.graph_mode  # file names are fixed when the graph is compiled: no call in them

    def parallel_settings(self) -> ParallelSettings:
        return ParallelSettings.read(self.primitives.auto_parallel_context)

    def under_parallel_pass(self) -> bool:
        """Whether MindSpore's parallel pass rewrites the graph's dumps: (semi-)auto parallel only
        (step_parallel.cc StepParallel returns early otherwise)."""
        return self.parallel_settings().parallel_mode in SEMI_AUTO_MODES

    def manifest_fields(self) -> dict:
        if not self.graph_mode:
            return {"step_numbering": NUMBERING_GLOBAL, "graph_step_base": 0}
        return {"step_numbering": NUMBERING_GRAPH, "graph_step_base": self.steps.base,
                "step_completion": COMPLETION_TENSORDUMP}

    def setup(self, initial_step: int) -> None:
        self.primitives = self._given or AscendPrimitives.from_mindspore()
        self.graph_mode = ms.get_context("mode") == ms.GRAPH_MODE
        if not self.graph_mode:
            self.host_files = self.context.device == "CPU" and _is_mindspore_tensordump(self.primitives.dump_out)
            # From 2.7.1 an eager TensorDump checks the process-wide step filter against the
            # graph counter too (TDC ExecTask -> ProcessFileName with the default mode): a
            # filter left by an earlier graph-mode capture would silently stop every file.
            self.primitives.tensordump_set_step([])
            return
        check_channel(self.primitives.backend_policy())
        check_tensordump_can_write(self.primitives.environ)
        advise_slicing(self.primitives.environ)
        self._mark_forward_primitives()
        self.steps = GraphStepMap.start(self.config.steps, initial_step, self.primitives.updates_sent())
        others = foreign_users()
        self.shared = bool(others) and not self.config.steps.selects_all
        if self.shared and self.context.unselected_steps_plain:
            logger.info("%s write TensorDump files on every step, and MindSpore's TensorDump step filter "
                        "(_tensordump_set_step) is one for the whole process: it stays open for them. Steps not "
                        "selected run the graph without capture ops, so they write nothing of this capture",
                        " and ".join(others))
        elif self.shared:
            logger.warning(
                "%s write TensorDump files on every step, and MindSpore's TensorDump step filter "
                "(_tensordump_set_step) is one for the whole process: filtering steps=%s would silence them. "
                "The filter stays open, so MindSpore writes this capture on every step and the files of steps "
                "not selected are deleted once MindSpore has finished them. That costs the dump's time and disk "
                "traffic on every step; to capture only the selected steps, turn them off for this run",
                " and ".join(others), self.config.steps.describe())
        # Always set: the filter is process-wide and outlives an earlier capture of this process.
        self.primitives.tensordump_set_step([] if self.shared else self.steps.mindspore_filter())

    def _mark_forward_primitives(self) -> None:
        """``td_flag`` names the kernel by its file in the statistics dump (debug_actor.cc AscendKbkDump);
        ``side_effect_io=False`` lets the scheduler move it (it lives through ``depend``). MindSpore
        sets both on the TensorDump inside DumpGradient (grad_debug_ops.py), msprobe 26.2 on its own.

        ``recompute=False`` on the TensorDumps and on DumpGradient keeps them out of MindSpore's recompute
        pass: a cell under ``Cell.recompute()`` has its forward nodes cloned into the backward pass, and a
        primitive's own ``recompute`` attribute wins over its cell's (``Cell.recompute`` and
        ``Primitive.recompute`` docstrings, ``mindspore/nn/cell.py`` and ``mindspore/ops/primitive.py``, 2.9),
        so each dump runs once, in the forward pass, as without recompute (DumpGradient's output is kept
        instead of recomputed; its bprop's TensorDump is built in the backward pass and runs once anyway).
        What ``Primitive.recompute(False)`` sets, set directly (``capture/recompute.py``)."""
        for primitive in (self.primitives.dump_out, self.primitives.dump_in):
            primitive.add_prim_attr("td_flag", True)
            primitive.add_prim_attr("side_effect_io", False)
        for primitive in (self.primitives.dump_out, self.primitives.dump_in, self.primitives.dump_gradient):
            primitive.add_prim_attr("recompute", False)

    def begin_step(self, step: int, captured: bool) -> bool:
        if not self.graph_mode:
            return False
        self._check_consecutive(step)
        if not self.steps.realign(step, self.primitives.updates_sent()):
            return False
        logger.info("step %d begins at TensorDump graph step %d (not where the previous steps lead): "
                    "step folders re-mapped", step, self.primitives.updates_sent())
        if not self.shared:
            self.primitives.tensordump_set_step(self.steps.mindspore_filter())
        return True

    def _check_consecutive(self, step: int) -> None:
        """Graph capture sees one step per callback; a jump usually means data sink with sink_size > 1."""
        if self._next_step is not None and step != self._next_step:
            logger.warning("step %d follows step %d: if one training callback covers several steps (data sink with "
                           "sink_size > 1), each captured step folder holds all of them; use sink_size 1",
                           step, self._next_step - 1)
        self._next_step = step + 1

    def end_step(self, step: int, captured: bool) -> None:
        if not self.graph_mode:
            super().end_step(step, captured)
            return
        self._step_boundary(step, captured)

    def abort_step(self, step: int, captured: bool) -> None:
        if self.graph_mode:  # no step-done marker: the failed step stays incomplete
            self._step_boundary(step, captured=False)
        elif captured and self._face is not None:
            self._face.flush()  # what was captured before the failure is written, as before; no marker

    def finish_step(self) -> None:
        if self._face is not None:
            self._face.flush()

    def synchronize(self) -> None:
        self.primitives.synchronize()

    def _step_boundary(self, step: int, captured: bool) -> None:
        """Device sync, step-done marker (captured steps), update marker: in this order, every step.

        The sync comes first so every TensorDump of the step is in the channel before the
        markers (MindSpore's test_tensordump_when_graph_pynative_hybrid_rank_step and msprobe
        do the same); the channel is one FIFO with one writer thread (MBUF MbufDataHandler),
        so the step-done marker is written after every file of the step.
        """
        try:
            self.primitives.synchronize()
        except RuntimeError as err:
            logger.warning("device synchronisation failed at the end of step %d: %s", step, err)
        if captured:
            self.steps.note_captured(step)
        if captured or self.writes_unselected:  # the files of a step not selected are deleted once this arrives
            self._last_unselected = None if captured else step
            stem = td_done_stem(step) if captured else td_skip_stem(step)
            path = os.path.join(self.context.writer.placeholder_step_dir(), stem)
            self._send(lambda: self.primitives.run_op_tensordump(path, self.primitives.make_marker_tensor()),
                       f"the end of step {step}")
        self._send(self.primitives.send_update_marker, f"the end of step {step}")

    def _send(self, send: Callable[[], None], when: str) -> None:
        try:
            send()
        except (RuntimeError, TypeError, ValueError) as err:
            if not self._send_failed:
                self._send_failed = True
                logger.error("could not launch TensorDump's step markers at %s (%s): MindSpore's step folders will "
                             "not advance and captured steps will be reported missing", when, err)

    def teardown(self) -> None:
        if self.graph_mode and self.steps is not None and not self.shared:
            self.reopen_filter(self.steps.captured_counters)

    def reopen_filter(self, queued: Sequence[int]) -> None:
        """Give the process-wide step filter back to everyone, as far as MindSpore allows.

        MindSpore has no narrower setting and no way to read the filter, so at detach it is
        set to: the graph steps in ``queued`` (their files may still be in MindSpore's queue)
        plus every TensorDump from now on, made one graph step of its own by one more update
        marker. Files still queued from steps not captured stay filtered out; other users'
        TensorDumps are written again. Capture ops compiled into a graph that runs again after
        detach write again too (into ``_raw``): MindSpore offers no way to stop only them.
        """
        self._send(self.primitives.send_update_marker, "detach")
        self.primitives.tensordump_set_step(sorted(set(queued) | {self.primitives.updates_sent()}))

    def pynative(self) -> PyNativeFace:
        self._face = TensorDumpPyNative(self)
        return self._face

    def graph(self) -> GraphFace:
        return TensorDumpGraph(self)


class TensorDumpPyNative(PyNativeFace):
    pending_limit_bytes = 256 * 1024 * 1024

    def __init__(self, backend: TensorDumpBackend):
        self.backend = backend
        self.context = backend.context
        self.primitives = backend.primitives
        self.forward_enabled = backend.config.captures_forward
        self.gradient_hooks = GradientHookCache(self.context.runtime, self._dump_gradient)
        self._pending: List[Tuple[str, int, ProbeKey, Tensor]] = []  # (mode, step, key, tensor) in capture order
        self._pending_bytes = 0
        self.aliases = ParameterAliases(self.context.runtime)  # Parameters and our hooks' aliases of them, this step
        self._ids = itertools.count()  # host_files: TensorDump's file ids (module docstring)

    def _queue(self, mode: str, key: ProbeKey, tensor, parameter: bool = False) -> None:
        step = self.context.runtime.step
        if parameter or isinstance(tensor, Parameter):
            self.flush()  # keeps capture order; the value is the one before the optimizer's update
            self._dump(mode, step, key, tensor, copy=True)
            return
        self._pending.append((mode, step, key, tensor))
        self._pending_bytes += tensor.nbytes
        if self._pending_bytes > self.pending_limit_bytes:
            self.flush()

    def flush(self) -> None:
        """Dump every queued value in capture order; the first dump waits for the queue, the rest do not."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if self.backend.host_files:
            self._hand_over(pending)
            return
        for mode, step, key, tensor in pending:
            self._dump(mode, step, key, tensor)

    def _dump(self, mode: str, step: int, key: ProbeKey, tensor, copy: bool = False) -> None:
        if self.backend.host_files:
            self._hand_over([(mode, step, key, tensor)], copy)
            return
        stem = raw_stem(key, self.backend.stem_separator)
        op = self.primitives.dump_in if mode == "in" else self.primitives.dump_out
        op(os.path.join(self.context.writer.step_dir(step), stem), tensor)

    def _hand_over(self, pending: List[Tuple[str, int, ProbeKey, Tensor]], copy: bool = False) -> None:
        """host_files: TensorDump's files of ``pending``, to the writer's thread in one hand-over per step (the
        arrays are taken first, so the thread does not compete with this loop)."""
        by_step: dict = {}
        for _mode, step, key, tensor in pending:
            # CPU TensorDump ignores the mode (no "_in" in the name) and writes bfloat16 as float32 data.
            host = tensor.astype(ms.float32) if tensor.dtype == ms.bfloat16 else tensor
            array = host.asnumpy()  # a view of the tensor's memory on CPU: the writer keeps ``host`` alive
            if copy:
                array, host = np.array(array, copy=True), None
            dtype = numpy_dtype_name(str(tensor.dtype))
            by_step.setdefault(step, []).append((key, array, dtype, next(self._ids), host))
        for step, files in by_step.items():
            self.context.writer.write_tensordump_files(step, files)

    def forward(self, value, key: ProbeKey, mode: str):
        if not self.forward_enabled:
            return value
        if isinstance(value, Tensor):
            parameter = self.aliases.is_parameter(value)
            self._queue(mode, key, value, parameter)
            return value
        kind = kind_of_value(value)
        if kind is not None:
            # Non-tensor values travel as scalar tensors so they share TensorDump's order.
            scalar = 0 if value is None else value
            self._queue(mode, key.with_kind(kind), Tensor(scalar))
        return value

    def backward(self, tensor, key: ProbeKey, mode: str):
        hooked = self.gradient_hooks.apply(tensor, key, mode)
        self.aliases.hooked(tensor, hooked)  # shares a Parameter's memory but is no Parameter
        return hooked

    def backward_inputs(self, tensors, keys, modes):
        return self.aliases.hooked_all(tensors, self.gradient_hooks.apply_many(tensors, keys, modes))

    def no_gradient(self, key: ProbeKey, mode: str) -> None:
        # Travels as a scalar file like the forward non-tensor values; its kind (None) makes it a null.
        if self.context.runtime.active:
            self._queue(mode, key.with_kind(KIND_NONE), Tensor(0))

    def _dump_gradient(self, gradient, key: ProbeKey, mode: str) -> None:
        self._queue(mode, key, gradient)


class TensorDumpGraph(GraphFace):
    dumps_in_control_flow = False  # debug_func.py: "The operator of tensordump doesn't support in control flow"

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
        has_gradient, gradient_path = _make_gradient_numbering()
        widened, float32, cast = _make_widening(self.backend.widens_low_precision), ms.float32, ops.cast
        parallel = self.backend.under_parallel_pass()
        refuse_widened = _make_parallel_widening_refusal(forward_enabled and parallel, self.backend.name)
        hook_of_in, hook_of_out = _hook_modes(parallel)

        def dumped(value, head, path, use_in, wide):  # TensorDump file order gives the call
            if backward_enabled and has_gradient(head):
                value = grad(graph_path(prefix, head, "b", gradient_path(head, path), sep, wide), value,
                             hook_of_in if use_in else hook_of_out)
            if forward_enabled:
                name = graph_path(prefix, head, "f", path, sep, wide)
                if use_in:  # noqa: SIM108 - statement form: what the graph parser is known to take
                    value = depend(value, dump_in(name, value))
                else:
                    value = depend(value, dump_out(name, value))
            return value

        def graph_probe(value, head, path, use_in, note, call):
            if isinstance(value, Tensor):
                wide = widened(value.dtype)
                if wide:  # a float32 copy goes through the dumps; its gradient comes back the same way
                    refuse_widened(wide, head, use_in)
                    # Under the parallel pass an 'in' probe of the copy is dumped on the producer side too ('out'
                    # dump, which no handler moves across the copy's Cast; its hook is 'in' anyway, _hook_modes):
                    # PTD InsertNewTensorDump would put the per-consumer clones after the cast back, on the
                    # low-precision value under a float32 name.
                    return cast(dumped(cast(value, float32), head, path, use_in and not parallel, wide),
                                value.dtype)
                return dumped(value, head, path, use_in, wide)
            return value

        return graph_probe

    def input_gradients_function(self) -> Optional[Callable]:
        """The inputs' DumpGradient probes record their gradients; a tie placed before them keeps each
        record alive: its function makes every gradient of the call depend on all of them.

        DumpGradient's bprop (MindSpore 2.9 ``grad_debug_ops.py`` ``get_bprop_dump_gradient``) joins its
        TensorDump (``side_effect_io`` False) to the gradient it returns by ``depend`` only, so when that
        gradient is used by nothing (a mask from the batch) the dump goes with it. Graph autodiff builds
        no bprop at all for a probe none of whose inputs is differentiated; after the tie, a mask's
        probe takes the tie's output, which depends on the call's other inputs. A call whose tensor
        inputs are all integer writes a null per input (a scalar file of kind None)."""
        if not self.backend.config.captures_backward:
            return None
        dump_out, depend = self.backend.primitives.dump_out, ops.depend
        prefix = self.backend.context.writer.placeholder_step_dir() + os.sep
        sep = self.backend.stem_separator
        null_path = _make_null_path()
        on_gradients = joined_gradients()

        def for_cell(cell_id):
            def no_gradient(tensors, rank):
                if not tensors:
                    return ()
                first = depend(tensors[0], dump_out(null_path(prefix, cell_id, rank, sep), Tensor(0)))
                return (first,) + no_gradient(tensors[1:], rank + 1)

            def on_no_gradient(tensors):
                return no_gradient(tensors, 0)

            return InputTie(on_gradients, on_no_gradient, before_probes=True)

        return for_cell

    def gradient_probe_function(self) -> Callable:
        dump_out, depend = self.backend.primitives.dump_out, ops.depend
        prefix = self.backend.context.writer.placeholder_step_dir() + os.sep
        sep = self.backend.stem_separator
        graph_path = _make_graph_path()
        widened, float32, cast = _make_widening(self.backend.widens_low_precision), ms.float32, ops.cast

        def gradient_probe(value, head, path):
            wide = widened(value.dtype)
            if wide:
                return depend(value, dump_out(graph_path(prefix, head, "b", path, sep, wide), cast(value, float32)))
            return depend(value, dump_out(graph_path(prefix, head, "b", path, sep, wide), value))

        return gradient_probe


def _is_mindspore_tensordump(op) -> bool:
    """Whether ``op`` is MindSpore's own TensorDump (not a stand-in), whose CPU files we can write ourselves."""
    from mindspore.ops.operations.debug_ops import TensorDump  # where MindSpore 2.5 to 2.10 define it

    return type(op) is TensorDump


def _make_gradient_numbering():
    """msprobe's numbering of input gradients (graph_wrapper gives a top-level tensor positional input
    ``head = (cell, slot, rank)``, a tensor inside a sequence argument rank -1): whether a gradient is
    recorded, and its path, ``(rank,)`` for a positional input."""

    @constexpr
    def has_gradient(head):
        return len(head) < 3 or head[2] >= 0

    @constexpr
    def gradient_path(head, path):
        return (head[2],) if len(head) > 2 else path

    return has_gradient, gradient_path


def _make_null_path():
    @constexpr
    def null_path(prefix, cell_id, rank, sep):
        # Compile-time: the file of an explicit null for backward input ``rank`` (no gradient can exist).
        key = ProbeKey(cell_id=cell_id, direction=BACKWARD, slot=SLOT_ARG, kind=KIND_NONE, path=(rank,), call=None)
        return prefix + raw_stem(key, sep)

    return null_path


def _make_graph_path():
    @constexpr
    def graph_path(prefix, head, direction_letter, path, sep, widened_from=""):
        # Compile-time: builds the TensorDump file path from constants.
        key = ProbeKey(cell_id=head[0], direction=FORWARD if direction_letter == "f" else BACKWARD,
                       slot=CODE_SLOTS[head[1]], kind=KIND_TENSOR, path=tuple(path), call=None)
        return prefix + raw_stem(key, sep, widened_from or None)

    return graph_path


def _hook_modes(parallel: bool) -> Tuple[str, str]:
    """The DumpGradient mode of an ``'in'`` probe's gradient hook and of an ``'out'`` probe's.

    Only MindSpore's parallel pass reads the mode (PTD; DumpGradient's bprop dumps the same
    way in either). Under it an ``'out'`` hook is deleted for every user of the value
    (``HandleDumpAfterRedistributionNode``: ``fg_manager->Replace(hook_cnode, hook_prenode)``)
    and cloned only onto the parallel-care consumers' inputs
    (``MakeOutModeDumpBwdHookAfterRedistribution``): each clone records one consumer's share, and
    a user outside ``next_nodes`` (a value returned as it is, a node with no operator info) adds
    to the gradient where nothing records it. An ``'in'`` hook is left on the producer side
    (``CollectBwdDumpHookAlongPath`` takes ``'out'`` hooks only), where autodiff has summed every
    user's contribution, each consumer's brought back to the producer's layout: the complete
    gradient, one file, in the producer's layout (``DecorateDumpPathIfDumpOps`` names it ``_in``).
    When the value is the output of an op completed by a forward AllReduce/ReduceScatter,
    ``MakeInModeBwdHookBeforeFwdComm`` moves an ``'in'`` hook before the communication, where a
    cell's ``'out'`` probe records its gradient too. Without the pass the mode changes nothing:
    the pairing is msprobe 26.2's (forward ``'in'`` with gradient ``'out'``, ``'out'`` with ``'in'``)."""
    return ("in", "in") if parallel else ("out", "in")


def _make_parallel_widening_refusal(enabled: bool, backend: str):
    """``refuse(wide, head, use_in)``: compile time; raises for an ``'out'`` probe of a bfloat16/float16 value
    dumped forward as a float32 copy under MindSpore's parallel pass (PTD, MindSpore 2.9):
    ``MakeOutModeDumpBeforeFwdComm`` re-points an ``'out'`` TensorDump reached from an op's output through
    Depend, DumpGradient or Reshape (``CollectDumpNodesRecursively``; not through Cast) to the value before
    the op's forward AllReduce/ReduceScatter. Behind the copy's Cast the dump keeps the reduced value, where
    a float32 probe of the same kind of cell, and the tensor task, record this rank's partial sum: the two
    would disagree, and nothing in the files says which a dump holds. (An ``'in'`` probe of a copy is
    taken on the producer side instead, where it holds the reduced value as the consumers' copies of a
    float32 value do.) The dtype is known only when the graph is compiled, before any kernel of it runs."""

    @constexpr
    def refuse(wide, head, use_in):
        if enabled and wide and not use_in:
            raise BackendSetupError(
                f"cell id {head[0]}: an 'out' probe of a {wide} value would be dumped forward as a float32 copy "
                "under (semi-)auto parallel, where MindSpore's parallel pass points 'out' dumps of an op's output "
                "at the value before its forward AllReduce/ReduceScatter (parallel_tensordump.cc "
                "MakeOutModeDumpBeforeFwdComm) but cannot reach one behind the copy's Cast: it would record the "
                f"reduced value where float32 values and the tensor task record this rank's partial sum. The "
                f"{backend} backend cannot record it consistently: use task: tensor (processing computes the "
                "statistics from the files in float64), 'in' for this value in the layer mapping, or "
                "data_mode: backward")
        return 0

    return refuse


def _make_widening(enabled: bool):
    """``widened(dtype)``: the numpy-style name of a bfloat16/float16 dtype the backend dumps as a float32
    copy (``names.WIDENED_DTYPES``), else ``""``; compile time."""
    low = {str(ms.bfloat16): "bfloat16", str(ms.float16): "float16"}

    @constexpr
    def widened(dtype):
        return low.get(str(dtype), "") if enabled else ""

    return widened
