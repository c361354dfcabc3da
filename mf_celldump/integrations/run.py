"""One capture through one training run, whatever trainer drives it.

Trainer adapters (``mindspore_callback``, ``mindformers2``) translate their trainer's
events into the four calls here: attach (once, whoever comes first: the compile hook
or the train-begin event), begin a step, end a step, finish. The step state itself
lives in the attached ``CellDump`` (the one step state machine); this object reacts
to what ``end_step`` says it finished: a captured, completed step is handed to a
``StepProcessor`` (by default a worker process beside training, so nothing heavy runs
on the step path), a step cut short by a failure stays raw. A step whose files MindSpore
writes after the step (graph-mode TensorDump) is handed over too, with the time to wait
for them: the processor waits (``processing.async_steps``), never the step path. At the
end it detaches, waits for the processor and logs a summary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from mf_celldump.config import DumpConfig
from mf_celldump.errors import AttachError
from mf_celldump.integrations.background import BackgroundProcessor
from mf_celldump.integrations.rank_verdict import RankVerdict, world_size
from mf_celldump.integrations.step_processor import ProcessingResult, StepProcessor
from mf_celldump.integrations.watching import StepWatch
from mf_celldump.processing.outcome import counted, entries_text
from mf_celldump.watch import StepSignals

logger = logging.getLogger(__name__)

FAILED_RUN_WAIT_S = 60.0  # after a training failure, wait at most this long for MindSpore's late files


@dataclass
class RunSummary:
    """What one run left on disk for this rank (logged at the end of training)."""

    rank: Optional[int] = None
    dump_path: Optional[str] = None
    captured_steps: List[int] = field(default_factory=list)
    processed_steps: List[int] = field(default_factory=list)
    outputs: List[str] = field(default_factory=list)  # step folders, relative to dump_path
    entries: int = 0  # msprobe entries in the processed output: cell calls and weight-gradient entries
    weight_grad_entries: int = 0  # of the entries: parameters_grad ones
    files: int = 0  # raw files read by processing (tensors and non-tensor values)
    empty_steps: List[int] = field(default_factory=list)
    unfinished_step: Optional[int] = None
    problems: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    processing: Dict[str, Any] = field(default_factory=dict)  # where processing ran (worker pid, exit, ...)

    def add_report(self, report: Any) -> List[int]:
        """Fold a ``ProcessingReport`` into the run totals; returns the steps that had no entry."""
        empty = []
        for outcome in report.processed:
            if outcome.step not in self.processed_steps:
                self.processed_steps.append(outcome.step)
                self.outputs.append(outcome.output)
            self.entries += outcome.entries
            self.weight_grad_entries += outcome.weight_grad_entries
            self.files += outcome.files
            if outcome.entries == 0 and outcome.step not in self.empty_steps:
                self.empty_steps.append(outcome.step)
                empty.append(outcome.step)
        self.problems.extend(report.all_problems)
        return empty

    def text(self) -> str:
        steps = ",".join(str(s) for s in sorted(self.processed_steps)) or "none"
        captured = ",".join(str(s) for s in self.captured_steps) or "none"
        lines = [f"mf_celldump: rank {self.rank}: captured steps {captured}; processed {steps} "
                 f"({entries_text(self.entries, self.weight_grad_entries)}, {counted(self.files, 'raw file')}) "
                 f"under {self.dump_path}"]
        if self.outputs:
            lines.append("  output: " + ", ".join(sorted(self.outputs)))
        if self.empty_steps:
            lines.append(f"  steps with no captured cell: {','.join(str(s) for s in self.empty_steps)}")
        if self.unfinished_step is not None:
            lines.append(f"  step {self.unfinished_step} did not finish: its raw data stays in {self.dump_path}/_raw "
                         f"(`mf-celldump process {self.dump_path}` writes what is there, named incomplete)")
        if self.processing.get("text"):
            lines.append(f"  processing: {self.processing['text']}")
        lines.extend(f"  note: {n}" for n in self.notes)
        if self.problems:
            lines.append(f"  {len(self.problems)} problem(s):")
            lines.extend(f"    - {p}" for p in self.problems[:20])
        return "\n".join(lines)


class TrainingRun:
    """Attach-once / step / finish logic shared by every trainer adapter.

    ``run_tag`` numbers the training runs of one process (a second ``train()`` with the same
    callback): every rank numbers them alike, so their verdicts across ranks stay apart.
    """

    def __init__(self, config: DumpConfig, wait_timeout: Optional[float] = None, run_tag: int = 0):
        self.config = config
        self.run_tag = run_tag
        self.verdict: Optional[RankVerdict] = None  # the verdict across ranks (distributed runs)
        self.dump = None  # CellDump once attached
        self.finished = False
        self.summary = RunSummary()
        self.processor: Optional[StepProcessor] = None  # created at the first captured step
        # How long to wait for steps MindSpore writes late; None: async_steps.DEFAULT_TIMEOUT_S.
        self.wait_timeout = wait_timeout
        self.written_later = False  # a step was handed over with a wait
        self.watching = StepWatch(config) if config.watch is not None else None  # the watch (docs/watch.md)
        self.last_step: Optional[int] = None  # the last step that began, for the selected steps never reached

    @property
    def attached(self) -> bool:
        return self.dump is not None and self.dump.attached

    def ensure_attached(self, network, *, initial_step: int = 0, output_dir: Optional[str] = None,
                        origin: str = ""):
        """Attach to ``network`` unless this run already did; returns the handle."""
        if self.dump is not None:
            return self.dump
        from mf_celldump.capture.session import attach  # late: the capture session pulls in MindSpore

        RankVerdict.check(self.config)  # a verdict asked for that cannot be served: refused before anything changes
        self.dump = attach(network, self.config, initial_step=initial_step, output_dir=output_dir,
                           watched_by_trainer=True)
        self.summary.rank = self.dump.rank
        if self.watching is not None:
            self._watch_ranks()
        self.summary.dump_path = self.dump.dump_path
        logger.info("mf_celldump: capture attached%s (first step %d)", f" at {origin}" if origin else "",
                    initial_step)
        try:
            self.verdict = RankVerdict.start(self.config, self.dump.rank, self.run_tag)  # every rank, together
        except AttachError:
            self.dump.detach()
            self.dump = None
            raise
        if self.config.process_on_train_end and self.dump.rank in self.config.ranks:
            self._step_processor().prepare()  # before training: submit stays a queue put
        return self.dump

    def _watch_ranks(self) -> None:
        """In a distributed run the watch shares each step's firings with every rank (``watch_ranks``): a rule
        that fires on one rank makes every rank rerun, capture or stop at the same step. A watch that only logs
        (no ``steps: anomaly``, no ``stop``, no ``rank_verdict`` to name the first firing) needs no gather."""
        self.watching.set_rank(self.dump.rank)
        acts = self.config.steps.on_anomaly or self.config.watch.stop or self.config.rank_verdict
        world = world_size()
        if world > 1 and acts:
            from mf_celldump.integrations.watch_ranks import RankTable

            self.watching.share_across(RankTable(self.dump.rank, world))

    # -- steps -------------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        if self.dump is not None and not self.finished:
            self.last_step = step
            if self.watching is not None:
                self.watching.before_step(self.dump, step)  # a rule fired at the step before: capture this one
            self._ended(self.dump.begin_step(step))

    def end_step(self, signals=None, rerun=None) -> None:
        """The running step ended; ``signals`` (``watch.StepSignals``): what it computed, for the watch;
        ``rerun`` (``rerun.StepRerun``): how to run it again, should a rule fire where its update was skipped."""
        if self.dump is not None and not self.finished:
            ended = self.dump.end_step()
            self._ended(ended)
            step = None if ended is None else ended.step
            health = self.dump.last_health
            cells = health[1] if health is not None and health[0] == step else None
            if self.watching is not None and (signals is not None or cells is not None):
                self.watching.after_step(self.dump, step, signals or StepSignals(), rerun, self._ended, cells)

    @property
    def stop_requested(self) -> bool:
        """True when the watch asks the trainer to stop (``watch: {stop: true}``) after the step that ended."""
        return self.watching is not None and self.watching.stop_requested

    def _ended(self, ended) -> None:
        if ended is None or not (ended.captured and ended.completed and self.config.process_on_train_end):
            return
        wait_s = 0.0
        if ended.written_later:
            self.written_later = True
            wait_s = self._wait_s()
        elif ended.marked_later:  # our writer's thread marks it within moments (detach waits for it)
            wait_s = self._wait_s()
        self._step_processor().submit([ended.step], wait_s)  # the only processing work on the step path

    def _wait_s(self, failed: bool = False) -> float:
        from mf_celldump.processing.async_steps import DEFAULT_TIMEOUT_S

        timeout = DEFAULT_TIMEOUT_S if self.wait_timeout is None else self.wait_timeout
        return min(timeout, FAILED_RUN_WAIT_S) if failed else timeout

    def _step_processor(self) -> StepProcessor:
        if self.processor is None:
            on_summary = self.verdict.on_summary if self.verdict is not None else None
            self.processor = BackgroundProcessor(self.dump.dump_path, self.dump.rank, self.config.jobs, on_summary)
        return self.processor

    # -- end of training -----------------------------------------------------------------
    def finish(self, failed: bool = False) -> Optional[RunSummary]:
        """Detach and process what is complete. Idempotent; never raises on a failed run."""
        if self.finished:
            return None
        self.finished = True
        if self.dump is None:
            return None
        try:
            self._close_dump(failed)
        except Exception as err:  # never hide the training outcome behind a dump problem
            if not failed:
                raise
            logger.exception("mf_celldump: could not finish the dump after the training failure: %s", err)
        logger.info("%s", self.summary.text())
        return self.summary

    def _close_dump(self, failed: bool) -> None:
        try:
            if failed:
                ended = self.dump.abort_step()  # the step never finished: keep its raw data unmarked
                if ended is not None and ended.captured:
                    self.summary.unfinished_step = ended.step
            else:
                self._ended(self.dump.end_step())
            self.dump.detach()
        finally:
            self._finish_processing()
        self.summary.captured_steps = list(self.dump.captured_steps)
        if self.watching is not None:
            self.summary.notes.extend(self.watching.summary_notes())
        if self.dump.health_path is not None:
            self.summary.notes.append(f"watch: cell health of this rank in {self.dump.health_path} "
                                      f"(`mf-celldump health {self.dump.dump_path}` names the first bad cell)")
        if self.dump.writes_unselected:
            from mf_celldump.integrations.captured import discard_unselected

            self.summary.notes.extend(discard_unselected(self.dump, timeout=self._wait_s(failed)))
        if self.verdict is not None:
            verdict, self.verdict = self.verdict, None
            verdict.finish(self.summary.processed_steps, failed)
        if not self.config.process_on_train_end and self.dump.writes_later:
            self._wait_unprocessed(failed)
        if self.dump.rank not in self.config.ranks:
            self.summary.notes.append(
                f"rank {self.dump.rank} is not in ranks={self.config.ranks.describe()}: nothing captured")
        elif not failed and self.last_step is not None and self.config.steps.spans:
            self._note_unreached()
        remaining = [s for s in self.summary.captured_steps if s not in self.summary.processed_steps]
        if not self.config.process_on_train_end and remaining:
            self.summary.notes.append("process_on_train_end is false: run `mf-celldump process "
                                      f"{self.dump.dump_path}` to produce the msprobe layout")

    def _note_unreached(self) -> None:
        """Selected steps after the last one the run reached: named, so that nobody looks for them in the
        raw data (``process`` cannot make a step that never ran)."""
        unreached = self.config.steps.from_value(self.last_step + 1, 6)
        if unreached:
            shown = ",".join(str(s) for s in unreached[:5]) + (",..." if len(unreached) > 5 else "")
            self.summary.notes.append(f"selected step{'s' if len(unreached) > 1 else ''} {shown} never reached: "
                                      f"the run ended after step {self.last_step}")

    def _finish_processing(self) -> None:
        """Wait (up to ``process_timeout``) for the processor and fold what it did into the summary."""
        processor, self.processor = self.processor, None
        if processor is None:
            return
        timeout = self.config.process_timeout + (self._wait_s() if self.written_later else 0.0)
        result: ProcessingResult = processor.finish(timeout)
        for report in result.reports:
            self._fold(report)
        self.summary.problems.extend(result.problems)
        self.summary.notes.extend(result.notes)
        self.summary.processing.update(result.info)

    def _wait_unprocessed(self, failed: bool) -> None:
        """Without processing, still let MindSpore finish writing before the process may exit."""
        from mf_celldump.integrations.captured import wait_for_files

        waited = wait_for_files(self.dump, timeout=self._wait_s(failed))
        self.summary.problems.extend(waited.problems(self.dump.rank))

    def _fold(self, report) -> None:
        for step in self.summary.add_report(report):
            logger.warning(
                "mf_celldump: step %d was captured but no cell call reached the capture. If the graph "
                "was compiled before capture was attached (network.compile, Model.build outside the "
                "callback's hook), the wrapped cells are ignored: attach before the first compile.", step,
            )
