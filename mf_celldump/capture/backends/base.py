"""The capture backend interface: how a captured value reaches the raw tree.

A backend has up to two faces, one per execution mode, and a small lifecycle whose
defaults do nothing:

* :class:`PyNativeFace`: plain Python, called by the wrapped ``construct`` when it runs
  eagerly; the key carries the exact call index and the step is known.
* :class:`GraphFace`: gives a probe function MindSpore's graph compiler parses (only
  primitives, ``constexpr`` helpers and closures over them), inserted into the graph
  once per captured value; it handles forward and backward capture of that value.
  Call indices are unknown at graph build time and inferred by processing.
"""

from __future__ import annotations

import inspect
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, Optional, Protocol, Tuple

from mf_celldump.capture.runtime import CaptureRuntime, RawSink
from mf_celldump.config import DumpConfig
from mf_celldump.errors import BackendModeError
from mf_celldump.rawformat.keys import ProbeKey
from mf_celldump.rawformat.writer import RawWriter

logger = logging.getLogger(__name__)


@dataclass
class BackendContext:
    """What every backend works with: the configuration, the step state, the raw output.

    ``device`` is MindSpore's device target; ``primitives`` an ``AscendPrimitives`` given
    by the caller of ``attach`` (tests, platforms without the kernels), else None;
    ``networks`` the cell given to ``attach`` and the model inside it (where a cell's own
    ``JitConfig`` is read). ``unselected_steps_plain``: graph mode, where a step that is not
    selected runs a compiled graph without capture ops (``capture/graph_switch.py``), so nothing
    of ours is written in it whatever MindSpore's step filter lets through.
    """

    config: DumpConfig
    runtime: CaptureRuntime
    writer: RawWriter
    device: str = "CPU"
    primitives: Optional[Any] = None
    networks: Tuple[Any, ...] = ()
    unselected_steps_plain: bool = False

    @property
    def sink(self) -> RawSink:
        return RawSink(self.runtime, self.writer)


class PyNativeFace(ABC):
    """Capture in PyNative mode: values pass through and come back (possibly with a hook)."""

    @abstractmethod
    def forward(self, value: Any, key: ProbeKey, mode: str) -> Any:
        """Capture ``value`` (a Tensor or a Python value) of a forward call; return it unchanged."""

    @abstractmethod
    def backward(self, tensor: Any, key: ProbeKey, mode: str) -> Any:
        """Return ``tensor`` so that its gradient is captured under ``key`` when it flows back."""

    @abstractmethod
    def backward_inputs(self, tensors: Tuple, keys: Tuple[ProbeKey, ...], modes: Tuple[str, ...]) -> Tuple:
        """Return the tensor inputs of one call, tied by ONE op, so that the gradient of each is
        captured under its key when the call's backward runs (also for an input that depends on
        no parameter, as long as another one of the call does)."""

    @abstractmethod
    def no_gradient(self, key: ProbeKey, mode: str) -> None:
        """Record that input ``key`` (a backward key, kind None) can have no gradient: an explicit null."""


class GraphProbe(Protocol):
    """What the wrapped ``construct`` calls for every captured value in graph mode.

    Called from graph code with exactly these six positional arguments (the graph parser
    gives no keyword or default-argument safety net, so a missing one fails the compile):
    ``value`` (a Tensor or a non-tensor value), ``head`` = (cell id, slot code[, backward
    rank]), ``path`` = the value's index path, ``use_in`` = the layer mapping's ``in`` mode,
    ``note`` = the call's constants id (0 but for the call's first tensor), ``call`` = what
    ``call_function`` returned at the start of the call (-1 when the backend has none).
    """

    def __call__(self, value: Any, head: Tuple[int, ...], path: Tuple[int, ...], use_in: bool, note: int,
                 call: int) -> Any: ...


class GradientProbe(Protocol):
    """``probe(value, head, path) -> value``: records a tensor that is itself a gradient."""

    def __call__(self, value: Any, head: Tuple[int, ...], path: Tuple[int, ...]) -> Any: ...


