"""The watch inside a training run: signals read from the trainer, capture on trigger, stop.

``TrainingRun`` owns one ``StepWatch`` when ``watch`` is configured. At each step end the trainer
adapter hands it what the step already computed (``signals_from_outputs`` reads MindSpore's
``cb_params.net_outputs``: the loss, and from a loss-scale wrapper its overflow flag and loss
scale, from MindFormers' wrappers also the global norm), and ``after_step`` checks the rules
(``mf_celldump.watch.Watch``, one log line per firing). With ``steps: "anomaly"`` a firing makes
the next step that begins a captured one: ``before_step`` selects it in the attached dump
(``CellDump.select_step``; graph mode runs the captured graph from that step, see
``capture.graph_switch``), within ``anomaly_captures`` and ``anomaly_max_bytes``. With
``watch.stop`` it asks the trainer to stop: after the captured step when one is pending, else
after the firing step; the trainer then ends training normally, so processing and the summary run.

A step whose update the loss-scale wrapper skipped (its overflow flag set) is run again at once, with
capture on, on the same batch and weights (``integrations.rerun``); the log and the summary say
whether the fault came back (persistent) or not (transient). Otherwise the next step is captured,
and the log says which was done and why (docs/watch.md).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from mf_celldump.config import DumpConfig
from mf_celldump.fsutil import bytes_under
from mf_celldump.integrations.watch_ranks import RankTable, firings_of, ranks_text, rerun_agreement, step_row
from mf_celldump.watch import Firing, StepSignals, Watch

logger = logging.getLogger(__name__)

# Lengths of MindFormers' net_outputs that carry (loss, overflow, loss scale, ...): the layouts
# ``_get_loss_output`` reads (mindformers/core/callback/callback.py, 1.9.0); index 4 is the global norm.
_LOSS_SCALE_LENGTHS = (3, 4, 5, 7)
_GLOBAL_NORM_INDEX = 4


def number(value: Any) -> Optional[float]:
    """A host float of a tensor, array or number (the mean of several values), or None."""
    if value is None:
        return None
    if hasattr(value, "asnumpy"):
        value = value.asnumpy()
    try:
        import numpy as np

        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if array.size == 0:
        return None
    return float(array.mean()) if array.size > 1 else float(array.reshape(()))


def signals_from_outputs(outputs: Any) -> StepSignals:
    """What a training step returned, as the watch's signals.

    A tensor is the loss (``TrainOneStepCell``); a tuple of 3, 4, 5 or 7 values is a loss-scale
    wrapper's ``(loss, overflow, loss scale[, learning rate, global norm, ...])``
    (``nn.TrainOneStepWithLossScaleCell``, MindFormers' ``MFTrainOneStepCell``); any other tuple
    gives its first value as the loss.
    """
    if isinstance(outputs, (tuple, list)):
        if not outputs:
            return StepSignals()
        if len(outputs) in _LOSS_SCALE_LENGTHS:
            overflow = number(outputs[1])
            norm = number(outputs[_GLOBAL_NORM_INDEX]) if len(outputs) > _GLOBAL_NORM_INDEX else None
            return StepSignals(loss=number(outputs[0]), grad_norm=norm,
                               overflow=None if overflow is None else bool(overflow), loss_scale=number(outputs[2]))
        return StepSignals(loss=number(outputs[0]))
    return StepSignals(loss=number(outputs))


# Attributes of a callback that raises in its step end on what the watch fires on, so training stops there:
# MindFormers' TrainingStateMonitor (check_for_global_norm raises RuntimeError("TREError"),
# check_for_nan_in_loss_and_grad raises ValueError; mindformers/core/callback/callback.py, 1.9.0).
_STOPPING_CHECKS = ("check_for_global_norm", "check_for_nan_in_loss_and_grad")


def stopping_callbacks_before(callbacks, owner) -> List[str]:
    """The callbacks before ``owner`` in ``callbacks`` that stop training on a NaN or a norm spike in their step
    end: MindSpore calls step ends in list order, so the watch would never see the step they stop at."""
    names = []
    for callback in callbacks or ():
        if callback is owner:
            return names
        checks = [name for name in _STOPPING_CHECKS if getattr(callback, name, False) is True]
        if checks:
            names.append(f"{type(callback).__name__} ({', '.join(checks)})")
    return []  # owner not in the list: nothing to say


@dataclass
class StepWatch:
    """One rank's watch in a training run, and the captures it triggers (``steps: "anomaly"``).

    In a distributed run (``share_across``) every decision comes from what fired on any rank, gathered at
    each step end (``watch_ranks``): all ranks rerun, capture the next step, or stop at the same step.
    Everything a later gather depends on (``pending``, ``_used``, ``_stop_after``) is therefore set from
    gathered tables only, never from what one rank saw alone.
    """

    config: DumpConfig
    watch: Watch = field(init=False)
    captured: List[int] = field(default_factory=list)  # steps selected because a rule fired
    notes: List[str] = field(default_factory=list)  # what the run summary says of the watch
    pending: Optional[Firing] = None  # a firing whose capture waits for the next step to begin
    stop_requested: bool = False
    ranks: Optional[RankTable] = None  # a distributed run: the table every rank's firings reach
    first_across_ranks: Optional[Firing] = None
    _used: int = 0  # firings acted on (captured or refused): the same count on every rank
    _acted_ranks: List[int] = field(default_factory=list)  # distributed: where the firing acted on fired
    _stop_after: Optional[int] = None  # stop once this step has ended
    _bytes_at_last_capture: Optional[int] = None
    _last_capture_bytes: int = 0
    _said_no_capture_left: bool = False
    _not_rerun: str = ""  # why the pending firing's step is not rerun
    reruns: Dict[int, str] = field(default_factory=dict)  # rerun step -> "transient" or "persistent"

    def __post_init__(self):
        self.watch = Watch(self.config.watch)

    def set_rank(self, rank: int) -> None:
        self.watch.rank = rank

    def share_across(self, table: RankTable) -> None:
        """Take every decision from what fired on any rank (``table`` gathers a row per rank each step)."""
        self.ranks = table
        self.watch.rank = table.rank

    @property
    def captures_on_trigger(self) -> bool:
        return self.config.steps.on_anomaly

    def before_step(self, dump, step: int) -> None:
        """Select ``step`` for capture when a rule fired at the step before it."""
        firing, self.pending = self.pending, None
        if firing is None or dump is None:
            return
        if self.config.watch.stop:
            self._stop_after = step  # whether or not the step is captured
        if dump.backend is None:
            self._note(f"rule {firing.rule} fired at step {firing.step}: step {step} not captured, nothing is "
                       f"captured on rank {dump.rank}")
            return
        refusal = self._bytes_refusal(dump.dump_path)
        if refusal:
            self._note(f"rule {firing.rule} fired at step {firing.step}: step {step} not captured: {refusal}")
            return
        dump.select_step(step)
        dump.record_watch(step, {"rule": firing.rule, "fired_at_step": firing.step, "capture": "next_step",
                                 **_cell_of(firing), **self._fired_on()})
        self.captured.append(step)
        self._note(f"rule {firing.rule} fired at step {firing.step}{self._where(firing)}: capturing step {step}, "
                   f"the step after it ({self._not_rerun}); capture {len(self.captured)} of "
                   f"{self.config.anomaly_captures}")

    @property
    def wants_snapshot(self) -> bool:
        """True while a firing could still rerun its step: the adapter then keeps what a rerun needs from each
        step's start (``rerun.StepSnapshot``: a copy of the loss scale and the random state)."""
        return self.captures_on_trigger and self.pending is None and self._captures_left()

    def after_step(self, dump, step: Optional[int], signals: StepSignals, rerun=None,
                   on_ended: Optional[Callable[[Any], None]] = None, cells=None) -> List[Firing]:
        """Check the rules on the step that just ended (on every rank: ``share_across``); a firing reruns it
        (``rerun``, a ``rerun.StepRerun``, where the wrapper skipped its update), or schedules the next step's
        capture, or a stop. ``cells``: the step's cell health (``watch.CellReading``s), or None. Returns this
        rank's firings: the signals' rules, then the cell rules."""
        if self._stop_after is not None and step is not None and step >= self._stop_after:
            self.stop_requested = True
        if step is None:
            return []
        fired = self.watch.check(step, signals)
        if cells is not None:
            fired = fired + self.watch.check_cells(step, cells)
        firing, table = self._first_firing(step, fired, signals, rerun)
        if firing is None:
            return fired
        if self.captures_on_trigger and self.pending is None:
            self._act(dump, firing, signals, rerun, table, on_ended or (lambda ended: None))
        if self.config.watch.stop and self.pending is None and self._stop_after is None:
            self.stop_requested = True
        if self.config.watch.stop:
            logger.warning("mf_celldump watch: stop is set: training is asked to stop after step %d",
                           step if self.pending is None else step + 1)
        return fired

    def _first_firing(self, step: int, fired: List[Firing], signals: StepSignals, rerun):
        """(the firing to act on, the gathered table): this rank's first, or in a distributed run the first on
        any rank (lowest rank, then the order of the rules); (None, table) when nothing fired anywhere."""
        if self.ranks is None:
            return (fired[0] if fired else None), None
        table = self.ranks.gather(step_row(fired, bool(signals.overflow), rerun is not None))
        everywhere = firings_of(step, table)
        if not everywhere:
            return None, table
        first = everywhere[0]
        chosen = fired[0] if first.rank == self.ranks.rank else first  # this rank's own, with its full value
        if self.first_across_ranks is None:
            self.first_across_ranks = chosen
        if not fired:
            logger.warning("mf_celldump watch: step %d rank %d: rule %s fired on %s (value %s); every rank acts "
                           "on it", step, self.ranks.rank, first.rule,
                           ranks_text(sorted({f.rank for f in everywhere})), first.value)
        return chosen, table

    def _act(self, dump, firing: Firing, signals: StepSignals, rerun, table, on_ended) -> None:
        """Rerun the firing step (its update was skipped), or capture the next one, within the bounds."""
        if not self._captures_left():
            if not self._said_no_capture_left:
                self._said_no_capture_left = True
                self._note(f"rule {firing.rule} fired at step {firing.step}: not captured, anomaly_captures="
                           f"{self.config.anomaly_captures} captures are done (later firings are only logged)")
            return
        self._used += 1
        self._acted_ranks = [] if table is None else sorted({f.rank for f in firings_of(firing.step, table)})
        why_not = self._why_not_rerun(dump, firing, signals, rerun, table)
        if why_not is not None:
            self.pending = firing
            self._not_rerun = f"step {firing.step} is not rerun: {why_not}"
            return
        refusal = self._rerun_refusal(dump)
        if refusal:
            self._note(f"rule {firing.rule} fired at step {firing.step}: its rerun is not captured: {refusal}")
            return
        self._rerun(dump, firing, rerun, on_ended)

    def _why_not_rerun(self, dump, firing: Firing, signals: StepSignals, rerun, table) -> Optional[str]:
        """Why the firing step is not rerun (None: it is, on every rank). Where its update was skipped but it
        cannot be rerun here, a note says why."""
        skipped_but = None
        if table is not None:
            agreement = rerun_agreement(table)
            if agreement.together:
                return None
            if not agreement.skipped:
                return agreement.why_not
            skipped_but = agreement.why_not
        elif not signals.overflow:
            return "its update was applied, so its weights are gone"
        elif dump is None or dump.backend is None:
            return "nothing is captured on this rank"  # before_step says so
        elif rerun is None:
            skipped_but = ("its update was skipped, but the trainer gave no batch or loss scale to rerun with "
                           "(dataset sink mode, or a wrapper without scale_sense)")
        else:
            return None
        self._note(f"the update of step {firing.step} was skipped (overflow) but it is not rerun: {skipped_but}, so "
                   "the next step is captured")
        return skipped_but

    def _rerun_refusal(self, dump) -> Optional[str]:
        """Why no rank captures the rerun (``anomaly_max_bytes``); in a distributed run every rank learns whether
        any rank would pass it, so all rerun or none does."""
        own = None
        if dump is not None and dump.backend is not None:
            own = self._bytes_refusal(dump.dump_path)
        if self.ranks is None or self.config.anomaly_max_bytes is None:
            return own
        table = self.ranks.gather([0.0 if own else 1.0])
        refused = [rank for rank, row in enumerate(table) if not row[0]]
        if not refused:
            return None
        return own or f"{ranks_text(refused)} would pass anomaly_max_bytes={self.config.anomaly_max_bytes}, and " \
                      "every rank reruns together or none does; training goes on"

    def _rerun(self, dump, firing: Firing, rerun, on_ended: Callable[[Any], None]) -> None:
        """Run ``firing.step`` again, captured, on the same batch and weights (on every rank together in a
        distributed run; a rank that captures nothing reruns uncaptured); say whether the fault came back."""
        step = firing.step
        capturing = dump is not None and dump.backend is not None
        if capturing:
            dump.select_step(step)
            on_ended(dump.begin_step(step))
        result, error = None, None
        try:
            result = rerun.run()
        except Exception as err:  # the rerun is ours: training must go on, with the next step captured instead
            error = f"{type(err).__name__}: {err}"
            if capturing:
                dump.abort_step()
        failed, came_back = self._rerun_outcomes(result)
        verdict = "persistent" if came_back else "transient"
        if capturing and result is not None:  # kept even when another rank's rerun failed
            dump.record_watch(step, self._rerun_record(firing, result, verdict, came_back))
            on_ended(dump.end_step())
            self.captured.append(step)
        if failed:
            self._rerun_failed(firing, error, failed)
            return
        self.reruns[step] = verdict
        self._note(self._rerun_text(firing, result, came_back, capturing))

    def _rerun_outcomes(self, result) -> tuple:
        """(ranks whose rerun failed, ranks where the fault came back): this rank's alone, or every rank's."""
        ran = result is not None
        back = ran and not result.finite
        if self.ranks is None:
            return ([] if ran else [self.watch.rank]), ([self.watch.rank] if back else [])
        table = self.ranks.gather([float(ran), float(back)])
        return ([r for r, row in enumerate(table) if not row[0]], [r for r, row in enumerate(table) if row[1]])

    def _rerun_failed(self, firing: Firing, error: Optional[str], failed: List[int]) -> None:
        """A rerun failed (here or on another rank): every rank captures the next step instead."""
        where = f"its rerun failed ({error})" if error else f"its rerun failed on {ranks_text(failed)}"
        self._note(f"rule {firing.rule} fired at step {firing.step}: {where}; capturing the next step instead")
        self.pending = firing
        self._not_rerun = f"step {firing.step}'s rerun failed"

    def _rerun_record(self, firing: Firing, result, verdict: str, came_back: List[int]) -> dict:
        record = {"rule": firing.rule, "fired_at_step": firing.step, "capture": "rerun", "fault": verdict,
                  "exact": result.exact, **({} if result.exact else {"not_exact": result.inexact_reason}),
                  **self._fired_on()}
        if self.ranks is not None:
            record["came_back_on_ranks"] = came_back
        return record

    def _rerun_text(self, firing: Firing, result, came_back: List[int], capturing: bool) -> str:
        step = firing.step
        came = "did not come back: transient"
        if came_back:
            came = "came back: persistent" if self.ranks is None else f"came back on {ranks_text(came_back)}: " \
                                                                      "persistent"
        where = " on every rank" if self.ranks is not None else ""
        exact = "" if result.exact else f"; the rerun is not exact: {result.inexact_reason}"
        count = f"capture {len(self.captured)} of {self.config.anomaly_captures}" if capturing else \
            "nothing is captured on this rank"
        return (f"rule {firing.rule} fired at step {step}{self._where(firing)}, whose update the training wrapper "
                f"skipped (overflow): step {step} rerun{where} on the same batch and weights with capture on (loss "
                f"scale and random state of the step's start; no update); the fault {came} (rerun loss "
                f"{result.loss:.6g}){exact}; {count}")

    def _fired_on(self) -> dict:
        """In a distributed run, the ranks where a rule fired at the step acted on (for ``dump.json``)."""
        if self.ranks is None:
            return {}
        return {"fired_on_ranks": list(self._acted_ranks)}

    def _where(self, firing: Firing) -> str:
        return "" if self.ranks is None else f" on rank {firing.rank}"

    def _captures_left(self) -> bool:
        return self._used < self.config.anomaly_captures

    def _bytes_refusal(self, dump_path: str) -> Optional[str]:
        """Why a capture now would pass ``anomaly_max_bytes`` (None: it may go ahead)."""
        limit = self.config.anomaly_max_bytes
        if limit is None:
            return None
        used = bytes_under(dump_path)
        if self._bytes_at_last_capture is not None:
            self._last_capture_bytes = max(self._last_capture_bytes, used - self._bytes_at_last_capture)
        expected = used + self._last_capture_bytes
        if expected > limit:
            return (f"dump_path holds {used} bytes, and with the last capture's {self._last_capture_bytes} bytes "
                    f"again it would pass anomaly_max_bytes={limit}; training goes on")
        self._bytes_at_last_capture = used
        return None

    def _note(self, text: str) -> None:
        logger.warning("mf_celldump watch: %s", text)
        self.notes.append(f"watch: {text}")

    def summary_notes(self) -> List[str]:
        """The watch's lines for the run summary: what fired first (on this rank, and in a distributed run on any
        rank), and what was captured."""
        fired = self.watch.fired
        lines = [f"watch: {len(fired)} firing(s); first: {_firing_text(fired[0])}" if fired
                 else "watch: no rule fired"]
        if self.ranks is not None:
            first = self.first_across_ranks
            lines.append(f"watch: first firing across ranks: {_firing_text(first)}" if first is not None
                         else "watch: no rule fired on any rank")
        return lines + self.notes


def _firing_text(firing: Firing) -> str:
    value = firing.value
    if isinstance(value, float) and not math.isfinite(value):
        value = str(value)
    cell = f" cell {firing.cell} {firing.direction} {firing.what}" if firing.cell is not None else ""
    return f"step {firing.step} rank {firing.rank} rule {firing.rule}{cell} (value {value})"


def _cell_of(firing: Firing) -> dict:
    """A cell rule's cell and direction, for the captured step's ``dump.json``."""
    return {} if firing.cell is None else {"cell": firing.cell, "direction": firing.direction}
