"""The captured cells' own weights and their gradients, as msprobe's L0 dump records them.

msprobe 26.2 writes, for each cell, its own parameters (``parameters`` in every forward
entry, read at the forward call) and their gradients (a
``Cell.{name}.{Class}.parameters_grad.{n}`` entry). Here, without adding anything that
changes the network's numbers:

* **weights** are read on the host when a captured step begins (slot ``w``). Nothing
  writes a parameter between the start of a step and the optimizer's update at its end,
  so these are the values every forward call of the step reads, in both modes. (A cell
  that updates a parameter inside its own forward, such as BatchNorm's moving
  statistics, is recorded before that update; msprobe records it after.)
* **gradients** (slot ``g``): a hook on each captured cell's parameter
  (``Parameter.register_hook``, as msprobe does) in both modes, so both record this rank's
  gradient as autodiff gives it (the parameter's uses summed, multiplied by the loss
  scale), before the training wrapper reduces, unscales and clips it. PyNative: the hook
  keeps a reference and returns the gradient unchanged; the gradients are read when the
  step ends (``flush``), after the synchronisation the step ends with anyway: reading
  each one inside its hook would synchronise the device in the middle of the backward
  pass once per parameter (measured: ~8 ms per gradient on the tiny LLaMA on CPU). (Wrapping the optimizer does not work
  there: MindSpore's optimizers compile their ``construct`` even in PyNative mode.)
  Graph mode: the hook is compiled into the backward graph and passes the gradient
  through the backend's graph gradient probe (an identity for the values). Where a
  MindSpore cannot register it, the optimizer's ``construct`` is wrapped instead so that
  each gradient it receives goes through the probe; gradients are mapped back to the
  cells owning the parameters through the optimizer's parameter list, whose order is the
  order of its gradients (``mindspore.nn.Optimizer``'s contract). Those are after the
  training wrapper's reduction, loss-scale division and clipping; ``gradient_point``
  (written to the manifest and dump.json) says which point was recorded.
"""

from __future__ import annotations

import inspect
import linecache
import logging
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from mf_celldump.capture.backends.base import GradientProbe, check_probe
from mf_celldump.capture.construct import InstalledConstruct, install
from mf_celldump.capture.control_flow import conditional_call
from mf_celldump.capture.runtime import CaptureRuntime, RawSink
from mf_celldump.config import DumpConfig
from mf_celldump.dtypes import mindspore_dtype_name, numpy_dtype_name
from mf_celldump.fsutil import ensure_dir
from mf_celldump.layout.naming import GRADIENT_POINT_AUTODIFF, GRADIENT_POINT_OPTIMIZER
from mf_celldump.rawformat.keys import (
    BACKWARD,
    FORWARD,
    KIND_TENSOR,
    SLOT_CODES,
    SLOT_WEIGHT,
    SLOT_WEIGHT_GRAD,
    ProbeKey,
)
from mf_celldump.statistics import compute_statistics

logger = logging.getLogger(__name__)

# Where parameters_grad is read (the manifest's and dump.json's ``naming.PARAMETERS_GRAD_KEY``): each
# parameter's gradient as autodiff gives it (local, before reduction, unscaling and clipping), or what
# the optimizer receives (after the training wrapper's reduction, loss-scale division and clipping).
AUTODIFF, OPTIMIZER_INPUT = GRADIENT_POINT_AUTODIFF, GRADIENT_POINT_OPTIMIZER

_GENERATED_MODULE = __name__


def own_parameters(cell) -> List[Tuple[str, object]]:
    """(msprobe's name, Parameter) of the parameters ``cell`` holds itself, not its children's.

    msprobe names a parameter by the last dotted part of its name; a later parameter with
    the same last part replaces an earlier one, as in msprobe's dict.
    """
    try:
        found = cell.parameters_dict(recurse=False)
    except (AttributeError, TypeError):
        return []
    named: Dict[str, object] = {}
    for full_name, param in found.items():
        named[str(full_name).rsplit(".", 1)[-1]] = param
    return list(named.items())


def weight_names(cell) -> Tuple[str, ...]:
    return tuple(name for name, _ in own_parameters(cell))


@dataclass
class _Owner:
    cell_id: int
    index: int  # in the cell's weights


