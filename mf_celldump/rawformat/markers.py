"""Marker files: a step is complete (capture side), a step was consumed (processing side).

``_step_done.json`` in a raw step folder says every capture of the step has reached
disk. In graph-mode TensorDump captures MindSpore writes the step's files after the
step, and the folder is complete once it holds ``_td_done_g{G}_{dtype}_{id}.npy``:
MindSpore writes that marker after every file of the step (one FIFO writer thread), and
G names the global step the folder holds. ``_processed/step{N}.json`` says which raw
input an output in place was made from, so a re-run after a kill knows what it may delete.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

from mf_celldump.fsutil import atomic_write_json, read_json_inside
from mf_celldump.rawformat import names
from mf_celldump.rawformat.manifest import Manifest

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


TD_DONE_FIELDS = {
    "name": "_td_done_g{G}_{dtype}_{id}.npy, in the raw step folder",
    "G": "int: the global step whose files the folder holds",
    "written by": "MindSpore's TensorDump writer thread, after every file of the step; its content is not read",
}


def tensordump_done_step(folder: str) -> Optional[int]:
    """The global step named by the step-done marker MindSpore wrote into ``folder``; None if absent."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.name.startswith(names.TD_DONE_PREFIX) and entry.is_file(follow_symlinks=False):
                    step = names.parse_td_done_name(entry.name)
                    if step is not None:
                        return step
    except OSError:
        return None
    return None


def raw_folder_state(manifest: Manifest, folder_step: int, folder: str) -> Tuple[int, bool]:
    """(global step, complete) of the raw folder ``step{folder_step}`` at ``folder``."""
    if manifest.written_later:
        step = tensordump_done_step(folder)
        if step is not None:
            return step, True
        return manifest.global_step(folder_step), False
    return manifest.global_step(folder_step), os.path.isfile(os.path.join(folder, names.STEP_DONE_FILE))


def written_steps(rank_dir: str, manifest: Manifest) -> Dict[int, str]:
    """Global step -> raw folder, for every step folder of ``rank_dir`` that is complete: it holds its
    step marker (``_step_done.json``, or MindSpore's step-done file for graph-mode TensorDump)."""
    found: Dict[int, str] = {}
    try:
        entries = list(os.scandir(rank_dir))
    except OSError:
        return found
    for entry in entries:
        folder_step = names.parse_step_dir_name(entry.name)
        if folder_step is None or not entry.is_dir(follow_symlinks=False):
            continue
        step, complete = raw_folder_state(manifest, folder_step, entry.path)
        if complete:
            found[step] = entry.path
    return found


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
