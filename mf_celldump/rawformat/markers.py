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
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from mf_celldump.errors import UnsafePathError, short_repr
from mf_celldump.fsutil import atomic_write_json, read_json_inside
from mf_celldump.rawformat import names
from mf_celldump.rawformat.manifest import Manifest

PROCESSED_FORMAT = "mf_celldump-processed/1"
STEP_DONE_FIELDS = {
    "step": "int: the global step",
    "complete": "true",
    "run_id": "the manifest's run_id",
    "task": "the manifest's task (a manifest changed after capture is told apart by it)",
}
STEP_DONE_MAX_BYTES = 1 << 16  # a few fields
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
    "_td_skip_g{G}_{dtype}_{id}.npy": "the same for a step that was not selected but written anyway (another "
                                      "TensorDump user keeps the process-wide step filter open): processing "
                                      "deletes the folder's files once it holds this marker",
}


def _tensordump_marker(folder: str) -> Tuple[Optional[int], bool]:
    """(global step, selected) named by the marker MindSpore wrote into ``folder``: ``_td_done_g`` is a
    selected step, ``_td_skip_g`` one written only because the step filter stayed open; (None, True) if absent."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if not entry.name.startswith((names.TD_DONE_PREFIX, names.TD_SKIP_PREFIX)):
                    continue
                if not entry.is_file(follow_symlinks=False):
                    continue
                step = names.parse_td_done_name(entry.name)
                if step is not None:
                    return step, True
                step = names.parse_td_skip_name(entry.name)
                if step is not None:
                    return step, False
    except OSError:
        pass
    return None, True


@dataclass(frozen=True)
class FolderState:
    """A raw step folder as its marker describes it: global step, complete, and why it cannot be
    processed (``refused``: the marker is not ours, or disagrees with the folder or the manifest)."""

    step: int
    complete: bool
    refused: Optional[str] = None
    fields: Dict[str, Any] = field(default_factory=dict)
    # MindSpore wrote the folder for a step that was not selected, and has finished it: delete it.
    discard: bool = False


def read_step_done(folder: str, root_real: str) -> FolderState:
    """``_step_done.json`` of ``folder`` (step -1: not checked yet); absent: not complete.

    Read like every file of ours (never through a link, one name, bounded size); a marker
    that cannot be read so is refused, and the folder is not taken for complete.
    """
    path = os.path.join(folder, names.STEP_DONE_FILE)
    if not os.path.lexists(path):
        return FolderState(-1, False)
    try:
        data = read_json_inside(path, root_real, STEP_DONE_MAX_BYTES)
    except UnsafePathError as err:
        return FolderState(-1, False, f"{err}; the step is not processed, its raw data is kept")
    except (OSError, ValueError, RecursionError) as err:
        return FolderState(-1, False, f"{path}: unreadable ({short_repr(str(err))}); the step is not processed, "
                                      "its raw data is kept")
    if not isinstance(data, dict):
        return FolderState(-1, False, f"{path}: not a JSON object; the step is not processed, its raw data is kept")
    return FolderState(-1, True, None, data)


def step_done_disagreement(path: str, fields: Dict[str, Any], manifest: Manifest, step: int) -> Optional[str]:
    """Why a step-done marker's fields do not fit its folder (``step``) and the rank's manifest; None if they do."""
    named = fields.get("step", step)
    if named != step or isinstance(named, bool):
        return (f"{path} marks step {short_repr(named)} complete, but its folder holds step {step} (folder renamed "
                "or copied?)")
    run_id = fields.get("run_id")
    if isinstance(run_id, str) and run_id and manifest.run_id and run_id != manifest.run_id:
        return (f"{path} was written by run {short_repr(run_id)}, but {manifest.path or names.MANIFEST_FILE} is "
                f"of run {short_repr(manifest.run_id)} (raw data of two runs in one rank folder)")
    task = fields.get("task")
    if task is not None and task != manifest.task:
        return (f"{path} says task {short_repr(task)}, but {manifest.path or names.MANIFEST_FILE} says task "
                f"{manifest.task!r} (manifest changed after capture?)")
    return None


def raw_folder_state(manifest: Manifest, folder_step: int, folder: str, root_real: str) -> FolderState:
    """The state of the raw folder ``step{folder_step}`` at ``folder``."""
    if manifest.written_later:
        step, selected = _tensordump_marker(folder)
        if step is not None:
            return FolderState(step, True, discard=not selected)
        return FolderState(manifest.global_step(folder_step), False)
    step = manifest.global_step(folder_step)
    done = read_step_done(folder, root_real)
    refused = done.refused
    if refused is None and done.complete:
        refused = step_done_disagreement(os.path.join(folder, names.STEP_DONE_FILE), done.fields, manifest, step)
        if refused is not None:
            refused += "; the step is not processed, its raw data is kept"
    return FolderState(step, done.complete, refused, done.fields)


def written_steps(rank_dir: str, manifest: Manifest, root_real: str,
                  include_unselected: bool = False) -> Dict[int, str]:
    """Global step -> raw folder, for every step folder of ``rank_dir`` that is finished: it holds its step
    marker (``_step_done.json``, or MindSpore's step-done file for graph-mode TensorDump), or a marker that
    processing will refuse and name (waiting longer would not change it). With ``include_unselected``, also
    a step MindSpore wrote although it was not selected."""
    found: Dict[int, str] = {}
    try:
        entries = list(os.scandir(rank_dir))
    except OSError:
        return found
    for entry in entries:
        folder_step = names.parse_step_dir_name(entry.name)
        if folder_step is None or not entry.is_dir(follow_symlinks=False):
            continue
        state = raw_folder_state(manifest, folder_step, entry.path, root_real)
        if (state.complete or state.refused) and (include_unselected or not state.discard):
            found[state.step] = entry.path
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