@dataclass
class ParameterCapture:
    """Weights at step start and the optimizer's gradients, for the captured cells."""

    config: DumpConfig
    runtime: CaptureRuntime
    sink: RawSink
    weights: List[Tuple[_Owner, object]] = field(default_factory=list)  # (owner, Parameter)
    owners: Dict[int, List[_Owner]] = field(default_factory=dict)  # id(Parameter) -> cells owning it
    installed: List[InstalledConstruct] = field(default_factory=list)
    hook_handles: List[object] = field(default_factory=list)
    pending: List[Tuple[ProbeKey, object]] = field(default_factory=list)  # gradients to read at step end
    gradient_point: Optional[str] = None  # where parameters_grad is read: AUTODIFF or OPTIMIZER_INPUT

    @classmethod
    def for_cells(cls, config: DumpConfig, runtime: CaptureRuntime, sink: RawSink, cells) -> ParameterCapture:
        """``cells``: (cell id, cell) of every captured cell."""
        capture = cls(config, runtime, sink)
        for cell_id, cell in cells:
            for index, (_, param) in enumerate(own_parameters(cell)):
                owner = _Owner(cell_id, index)
                capture.weights.append((owner, param))
                if getattr(param, "requires_grad", True):
                    capture.owners.setdefault(id(param), []).append(owner)
        return capture

    # -- weights -----------------------------------------------------------------------
    def record_weights(self, step_dir: str) -> None:
        """Record every captured cell's weights for the running step (call once it began)."""
        if not (self.config.captures_weights and self.runtime.active and self.weights):
            return
        ensure_dir(step_dir)  # graph-mode TensorDump steps: MindSpore has not made the folder yet
        for owner, param in self.weights:
            self._record(ProbeKey(owner.cell_id, FORWARD, SLOT_WEIGHT, KIND_TENSOR, (owner.index,)), param)

    # -- gradients ---------------------------------------------------------------------
    def capture_gradients(self, network, graph_mode: bool, gradient_probe: Optional[GradientProbe],
                          in_control_flow: bool = True, plain: Optional[Callable] = None) -> None:
        """Hook the parameters, in both modes: each gradient as autodiff gives it, before any training wrapper
        reduces, unscales or clips it. PyNative: hooked from attach to detach; in an unselected step each hook
        hands the gradient back untouched. Hooking per captured step instead would move MindSpore's hook
        version, which every ``jit`` compile key holds (``_CellGraphExecutor.compile``/``_JitExecutor``,
        ``mindspore/graph/api.py`` 2.9): a jit-compiled optimizer (``AdamWeightDecay``) was compiled again at
        every selected step and each copy kept (+10 MB per selected step, tiny LLaMA). Graph mode: the hook is
        compiled into the backward graph, and ``plain`` (``graph_switch``'s constexpr) leaves it out of the
        graph without capture ops;
        where a MindSpore cannot compile a parameter hook, the optimizer's input is recorded instead (not
        where a wrapper calls the optimizer under a run-time condition, when the probes may not run in
        control flow). ``gradient_point`` says which was recorded."""
        if not (self.config.captures_weight_gradients and self.owners):
            return
        if not graph_mode:
            self.hook_parameters()
            return
        if gradient_probe is None:
            logger.warning("this capture backend records no gradient in graph mode outside a cell: "
                           "parameters_grad is not recorded")
            return
        check_probe(gradient_probe, GradientProbe, "graph")
        try:
            self.hook_parameters(gradient_probe, plain)
        except (TypeError, RuntimeError, AttributeError) as err:
            self.restore_hooks()
            logger.warning("parameters_grad: this MindSpore cannot hook a parameter in graph mode (%s); the "
                           "optimizer's input is recorded instead (after the training wrapper's reduction, "
                           "loss-scale division and clipping; dump.json says so)", str(err).splitlines()[0])
            self.wrap_optimizer(network, gradient_probe, in_control_flow, plain)

    def hook_parameters(self, graph_probe: Optional[GradientProbe] = None, plain: Optional[Callable] = None) -> None:
        """One hook per captured parameter (shared parameters: one hook for all their owners).

        PyNative: the hook keeps the gradient for ``flush``. Graph mode: the hook is compiled into
        the backward graph, where it passes the gradient through ``graph_probe`` once per owner.
        Either way the hook sees the parameter's whole gradient of the step's backward pass (every
        use summed, micro-batches included), multiplied by the loss scale when there is one.
        """
        seen = set()
        for _, param in self.weights:
            owners = self.owners.get(id(param))
            if owners is None or id(param) in seen:
                continue
            seen.add(id(param))
            hook = self._gradient_hook(owners) if graph_probe is None else _graph_hook(graph_probe, owners, plain)
            self.hook_handles.append(param.register_hook(hook))
        self.gradient_point = AUTODIFF

    def _gradient_hook(self, owners: List[_Owner]) -> Callable:
        capture = self

        def hook(grad):
            if capture.runtime.active:
                for owner in owners:
                    key = ProbeKey(owner.cell_id, BACKWARD, SLOT_WEIGHT_GRAD, KIND_TENSOR, (owner.index,))
                    capture.pending.append((key, grad))
            return grad

        return hook

    def wrap_optimizer(self, network, gradient_probe: GradientProbe, in_control_flow: bool = True,
                       plain: Optional[Callable] = None) -> None:
        """Wrap the optimizer inside ``network`` so the gradients it receives are recorded (graph mode; the
        probe is checked by ``capture_gradients``, the one caller)."""
        optimizer = find_optimizer(network)
        if optimizer is None:
            logger.info("no mindspore.nn.Optimizer inside %s: parameters_grad is not recorded (attach to the "
                        "training wrapper, e.g. TrainOneStepCell, to record it)", type(network).__name__)
            return
        where = None if in_control_flow else conditional_call((c for _, c in network.cells_and_names()), optimizer)
        if where is not None:
            logger.warning("parameters_grad is not recorded: %s, a condition computed in the graph, so its probes "
                           "would run inside control flow, where MindSpore does not support TensorDump "
                           "(debug_func.py); weights (parameters) and every cell's gradients are recorded. Use "
                           "PyNative mode to record weight gradients, or set parameters: false to record neither",
                           where)
            return
        table = self._gradient_table(optimizer)
        if not table:
            return
        construct = _graph_optimizer_construct(optimizer.construct, table, gradient_probe, plain)
        if construct is not None:
            self.installed.append(install(optimizer, construct))
            self.gradient_point = OPTIMIZER_INPUT
            logger.info("parameters_grad: the gradients %s receives, for %d parameters of captured cells",
                        type(optimizer).__name__, sum(len(v) for v in table.values()))

    def _gradient_table(self, optimizer) -> Dict[int, List[_Owner]]:
        """Gradient index -> the captured cells owning that parameter."""
        try:
            params = list(optimizer.parameters)
        except (AttributeError, TypeError):
            return {}
        return {i: self.owners[id(p)] for i, p in enumerate(params) if id(p) in self.owners}

    def flush(self) -> None:
        """Record the gradients the hooks kept (at the end of the step, before it is marked complete).

        A parameter whose hook ran more than once in the step (one backward pass per micro-batch)
        gets the sum: the step's accumulated local gradient, as graph mode's one backward pass gives it.
        """
        pending, self.pending = self.pending, []
        summed: Dict[ProbeKey, object] = {}
        for key, grad in pending:
            summed[key] = grad if key not in summed else summed[key] + grad
        for key, grad in summed.items():
            self._record(key, grad)

    def drop_pending(self) -> None:
        self.pending = []

    # -- common ------------------------------------------------------------------------
    def _record(self, key: ProbeKey, tensor) -> None:
        array, dtype = host_array(tensor)
        if self.config.task == "tensor":
            self.sink.tensor(key, array, dtype)
        else:
            seq = self.runtime.next_seq()
            stats = compute_statistics(array, self.config.statistics)
            self.sink.statistics(key, mindspore_dtype_name(dtype), array.shape, stats, seq)

    def restore_hooks(self) -> None:
        for handle in self.hook_handles:
            handle.remove()
        self.hook_handles.clear()
        self.gradient_point = None

    def restore(self) -> None:
        self.restore_hooks()
        for installed in reversed(self.installed):
            installed.restore()
        self.installed.clear()


