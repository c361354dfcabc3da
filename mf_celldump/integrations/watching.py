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
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from mf_celldump.config import DumpConfig
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


def bytes_under(path: str) -> int:
    """Bytes of the regular files under ``path`` (links not followed); 0 when it does not exist."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                stat = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            total += stat.st_size if not os.path.islink(os.path.join(folder, name)) else 0
    return total


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
    """One rank's watch in a training run, and the captures it triggers (``steps: "anomaly"``)."""

    config: DumpConfig
    watch: Watch = field(init=False)
    captured: List[int] = field(default_factory=list)  # steps selected because a rule fired
    notes: List[str] = field(default_factory=list)  # what the run summary says of the watch
    pending: Optional[Firing] = None  # a firing whose capture waits for the next step to begin
    stop_requested: bool = False
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
        dump.record_watch(step, {"rule": firing.rule, "fired_at_step": firing.step, "capture": "next_step"})
        self.captured.append(step)
        self._note(f"rule {firing.rule} fired at step {firing.step}: capturing step {step}, the step after it "
                   f"({self._not_rerun}); capture {len(self.captured)} of {self.config.anomaly_captures}")

    @property
    def wants_snapshot(self) -> bool:
        """True while a firing could still rerun its step: the adapter then keeps what a rerun needs from each
        step's start (``rerun.StepSnapshot``: a copy of the loss scale and the random state)."""
        return self.captures_on_trigger and self.pending is None and self._captures_left()

    def after_step(self, dump, step: Optional[int], signals: StepSignals, rerun=None,
                   on_ended: Optional[Callable[[Any], None]] = None) -> List[Firing]:
        """Check the rules on the step that just ended; a firing reruns it (``rerun``, a ``rerun.StepRerun``,
        where the wrapper skipped its update), or schedules the next step's capture, or a stop."""
        if self._stop_after is not None and step is not None and step >= self._stop_after:
            self.stop_requested = True
        if step is None:
            return []
        fired = self.watch.check(step, signals)
        if not fired:
            return fired
        if self.captures_on_trigger and self.pending is None:
            if not self._captures_left():
                if not self._said_no_capture_left:
                    self._said_no_capture_left = True
                    self._note(f"rule {fired[0].rule} fired at step {step}: not captured, anomaly_captures="
                               f"{self.config.anomaly_captures} captures are done (later firings are only logged)")
            elif signals.overflow and self._rerun_possible(dump, rerun):
                self._rerun(dump, fired[0], rerun, on_ended or (lambda ended: None))
            else:
                self.pending = fired[0]
                why = ("its update was skipped, but a rerun is not possible here" if signals.overflow
                       else "its update was applied, so its weights are gone")
                self._not_rerun = f"step {step} is not rerun: {why}"
        if self.config.watch.stop and self.pending is None and self._stop_after is None:
            self.stop_requested = True
        if self.config.watch.stop:
            logger.warning("mf_celldump watch: stop is set: training is asked to stop after step %d",
                           step if self.pending is None else step + 1)
        return fired

    def _rerun_possible(self, dump, rerun) -> bool:
        """Whether the step whose update was skipped can run again here; if not, the log says why."""
        why = None
        if dump is None or dump.backend is None:
            return False  # nothing is captured on this rank: before_step says so
        if dump.distributed:
            why = ("a distributed run: every rank would have to rerun together (not implemented), so the next "
                   "step is captured")
        elif rerun is None:
            why = ("the trainer gave no batch or loss scale to rerun with (dataset sink mode, or a wrapper without "
                   "scale_sense), so the next step is captured")
        if why:
            self._note(f"the update of this step was skipped (overflow) but it is not rerun: {why}")
        return why is None

    def _rerun(self, dump, firing: Firing, rerun, on_ended: Callable[[Any], None]) -> None:
        """Run ``firing.step`` again, captured, on the same batch and weights; say whether the fault came back."""
        step = firing.step
        refusal = self._bytes_refusal(dump.dump_path)
        if refusal:
            self._note(f"rule {firing.rule} fired at step {step}: its rerun is not captured: {refusal}")
            return
        dump.select_step(step)
        on_ended(dump.begin_step(step))
        try:
            result = rerun.run()
        except Exception as err:  # the rerun is ours: training must go on, with the next step captured instead
            dump.abort_step()
            self._note(f"rule {firing.rule} fired at step {step}: its rerun failed ({type(err).__name__}: {err}); "
                       "capturing the next step instead")
            self.pending = firing
            self._not_rerun = f"step {step}'s rerun failed"
            return
        dump.record_watch(step, {"rule": firing.rule, "fired_at_step": step, "capture": "rerun",
                                 "fault": result.verdict, "exact": result.exact,
                                 **({} if result.exact else {"not_exact": result.inexact_reason})})
        on_ended(dump.end_step())
        self.captured.append(step)
        self.reruns[step] = result.verdict
        came = "came back: persistent" if not result.finite else "did not come back: transient"
        exact = "" if result.exact else f"; the rerun is not exact: {result.inexact_reason}"
        self._note(f"rule {firing.rule} fired at step {step}, whose update the training wrapper skipped (overflow): "
                   f"step {step} rerun on the same batch and weights with capture on (loss scale and random state "
                   f"of the step's start; no update); the fault {came} (rerun loss {result.loss:.6g}){exact}; "
                   f"capture {len(self.captured)} of {self.config.anomaly_captures}")

    def _captures_left(self) -> bool:
        return len(self.captured) < self.config.anomaly_captures

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
        """The watch's lines for the run summary: what fired first, and what was captured."""
        fired = self.watch.fired
        if not fired:
            return ["watch: no rule fired"] + self.notes
        first = fired[0]
        value = first.value if not isinstance(first.value, float) or math.isfinite(first.value) else str(first.value)
        return [f"watch: {len(fired)} firing(s); first: step {first.step} rank {first.rank} rule {first.rule} "
                f"(value {value})"] + self.notes