def check_probe(probe: Callable, protocol: type, backend: str) -> None:
    """Refuse a backend probe whose parameters differ from ``protocol``'s, before any graph is compiled.

    MindSpore reports such a mismatch only when it compiles the first graph that calls
    the probe, as a parse error far from its cause.
    """
    wanted = [name for name in inspect.signature(protocol.__call__).parameters if name != "self"]
    params = list(inspect.signature(probe).parameters.values())
    kinds = {inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD}
    if len(params) != len(wanted) or any(p.kind not in kinds or p.default is not p.empty for p in params):
        raise TypeError(f"the {backend} backend's {protocol.__name__} takes ({', '.join(p.name for p in params)}); "
                        f"the contract is ({', '.join(wanted)}), all positional, no defaults")


class GraphFace(ABC):
    """Capture in graph mode: one graph-parsable probe function, and optionally a recorder of
    the non-tensor values a call receives."""

    # False where the probes are MindSpore's TensorDump, documented as unsupported inside control flow
    # (debug_func.py): no probe is then put where a wrapper calls it under a run-time condition.
    dumps_in_control_flow: ClassVar[bool] = True

    @abstractmethod
    def probe_function(self) -> GraphProbe:
        """The :class:`GraphProbe` of this backend.

        A non-tensor ``value`` must come back as the very same object, with no operation
        applied to it: a value that is a constant to MindSpore's compiler (``None``, a Python
        int, a flag) has to stay one for the wrapped ``construct``; a variable scalar
        (``mutable``) is recorded by backends that can. ``note`` is the id
        ``constants_function`` gave for this call's constant values, handed to the first
        tensor probe of the call (0 for the others): emitting those values when that probe
        runs records them once per call without any op of their own.
        """

    def call_function(self) -> Optional[Callable]:
        """``call_number(cell_id)``, run once at the start of each call of a cell: the call's number
        as the running graph sees it, handed to that call's probes; None when this backend
        cannot number calls at run time (processing then infers the numbers from the order of
        captures, docs/raw-format.md)."""
        return None

    def constants_function(self) -> Optional[Callable]:
        """A ``constexpr`` ``note(cell_id, leaves) -> int`` run at compile time, ``leaves`` being
        ``((slot code, path, value), ...)`` for the call's constant non-tensor values; None
        when this backend records no non-tensor values in graph mode."""
        return None

    def input_gradients_function(self) -> Optional[Callable]:
        """``for_cell(cell_id) -> InputTie``: how each call of that cell ties its top-level tensor
        positional arguments (``graph_wrapper``); None: this backend records no input gradients."""
        return None

    def gradient_probe_function(self) -> Optional[GradientProbe]:
        """A :class:`GradientProbe` recording a tensor that is itself a gradient (what the optimizer
        receives) as a backward value when it runs; None if the backend cannot."""
        return None


@dataclass(frozen=True)
class InputTie:
    """One ``InsertGradientOf`` per call over the tuple of its top-level tensor positional arguments
    (graph mode), so an input that depends on no parameter (an attention mask) is on the gradient
    path as soon as another input of the call is; graph-parsable functions."""

    # (gradients) -> gradients, ``gradients[i]`` w.r.t. the i-th of those tensors (msprobe's
    # ``backward.output.i``): the function of the call's ``InsertGradientOf``.
    on_gradients: Callable
    # (tensors) -> tensors, run instead in a call whose tensor inputs are all integer: the nulls.
    no_gradient: Callable
    # True: the tie comes before the inputs' probes, whose own bprops record the gradients; the tie
    # only keeps them alive. False: after the probes, and ``on_gradients`` records.
    before_probes: bool = False


def joined_gradients() -> Callable:
    """``on_gradients`` for a tie before the probes: each gradient returned ``depend``-ed on all of them.

    A recording in a probe's bprop is joined to the gradient it passes on by data or ``depend``
    only; the gradient of an input used by nothing upstream (a mask from the batch) is dropped by
    the compiler, and the recording with it, unless another gradient of the call depends on it.
    ``depend`` returns its first input, so no value changes. Graph-parsable."""
    from mindspore import ops

    depend = ops.depend

    def joined(gradients, anchor):
        if not gradients:
            return ()
        return (depend(gradients[0], anchor),) + joined(gradients[1:], anchor)

    def on_gradients(gradients):
        return joined(gradients, gradients)

    return on_gradients


