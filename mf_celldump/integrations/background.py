"""Processing beside training: one worker process per run, fed step by step.

The training thread only calls ``submit(steps)``: the first call starts the worker, every
call writes one short line to the worker's stdin pipe (non-blocking) and returns. The
worker (``python -m mf_celldump.processing.worker``) processes each step while training
goes on. At the end of training ``finish(timeout)`` waits for it with a progress bar,
then reports. A worker that dies or hangs costs no data: raw steps are only removed
after their output is in place, so whatever it did not finish stays complete on disk for
``mf-celldump process``, and training never waits for it or fails because of it.

Why ``subprocess.Popen([sys.executable, "-m", worker])`` and not ``multiprocessing``:
a worker must be spawned, never forked from the training process (which holds MindSpore threads).
Popen of a fresh interpreter *is* a spawned process (fork+exec through vfork: nothing of
the training process is inherited but the environment and the three standard streams).
multiprocessing's own "spawn" start method re-imports the parent's ``__main__`` in the
child (CPython 3.11 ``multiprocessing/spawn.py`` ``get_preparation_data`` ->
``_fixup_main_from_path``), i.e. the training script with MindSpore and MindFormers:
measured 4.0 s and 515 MB until ready, against 0.3-0.5 s and 45 MB without MindSpore for
``python -m`` (measured on CPU with MindSpore 2.9, see bench/README.md).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

from tqdm import tqdm

from mf_celldump.integrations.step_processor import (
    ProcessingResult,
    StepProcessor,
    SummaryListener,
    finish_command,
    run_inline,
)
from mf_celldump.processing import worker as protocol
from mf_celldump.processing.observer import LOG_INTERVAL_S

logger = logging.getLogger(__name__)

# Worker processes of process_dump inside the worker, unless the configuration sets
# ``jobs``. The worker shares the node with training: every rank has its own worker (8 on
# an 8-card node) and training's host threads (data pipeline, kernel launch) need the
# cores. One process per rank keeps processing beside training, not on top of it; a pool
# would only pay from 1000 files per pool process anyway (bench/README.md, "Processing"),
# and a few large tensors per step are read as a stream, not in parallel.
DEFAULT_WORKER_JOBS = 1
POLL_S = 0.5  # how often the wait at train end refreshes its progress
EXIT_GRACE_S = 10.0  # after "stop" with nothing pending, the worker exits by itself within this
READER_JOIN_S = 5.0
_EOF = {"event": "eof"}


def worker_command(log_level: str) -> List[str]:
    return [sys.executable, "-m", protocol.MODULE, "--parent-pid", str(os.getpid()), "--log-level", log_level]


def worker_env() -> Dict[str, str]:
    """The training environment, plus the folder this package was imported from.

    A source checkout found through ``sys.path`` tweaks in the training script would be
    invisible to a fresh interpreter. A site-packages folder is never added: it is on
    the worker's path already, and putting it on PYTHONPATH would place it before the
    standard library.
    """
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(protocol.__file__))))
    if os.path.basename(root) not in ("site-packages", "dist-packages"):
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if root not in parts:
            env["PYTHONPATH"] = os.pathsep.join(parts + [root])
    return env


def exit_status(returncode: Optional[int]) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class WorkerProcess:
    """The worker's process and pipes: requests out (never blocking), replies in (on a thread)."""

    def __init__(self, popen: subprocess.Popen, on_summary: Optional[SummaryListener] = None):
        self.proc = popen
        self.on_summary = on_summary
        self.pid = popen.pid
        self.events: queue.Queue = queue.Queue()
        self.progress: Optional[dict] = None  # the latest progress reply; older ones do not matter
        self._input_open = True
        self._replies_ended = False
        os.set_blocking(popen.stdin.fileno(), False)
        self._reader = threading.Thread(target=self._read, name=f"mf_celldump-worker-{self.pid}", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, cwd: Optional[str], on_summary: Optional[SummaryListener] = None) -> WorkerProcess:
        level = logging.getLogger("mf_celldump").getEffectiveLevel()
        popen = subprocess.Popen(worker_command(str(level)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=None, cwd=cwd, env=worker_env(), close_fds=True)
        return cls(popen, on_summary)

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    logger.debug("worker %d: unreadable reply %r", self.pid, line[:200])
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("event") == "progress":
                    self.progress = event
                else:
                    self._hand_over_summaries(event)
                    self.events.put(event)
        except (OSError, ValueError) as err:  # the pipe was closed under us
            logger.debug("worker %d: reply pipe closed: %s", self.pid, err)
        finally:
            self.events.put(_EOF)

    def _hand_over_summaries(self, event: dict) -> None:
        """A result's step summaries go to ``on_summary`` now, while training goes on (this thread)."""
        summaries = event.pop("summaries", None)
        if not summaries or self.on_summary is None:
            return
        for summary in summaries:
            try:
                self.on_summary(summary)
            except Exception as err:  # noqa: BLE001  -- the reply thread must go on
                logger.warning("mf_celldump: a step summary could not be handed over: %s", err)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, line: bytes) -> bool:
        """Write one request without blocking; False when the worker cannot take it."""
        if not self._input_open:
            return False
        try:
            written = os.write(self.proc.stdin.fileno(), line)
        except (BlockingIOError, OSError):  # pipe full (worker stopped) or closed (worker dead)
            return False
        if written != len(line):  # only possible for lines longer than PIPE_BUF: the stream is broken
            self.close_input(stop=False)
            return False
        return True

    def close_input(self, stop: bool = True) -> None:
        """Send ``stop`` (finish what was sent, then exit) and close the pipe."""
        if not self._input_open:
            return
        if stop:  # non-blocking too: a worker that stopped reading (SIGSTOP) must not hang training's end
            self.send(protocol.STOP_LINE)
        self._input_open = False
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def next_event(self, timeout: float) -> Optional[dict]:
        """The next reply, None if there is none within ``timeout``, ``_EOF`` (again and again) once
        the worker's output has ended."""
        if self._replies_ended:
            timeout = 0.0
        try:
            event = self.events.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return _EOF if self._replies_ended else None
        if event is _EOF:
            self._replies_ended = True
        return event

    def terminate(self) -> None:
        """Stop the worker now. SIGKILL: processing is safe to interrupt anywhere, the worker has
        nothing to clean up, and a stopped (SIGSTOP) worker would hold a SIGTERM pending."""
        self.close_input(stop=False)
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def close(self, grace: float) -> None:
        """Let the worker exit (terminating it after ``grace`` seconds), then close the pipes."""
        self.close_input(stop=False)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.terminate()
        self._reader.join(READER_JOIN_S)  # the process is gone: its end of the pipe is closed
        if not self._reader.is_alive():
            self.proc.stdout.close()