def host_array(tensor) -> Tuple[np.ndarray, str]:
    """(numpy array, numpy-style dtype name); bfloat16 comes as float32 data named ``bfloat16``.

    Always a copy: on CPU ``asnumpy()`` of a Parameter can share its memory, and the raw
    writer saves the array later, on its thread, after the optimizer updated the Parameter
    in place (seen as weights of the next step under MindSpore 2.8 and 2.10).
    """
    import mindspore as ms

    dtype = numpy_dtype_name(str(tensor.dtype))
    if tensor.dtype == ms.bfloat16:
        return np.array(tensor.astype(ms.float32).asnumpy(), copy=True), dtype
    return np.array(tensor.asnumpy(), copy=True), dtype


def _graph_hook(probe: GradientProbe, owners: List[_Owner], plain: Optional[Callable] = None) -> Callable:
    """A graph-parsable hook: the gradient through ``probe`` once per owner (straight-line, closures only).
    ``plain``: ``graph_switch``'s constexpr; the graph without capture ops passes the gradient on untouched."""
    slot = SLOT_CODES[SLOT_WEIGHT_GRAD]
    hook = None
    for owner in owners:
        hook = _probe_after(probe, (owner.cell_id, slot), (owner.index,), hook)
    return _unless_plain(hook, plain or _never_plain)


