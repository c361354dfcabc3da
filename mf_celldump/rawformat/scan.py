"""Finding raw data: rank folders, their step folders and kbk iterations, the files of a step.

Only names are read here (and the records file, which holds metadata). Nothing is
followed through a symlink: a link where a raw folder or file is expected is reported
and left alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mf_celldump.fsutil import child, read_bytes_inside
from mf_celldump.rawformat import markers, names
from mf_celldump.rawformat.captured import Capture
from mf_celldump.rawformat.manifest import Manifest
from mf_celldump.rawformat.records import read_records

logger = logging.getLogger(__name__)

MAX_RECORDS_BYTES = 1 << 30  # records of one step are metadata: far below this


@dataclass
class StepSource:
    """Everything raw that belongs to one global step of one rank."""

    step: int
    raw_dir: Optional[str] = None
    kbk_csvs: List[str] = field(default_factory=list)
    complete: bool = False

    def kbk_dirs(self) -> List[str]:
        return sorted({os.path.dirname(p) for p in self.kbk_csvs})


@dataclass
class StepFiles:
    """The raw tensor files and records of one step folder, as captures (files not opened)."""

    captures: List[Capture] = field(default_factory=list)
    records_size: Optional[int] = None
    names: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def digest(self) -> str:
        extra = {} if self.records_size is None else {names.RECORDS_FILE: self.records_size}
        return source_digest(self.names, extra)


def find_rank_dirs(root_real: str, raw_root: str) -> List[Tuple[int, str]]:
    """``(rank, folder)`` for every ``rank{R}`` folder holding a manifest, by rank."""
    found = []
    if not os.path.isdir(raw_root) or os.path.islink(raw_root):
        return found
    for entry in os.scandir(raw_root):
        rank = names.parse_rank_dir_name(entry.name)
        if rank is None or not entry.is_dir(follow_symlinks=False):
            continue
        path = child(root_real, raw_root, entry.name)
        if os.path.isfile(os.path.join(path, names.MANIFEST_FILE)):
            found.append((rank, path))
    return sorted(found)


def _raw_step_folders(root_real: str, rank_dir: str, manifest: Manifest, steps: Dict[int, StepSource],
                      problems: List[str]) -> None:
    for entry in os.scandir(rank_dir):
        folder_step = names.parse_step_dir_name(entry.name)
        if folder_step is None:
            continue
        if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            problems.append(f"{entry.path}: not a plain folder (symlink?); skipped")
            continue
        raw_dir = child(root_real, rank_dir, entry.name)
        step, complete = markers.raw_folder_state(manifest, folder_step, raw_dir)
        source = steps.setdefault(step, StepSource(step))
        if source.raw_dir is not None:  # two folders claim the step (graph-mode TensorDump numbering)
            kept, skipped = (source.raw_dir, raw_dir) if source.complete or not complete else (raw_dir, source.raw_dir)
            problems.append(f"{skipped}: another raw folder ({kept}) holds step {step}; skipped")
            if kept is source.raw_dir:
                continue
        source.raw_dir, source.complete = raw_dir, complete


def _kbk_iterations(root_real: str, rank_dir: str, manifest: Manifest, steps: Dict[int, StepSource],
                    problems: List[str]) -> None:
    kbk_root = os.path.join(rank_dir, names.KBK_DIR)
    if not os.path.isdir(kbk_root) or os.path.islink(kbk_root):
        return
    for folder, dirs, files in os.walk(kbk_root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not names.is_removing_dir_name(d))
        if names.KBK_STATISTIC_CSV not in files:
            continue
        iteration = names.kbk_iteration_from_dir_name(os.path.basename(folder))
        csv_path = os.path.join(folder, names.KBK_STATISTIC_CSV)
        if iteration is None or os.path.islink(csv_path):
            problems.append(f"{csv_path}: not in a numbered iteration folder (or a symlink); skipped")
            continue
        child(root_real, folder, names.KBK_STATISTIC_CSV)
        step = manifest.graph_step_base + iteration
        steps.setdefault(step, StepSource(step)).kbk_csvs.append(csv_path)


def find_steps(root_real: str, rank_dir: str, manifest: Manifest) -> Tuple[Dict[int, StepSource], List[str]]:
    """Raw step folders and kbk iteration folders of one rank, keyed by global step."""
    steps: Dict[int, StepSource] = {}
    problems: List[str] = []
    _raw_step_folders(root_real, rank_dir, manifest, steps, problems)
    _kbk_iterations(root_real, rank_dir, manifest, steps, problems)
    # A kbk-only iteration is complete once a later one exists (MindSpore has moved on).
    last = max(steps) if steps else None
    for step, source in steps.items():
        source.kbk_csvs.sort()
        if source.raw_dir is None and step != last:
            source.complete = True
    return steps, problems


def list_step_files(step_dir: str, root_real: str) -> StepFiles:
    """Every raw tensor file name of a step folder parsed, and its records read."""
    out = StepFiles()
    records_path = None
    for entry in os.scandir(step_dir):
        name = entry.name
        if names.is_step_marker(name):
            continue
        out.names.append(name)
        if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
            out.problems.append(f"{entry.path}: not a plain file (symlink?); refused")
            continue
        if name == names.RECORDS_FILE:
            records_path = entry.path
            continue
        parsed = names.parse_raw_tensor_name(name)
        if parsed is None:
            if not name.startswith("."):
                out.warnings.append(f"{entry.path}: not a raw capture file; ignored")
            continue
        out.captures.append(Capture(parsed.seq, len(out.captures), parsed.key, name, file=name,
                                    file_dtype=parsed.numpy_dtype))
    out.names.sort()
    if records_path is not None:
        _read_step_records(records_path, root_real, out)
    return out


def _read_step_records(path: str, root_real: str, out: StepFiles) -> None:
    try:
        data = read_bytes_inside(path, root_real, MAX_RECORDS_BYTES)
    except (OSError, ValueError) as err:
        out.problems.append(f"{path}: unreadable ({err})")
        return
    records = read_records(data, path, first_order=len(out.captures))
    out.captures.extend(records.captures)
    out.problems.extend(records.problems)
    out.warnings.extend(records.warnings)
    out.records_size = records.size


def step_folder_digest(step_dir: str) -> str:
    """The digest of a step folder as it is now (same value as ``StepFiles.digest`` of it)."""
    listed = sorted(n for n in os.listdir(step_dir) if not names.is_step_marker(n))
    extra = {}
    if names.RECORDS_FILE in listed:
        extra[names.RECORDS_FILE] = os.path.getsize(os.path.join(step_dir, names.RECORDS_FILE))
    return source_digest(listed, extra)


def source_digest(file_names: List[str], extra: Dict[str, int]) -> str:
    """Identity of a step's raw input: file names (written once) plus sizes of append-only files."""
    digest = hashlib.sha256()
    for name in file_names:
        digest.update(name.encode("utf-8", "surrogateescape") + b"\0")
    for key in sorted(extra):
        digest.update(f"{key}={extra[key]}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()
