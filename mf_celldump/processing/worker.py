"""The processing worker: ``python -m mf_celldump.processing.worker``, beside a training process.

The training side (``integrations.background``) starts this module once per run as a
fresh interpreter and sends it one JSON request per line on stdin; for each request it
runs ``process_dump`` and answers one JSON line on stdout. It never imports MindSpore:
processing needs numpy and yaml only, and each reply says whether MindSpore is loaded.

Protocol (one JSON object per line, UTF-8):

stdin   ``{"cmd": "process", "id": 3, "dump_path": P, "rank": 0, "steps": [5], "jobs": 1, "summarize": true}``
        ``{"cmd": "stop"}``: finish every request sent before it, then exit.
stdout  ``{"event": "ready", "pid", "startup_s", "policy", "nice", "mindspore_imported"}`` once;
        ``{"event": "progress", "id", "files_done", "files_total"}`` at most every 0.5 s, once
        ``stop`` arrived (the trainer is waiting and shows it);
        ``{"event": "result", "id", "steps", "seconds", "cpu_s", "report": {...}, "mindspore_imported",
        "summaries": [...]}`` (with ``summarize``: each processed step reduced to its rank summary,
        ``mf_celldump.ranks.rank_summary``, kilobytes, for the cross-rank verdict at train end);
        ``{"event": "error", "id", "steps", "error"}`` when ``process_dump`` raised;
        ``{"event": "bad_request", "line", "error"}`` for a line that is not a valid request;
        ``{"event": "exit", "reason", "requests"}`` last.

When stdin ends without ``stop``, or the training process is gone, the training process
died: the worker finishes the request it is working on and exits without starting
another. Raw data of steps it never processed stays complete on disk for
``mf-celldump process``. It runs at a lower CPU and I/O priority than training
(SCHED_IDLE and nice, see NICE_INCREMENT).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import queue
import sys
import threading
import time
from typing import Any, Dict, Iterable, List, Optional, TextIO, Tuple

from mf_celldump.errors import CellDumpError

_STARTED = time.monotonic()

from mf_celldump.processing.async_steps import wait_for_steps  # noqa: E402  (folder listings only)
from mf_celldump.processing.driver import process_dump  # noqa: E402  (numpy + yaml; no MindSpore)
from mf_celldump.processing.observer import ProgressObserver  # noqa: E402
from mf_celldump.processing.outcome import ProcessingReport  # noqa: E402
from mf_celldump.processing.step_transaction import StepOutcome  # noqa: E402
from mf_celldump.ranks.rank_summary import RankSummary, summarize_entries, summarize_outputs  # noqa: E402  (no MindSpore)

logger = logging.getLogger(__name__)

MODULE = "mf_celldump.processing.worker"
# The worker's priority. Linux SCHED_IDLE (sched(7): "for running very low priority
# background jobs") gives it a core only when training and everything else leave one
# idle; a process without an explicit I/O priority then also gets the idle I/O class
# (include/linux/ioprio.h task_nice_ioclass: SCHED_IDLE -> IOPRIO_CLASS_IDLE). Where
# SCHED_IDLE is missing, the nice increment still applies, and Linux derives a best-effort
# I/O level from it, io_nice = (cpu_nice + 20) / 5, i.e. 6 of 0-7 for nice 10
# (Documentation/block/ioprio.rst; bfq and mq-deadline honour it). Starving the worker
# costs no data: the wait at train end processes what is left, up to process_timeout.
NICE_INCREMENT = 10
PROGRESS_INTERVAL_S = 0.5
PARENT_CHECK_S = 1.0


class BadRequest(CellDumpError, ValueError):
    """A request line that cannot be processed; the message names the key and the valid values."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One ``process`` request: the complete raw ``steps`` of ``rank`` under ``dump_path``."""

    id: int
    dump_path: str
    rank: int
    steps: List[int]
    jobs: int
    wait_s: float = 0.0  # > 0: MindSpore writes these steps' files late; wait up to this long first
    summarize: bool = False  # reply with each processed step's rank summary

    def to_line(self) -> bytes:
        body = {"cmd": "process", "id": self.id, "dump_path": self.dump_path, "rank": self.rank,
                "steps": list(self.steps), "jobs": self.jobs, "wait_s": self.wait_s, "summarize": self.summarize}
        return (json.dumps(body) + "\n").encode("utf-8")


STOP_LINE = b'{"cmd": "stop"}\n'


def _non_negative_int(message: Dict[str, Any], key: str, minimum: int = 0) -> int:
    value = message.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"key {key!r}: {value!r} is not an integer >= {minimum}")
    return value


