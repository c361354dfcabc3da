"""Worker processes that pair ranges of a unit's entries, so a large comparison uses every core.

Pairing an entry is reading its tensor files and computing the pair numbers: independent
from entry to entry once the unit's entries are in the store (each entry's depth, the one
thing carried along the execution order, is stored with it). The main process splits a
unit into ranges of positions; each worker opens the store's entries read-only, pairs its range with
its own :class:`pairing.UnitPairer` and sends the rows back as tuples; the main process
writes them in order. At most two ranges per worker are in flight, so memory stays bounded
whatever the dump size.

A pool costs a few tenths of a second to start (each worker imports numpy and this
package), so it starts only for a unit whose pairing is estimated to take longer than
that several times over (:meth:`Workers.worth`), and once started serves every later unit.
Workers are started by ``forkserver`` where the platform has it (a fork from a clean
server process, never from this one, which may run threads), else by ``spawn``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Deque, Iterable, Iterator, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

# Pairing cost in one process, measured on this project's 2-core CI machine: about 0.2-0.25 ms per pair
# of small tensors (bench/bench_compare.py's 64x64), plus about 25 ns per element of a pair for reading
# both files and the metrics (a pair of 2048x2048 float32: 0.1 s).
SECONDS_PER_PAIR = 2.5e-4
SECONDS_PER_ELEMENT = 2.5e-8
# A pool starts for a unit estimated to take at least this long on one core (starting costs ~0.3 s).
WORTH_SECONDS = 1.5
IN_FLIGHT_PER_WORKER = 2
MAX_DEFAULT_JOBS = 8


def default_jobs() -> int:
    """The CPUs this process may run on, at most ``MAX_DEFAULT_JOBS``."""
    try:
        available = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        available = os.cpu_count() or 1
    return max(1, min(available, MAX_DEFAULT_JOBS))


def estimated_seconds(tensors: int, elements: int) -> float:
    """How long pairing ``tensors`` tensors of ``elements`` elements in all takes on one core."""
    return tensors * SECONDS_PER_PAIR + elements * SECONDS_PER_ELEMENT


class Workers:
    """A pool of pairing processes, started on first use and shut down by :meth:`close` (or ``with``)."""

    def __init__(self, jobs: Optional[int] = None, preload: Sequence[str] = ()):
        """``jobs``: None, as many workers as :func:`default_jobs` for a unit worth it (:meth:`worth`); a number,
        that many for every unit (1: none). ``preload``: modules the workers import before their first task
        (those of the functions they run)."""
        if jobs is not None and jobs < 1:
            raise ValueError(f"jobs must be 1 or more, not {jobs}")
        self.jobs, self.always, self.preload = jobs or default_jobs(), jobs is not None, list(preload)
        self._pool: Optional[ProcessPoolExecutor] = None
        self._starting: Optional[threading.Thread] = None

    def worth(self, tensors: int, elements: int) -> bool:
        """Whether a unit of this size is paired in the workers: always when a number of jobs was given or
        once they run, never with one job, else when the unit would take ``WORTH_SECONDS`` in this process."""
        if self.jobs == 1:
            return False
        started = self._pool is not None or self._starting is not None
        return started or self.always or estimated_seconds(tensors, elements) >= WORTH_SECONDS

    def prepare(self, tensors: int, elements: int) -> None:
        """Start the workers if a unit of this size will be paired in them, from a thread, so that they start
        while this process goes on (loading the target's entries): starting waits for the fork server to
        import the preloaded modules."""
        if self.worth(tensors, elements) and self._pool is None and self._starting is None:
            self._starting = threading.Thread(target=self._start, name="mf_celldump-workers", daemon=True)
            self._starting.start()

    def submit(self, function: Callable[..., Any], *args: Any) -> Optional[Future]:
        """``function(*args)`` in a worker, when they run (None when not: the caller runs it itself)."""
        self._started()
        return self._pool.submit(function, *args) if self._pool is not None else None

    def _started(self) -> None:
        if self._starting is not None:
            self._starting.join()
            self._starting = None

    def map(self, function: Callable[..., Any], task: Any, ranges: Iterable[Tuple[int, int]]) -> Iterator[Any]:
        """``function(task, start, stop)`` for each range, results in the ranges' order: in the workers, or
        here from the first range whose worker died (a process that could not start, a worker killed for
        memory: a warning says so and later units stay here too)."""
        self._started()
        self._start()
        pending: Deque[Tuple[Tuple[int, int], Optional[Future]]] = deque()
        for bounds in ranges:
            pending.append((bounds, self._pool.submit(function, task, *bounds) if self._pool else None))
            if len(pending) >= self.jobs * IN_FLIGHT_PER_WORKER:
                yield self._result(function, task, *pending.popleft())
        while pending:
            yield self._result(function, task, *pending.popleft())

    def _result(self, function, task, bounds: Tuple[int, int], future: Optional[Future]) -> Any:
        if future is not None and self._pool is not None:
            try:
                return future.result()
            except BrokenProcessPool as err:
                logger.warning("the worker processes stopped (%s); pairing goes on in this process", err)
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool, self.jobs = None, 1
        return function(task, *bounds)

    def _start(self) -> None:
        if self._pool is None and self.jobs > 1:
            methods = multiprocessing.get_all_start_methods()
            context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
            if context.get_start_method() == "forkserver" and self.preload:
                # the server imports them once and each worker forks with them imported (like any
                # multiprocessing child, a worker still imports the caller's main module: the CLI's is guarded)
                context.set_forkserver_preload(self.preload)
            logger.info("pairing in %d worker processes (%s)", self.jobs, context.get_start_method())
            pool = ProcessPoolExecutor(self.jobs, mp_context=context)
            try:
                for _ in range(self.jobs):  # a process starts for each (the pool starts them one task at a time)
                    pool.submit(_ready)
            except (OSError, RuntimeError) as err:
                logger.warning("worker processes could not start (%s); pairing in this process", err)
                pool.shutdown(wait=False, cancel_futures=True)
                self.jobs = 1
                return
            self._pool = pool

    def close(self) -> None:
        self._started()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _ready() -> None:
    """A task that does nothing: submitted once per worker so that every worker process starts."""


def ranges(total: int, size: int) -> Iterator[Tuple[int, int]]:
    """[start, stop) ranges of ``size`` positions covering 0 to ``total``."""
    for start in range(0, total, size):
        yield start, min(start + size, total)
