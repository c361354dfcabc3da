"""The per-file work (statistics, value extraction, linking into the output) and its distribution.

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
from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

from mf_celldump import naming
from mf_celldump.fsutil import link_or_copy
from mf_celldump.processing.errors import NpyReadError
from mf_celldump.processing.npystats import file_statistics, load_small

logger = logging.getLogger(__name__)

# Below this many files per worker a pool costs more than it saves (measured: bench/README.md).
MIN_FILES_PER_WORKER = 1000
CHUNK_FILES = 256
WATCHDOG_INTERVAL_S = 0.5

OK = "ok"
FAILED = "failed"


class FileTask(NamedTuple):
    """One raw file: its name in the step folder, its output name (or None), what it holds."""

    index: int
    name: str
    out_name: Optional[str]
    vkind: str


@dataclass(frozen=True)
class Folders:
    """Where a chunk's files are read from and linked to (sent once per chunk, not per file)."""

    src: str
    dst: Optional[str]


# (index, status, dtype or message, shape, stats or value)
FileResult = Tuple[int, str, str, Optional[Tuple[int, ...]], object]


def _scalar(array, vkind: str):
    if array.size != 1:
        raise NpyReadError(f"expected a single value for a non-tensor capture, got shape {array.shape}")
    item = array.reshape(()).item()
    if vkind == naming.VKIND_INT:
        return int(item)
    if vkind == naming.VKIND_FLOAT:
        return float(item)
    if vkind == naming.VKIND_BOOL:
        return bool(item)
    return None


def run_one(task: FileTask, wanted: Tuple[str, ...], folders: Folders) -> FileResult:
    """Process one file; any failure becomes a FAILED result naming the file, never an exception."""
    src = os.path.join(folders.src, task.name)
    try:
        if task.vkind == naming.VKIND_TENSOR:
            dtype, shape, stats = file_statistics(src, wanted)
            if task.out_name is not None and folders.dst is not None:
                link_or_copy(src, os.path.join(folders.dst, task.out_name))
            return (task.index, OK, dtype, shape, stats)
        if task.vkind == naming.VKIND_NONE:
            return (task.index, OK, "", None, None)
        array = load_small(src)
        return (task.index, OK, array.dtype.name, tuple(array.shape), _scalar(array, task.vkind))
    except (NpyReadError, OSError, ValueError) as err:
        text = str(err)
        if src not in text:
            text = f"{src}: {text}"
        return (task.index, FAILED, text, None, None)


def run_chunk(tasks: Sequence[FileTask], wanted: Tuple[str, ...], folders: Folders) -> List[FileResult]:
    return [run_one(task, wanted, folders) for task in tasks]


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

    def run(
        self,
        tasks: Sequence[FileTask],
        wanted: Tuple[str, ...],
        folders: Folders,
        on_result: Callable[[FileResult], None],
    ) -> None:
        """Call ``on_result`` in this process for every task, in completion order."""
        if self.jobs <= 1 or len(tasks) < MIN_FILES_PER_WORKER * 2 or not can_fork_workers():
            for task in tasks:
                on_result(run_one(task, wanted, folders))
            return
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


# Modules whose runtime threads make forking this process unsafe.
_THREADED_RUNTIMES = ("mindspore", "torch", "torch_npu")


def can_fork_workers() -> bool:
    """Whether a worker pool may be forked from this process.

    Forking a process that runs MindSpore's runtime threads (processing at the end of
    training) can deadlock the child, and a fresh interpreter (spawn) would re-import the
    training script, so such a process does the work itself; the offline command forks.
    """
    if "fork" not in multiprocessing.get_all_start_methods():
        return False
    return not any(name in sys.modules for name in _THREADED_RUNTIMES)


def default_jobs(jobs: Optional[int]) -> int:
    if jobs is not None:
        if jobs < 1:
            raise ValueError(f"jobs must be a positive number of processes, got {jobs}")
        return jobs
    return os.cpu_count() or 1