def parse_request(line: bytes) -> Optional[Request]:
    """The request on ``line``, or None for ``stop``; raises BadRequest naming what is wrong."""
    try:
        message = json.loads(line)
    except ValueError as err:
        raise BadRequest(f"not JSON ({err}): {line[:80]!r}") from None
    if not isinstance(message, dict):
        raise BadRequest(f"expected a JSON object, got {type(message).__name__}")
    command = message.get("cmd")
    if command == "stop":
        return None
    if command != "process":
        raise BadRequest(f"key 'cmd': {command!r} is not one of 'process', 'stop'")
    dump_path = message.get("dump_path")
    if not isinstance(dump_path, str) or not dump_path:
        raise BadRequest(f"key 'dump_path': {dump_path!r} is not a non-empty path")
    steps = message.get("steps")
    if not isinstance(steps, list) or not steps or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps):
        raise BadRequest(f"key 'steps': {steps!r} is not a non-empty list of integers >= 0")
    wait_s = message.get("wait_s", 0.0)
    if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s < 1e7:
        raise BadRequest(f"key 'wait_s': {wait_s!r} is not a number of seconds >= 0")
    summarize = message.get("summarize", False)
    if not isinstance(summarize, bool):
        raise BadRequest(f"key 'summarize': {summarize!r} is not true or false")
    return Request(_non_negative_int(message, "id"), dump_path, _non_negative_int(message, "rank"), steps,
                   _non_negative_int(message, "jobs", minimum=1), float(wait_s), summarize)


def report_to_json(report: ProcessingReport) -> Dict[str, Any]:
    return dataclasses.asdict(report)


def report_from_json(data: Dict[str, Any]) -> ProcessingReport:
    """The inverse of ``report_to_json`` (both ends run the same installed package)."""
    fields = dict(data)
    fields["outcomes"] = [StepOutcome(**outcome) for outcome in data.get("outcomes", [])]
    return ProcessingReport(**fields)


class Channel:
    """The protocol's output: a private copy of stdout; fd 1 itself is pointed at stderr so a
    stray print from any library can never corrupt a reply."""

    def __init__(self) -> None:
        self._out: TextIO = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._lock = threading.Lock()

    def send(self, **message: Any) -> None:
        text = json.dumps(message) + "\n"
        with self._lock:
            try:
                self._out.write(text)
                self._out.flush()
            except OSError:  # the trainer is gone (killed): nobody reads the replies any more
                self._out = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115  (lives as long as the worker)


class SummarizingObserver(ProgressObserver):
    """Progress as usual, and the rank summary of every step whose output the run puts in place, made of the
    entries processing holds as it writes them (streamed: no dump.json is read back, memory holds one entry)."""

    def __init__(self, show_bar: bool = False, summarize: bool = True):
        super().__init__(show_bar=show_bar)
        self.summarize = summarize  # False: progress only
        self.summaries: Dict[Tuple[int, int], RankSummary] = {}  # (rank, step) -> its summary

    def on_output(self, rank: int, step: int, entries: Iterable[Tuple[str, Dict[str, Any]]]) -> None:
        if not self.summarize:
            return
        try:
            self.summaries[(rank, step)] = summarize_entries(entries, step, rank)
        except (OSError, ValueError) as err:  # the step's output is in place; only its summary is missing
            logger.warning("no rank summary for step %s rank %s: %s", step, rank, err)


class _ProgressEvents(SummarizingObserver):
    """Log lines as in any processing run, plus a throttled ``progress`` reply once the trainer waits.

    Only after ``stop`` (sent when training has ended and the trainer waits with a progress
    bar): during training every reply wakes a thread in the training process, so then the
    worker answers once per request and no more.
    """

    def __init__(self, channel: Channel, request_id: int, inbox: Inbox, summarize: bool):
        super().__init__(show_bar=False, summarize=summarize)
        self._channel = channel
        self._id = request_id
        self._inbox = inbox
        self._sent = 0.0

    def _send(self) -> None:
        if not self._inbox.stop_received:
            return
        self._sent = time.monotonic()
        self._channel.send(event="progress", id=self._id, files_done=self.done, files_total=self.total)

    def on_start(self, total_files: int) -> None:
        super().on_start(total_files)
        self._send()

    def on_file(self) -> None:
        super().on_file()
        if time.monotonic() - self._sent >= PROGRESS_INTERVAL_S:
            self._send()


class Inbox:
    """Reads stdin on a thread, so the end of input (the trainer is gone) is seen at once."""

    def __init__(self, stream, parent_pid: int):
        self._lines: queue.Queue = queue.Queue()
        self._stream = stream
        self._parent_pid = parent_pid
        self.stop_received = False
        self.closed = False
        threading.Thread(target=self._read, name="worker-stdin", daemon=True).start()

    def _read(self) -> None:
        for number, line in enumerate(self._stream, 1):
            if _is_stop(line):
                self.stop_received = True
            self._lines.put((number, line))
        self.closed = True
        self._lines.put(None)

    def trainer_gone(self) -> Optional[str]:
        """Why to exit without starting more work, or None."""
        if os.getppid() != self._parent_pid:
            return "training process gone"
        if self.closed and not self.stop_received:
            return "stdin closed without stop"
        return None

    def next(self):
        """(line number, bytes), or None at the end of input or when the trainer is gone."""
        while True:
            if self.trainer_gone():
                return None
            try:
                return self._lines.get(timeout=PARENT_CHECK_S)
            except queue.Empty:
                continue


