"""Writes one rank's raw capture tree (docs/raw-format.md): manifest, step folders, records.

Everything written here is readable after a kill at any moment: tensors go to a
temporary name and are renamed, records are whole lines flushed one at a time (a torn
last line is detected by processing), the manifest and step markers are atomic.
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import time
from typing import Dict, Optional, TextIO

import numpy as np

from mf_celldump import naming
from mf_celldump.fsutil import atomic_write_bytes, atomic_write_json, ensure_dir, open_append, safe_join

logger = logging.getLogger(__name__)


class RawWriter:
    """Owns ``{dump_path}/_raw/rank{R}/`` for one attached dump."""

    def __init__(self, dump_path: str, rank: int, run_id: str):
        self.dump_path = dump_path
        self.rank = rank
        self.run_id = run_id
        ensure_dir(dump_path)
        raw_root = ensure_dir(safe_join(dump_path, naming.RAW_ROOT))
        self.rank_dir = ensure_dir(safe_join(raw_root, naming.raw_rank_dir_name(rank)))
        self._records: Dict[int, TextIO] = {}
        self._step_dirs: Dict[int, str] = {}
        self._lock = threading.Lock()

    # -- layout --------------------------------------------------------------------
    def step_dir(self, step: int) -> str:
        path = self._step_dirs.get(step)
        if path is None:
            path = self._step_dirs[step] = safe_join(self.rank_dir, naming.step_dir_name(step))
        return path

    def prepare_step(self, step: int) -> str:
        """Create the step folder; unprocessed data of an earlier run is moved aside, never deleted."""
        self._step_dirs.pop(step, None)  # checked afresh: the folder may have been replaced
        path = self.step_dir(step)
        if os.path.isdir(path) and os.listdir(path):
            aside = f"{path}.earlier-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            os.replace(path, aside)
            logger.warning(
                "raw data of an earlier run for step %d was not processed; moved to %s "
                "(process it with `mf-celldump process`, or delete it)",
                step,
                aside,
            )
        return ensure_dir(path)

    # -- writing -------------------------------------------------------------------
    def write_manifest(self, manifest: dict) -> None:
        atomic_write_json(safe_join(self.rank_dir, naming.MANIFEST_FILE), manifest)

    def write_tensor(self, step: int, key: naming.ProbeKey, array: np.ndarray, dtype_name: str,
                     seq: int) -> None:
        """Save ``array`` under its raw name, atomically."""
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(array), allow_pickle=False)
        name = naming.raw_tensor_file_name(key, dtype_name, seq)
        # No fsync per file: the rename alone keeps a killed run readable; the step
        # marker written at the end of the step is fsynced.
        atomic_write_bytes(os.path.join(self.step_dir(step), name), buffer.getvalue(), fsync=False)

    def append_record(self, step: int, record: dict) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            handle = self._records.get(step)
            if handle is None:
                handle = open_append(safe_join(self.step_dir(step), naming.RECORDS_FILE))
                self._records[step] = handle
            handle.write(line)

    def finish_step(self, step: int, extra: Optional[dict] = None) -> None:
        """Close the step's record file and mark the step complete."""
        with self._lock:
            handle = self._records.pop(step, None)
        if handle is not None:
            handle.close()
        marker = {"step": step, "complete": True, "run_id": self.run_id}
        marker.update(extra or {})
        path = self.step_dir(step)
        if os.path.isdir(path):
            atomic_write_json(safe_join(path, naming.STEP_DONE_FILE), marker)

    def close(self) -> None:
        with self._lock:
            handles, self._records = list(self._records.values()), {}
        for handle in handles:
            handle.close()
