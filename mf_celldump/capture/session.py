"""``attach(network, config)``: the handle that owns one capture, from wrap to detach.

An attached dump is an object: it holds the wrapped cells, the raw writer, the backend
and THE step state machine of a capture (``begin_step`` / ``end_step`` /
``abort_step``); ``detach()`` undoes all of it. Nothing is stored in module globals, so
two networks can be dumped side by side and a second run starts clean. A marker
attribute on the model root lets integrations find the handle (and refuses a second
attach); it is removed at detach.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from packaging.version import InvalidVersion, Version

from mf_celldump import __version__
from mf_celldump.capture.backends import BackendContext, CaptureBackend, choose_backend, create_backend
from mf_celldump.capture.construct import GradientGapLog, InstalledConstruct, install, surplus_mode_warnings
from mf_celldump.capture.graph_switch import GraphSwitch, finds_compiling_cell
from mf_celldump.capture.graph_wrapper import GeneratedSources, graph_construct
from mf_celldump.capture.health import CellHealth, GraphHealth, health_file
from mf_celldump.capture.micro_batches import MicroBatches, mindspore_parallel_settings
from mf_celldump.capture.micro_batches import detect as detect_micro_batches
from mf_celldump.capture.parallel_layout import parallel_layout
from mf_celldump.capture.parameters import ParameterCapture
from mf_celldump.capture.pynative_wrapper import pynative_construct
from mf_celldump.capture.recompute import recompute_problem
from mf_celldump.capture.run_identity import claim
from mf_celldump.capture.runtime import CaptureRuntime
from mf_celldump.capture.selection import SelectedCell, select_cells, selection_warnings, unwrap
from mf_celldump.capture.wrappers import peel
from mf_celldump.config import DumpConfig
from mf_celldump.errors import AttachError, BackendSetupError, DumpInUseError, StepError, WrapperError, short_repr
from mf_celldump.fsutil import bytes_under, writable_dir_problem
from mf_celldump.layout.naming import PARAMETERS_GRAD_KEY, WATCH_KEY
from mf_celldump.mapping import ArgModes
from mf_celldump.rawformat.manifest import Manifest
from mf_celldump.rawformat.names import MAX_STEP
from mf_celldump.rawformat.writer import RawWriter
from mf_celldump.watch import Watch

logger = logging.getLogger(__name__)

_MARKER = "_mf_celldump_attached"
DEFAULT_MODES = ArgModes(bench_name="")

# The MindSpore versions capture supports, checked at attach (before training). 2.7.0 is the
# floor: ``ops.DumpGradient``, ``_dump_step`` and the ``td_flag`` naming of statistics rows
# first appear there (absent from v2.5.0, v2.6.0 and r2.6 of
# ``mindspore/python/mindspore/ops/operations/debug_ops.py`` and
# ``runtime/graph_scheduler/actor/debug_actor.cc``). The tests run on 2.7.2, 2.8.0, 2.9.0 and
# 2.10.0 (``.ci/run``); keep ``pyproject.toml`` in step with these values. ``pyproject.toml`` admits
# 2.11 (MindFormers 2.1 requires ``mindspore~=2.11.0``), which no index reachable here has: it
# attaches with the warning below for a version newer than the newest tested one.
MINIMUM_MINDSPORE = (2, 7, 0)
NEWEST_TESTED_MINDSPORE = (2, 10)


def checked_step(step: Any) -> int:
    """``step`` as an int, or ``StepError``: raw step folders name global steps, which are ints in [0, MAX_STEP]."""
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or not 0 <= step <= MAX_STEP:
        raise StepError(f"step {short_repr(step)} is not a training step: a step is the global step number, an "
                        f"int from 0 to {MAX_STEP} (0 is the first step of training)")
    return int(step)


@dataclass(frozen=True)
class StepEnd:
    """What ``end_step``/``abort_step`` finished: the step, whether raw data was written for it,
    and whether it completed (False: training failed in it, its raw data stays unmarked).

    ``written_later``: MindSpore writes the step's raw files after the step (graph-mode
    TensorDump), for as long as it takes. ``marked_later``: the raw writer's thread writes
    the step's last files and then its step marker, beside the next step (``CellDump.detach``
    and ``wait_written`` wait for it). Either way the folder is complete once its step marker
    is there: wait for it (``integrations.captured.wait_for_files``,
    ``processing.async_steps.wait_for_steps``) before processing.
    """

    step: int
    captured: bool
    completed: bool
    written_later: bool = False
    marked_later: bool = False


def detect_rank() -> tuple:
    """(rank, distributed): ``mindspore.communication`` when initialised, else RANK_ID, else 0."""
    try:
        from mindspore.communication import get_group_size, get_rank

        rank, size = int(get_rank()), int(get_group_size())
        return rank, size > 1
    except Exception:  # not initialised: MindSpore raises RuntimeError (type varies by version)
        pass
    env_rank, env_size = os.environ.get("RANK_ID"), os.environ.get("RANK_SIZE")
    if env_rank is not None and env_rank.strip().isdigit():
        distributed = env_size is not None and env_size.strip().isdigit() and int(env_size) > 1
        return int(env_rank), distributed
    return 0, False


def late_selection_problem(backend: str, graph_mode: bool) -> Optional[str]:
    """Why ``backend`` cannot capture a step chosen while training runs (``steps: "anomaly"``), or None.

    Graph-mode TensorDump has MindSpore filter the steps it writes from a list set before training
    (``TensorDumpBackend.steps_fixed_at_attach``); the kernel-by-kernel statistics dump reads its
    ``iteration`` list from ``MINDSPORE_DUMP_CONFIG`` once. The host backend and PyNative select in Python.
    """
    if backend == "kbk_statistics" or (backend == "tensordump" and graph_mode):
        return (f"steps: 'anomaly': the {backend} backend in graph mode has MindSpore select the captured steps "
                "from a list given before training, so a step chosen by a watch rule while training runs cannot be "
                "captured; use backend: host (captures in graph mode on any device), PyNative mode, or name the "
                "steps to capture")
    return None


def find_attached(network) -> Optional[CellDump]:
    """The dump attached to ``network`` (or to the model inside its wrappers), if any."""
    for candidate in (network, unwrap(network)):
        handle = getattr(candidate, "__dict__", {}).get(_MARKER)
        if handle is not None:
            return handle
    return None


def _layer_modes(config: DumpConfig, cells: Sequence[SelectedCell], model) -> Dict[str, ArgModes]:
    """Per-cell in/out modes from the configured layer mappings; warns about mismatches."""
    if not config.layer_mapping:
        return {}
    from mf_celldump import mapping

    named = mapping.named_classes(model.cells_and_names())
    layer_mapping = mapping.resolve_mapping(tuple(config.layer_mapping), {cls for _, cls in named})
    mapping.log_mapping_warnings(mapping.check_mapping(layer_mapping, named), logger)
    captured = {selected.name for selected in cells}
    result = {name: modes for name, modes in mapping.modes_for_network(layer_mapping, named).items()
              if name in captured}
    for text in surplus_mode_warnings(result, ((s.name, s.cell) for s in cells)):
        logger.warning("layer mapping: %s", text)
    return result


class CellDump:
    """One attached capture. Use ``begin_step``/``end_step`` around each training step."""

    def __init__(self, network, model, config: DumpConfig, rank: int, distributed: bool,
                 initial_step: int, dump_path: str, primitives=None, watched_by_trainer: bool = False):
        self.network = network
        self.model = model
        self.config = config
        self.rank = rank
        self.distributed = distributed
        self.initial_step = initial_step
        self.dump_path = dump_path
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{id(self) & 0xFFFF:04x}"
        self.captured_steps: List[int] = []
        self.cells: List[SelectedCell] = []
        self.backend: Optional[CaptureBackend] = None
        self.writer: Optional[RawWriter] = None
        self.runtime = CaptureRuntime(rank_selected=rank in config.ranks)
        self.device = "CPU"
        self.graph_mode = False
        self.attached = False
        self._installed: List[InstalledConstruct] = []
        self._health_installed: List[InstalledConstruct] = []  # graph mode: cell health's wrappers
        # Their sources apart from capture's: both name a cell's file construct_{cell id}, and the compiler reads
        # the source from the file name (a second one of the same name would replace the first in linecache).
        self._health_sources = GeneratedSources()
        self._sources = GeneratedSources()
        self._parameters: Optional[ParameterCapture] = None
        self._running: Optional[int] = None  # the step between begin_step and end_step
        self._chosen: set = set()  # steps selected while training runs (``select_step``)
        self.switch: Optional[GraphSwitch] = None  # graph mode: which compiled graph a step runs
        self._primitives = primitives  # AscendPrimitives given to attach(), else None
        self.micro_batches: Optional[MicroBatches] = None  # where backward captures are paired by order
        # False when every selected step lies before initial_step (a resumed run): nothing is captured.
        self.steps_remain = bool(config.steps.from_value(initial_step, 1)) or config.steps.on_anomaly
        self.watch_records: Dict[int, dict] = {}  # step -> why the watch captured it (``record_watch``)
        self.health: Optional[CellHealth] = None  # cell health (watch: {cells: true}), capture or not
        self.health_path: Optional[str] = None  # its record, health/rank{R}.csv (kept after detach)
        self.last_health: Optional[tuple] = None  # (step, readings) of the last step that read health
        # A plain attach() with a watch: the dump checks the cell rules itself (a trainer's run checks them
        # with its signals, integrations/watching.py); the captures it chose (steps: anomaly).
        self.watch: Optional[Watch] = None if watched_by_trainer or config.watch is None else Watch(config.watch,
                                                                                                    rank)
        self._watch_captures = 0

    # -- attach / detach -----------------------------------------------------------------
    def attach(self) -> None:
        """Wrap the selected cells and write the manifest; ``detach`` undoes it. Called once, by ``attach()``."""
        import mindspore as ms

        graph_mode = self.graph_mode = ms.get_context("mode") == ms.GRAPH_MODE
        self.device = ms.get_context("device_target")
        self.model.__dict__[_MARKER] = self
        self.attached = True
        if self.config.watch is not None and self.config.watch.cells:
            self._install_health(graph_mode)
        if not self.runtime.rank_selected:
            logger.info("rank %d is not in ranks=%s: nothing is captured on this rank",
                        self.rank, self.config.ranks.describe())
            return
        if not self.steps_remain:
            logger.info("steps=%s are all before the first step %d of this run: nothing is captured",
                        self.config.steps.describe(), self.initial_step)
            return
        choice = choose_backend(self.config, self.device, graph_mode)
        logger.info("capture backend: %s (%s)", choice.name, choice.reason)
        if self.config.steps.on_anomaly and late_selection_problem(choice.name, graph_mode):
            self.detach()
            raise AttachError(late_selection_problem(choice.name, graph_mode))
        self.cells = select_cells(self.model, self.config)
        for text in selection_warnings(self.model, self.config, self.cells):
            logger.warning("%s", text)
        problem = recompute_problem(self.model, self.cells, graph_mode, choice.name)
        if problem:
            self.detach()
            raise AttachError(problem)
        self._claim_dump_path()
        self.writer = RawWriter(self.dump_path, self.rank, self.run_id)
        context = BackendContext(self.config, self.runtime, self.writer, self.device, self._primitives,
                                 (self.network, self.model), graph_mode and finds_compiling_cell())
        self.backend = create_backend(choice.name, context)
        try:
            self.backend.setup(self.initial_step)
            self.micro_batches = self._micro_batches()
            if self.backend.writes_later:
                self.writer.set_aside_earlier_steps()
            self._wrap_cells(graph_mode)
        except BaseException as err:
            self.detach()
            if isinstance(err, BackendSetupError):
                raise AttachError(f"{choice.name} capture: {err}") from None
            raise
        self.writer.write_manifest(self._manifest(graph_mode))
        logger.info("capturing %d cells of %s into %s (task=%s, data_mode=%s, steps=%s)",
                    len(self.cells), type(self.model).__name__, self.dump_path,
                    self.config.task, self.config.data_mode, self.config.steps.describe())

    def _install_health(self, graph_mode: bool) -> None:
        """Cell health on every rank, whatever capture selects (``capture/health.py``)."""
        rules = self.config.watch
        selected = select_cells(self.model, self.config)
        cells = [(s.name, s.cell) for s in selected]
        path = health_file(self.dump_path, self.rank) if rules.health_max_bytes else None
        self.health_path = path
        self.health = CellHealth(rules, cells, self.config.captures_backward, path, self.rank)
        if graph_mode:  # the cells' outputs are read inside the graph, under capture's wrappers if any
            self.health.graph = GraphHealth(cells, self.config.captures_backward)
            face, gaps = self.health.graph.face(), GradientGapLog()
            for one in selected:
                construct = graph_construct(one, DEFAULT_MODES, face, self._health_sources, gaps)
                self._health_installed.append(install(one.cell, construct))
        self.health.install()
        logger.info("cell health: %d cells every %d step(s)%s", len(cells), rules.cells_every,
                    f", recorded in {path}" if path else "")

    def _claim_dump_path(self) -> None:
        """Start a run in ``dump_path``, or continue the one this attach resumes (``capture.run_identity``)."""
        own = self.run_id
        try:
            self.run_id = claim(self.dump_path, self.rank, self.distributed, own, [s.record for s in self.cells],
                                self.config.task, self.initial_step, self._dump_path_given())
        except DumpInUseError as err:
            self.detach()
            raise DumpInUseError(str(err)) from None  # an AttachError a caller can tell apart
        if self.run_id != own:
            logger.info("continuing run %s in %s from step %d (a resumed run)", self.run_id, self.dump_path,
                        self.initial_step)

    def _dump_path_given(self) -> str:
        """What the user set that names ``dump_path``: the key, or output_dir when the key is unset."""
        if self.config.dump_path:
            return "dump_path"
        parent = os.path.dirname(self.dump_path)
        return f"dump_path (unset: the dump goes to <output_dir>/{os.path.basename(self.dump_path)}) or output_dir " \
               f"(here {parent})"

    def _micro_batches(self) -> Optional[MicroBatches]:
        """The micro-batch schedule where processing pairs backward captures by order (else None); a backward
        capture whose order MindSpore does not fix is refused here, before training."""
        if not self.backend.pairs_backward_by_order:
            return None
        found = detect_micro_batches(peel(self.network).layers, self.backend.parallel_settings())
        if found.count > 1:
            logger.info("micro-batches: %s", found.source)
        if self.config.captures_backward and not found.in_order:
            raise BackendSetupError(found.refusal(self.backend.name))
        return found

    def _wrap_cells(self, graph_mode: bool) -> None:
        modes = _layer_modes(self.config, self.cells, self.model)
        face = self.backend.graph() if graph_mode else self.backend.pynative()
        plain = None
        if graph_mode:
            self.switch = GraphSwitch(self.runtime)
            self.switch.add_entry(self.network)
            plain = self.switch.plain_function()
            if self.health is not None and self.health.graph is not None:
                self.health.graph.compiles_captured = self.switch.compiles_captured
        gaps = GradientGapLog()  # one log line per cell class and reason, per attach
        for selected in self.cells:
            arg_modes = modes.get(selected.name, DEFAULT_MODES)
            if graph_mode:
                construct = graph_construct(selected, arg_modes, face, self._sources, gaps, plain)
            else:
                construct = pynative_construct(selected, arg_modes, face, self.runtime,
                                               self.config.captures_forward, self.config.captures_backward, gaps)
            self._installed.append(install(selected.cell, construct))
        if self.config.parameters:
            self._parameters = ParameterCapture.for_cells(self.config, self.runtime, self.backend.context.sink,
                                                          [(s.cell_id, s.cell) for s in self.cells])
            self._parameters.capture_gradients(self.network, graph_mode,
                                               face.gradient_probe_function() if graph_mode else None,
                                               not graph_mode or face.dumps_in_control_flow, plain)

    def _manifest(self, graph_mode: bool) -> Manifest:
        import mindspore as ms

        details = {"tool_version": __version__, "config": self.config.to_dict(), "data_mode": self.config.data_mode,
                   "execution_mode": "graph" if graph_mode else "pynative", "device": self.device,
                   "mindspore_version": ms.__version__, "model_class": type(self.model).__name__}
        fields = {"statistics": self.config.statistics}
        fields.update(self.backend.manifest_fields())
        if self.micro_batches is not None and self.micro_batches.count > 1:
            fields["micro_batches"] = self.micro_batches.count
            details["micro_batch_schedule"] = self.micro_batches.source
        layout = parallel_layout(self.config.replica_groups.model_parallel, self.model,
                                 mindspore_parallel_settings().parallel_mode)
        if layout is not None:
            details["parallel"] = layout
        point = self._parameters.gradient_point if self._parameters is not None else None
        if self.watch_records:
            details[WATCH_KEY] = {str(step): record for step, record in sorted(self.watch_records.items())}
        if point:  # the step's one gradient per parameter: summed over its micro-batches in both modes
            found = self.micro_batches or detect_micro_batches(peel(self.network).layers,
                                                               self.backend.parallel_settings())
            details[PARAMETERS_GRAD_KEY] = {"point": point, "micro_batches": found.count}
        return Manifest(rank=self.rank, distributed=self.distributed, task=self.config.task,
                        cells={s.cell_id: s.record for s in self.cells}, backend=self.backend.name,
                        run_id=self.run_id, parameters=self.config.captures_weights, details=details, **fields)

    def detach(self) -> None:
        """Restore every wrapped cell, stop capture ops still compiled into graphs, close files.

        A step still running is aborted, never completed: only ``end_step`` completes a step,
        so a step cut short (an exception inside ``with attach(...)``) keeps its raw data unmarked.
        """
        if not self.attached:
            return
        if self._running is not None:
            logger.warning("step %d was still running at detach: it is not marked complete (end_step completes "
                           "a step); its raw data stays for `mf-celldump process`", self._running)
            self.abort_step()
        if self._parameters is not None:
            self._parameters.restore()
        for installed in reversed(self._installed):
            installed.restore()
        self._installed.clear()
        if self.health is not None:  # after capture's wrappers, which wrap the health ones in graph mode
            self.health.restore()
            self.health = None
        for installed in reversed(self._health_installed):
            installed.restore()
        self._health_installed.clear()
        self._health_sources.remove()
        if self.switch is not None:
            self.switch.close()
        self._sources.remove()
        self.runtime.closed = True
        self.runtime.stop_step()
        if self.backend is not None:
            self.backend.teardown()
        if self.writer is not None:
            self.writer.close()
        self.model.__dict__.pop(_MARKER, None)
        self.attached = False
        logger.info("capture detached from %s", type(self.model).__name__)

    # -- the step state machine: idle -> running(step) -> idle ---------------------------
    def step_selected(self, step: int) -> bool:
        return (self.backend is not None and self.runtime.rank_selected
                and (step in self.config.steps or step in self._chosen))

    def select_step(self, step: int) -> None:
        """Capture global step ``step`` too, though ``steps`` did not select it: a step chosen while training
        runs (a rule that fires). Call it before ``begin_step(step)``; in graph mode the graph with capture
        ops is compiled at the first selected step, whichever it is.

        Refuses a bad step (``StepError``), a detached handle, and a dump that captures nothing on this rank
        or has no step left to capture at attach (``AttachError``: no capture op was installed).
        """
        step = checked_step(step)
        if not self.attached:
            raise AttachError(f"select_step({step}): this dump of {type(self.model).__name__} is detached; "
                              "attach again to capture more steps")
        if self.backend is None:
            raise AttachError(f"select_step({step}): nothing is captured on rank {self.rank} (ranks="
                              f"{self.config.ranks.describe()}, steps={self.config.steps.describe()} from step "
                              f"{self.initial_step}), so no capture op was installed; attach with this rank in "
                              "ranks and a steps value that leaves a step to capture")
        if self.backend.steps_fixed_at_attach:
            raise AttachError(f"select_step({step}): the {self.backend.name} backend has MindSpore select its "
                              "steps from a list given at attach; name the step in steps, or use backend host")
        self._chosen.add(step)

    def record_watch(self, step: int, record: dict) -> None:
        """Say in the raw manifest (and so in the step's ``dump.json``) why the watch captured ``step``. Call it
        before ``end_step(step)``: processing reads the manifest once the step is marked complete."""
        if self.writer is None:
            return
        self.watch_records[step] = dict(record)
        self.writer.write_manifest(self._manifest(self.graph_mode))

    @property
    def writes_later(self) -> bool:
        """True when MindSpore writes captured steps' files after the steps (graph-mode TensorDump)."""
        return self.backend is not None and self.backend.writes_later

    @property
    def writes_unselected(self) -> bool:
        """True when MindSpore also writes steps that are not selected (their files are deleted later)."""
        return self.backend is not None and self.backend.writes_unselected

    @property
    def last_unselected_step(self) -> Optional[int]:
        """See ``CaptureBackend.last_unselected_step``."""
        return None if self.backend is None else self.backend.last_unselected_step

    def begin_step(self, step: int) -> Optional[StepEnd]:
        """Global step ``step`` (0-based) is about to run; ends a step still running (returned).

        Refuses a step that is not an int in [0, MAX_STEP] (``StepError``) and a detached handle
        (``AttachError``): their data would go where processing never looks.
        """
        step = checked_step(step)
        if not self.attached:
            raise AttachError(f"step {step}: this dump of {type(self.model).__name__} is detached; attach again to "
                              "capture more steps")
        ended = self.end_step()
        selected = self.attached and self.step_selected(step)
        if selected and self.backend is not None:  # recompute() may have been called after attach
            problem = recompute_problem(self.model, self.cells, self.graph_mode, self.backend.name)
            if problem:
                raise StepError(f"step {step} is not captured: {problem}")
        if selected and not self.writes_later:
            self.writer.prepare_step(step)
        self.runtime.start_step(step, selected)
        self._running = step
        if self.health is not None:
            self.health.begin_step(step)
        if self.switch is not None:
            self.switch.select(self.runtime.active)
        if self.attached and self.backend is not None and self.backend.begin_step(step, self.runtime.active):
            self.writer.write_manifest(self._manifest(self.graph_mode))
        if self._parameters is not None and self.runtime.active:
            self._parameters.record_weights(self.writer.step_dir(step))
        return ended

    def end_step(self) -> Optional[StepEnd]:
        """The running step's outputs are materialised: hand its last values to the writer, which
        marks the step complete after its last file (see ``StepEnd.marked_later``).

        Every step that began is ended in the backend too, captured or not: graph-mode
        backends move MindSpore's step counters there.
        """
        if self._running is None:
            return None
        step, captured = self._running, self.runtime.active
        if self._parameters is not None and captured:
            self._parameters.flush()
        if self.backend is not None and self.attached:
            self.backend.end_step(step, captured)
        self.runtime.stop_step()
        if self.switch is not None:
            self.switch.release()
        self._running = None
        if self.health is not None:
            self.last_health = self.health.end_step() or self.last_health
            if self.watch is not None and self.last_health is not None and self.last_health[0] == step:
                self._watch_cells(step, self.last_health[1])
        if captured:
            if not self.writes_later:
                self.writer.complete_step(step)  # by the writer thread, after the step's files: no wait here
            self.captured_steps.append(step)
        return StepEnd(step, captured, completed=True, written_later=captured and self.writes_later,
                       marked_later=captured and not self.writes_later)

    def wait_written(self) -> None:
        """Wait until everything captured so far is on disk and its steps are marked complete
        (the raw writer works beside training); raises the first write failure since the last wait."""
        if self.writer is not None:
            self.writer.flush()

    def abort_step(self) -> Optional[StepEnd]:
        """Stop the running step without marking it complete (training failed in it).

        Its raw data stays on disk for `mf-celldump process`.
        """
        if self._running is None:
            return None
        step, captured = self._running, self.runtime.active
        if self._parameters is not None:
            self._parameters.drop_pending()
        if self.backend is not None and self.attached:
            try:
                self.backend.abort_step(step, captured)
            except Exception as err:  # the training error is what matters; keep it visible
                logger.warning("could not end step %d in the %s backend after the failure: %s", step,
                               self.backend.name, err)
        self.runtime.stop_step()
        if self.switch is not None:
            self.switch.release()
        if self.health is not None:
            self.health.abort_step()
        self._running = None
        return StepEnd(step, captured, completed=False)

    def _watch_cells(self, step: int, readings) -> None:
        """A plain attach() with a watch: the cell rules over the step's health (one log line per firing);
        with ``steps: anomaly`` a firing selects the next step, within ``anomaly_captures`` and
        ``anomaly_max_bytes``. A trainer's run does this with its signals instead (integrations/watching.py)."""
        fired = self.watch.check_cells(step, readings)
        if not fired or not self.config.steps.on_anomaly or self.backend is None:
            return
        first = fired[0]
        if self._watch_captures >= self.config.anomaly_captures:
            return
        self._watch_captures += 1
        limit = self.config.anomaly_max_bytes
        if limit is not None and bytes_under(self.dump_path) >= limit:
            logger.warning("mf_celldump watch: rule %s fired at step %d: step %d not captured: dump_path holds %d "
                           "bytes, anomaly_max_bytes=%d", first.rule, step, step + 1, bytes_under(self.dump_path),
                           limit)
            return
        self.select_step(step + 1)
        self.record_watch(step + 1, {"rule": first.rule, "fired_at_step": step, "capture": "next_step",
                                     "cell": first.cell, "direction": first.direction})
        logger.warning("mf_celldump watch: rule %s fired at step %d (cell %s): capturing step %d, the step after "
                       "it; capture %d of %d", first.rule, step, first.cell, step + 1, self._watch_captures,
                       self.config.anomaly_captures)

    @contextlib.contextmanager
    def step(self, step: int):
        """``with dump.step(n): train_step()`` for hand-written training loops.

        It takes no step outputs: with ``watch`` on, a plain attach() watches the cells' own values (cell
        health, ``watch: {cells: true}``), which need none; the rules over the loss, the overflow flag and
        the global norm need a trainer's callback (``CellDumpCallback``). A step that raises is aborted, not
        completed: its raw data stays unprocessed.
        """
        self.begin_step(step)  # refuses a bad step or a detached handle before anything runs
        try:
            yield self
        except BaseException:
            self.abort_step()
            raise
        self.end_step()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.detach()
        return False

    def __repr__(self) -> str:
        state = "attached" if self.attached else "detached"
        return f"<CellDump {state} rank={self.rank} cells={len(self.cells)} path={self.dump_path!r}>"


def _version_text(version) -> str:
    return ".".join(str(part) for part in version)


def mindspore_version_problem(installed: str) -> Optional[str]:
    """Why ``installed`` cannot be used (None when it can); logs a warning for untested newer versions."""
    try:
        release = Version(installed).release
    except InvalidVersion:
        logger.warning("cannot read the MindSpore version %r; assuming it is supported", installed)
        return None
    minimum, newest = _version_text(MINIMUM_MINDSPORE), _version_text(NEWEST_TESTED_MINDSPORE)
    if tuple(release[:3]) < MINIMUM_MINDSPORE:
        return (f"mf_celldump needs MindSpore {minimum} or later (ops.DumpGradient, _dump_step and the "
                f"td_flag naming of statistics rows start there); installed: MindSpore {installed}. Install "
                f"MindSpore {minimum} to {newest}.x")
    if tuple(release[:2]) > NEWEST_TESTED_MINDSPORE:
        logger.warning("MindSpore %s is newer than the newest version mf_celldump is tested with (%s.x); Ascend "
                       "graph capture relies on private MindSpore APIs: run examples/ascend/acceptance.sh first",
                       installed, newest)
    return None


def attach(network, config: Union[DumpConfig, Mapping[str, Any], None] = None, *,
           rank: Optional[int] = None, distributed: Optional[bool] = None,
           initial_step: int = 0, output_dir: Optional[str] = None, primitives=None,
           watched_by_trainer: bool = False) -> CellDump:
    """Wrap every selected cell of ``network`` with capture ops; returns the handle.

    ``network`` may be the model or any training wrapper around it. Call this before
    the network's graph is compiled (wrapping after the first compile is ignored by
    MindSpore until its compile cache is cleared). ``initial_step`` is the global step
    the run starts at (a resumed run); selected steps before it are not captured.
    ``primitives``: an ``AscendPrimitives`` for the tensordump/kbk_statistics backends
    (tests, platforms without the kernels); by default MindSpore's own.
    ``watched_by_trainer``: a trainer adapter hands the watch each step's signals (``TrainingRun``); a
    plain attach() has none, so a ``watch`` without cell health, which could see nothing, is refused.
    """
    config = DumpConfig.coerce(config)
    if config.watch is not None and not config.watch.cells and not watched_by_trainer:
        raise AttachError("watch: a plain attach() receives no step signals (loss, overflow flag, global norm), "
                          "so these rules would never see anything; turn on cell health (watch: {cells: true}, "
                          "which reads the cells' own values and needs no signals), train through "
                          "CellDumpCallback, whose trainer hands the watch each step's outputs, or set watch: "
                          "false (docs/watch.md)")
    initial_step = checked_step(initial_step)
    import mindspore as ms
    from mindspore import nn

    problem = mindspore_version_problem(ms.__version__)
    if problem:
        raise AttachError(problem)

    if not isinstance(network, nn.Cell):
        raise AttachError(f"attach() needs a mindspore.nn.Cell, got {type(network).__name__}")
    try:
        model = unwrap(network)
    except WrapperError as err:
        raise AttachError(str(err)) from None
    existing = find_attached(network)
    if existing is not None:
        raise AttachError(
            f"a dump is already attached to {type(model).__name__} ({existing!r}), by attach() or a "
            "CellDumpCallback; use one of them, or call detach() on the other handle first"
        )
    detected_rank, detected_distributed = detect_rank()
    rank = detected_rank if rank is None else rank
    distributed = detected_distributed if distributed is None else distributed
    dump_path = config.resolved_dump_path(output_dir)
    dump = CellDump(network, model, config, rank, distributed, initial_step, dump_path, primitives,
                    watched_by_trainer)
    if rank in config.ranks and dump.steps_remain:
        problem = writable_dir_problem(dump_path, create=True)
        if problem:
            raise AttachError(f"dump_path {problem}")
    dump.attach()
    return dump