def _is_stop(line: bytes) -> bool:
    try:
        return json.loads(line).get("cmd") == "stop"
    except (ValueError, AttributeError):
        return False


def _lower_priority() -> Dict[str, Any]:
    """Step back for training: SCHED_IDLE where the OS has it, and a nice increment in any case."""
    applied: Dict[str, Any] = {"policy": "normal", "nice": None}
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            applied["policy"] = "SCHED_IDLE"
        except OSError as err:  # e.g. a seccomp profile that forbids it
            logger.debug("SCHED_IDLE not set: %s", err)
    try:
        applied["nice"] = os.nice(NICE_INCREMENT)
    except (AttributeError, OSError) as err:  # no nice() here, or not allowed
        logger.debug("nice not set: %s", err)
    return applied


def handle(request: Request, channel: Channel, inbox: Inbox) -> None:
    """Process one request and reply; a failure is a reply, never the end of the worker."""
    started, cpu_started = time.monotonic(), time.process_time()
    try:
        waited = None
        if request.wait_s > 0:  # the step's files are written beside training (our writer, MindSpore's TensorDump)
            waited = wait_for_steps(request.dump_path, request.rank, request.steps, timeout=request.wait_s,
                                    show_bar=False)
        observer = _ProgressEvents(channel, request.id, inbox, request.summarize)
        report = process_dump(request.dump_path, steps=request.steps, ranks=[request.rank], jobs=request.jobs,
                              only_complete=True, observer=observer)
        if waited is not None:
            report.problems.extend(waited.problems(request.rank))
    except Exception as err:  # noqa: BLE001  -- reported to the trainer, which logs it
        logger.exception("processing steps %s of rank %d failed", request.steps, request.rank)
        channel.send(event="error", id=request.id, steps=request.steps, error=f"{type(err).__name__}: {err}")
        return
    summaries = [s.to_json() for s in step_summaries(request.dump_path, report, observer.summaries)
                 ] if request.summarize else []
    channel.send(event="result", id=request.id, steps=request.steps,
                 seconds=round(time.monotonic() - started, 4), cpu_s=round(time.process_time() - cpu_started, 4),
                 report=report_to_json(report), summaries=summaries,
                 mindspore_imported="mindspore" in sys.modules)


def step_summaries(dump_path: str, report: ProcessingReport,
                   made: Optional[Dict[Tuple[int, int], RankSummary]] = None):
    """The rank summary of every step whose output is in place (off the training step path): ``made``
    (``SummarizingObserver.summaries``) for the outputs the run wrote, from ``dump.json`` for those it found
    already in place."""
    outputs = ((o.step, o.rank, o.output) for o in report.outcomes if o.status in ("processed", "already-processed"))
    return summarize_outputs(dump_path, outputs, made)


def serve(inbox: Inbox, channel: Channel) -> str:
    """Answer requests until ``stop``, the end of input or the trainer's death; returns why it ended."""
    handled = 0
    while True:
        item = inbox.next()
        if item is None:
            reason = inbox.trainer_gone() or "stop"
            break
        number, line = item
        try:
            request = parse_request(line)
        except BadRequest as err:
            logger.error("request line %d: %s", number, err)
            channel.send(event="bad_request", line=number, error=str(err))
            continue
        if request is None:
            reason = "stop"
            break
        handle(request, channel, inbox)
        handled += 1
    channel.send(event="exit", reason=reason, requests=handled)
    return reason


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--parent-pid", type=int, default=os.getppid(),
                        help="exit when this process is gone (default: the parent)")
    parser.add_argument("--log-level", default="INFO", help="logging level of the worker's stderr log (name or number)")
    args = parser.parse_args(argv)
    channel = Channel()
    level = int(args.log_level) if args.log_level.isdigit() else args.log_level.upper()
    logging.basicConfig(level=level, stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s mf_celldump worker[{os.getpid()}] %(name)s: %(message)s")
    # Ctrl-C in the training terminal reaches the whole process group; the trainer decides
    # whether to wait for or stop this worker (its on_train_end / exit path), so ignore it.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    priority = _lower_priority()
    inbox = Inbox(sys.stdin.buffer, args.parent_pid)
    channel.send(event="ready", pid=os.getpid(), startup_s=round(time.monotonic() - _STARTED, 4),
                 mindspore_imported="mindspore" in sys.modules, **priority)
    reason = serve(inbox, channel)
    logger.debug("worker exits: %s", reason)
    return 0


if __name__ == "__main__":
    sys.exit(main())