class WaitProgress:
    """The wait at train end: a tqdm bar on a terminal, and a log line every LOG_INTERVAL_S in any case."""

    def __init__(self, total_steps: int, timeout: float):
        self.total = total_steps
        self.timeout = timeout
        self.done = 0
        self._start = self._logged = time.monotonic()
        self._bar = tqdm(total=total_steps, unit="step", desc="mf_celldump: processing", leave=False,
                         disable=not sys.stderr.isatty())

    def show(self, done_steps: int, progress: Optional[dict]) -> None:
        if done_steps > self.done:
            self._bar.update(done_steps - self.done)
            self.done = done_steps
        files = ""
        if progress and progress.get("files_total"):
            files = f"{progress.get('files_done')}/{progress.get('files_total')} files of the current request"
            self._bar.set_postfix_str(files, refresh=False)
        now = time.monotonic()
        if now - self._logged >= LOG_INTERVAL_S:
            self._logged = now
            logger.info("mf_celldump: waiting for background processing: %d of %d step(s) done%s; %.0f of %.0f s "
                        "(process_timeout) used", self.done, self.total, f", {files}" if files else "",
                        now - self._start, self.timeout)

    def close(self) -> None:
        self._bar.close()


class BackgroundProcessor(StepProcessor):
    """Steps are processed by one worker process, started at the first submitted step.

    ``submit`` only puts the steps in a queue. A sender thread, started by ``prepare``
    before training (starting a thread waits until it runs: milliseconds on a loaded
    machine), owns the worker's start (a fork+exec measured at 1-140 ms on a loaded
    machine) and the pipe writes, so the training thread never waits for either;
    ``finish`` stops that thread first and then owns everything.
    """

    def __init__(self, dump_path: str, rank: int, jobs: Optional[int], on_summary: Optional[SummaryListener] = None):
        super().__init__(dump_path, rank, jobs, on_summary)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sender: Optional[threading.Thread] = None
        self._worker: Optional[WorkerProcess] = None
        self._start_error: Optional[str] = None
        self._next_id = 0
        self._pending: Dict[int, List[int]] = {}  # request id -> steps, sent and not answered
        self._unsent: List[int] = []  # steps the worker never received (it could not start, or was gone)
        self._ready: Optional[dict] = None
        self._result = ProcessingResult(info={"where": "background worker", "mindspore_imported": False,
                                              "requests": 0, "worker_seconds": 0.0})

    @property
    def pid(self) -> Optional[int]:
        return self._worker.pid if self._worker is not None else None

    def prepare(self) -> None:
        if self._sender is None:
            self._sender = threading.Thread(target=self._send_loop, name="mf_celldump-processing-sender",
                                            daemon=True)
            self._sender.start()

    # -- the training thread ------------------------------------------------------------
    def submit(self, steps: Sequence[int], wait_s: float = 0.0) -> None:
        self._outbox.put((list(steps), wait_s))
        if self._sender is None:  # not prepared before training
            self.prepare()

    # -- the sender thread --------------------------------------------------------------
    def _send_loop(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            steps, wait_s = item
            try:
                self._send(steps, wait_s)
            except Exception as err:  # noqa: BLE001  -- a bug here must not kill the thread silently
                logger.exception("mf_celldump: could not hand steps %s to the processing worker: %s", steps, err)
                self._unsent.extend(steps)

    def _send(self, steps: List[int], wait_s: float = 0.0) -> None:
        if self._worker is None and self._start_error is None:
            self._start()
        if self._worker is None:
            self._unsent.extend(steps)
            return
        request = protocol.Request(self._next_id, self.dump_path, self.rank, steps, self.jobs or DEFAULT_WORKER_JOBS,
                                   wait_s, summarize=self.on_summary is not None)
        if self._worker.alive() and self._worker.send(request.to_line()):
            self._pending[request.id] = steps
            self._next_id += 1
            return
        if not self._unsent:  # warn once: training goes on, the steps stay raw
            logger.warning("mf_celldump: the processing worker (pid %d) cannot take step(s) %s (%s); training goes "
                           "on and their raw data stays complete for `mf-celldump process`", self._worker.pid,
                           steps, exit_status(self._worker.proc.poll()))
        self._unsent.extend(steps)

    def _start(self) -> None:
        started = time.perf_counter()
        try:
            self._worker = WorkerProcess.start(cwd=self.dump_path if os.path.isdir(self.dump_path) else None,
                                               on_summary=self.on_summary)
        except OSError as err:  # no interpreter to run, no process allowed, ...
            self._start_error = f"{type(err).__name__}: {err}"
            logger.warning("mf_celldump: the processing worker could not be started (%s); captured steps will be "
                           "processed in the training process at the end of training", self._start_error)
            return
        self._result.info.update(pid=self._worker.pid, start_call_s=round(time.perf_counter() - started, 4))
        logger.info("mf_celldump: processing worker started (pid %d): captured steps are processed beside training",
                    self._worker.pid)

    def _stop_sender(self) -> None:
        if self._sender is not None:
            self._outbox.put(None)
            self._sender.join()
            self._sender = None

    # -- end of training ----------------------------------------------------------------
    def finish(self, timeout: float) -> ProcessingResult:
        self._stop_sender()  # every submitted step is now sent, or in _unsent
        worker, self._worker = self._worker, None
        if worker is None:
            if not self._unsent:  # nothing was ever submitted
                return ProcessingResult()
            self._process_here(self._unsent, f"the worker could not be started: {self._start_error}")
            self._describe(None, "not started")
            return self._result
        try:
            worker.close_input(stop=True)
            outcome = self._collect(worker, timeout)
        except BaseException:  # e.g. Ctrl-C during the wait: stop the worker, the raw data stays
            worker.terminate()
            worker.close(0)
            raise
        if outcome == "timeout":
            worker.terminate()
        worker.close(EXIT_GRACE_S)
        self._drain(worker)
        self._report_unfinished(worker, outcome, timeout)
        self._describe(worker, outcome)
        return self._result

    def _collect(self, worker: WorkerProcess, timeout: float) -> str:
        """Handle replies until every request is answered ("done"), the worker is gone ("exited")
        or ``timeout`` seconds passed ("timeout")."""
        deadline = time.monotonic() + timeout
        self._drain(worker)
        total = sum(len(steps) for steps in self._pending.values())
        if not self._pending:
            return "done"
        logger.info("mf_celldump: waiting up to %.0f s (process_timeout) for %d step(s) still being processed by "
                    "the worker (pid %d)", timeout, total, worker.pid)
        progress = WaitProgress(total, timeout)
        try:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                event = worker.next_event(min(left, POLL_S))
                if event is _EOF:
                    return "exited"
                if event is not None:
                    self._on_event(event)
                progress.show(total - sum(len(steps) for steps in self._pending.values()), worker.progress)
            return "done"
        finally:
            progress.close()

    def _drain(self, worker: WorkerProcess) -> None:
        """Handle the replies that are already there."""
        while True:
            event = worker.next_event(0)
            if event is None or event is _EOF:
                return
            self._on_event(event)

    def _on_event(self, event: dict) -> None:
        kind, info = event.get("event"), self._result.info
        if kind == "ready":
            self._ready = event
            info.update(startup_s=event.get("startup_s"), policy=event.get("policy"), nice=event.get("nice"))
            info["mindspore_imported"] = info["mindspore_imported"] or bool(event.get("mindspore_imported"))
        elif kind == "result":
            self._pending.pop(event.get("id"), None)
            self._result.reports.append(protocol.report_from_json(event.get("report") or {}))
            info["requests"] += 1
            info["worker_seconds"] = round(info["worker_seconds"] + float(event.get("seconds") or 0), 4)
            info["worker_cpu_seconds"] = round(info.get("worker_cpu_seconds", 0.0) + float(event.get("cpu_s") or 0), 4)
            info["mindspore_imported"] = info["mindspore_imported"] or bool(event.get("mindspore_imported"))
        elif kind == "error":
            steps = self._pending.pop(event.get("id"), None) or event.get("steps") or []
            self._result.problems.append(
                f"processing of steps {steps} failed in the worker: {event.get('error')}; their raw data is kept: "
                f"{finish_command(self.dump_path, steps, self.rank)} retries")
        elif kind == "bad_request":
            self._result.problems.append(f"the worker refused request line {event.get('line')}: {event.get('error')}")
        elif kind == "exit":
            info["exit_reason"] = event.get("reason")

    def _report_unfinished(self, worker: WorkerProcess, outcome: str, timeout: float) -> None:
        steps = sorted({s for steps in self._pending.values() for s in steps} | set(self._unsent))
        self._pending.clear()
        self._unsent = []
        if not steps:
            return
        status = exit_status(worker.proc.returncode)
        if self._ready is None and outcome == "exited" and (worker.proc.returncode or 0) > 0:
            # The interpreter failed on its own before serving (e.g. an import error): an
            # environment problem, not the data. A signal (OOM killer, operator) is a crash.
            self._process_here(steps, f"the worker failed to start ({status}; its error is in the log above)")
            return
        command = finish_command(self.dump_path, steps, self.rank)
        if outcome == "timeout":
            self._result.problems.append(
                f"processing did not finish within process_timeout={timeout:g} s: step(s) {steps} are not processed. "
                f"The worker (pid {worker.pid}) was stopped; their raw data is intact: {command} finishes them")
        else:
            self._result.problems.append(
                f"the processing worker (pid {worker.pid}) ended unexpectedly ({status}): step(s) {steps} are not "
                f"processed. Training was not affected and their raw data is intact: {command} finishes them")

    def _process_here(self, steps: Sequence[int], why: str) -> None:
        logger.warning("mf_celldump: %s; processing step(s) %s in the training process now", why, list(steps))
        self._result.notes.append(f"{why}: step(s) {list(steps)} were processed in the training process at the end "
                                  "of training")
        run_inline(self.dump_path, self.rank, self.jobs, steps, self._result, on_summary=self.on_summary)

    def _describe(self, worker: Optional[WorkerProcess], outcome: str) -> None:
        info = self._result.info
        if worker is None:
            info["text"] = "no worker was started" + (f" ({self._start_error})" if self._start_error else "")
            return
        info.update(outcome=outcome, exit=exit_status(worker.proc.returncode))
        ready = (f"ready after {info.get('startup_s')} s of imports, {info.get('policy')}, nice {info.get('nice')}, "
                 "MindSpore "
                 f"{'imported' if info['mindspore_imported'] else 'not imported'}") if self._ready else "never ready"
        info["text"] = (f"background worker pid {worker.pid} (python -m {protocol.MODULE}; {ready}); "
                        f"{info['requests']} request(s) answered, {info['worker_seconds']} s of processing "
                        f"({info.get('worker_cpu_seconds', 0.0)} s CPU); "
                        f"{outcome}, {info['exit']}")
