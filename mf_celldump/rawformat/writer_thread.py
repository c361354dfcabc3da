"""One thread beside training that does a raw writer's file work, in submission order.

Capture ops hand over (path, array) or (key, array) and return at once; saving, renaming,
statistics of host arrays and step markers run here, in the order handed over.
``failures`` counts failed jobs (a step marker is left out when one of its step's files
failed); ``drain`` waits for everything handed over so far and raises the first failure
since the last drain. Held arrays are bounded: a producer waits while more than
``limit_bytes`` are queued.

The thread is not a daemon: a process whose training raised (or that never detached) still
writes everything handed over before it ends. CPython's shutdown marks the main thread
stopped, then joins the threads that are not daemons, and only then runs ``atexit`` handlers
(MindSpore's teardown among them). A daemon writer was cut off mid-file there (``[Errno 14]
Bad address``: the step it was writing had ended, but its marker never came). So the thread
polls: once the main thread has stopped and the queue is empty, it calls ``on_process_end``
(the owner logs what is on disk and what to run) and returns, letting the process end.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Optional

logger = logging.getLogger(__name__)

EXIT_POLL_S = 0.25  # how often an idle thread looks whether the main thread has stopped


class WriterThread:
    """A FIFO of jobs for one daemon thread, started on the first job."""

    def __init__(self, name: str, limit_bytes: int = 256 * 1024 * 1024, inline: bool = False,
                 on_process_end: Optional[Callable[[], None]] = None):
        self.name = name
        self.on_process_end = on_process_end  # run on the thread when the process ends with it still open
        self.limit_bytes = limit_bytes
        self.inline = inline  # run every job in the caller (no thread)
        self._jobs: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._held = 0
        self._error: Optional[BaseException] = None
        self.failures = 0  # jobs that raised, ever (a step marker job compares it with its last look)
        self._thread: Optional[threading.Thread] = None

    def submit(self, job: Callable[[], None], nbytes: int = 0) -> None:
        """Run ``job`` on the thread after every job submitted before it."""
        if self.inline or (self._thread is not None and threading.get_ident() == self._thread.ident):
            job()  # a job handing over more work: run it in place (waiting here would wait for itself)
            return
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=False)
                self._thread.start()
            while self._held > self.limit_bytes:
                self._cond.wait()
            self._held += nbytes
        self._jobs.put((job, nbytes))

    def _run(self) -> None:
        while True:
            try:
                item = self._jobs.get(timeout=EXIT_POLL_S)
            except queue.Empty:
                if threading.main_thread().is_alive():
                    continue
                self._process_ending()
                return
            try:
                if item is None:
                    return
                job, nbytes = item
                try:
                    job()
                except BaseException as err:  # kept for drain(); the thread goes on with the next job
                    with self._cond:
                        self.failures += 1
                        if self._error is None:
                            self._error = err
                            logger.error("raw capture writer failed: %s", err)
                finally:
                    with self._cond:
                        self._held -= nbytes
                        self._cond.notify_all()
            finally:
                self._jobs.task_done()

    def _process_ending(self) -> None:
        """Every job handed over has run and the main thread has stopped: the process is ending."""
        with self._cond:
            self._thread = None  # a job submitted after this (by another thread) starts a new one
        if self.on_process_end is not None:
            try:
                self.on_process_end()
            except Exception as err:  # noqa: BLE001  -- the process is ending: log, never hang it
                logger.error("raw capture writer: finishing at process end failed: %s", err)

    def drain(self) -> None:
        """Wait until every submitted job has run; raise the first failure since the last drain."""
        if self._thread is None:
            return
        self._jobs.join()
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def stop(self) -> None:
        """Finish the queued jobs and end the thread (failures are logged, not raised)."""
        if self._thread is None:
            return
        self._jobs.put(None)
        self._thread.join()
        self._thread = None
        with self._cond:
            self._error = None
