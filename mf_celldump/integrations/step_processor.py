"""Who processes the captured steps of a training run, and when.

A ``TrainingRun`` hands each captured, completed step to a :class:`StepProcessor`
(``submit``) and collects everything at the end of training (``finish``). Two
implementations: the background worker (``integrations.background``, the default:
processing runs beside training, in another process) and :class:`InlineProcessor`
(in the training process).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)


@dataclass
class ProcessingResult:
    """What a processor did for the run: its reports, and what went wrong outside them."""

    reports: List[Any] = field(default_factory=list)  # ProcessingReport, one per processed request
    problems: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    info: Dict[str, Any] = field(default_factory=dict)  # where processing ran (shown in the run summary)


def finish_command(dump_path: str, steps: Sequence[int], rank: int) -> str:
    """The command that finishes what a run left raw."""
    listed = ",".join(str(s) for s in sorted(steps))
    return f"`mf-celldump process {dump_path} --steps {listed} --ranks {rank}`"


SummaryListener = Callable[[Dict[str, Any]], None]


class StepProcessor(ABC):
    """Processes this rank's complete raw steps into msprobe's layout.

    With ``on_summary``, each processed step is also reduced to its rank summary
    (``ranks.rank_summary``, as JSON data) and handed to ``on_summary`` as soon as it is made,
    from whichever thread learns of it (never the training step).
    """

    def __init__(self, dump_path: str, rank: int, jobs: Optional[int], on_summary: Optional[SummaryListener] = None):
        self.dump_path = dump_path
        self.rank = rank
        self.jobs = jobs
        self.on_summary = on_summary

    @abstractmethod
    def prepare(self) -> None:
        """Before training (off the step path): set up what ``submit`` needs to stay cheap."""

    @abstractmethod
    def submit(self, steps: Sequence[int], wait_s: float = 0.0) -> None:
        """``steps`` are complete on disk (called on the training thread); with ``wait_s`` > 0 their
        files are still being written by MindSpore: wait for them up to that long first."""

    @abstractmethod
    def finish(self, timeout: float) -> ProcessingResult:
        """End of training: wait up to ``timeout`` seconds for the submitted steps; never raises
        for a processing failure (those are in the result)."""


def run_inline(dump_path: str, rank: int, jobs: Optional[int], steps: Sequence[int],
               result: ProcessingResult, wait_s: float = 0.0, on_summary: Optional[SummaryListener] = None) -> None:
    """Process ``steps`` in this process (after waiting up to ``wait_s`` for late files); a failure
    becomes a problem of ``result``."""
    from mf_celldump.processing.async_steps import wait_for_steps
    from mf_celldump.processing.driver import process_dump
    from mf_celldump.processing.worker import SummarizingObserver, step_summaries

    try:
        if wait_s > 0:
            result.problems.extend(wait_for_steps(dump_path, rank, steps, timeout=wait_s).problems(rank))
        observer = SummarizingObserver(summarize=on_summary is not None)
        report = process_dump(dump_path, steps=list(steps), ranks=[rank], jobs=jobs, only_complete=True,
                              observer=observer)
        result.reports.append(report)
        if on_summary is not None:
            for summary in step_summaries(dump_path, report, observer.summaries):
                on_summary(summary.to_json())
    except Exception as err:  # processing problems must not stop training
        logger.exception("mf_celldump: processing steps %s failed: %s", list(steps), err)
        result.problems.append(f"processing of steps {list(steps)} failed: {err}; their raw data is kept: "
                               f"{finish_command(dump_path, steps, rank)} retries")


class InlineProcessor(StepProcessor):
    """Processing in the training process, on the thread that submits, before ``submit`` returns.

    The behaviour before processing moved to a worker: a captured step stalls training for
    as long as its processing takes. Kept as the reference ``bench/bench_step_processing.py``
    measures the worker against, and for callers that want the output when ``submit``
    returns.
    """

    def __init__(self, dump_path: str, rank: int, jobs: Optional[int], on_summary: Optional[SummaryListener] = None):
        super().__init__(dump_path, rank, jobs, on_summary)
        self._result = ProcessingResult(info={"where": "training process", "text": "in the training process"})

    def prepare(self) -> None:
        """Nothing to set up."""

    def submit(self, steps: Sequence[int], wait_s: float = 0.0) -> None:
        run_inline(self.dump_path, self.rank, self.jobs, steps, self._result, wait_s, self.on_summary)

    def finish(self, timeout: float) -> ProcessingResult:
        return self._result
