"""Writes one rank's raw capture tree: manifest, step folders, tensors, records, markers.

Everything written here is readable after a kill at any moment: tensors go to a
temporary name and are renamed, records are whole lines (written a batch at a time; a
torn last line is detected by processing), the manifest and step markers are atomic.
Tensors, records and step markers are written by one thread beside training
(``writer_thread``), in the order they were handed over: a step's marker comes after
every file of the step, and is left out when one of them failed, so training never
waits for the disk. Steps are given as global steps; the manifest's step numbering says
which raw folder holds them (graph-mode TensorDump folders follow the graph's own step
counter).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Dict, List, Optional, TextIO, Tuple

import numpy as np

from mf_celldump.fsutil import atomic_write_json, ensure_dir, open_append, safe_join
from mf_celldump.rawformat import names
from mf_celldump.rawformat.keys import ProbeKey
from mf_celldump.rawformat.manifest import Manifest, write_manifest
from mf_celldump.rawformat.markers import write_step_done
from mf_celldump.rawformat.npy_files import NpyFileWriter, c_order_data, numpy_data, numpy_header, tensordump_header
from mf_celldump.rawformat.records import encode_record
from mf_celldump.rawformat.writer_thread import WriterThread

logger = logging.getLogger(__name__)

# Records handed to the writer thread together: one hand-over and one write per batch, not per value
# (under a busy training step each hand-over costs a wake-up of the thread and its locks). A batch
# also goes when anything else is handed over, when a step is completed and on flush, so the order
# of the writer thread's work is the order of the calls.
RECORD_BATCH = 64


class RawWriter:
    """Owns ``{dump_path}/_raw/rank{R}/`` for one attached dump."""

    background = True  # False: every write happens in the caller (for comparisons)

    def __init__(self, dump_path: str, rank: int, run_id: str):
        self.dump_path = dump_path
        self.rank = rank
        self.run_id = run_id
        ensure_dir(dump_path)
        raw_root = ensure_dir(safe_join(dump_path, names.RAW_ROOT))
        self.rank_dir = ensure_dir(safe_join(raw_root, names.rank_dir_name(rank)))
        self.manifest: Optional[Manifest] = None
        self._records: Dict[int, TextIO] = {}
        self._step_dirs: Dict[int, str] = {}
        self._lock = threading.Lock()
        self._thread = WriterThread(f"mf_celldump-writer-rank{rank}", inline=not self.background,
                                    on_process_end=self._process_ending)
        self._begun: Dict[int, None] = {}  # steps prepared, in order (for the notice at process end)
        self._marked: Dict[int, None] = {}  # steps marked complete by the thread
        self._files = NpyFileWriter()
        self._batch: List[Tuple[int, str, ProbeKey, int, dict]] = []  # records not handed over yet
        self._batch_lock = threading.Lock()  # capture ops may run on several MindSpore threads
        self._failures_seen = 0  # the thread's failure count when the last step marker was due

    # -- layout --------------------------------------------------------------------
    def write_manifest(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self._step_dirs.clear()
        write_manifest(safe_join(self.rank_dir, names.MANIFEST_FILE), manifest)

    def step_dir(self, step: int) -> str:
        """The raw folder of global step ``step``."""
        path = self._step_dirs.get(step)
        if path is None:
            folder_step = self.manifest.folder_step(step) if self.manifest is not None else step
            path = self._step_dirs[step] = safe_join(self.rank_dir, names.step_dir_name(folder_step))
        return path

    def placeholder_step_dir(self) -> str:
        """The step folder spelled with TensorDump's ``{step}`` placeholder (graph-mode paths)."""
        return os.path.join(self.rank_dir, names.TENSORDUMP_STEP_PLACEHOLDER)

    def kbk_dir(self) -> str:
        return ensure_dir(safe_join(self.rank_dir, names.KBK_DIR))

    def kbk_config_path(self) -> str:
        return safe_join(self.rank_dir, names.KBK_CONFIG_FILE)

    def write_kbk_config(self, config: dict) -> str:
        path = self.kbk_config_path()
        atomic_write_json(path, config, indent=2)
        return path

    def prepare_step(self, step: int) -> str:
        """Create the step folder; unprocessed data of an earlier run is moved aside, never deleted."""
        self._step_dirs.pop(step, None)  # checked afresh: the folder may have been replaced
        self._begun[step] = None
        path = self.step_dir(step)
        if os.path.isdir(path) and os.listdir(path):
            aside = names.set_aside_dir_name(path, f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            os.replace(path, aside)
            logger.warning("raw data of an earlier run for step %d was not processed; moved to %s "
                           "(process it with `mf-celldump process`, or delete it)", step, aside)
        return ensure_dir(path)

    def set_aside_earlier_steps(self) -> None:
        """Move every raw step folder of an earlier run aside (never deleted).

        For captures whose step folders MindSpore names by its own counter, which restarts
        at 0 in every process: a new run would otherwise write into an old run's folders.
        """
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        for entry in sorted(os.scandir(self.rank_dir), key=lambda e: e.name):
            if names.parse_step_dir_name(entry.name) is None or not entry.is_dir(follow_symlinks=False):
                continue
            aside = names.set_aside_dir_name(entry.path, stamp)
            os.replace(entry.path, aside)
            logger.warning("raw data of an earlier run was not processed; moved %s to %s (process it with "
                           "`mf-celldump process` from a copy holding its manifest, or delete it)", entry.name, aside)

    def set_aside_kbk(self) -> None:
        """Move an earlier run's unprocessed statistics dump aside: MindSpore appends to existing csv files."""
        path = os.path.join(self.rank_dir, names.KBK_DIR)
        if os.path.isdir(path) and not os.path.islink(path) and os.listdir(path):
            aside = names.set_aside_dir_name(path, f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            os.replace(path, aside)
            logger.warning("statistics of an earlier run were not processed; moved %s to %s", path, aside)

    # -- writing -------------------------------------------------------------------
    def write_tensor(self, step: int, key: ProbeKey, array: np.ndarray, dtype_name: str, seq: int) -> None:
        """Save ``array`` under its raw name, atomically, on the writer thread (the bytes of ``np.save``).

        The writer keeps ``array`` until it is saved: the caller must not change it.
        """
        path = os.path.join(self.step_dir(step), names.raw_tensor_file_name(key, dtype_name, seq))
        self._submit(lambda: self._files.write(path, [numpy_header(array), numpy_data(array)]), array.nbytes)

    def write_tensordump_files(self, step: int, files: List[Tuple[ProbeKey, np.ndarray, str, int, object]]) -> None:
        """The files ``ops.TensorDump`` writes, ``(key, array, dtype name, id, keep)`` each: under the raw name of
        ``key``, with TensorDump's header and bytes, atomically, by one job of the writer thread (one hand-over
        for a whole flush). ``keep`` (the tensor ``array`` views) lives until then."""
        folder = self.step_dir(step)
        jobs = [(os.path.join(folder, names.raw_tensor_file_name(key, dtype, seq)), array, keep)
                for key, array, dtype, seq, keep in files]

        def job():
            for path, array, _kept in jobs:
                self._files.write(path, [tensordump_header(array), c_order_data(array)])

        self._submit(job, sum(array.nbytes for _, array, _ in jobs))

    def append_record(self, step: int, key: ProbeKey, seq: int, **payload) -> None:
        """One records.jsonl line, encoded and written by the writer thread with the rest of its batch."""
        item = (step, self.step_dir(step), key, seq, payload)
        with self._batch_lock:
            self._batch.append(item)
            full = len(self._batch) >= RECORD_BATCH
        if full:
            self._hand_over_records()

    def _hand_over_records(self) -> None:
        with self._batch_lock:
            batch, self._batch = self._batch, []
        if batch:
            self._thread.submit(lambda: self._append_batch(batch))

    def _submit(self, job: Callable[[], None], nbytes: int = 0) -> None:
        """Every job but a records batch goes through here: the pending records go first, so the writer
        thread's order is the order of the calls."""
        self._hand_over_records()
        self._thread.submit(job, nbytes)

    def _append_batch(self, batch: List[Tuple[int, str, ProbeKey, int, dict]]) -> None:
        """The batch's lines, one write per step; a record that cannot be encoded costs only itself (its error
        is raised after the others are written, so the step is not marked complete)."""
        per_step: Dict[int, Tuple[str, List[str]]] = {}
        error: Optional[Exception] = None
        for step, folder, key, seq, payload in batch:
            try:
                line = encode_record(key, seq, **payload)
            except (TypeError, ValueError) as err:
                error = error or err
                continue
            per_step.setdefault(step, (folder, []))[1].append(line)
        for step, (folder, lines) in per_step.items():
            self._append_line(step, folder, "".join(lines))
        if error is not None:
            raise error

    def _append_line(self, step: int, folder: str, line: str) -> None:
        with self._lock:
            handle = self._records.get(step)
            if handle is None:
                handle = open_append(safe_join(folder, names.RECORDS_FILE))
                self._records[step] = handle
            handle.write(line)

    def flush(self) -> None:
        """Wait until everything handed over is written; raises the first write failure since the last call."""
        self._hand_over_records()
        self._thread.drain()

    def complete_step(self, step: int, extra: Optional[dict] = None) -> None:
        """Close the step's record file and mark the step complete once everything handed over is written.

        Returns at once: the writer thread does it after the step's last file. If a write of
        the step failed, the step is not marked (its raw data stays for ``mf-celldump process``,
        which reports it) and the failure is raised by the next ``flush``.
        """
        path = self.step_dir(step)
        self._submit(lambda: self._mark_complete(step, path, extra))

    def _mark_complete(self, step: int, path: str, extra: Optional[dict]) -> None:
        with self._lock:
            handle = self._records.pop(step, None)
        if handle is not None:
            handle.close()
        failures, self._failures_seen = self._thread.failures - self._failures_seen, self._thread.failures
        if failures:
            logger.error("raw data of step %d is not marked complete: %d write(s) failed (see above); it stays in "
                         "%s", step, failures, path)
            return
        if os.path.isdir(path):
            fields = {"task": self.manifest.task} if self.manifest is not None else {}
            fields.update(extra or {})
            write_step_done(safe_join(path, names.STEP_DONE_FILE), step, self.run_id, fields)
            self._marked[step] = None

    def _process_ending(self) -> None:
        """On the writer thread, once everything handed over is written and the main thread has stopped
        with this writer still open (training raised, or the dump was never detached): the records of the
        unfinished step still pending are written too (it stays unmarked), then one line says what is on
        disk and what to run."""
        with self._batch_lock:
            batch, self._batch = self._batch, []
        if batch:
            self._append_batch(batch)
        with self._lock:
            handles, self._records = list(self._records.values()), {}
        for handle in handles:
            handle.close()
        unfinished = [s for s in self._begun if s not in self._marked]
        marked = list(self._marked)
        logger.warning(
            "mf_celldump: the process is ending with capture still attached (training raised, or the trainer "
            "never ended the run): raw data of step(s) %s written whole, %s; run `mf-celldump process %s` to "
            "write msprobe's layout", _steps_text(marked),
            f"step(s) {_steps_text(unfinished)} did not finish (processed, it is named incomplete)"
            if unfinished else "no step left unfinished", self.dump_path)

    def close(self) -> None:
        self._hand_over_records()
        self._thread.stop()
        with self._lock:
            handles, self._records = list(self._records.values()), {}
        for handle in handles:
            handle.close()


def _steps_text(steps: List[int]) -> str:
    """``0,1,2``; a long list as its first and last steps and its length (one log line)."""
    if not steps:
        return "none"
    if len(steps) > 8:
        return f"{','.join(str(s) for s in steps[:4])},...,{steps[-1]} ({len(steps)} steps)"
    return ",".join(str(s) for s in steps)