class CaptureBackend:
    """One way of capturing; see the module docstring. Subclasses set ``name``, and override
    the faces they have and the lifecycle hooks they need (like accelerate's ``ModelHook``)."""

    name: ClassVar[str]
    # True when the backend's graph-mode capture ops are kept out of MindSpore's recompute pass, so a cell
    # under ``Cell.recompute()`` records each call once (``capture/recompute.py``); else attach refuses it.
    graph_recompute_safe: ClassVar[bool] = False

    def __init__(self, context: BackendContext):
        self.context = context
        self.config = context.config

    @property
    def writes_later(self) -> bool:
        """True when MindSpore writes a step's raw files after the step has ended (a marker file in
        the step folder says when they are all there); the session then writes no step-done
        marker itself and processing waits for MindSpore's."""
        return False

    @property
    def writes_unselected(self) -> bool:
        """True when MindSpore also writes the steps that are not selected (see ``last_unselected_step``)."""
        return False

    @property
    def steps_fixed_at_attach(self) -> bool:
        """True when MindSpore selects the captured steps from a list given before training (TensorDump's
        step filter, the kernel-by-kernel dump's iterations): no step can be added while training runs."""
        return False

    @property
    def last_unselected_step(self) -> Optional[int]:
        """The last step whose raw files MindSpore writes although it was not selected (another
        TensorDump user keeps the process-wide step filter open), when no selected step ran
        after it; processing deletes such files once MindSpore has finished them. None: nothing
        of the kind to wait for."""
        return None

    @property
    def pairs_backward_by_order(self) -> bool:
        """True when backward captures carry no call number, so processing pairs each with a forward call by
        execution order (graph-mode TensorDump); the micro-batch schedule must then be known
        (``capture/micro_batches.py``)."""
        return False

    def parallel_settings(self):
        """MindSpore's auto-parallel settings as they schedule micro-batches (``micro_batches.ParallelSettings``)."""
        from mf_celldump.capture.micro_batches import mindspore_parallel_settings

        return mindspore_parallel_settings()

    def setup(self, initial_step: int) -> None:
        """Called once at attach, before any compile. May raise ``BackendSetupError``."""

    def teardown(self) -> None:
        """Called at detach."""

    def begin_step(self, step: int, captured: bool) -> bool:
        """Called when any step begins (selected or not); True if the manifest must be rewritten."""
        return False

    def end_step(self, step: int, captured: bool) -> None:
        """Called when any step ends normally; by default a captured step is synchronised and finished."""
        if captured:
            self.synchronize()
            self.finish_step()

    def abort_step(self, step: int, captured: bool) -> None:
        """Called when a step ends because training failed in it; its data stays unfinished.

        By default what was handed to the writer before the failure is written out first.
        """
        if captured:
            try:
                self.context.writer.flush()
            except OSError as err:
                logger.warning("raw data captured before the failure of step %d was not all written: %s", step, err)

    def finish_step(self) -> None:
        """Called when a captured step ends, after the device has been synchronised."""

    def synchronize(self) -> None:
        """Wait for queued work (and so for capture ops) to finish (``synchronize_device``)."""
        synchronize_device(self.context.device)

    def manifest_fields(self) -> Dict[str, Any]:
        """Manifest fields this backend decides (step numbering, completion rule, statistics)."""
        return {}

    def pynative(self) -> PyNativeFace:
        raise BackendModeError(f"the {self.name} backend does not capture in PyNative mode")

    def graph(self) -> GraphFace:
        raise BackendModeError(f"the {self.name} backend does not capture in graph mode")


def synchronize_device(device: str) -> None:
    """Wait for the device's queued work (and so for capture ops) to finish.

    ``mindspore.runtime.synchronize()`` serves devices; on CPU it only prints "[ERROR] ...
    CPU device is not supported" (mindspore/runtime/device.py), so there the PyNative
    executor's queue is drained instead. Every synchronisation of the backends goes
    through here, so plain use on CPU prints no MindSpore error line.
    """
    try:
        if device == "CPU":
            try:
                from mindspore.graph.api import _pynative_executor  # private, guarded (2.9+)
            except ImportError:  # before MindSpore 2.9
                from mindspore.common.api import _pynative_executor

            _pynative_executor.sync()
        else:
            import mindspore as ms

            ms.runtime.synchronize()
    except (AttributeError, ImportError, RuntimeError) as err:
        logger.debug("synchronize skipped: %s", err)
