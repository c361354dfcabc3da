"""Runs file tasks in this process or spread over worker processes.

Per-file results are small tuples, so spreading files over processes costs little; a
pool is started only when a step has enough files to pay for the workers' start-up.
Workers are forked, and only from a process without a framework runtime (the offline
command); inside a training process the work is done in that process. Workers end by
themselves if the run is killed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Executor, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

from mf_celldump.processing.file_tasks import FileResult, FileTask, Folders, run_chunk, run_one

logger = logging.getLogger(__name__)

# Below this many files per worker a pool costs more than it saves (measured: bench/README.md).
MIN_FILES_PER_WORKER = 1000
CHUNK_FILES = 256
WATCHDOG_INTERVAL_S = 0.5
# Modules whose runtime threads make forking this process unsafe.
_THREADED_RUNTIMES = ("mindspore", "torch", "torch_npu")


def _exit_with_parent(parent_pid: int) -> None:
    """Worker initializer: a watchdog thread ends this worker once the processing process is gone.

    A processing run killed with SIGKILL cannot stop its pool; without this its workers
    would wait for work forever. A worker is re-parented the moment its parent exits.
    """

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(WATCHDOG_INTERVAL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def can_fork_workers() -> bool:
    """Whether a worker pool may be forked from this process.

    Forking a process that runs MindSpore's runtime threads can deadlock the child, and a
    fresh interpreter (spawn) would re-import the training script, so such a process does
    the work itself; the offline command forks.
    """
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    return not any(name in sys.modules for name in _THREADED_RUNTIMES)


@dataclass
class FileRunner:
    """Runs file tasks in this process or in a lazily started pool of ``jobs`` processes."""

    jobs: int
    _pool: Optional[Executor] = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _get_pool(self) -> Executor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.jobs,
                mp_context=multiprocessing.get_context("fork"),
                initializer=_exit_with_parent,
                initargs=(os.getpid(),),
            )
            logger.debug("started %d worker processes", self.jobs)
        return self._pool

    def run(self, tasks: Sequence[FileTask], wanted: Tuple[str, ...], folders: Folders,
            on_result: Callable[[FileResult], None]) -> None:
        """Call ``on_result`` in this process for every task, in completion order."""
        if self.jobs <= 1 or len(tasks) < MIN_FILES_PER_WORKER * 2 or not can_fork_workers():
            for task in tasks:
                on_result(run_one(task, wanted, folders))
            return
        self._run_pooled(tasks, wanted, folders, on_result)

    def _run_pooled(self, tasks, wanted, folders, on_result) -> None:
        pool = self._get_pool()
        size = max(16, min(CHUNK_FILES, len(tasks) // (self.jobs * 4) or 1))
        chunks = [tasks[i : i + size] for i in range(0, len(tasks), size)]
        limit = self.jobs * 3  # chunks in flight: bounds memory of pending results
        pending = set()
        position = 0
        try:
            while position < len(chunks) or pending:
                while position < len(chunks) and len(pending) < limit:
                    pending.add(pool.submit(run_chunk, chunks[position], wanted, folders))
                    position += 1
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    for result in future.result():
                        on_result(result)
        except BaseException:
            for future in pending:
                future.cancel()
            raise
