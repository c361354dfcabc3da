"""Marker files: a step is complete (capture side), a step was consumed (processing side).

``_step_done.json`` in a raw step folder says every capture of the step has reached
disk; ``_processed/step{N}.json`` says which raw input an output in place was made
from, so a re-run after a kill knows what it may delete.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from mf_celldump.fsutil import atomic_write_json, read_json_inside

PROCESSED_FORMAT = "mf_celldump-processed/1"
STEP_DONE_FIELDS = {
    "step": "int: the global step",
    "complete": "true",
    "run_id": "the manifest's run_id",
}
PROCESSED_FIELDS = {
    "format": PROCESSED_FORMAT,
    "step": "int: the global step",
    "output": "the output folder, relative to dump_path",
    "raw_dir": "name of the consumed raw step folder, or null",
    "raw_digest": "digest of the consumed raw folder's file names and records size",
    "kbk": "consumed statistic.csv files (relative path -> size)",
}


def write_step_done(path: str, step: int, run_id: str, extra: Optional[Dict[str, Any]] = None) -> None:
    marker = {"step": step, "complete": True, "run_id": run_id}
    marker.update(extra or {})
    atomic_write_json(path, marker)


def write_processed(path: str, step: int, output: str, raw_dir: Optional[str], raw_digest: Optional[str],
                    kbk: Dict[str, int]) -> None:
    atomic_write_json(path, {"format": PROCESSED_FORMAT, "step": step, "output": output, "raw_dir": raw_dir,
                             "raw_digest": raw_digest, "kbk": kbk})


def read_processed(path: str, root_real: str) -> Optional[dict]:
    """The processed marker at ``path``, or None when absent, unreadable or not ours."""
    try:
        data = read_json_inside(path, root_real)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) and data.get("format") == PROCESSED_FORMAT else None