def _unless_plain(probed: Callable, plain: Callable) -> Callable:
    def hook(grad):
        if plain(-1):
            return grad
        return probed(grad)
    return hook


def _probe_after(probe: GradientProbe, head: Tuple[int, int], path: Tuple[int, ...], before) -> Callable:
    if before is None:
        def hook(grad):
            return probe(grad, head, path)
    else:
        def hook(grad):
            return probe(before(grad), head, path)
    return hook


def find_optimizer(network):
    """The ``mindspore.nn.Optimizer`` inside ``network`` (the first one found), or None."""
    from mindspore import nn

    if isinstance(network, nn.Optimizer):
        return network
    for _, cell in network.cells_and_names():
        if isinstance(cell, nn.Optimizer):
            return cell
    return None


def _never_plain(marker):
    return False


def _graph_optimizer_construct(original, table: Dict[int, List[_Owner]], probe: GradientProbe,
                               plain: Optional[Callable] = None) -> Optional[Callable]:
    """Source for an optimizer ``construct`` that passes each mapped gradient through ``probe``.

    Straight-line code (no loop, see graph_wrapper's notes), the original's explicit
    parameters, closures only; the first parameter is the gradients tuple. ``plain``: the
    ``constexpr`` of ``graph_switch`` (the graph without capture ops calls the original alone).
    """
    try:
        params = list(inspect.signature(original).parameters.values())
    except (TypeError, ValueError):
        params = []
    if not params or any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.KEYWORD_ONLY) for p in params):
        logger.warning("optimizer construct%s is not (gradients, ...): parameters_grad is not recorded",
                       f"({', '.join(p.name for p in params)})")
        return None
    names = [p.name for p in params]
    signature = [f"{p.name}=None" if p.default is not inspect.Parameter.empty else p.name for p in params]
    grads = names[0]
    slot = SLOT_CODES[SLOT_WEIGHT_GRAD]
    items = []
    for index in range(max(table) + 1):
        expr = f"{grads}[{index}]"
        for owner in table.get(index, ()):
            expr = f"_mfcd_probe({expr}, ({owner.cell_id}, {slot}), ({owner.index},))"
        items.append(expr)
    rest = "".join(f", {n}" for n in names[1:])
    lines = [
        "def _mfcd_make(_mfcd_original, _mfcd_probe, _mfcd_plain):",
        f"    def construct(self, {', '.join(signature)}):",
        "        if _mfcd_plain(-1):",
        f"            return _mfcd_original({grads}{rest})",
        f"        _mfcd_grads = ({', '.join(items)},) + {grads}[{max(table) + 1}:]",
        f"        return _mfcd_original(_mfcd_grads{rest})",
        "    return construct",
        "",
    ]
    source = "\n".join(lines)
    file_name = f"<mf_celldump generated optimizer construct {id(original):x}>"
    linecache.cache[file_name] = (len(source), None, source.splitlines(True), file_name)
    namespace = {"__name__": _GENERATED_MODULE}
    exec(compile(source, file_name, "exec"), namespace)  # noqa: S102 - our own generated source
    construct = namespace["_mfcd_make"](original, probe, plain or _never_plain)
    defaults = tuple(p.default for p in params if p.default is not inspect.Parameter.empty)
    construct.__defaults__ = defaults or None
    return construct
