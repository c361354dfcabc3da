"""Finding raw data: rank folders, their step folders and kbk iterations, and the files in a step."""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mf_celldump import naming
from mf_celldump.fsutil import child
from mf_celldump.processing.captures import Capture
from mf_celldump.processing.manifest import Manifest

logger = logging.getLogger(__name__)


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
    captures: List[Capture] = field(default_factory=list)
    records: Optional[str] = None
    names: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)


def find_rank_dirs(root_real: str, raw_root: str) -> List[Tuple[int, str]]:
    """``(rank, folder)`` for every ``rank{R}`` folder holding a manifest, by rank."""
    found = []
    if not os.path.isdir(raw_root):
        return found
    for entry in os.scandir(raw_root):
        rank = naming.parse_rank_dir_name(entry.name)
        if rank is None or entry.name == "rank" or not entry.is_dir():
            continue
        path = child(root_real, raw_root, entry.name)
        if os.path.isfile(os.path.join(path, naming.MANIFEST_FILE)):
            found.append((rank, path))
    return sorted(found)


def find_steps(root_real: str, rank_dir: str, manifest: Manifest) -> Tuple[Dict[int, StepSource], List[str]]:
    """Raw step folders and kbk iteration folders of one rank, keyed by global step."""
    steps: Dict[int, StepSource] = {}
    problems: List[str] = []
    for entry in os.scandir(rank_dir):
        folder_step = naming.parse_step_dir_name(entry.name)
        if folder_step is None:
            continue
        if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            problems.append(f"{entry.path}: not a plain folder (symlink?); skipped")
            continue
        step = manifest.output_step(folder_step)
        source = steps.setdefault(step, StepSource(step))
        source.raw_dir = child(root_real, rank_dir, entry.name)
        source.complete = os.path.isfile(os.path.join(source.raw_dir, naming.STEP_DONE_FILE))
    kbk_root = os.path.join(rank_dir, naming.KBK_DIR)
    if os.path.isdir(kbk_root) and not os.path.islink(kbk_root):
        for folder, dirs, files in os.walk(kbk_root, followlinks=False):
            dirs[:] = sorted(d for d in dirs if not naming.is_removing_dir_name(d))
            if naming.KBK_STATISTIC_CSV not in files:
                continue
            iteration = naming.kbk_iteration_from_dir_name(os.path.basename(folder))
            csv_path = os.path.join(folder, naming.KBK_STATISTIC_CSV)
            if iteration is None or os.path.islink(csv_path):
                problems.append(f"{csv_path}: not in a numbered iteration folder (or a symlink); skipped")
                continue
            child(root_real, folder, naming.KBK_STATISTIC_CSV)
            steps.setdefault(
                manifest.graph_step_base + iteration, StepSource(manifest.graph_step_base + iteration)
            )
            steps[manifest.graph_step_base + iteration].kbk_csvs.append(csv_path)
    # A kbk-only iteration is complete once a later one exists (MindSpore has moved on).
    last = max(steps) if steps else None
    for step, source in steps.items():
        source.kbk_csvs.sort()
        if source.raw_dir is None and step != last:
            source.complete = True
    return steps, problems


def list_step_files(step_dir: str) -> StepFiles:
    """Parse every raw tensor file name of a step folder (no file is opened here)."""
    out = StepFiles()
    order = 0
    for entry in os.scandir(step_dir):
        name = entry.name
        if name in (naming.STEP_DONE_FILE,):
            continue
        out.names.append(name)
        if entry.is_symlink() or not entry.is_file(follow_symlinks=False):
            out.problems.append(f"{entry.path}: not a plain file (symlink?); refused")
            continue
        if name == naming.RECORDS_FILE:
            out.records = entry.path
            continue
        parsed = naming.parse_raw_tensor_name(name)
        if parsed is None:
            if not name.startswith("."):
                out.warnings.append(f"{entry.path}: not a raw capture file; ignored")
            continue
        out.captures.append(
            Capture(parsed.seq, order, parsed.key, name, file=name, file_dtype=parsed.numpy_dtype)
        )
        order += 1
    out.names.sort()
    return out


def step_folder_digest(step_dir: str) -> str:
    """The digest of a step folder as it is now (same value as computed while reading it)."""
    names = sorted(n for n in os.listdir(step_dir) if n != naming.STEP_DONE_FILE)
    extra = {}
    if naming.RECORDS_FILE in names:
        extra[naming.RECORDS_FILE] = os.path.getsize(os.path.join(step_dir, naming.RECORDS_FILE))
    return source_digest(names, extra)


def source_digest(names: List[str], extra: Dict[str, int]) -> str:
    """Identity of a step's raw input: file names (written once) plus sizes of append-only files."""
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode("utf-8", "surrogateescape") + b"\0")
    for key in sorted(extra):
        digest.update(f"{key}={extra[key]}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()
