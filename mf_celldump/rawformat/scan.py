"""Finding raw data: rank folders, their step folders and kbk iterations, the files of a step.

Only names are read here (and the records file, which holds metadata). Nothing is
followed through a symlink: a link where a raw folder or file is expected is reported
and left alone. Files capture does not write are told apart by name (``is_ours``), so
processing can leave them where they are.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Dict, List, Optional, Tuple

from mf_celldump.fsutil import child, is_temp_name, open_own_file
from mf_celldump.rawformat import markers, names
from mf_celldump.rawformat.keys import Capture
from mf_celldump.rawformat.manifest import Manifest
from mf_celldump.rawformat.records import RecordsRead, read_records_stream

logger = logging.getLogger(__name__)

MAX_RECORDS_BYTES = 1 << 30  # records of one step are metadata: far below this
# (open records file, its path, the order of its first value, its size) -> what was read
RecordsReader = Callable[[BinaryIO, str, int, int], RecordsRead]
# The shape of a raw tensor file name with numbers of any length (names.py bounds them).
_LOOSE_RAW_NAME = re.compile(r"^c\d+\.[fb]\.[ako]\.[tifbn]\.n(\d+|x)\.p\d+(\.\d+)*(_in)?_[A-Za-z0-9]+_\d+\.npy$")


@dataclass
class StepSource:
    """Everything raw that belongs to one global step of one rank."""

    step: int
    raw_dir: Optional[str] = None
    kbk_csvs: List[str] = field(default_factory=list)
    complete: bool = False
    refused: Optional[str] = None  # why the step must not be processed (its raw data is kept)
    discard: bool = False  # written for a step that was not selected: its files are deleted, not processed


@dataclass
class StepFiles:
    """The raw tensor files and records of one step folder, as captures (files not opened).

    ``foreign`` lists files mf_celldump did not write (left where they are); ``temps``
    our temporary files a killed writer left (deleted with the step).
    """

    captures: List[Capture] = field(default_factory=list)
    records_size: Optional[int] = None
    names: List[str] = field(default_factory=list)
    foreign: List[str] = field(default_factory=list)
    temps: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def digest(self) -> str:
        extra = {} if self.records_size is None else {names.RECORDS_FILE: self.records_size}
        return source_digest(self.names, extra)


def not_ours_warning(path: str) -> str:
    """What is said of a folder named like ours (``step01``, ``rank00``, ``rank{13 digits}``) that is not."""
    return (f"{path}: not a name mf_celldump writes (numbers are written without leading zeros, steps below "
            f"{names.MAX_STEP + 1}, ranks below {names.MAX_RANK + 1}); not processed, left in place")


def find_rank_dirs(root_real: str, raw_root: str, problems: Optional[List[str]] = None,
                   warnings: Optional[List[str]] = None) -> List[Tuple[int, str]]:
    """``(rank, folder)`` for every ``rank{R}`` folder holding a manifest, by rank.

    A symlink in place of ``_raw`` or of a rank folder is not followed; it is named in
    ``problems``. A folder named like a rank folder that is not one of ours is named in ``warnings``.
    """
    found: List[Tuple[int, str]] = []
    problems = problems if problems is not None else []
    if os.path.islink(raw_root):
        problems.append(f"{raw_root} is a symbolic link where mf_celldump keeps its raw data; refused")
        return found
    if not os.path.isdir(raw_root):
        return found
    for entry in os.scandir(raw_root):
        rank = names.parse_rank_dir_name(entry.name)
        if rank is None:
            if names.looks_numbered(entry.name) and warnings is not None:
                warnings.append(not_ours_warning(entry.path))
            continue
        if not entry.is_dir(follow_symlinks=False):
            problems.append(f"{entry.path} is not a plain folder (a symlink?); refused")
            continue
        path = child(root_real, raw_root, entry.name)
        if not _readable(path):  # else its manifest would seem absent, and the folder not ours
            problems.append(f"{path} cannot be read (permission denied): rank {rank} is not processed; make it "
                            "readable by this user (chmod u+rx), or run as the user that trained")
            continue
        if os.path.lexists(os.path.join(path, names.MANIFEST_FILE)):  # a link is found, then refused by name
            found.append((rank, path))
    return sorted(found)


def _readable(folder: str) -> bool:
    """Whether the folder can be listed and its files looked at (what the file modes let this process do)."""
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                entry.is_dir(follow_symlinks=False)
                break
        os.stat(os.path.join(folder, names.MANIFEST_FILE), follow_symlinks=False)
    except FileNotFoundError:
        return True
    except PermissionError:
        return False
    return True


def _raw_step_folders(root_real: str, rank_dir: str, manifest: Manifest, steps: Dict[int, StepSource],
                      problems: List[str], warnings: List[str]) -> None:
    for entry in os.scandir(rank_dir):
        folder_step = names.parse_step_dir_name(entry.name)
        if folder_step is None:
            if names.looks_numbered(entry.name):
                warnings.append(not_ours_warning(entry.path))
            continue
        if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            problems.append(f"{entry.path}: not a plain folder (symlink?); refused, left in place")
            continue
        foreign = _only_foreign(entry.path)
        if foreign:
            shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
            warnings.append(f"{entry.path}: holds no capture data, only files mf_celldump did not write "
                            f"({shown}); left in place")
            continue
        raw_dir = child(root_real, rank_dir, entry.name)
        state = markers.raw_folder_state(manifest, folder_step, raw_dir, root_real)
        step, complete = state.step, state.complete
        if step < 0:
            problems.append(f"{raw_dir}: with graph_step_base {manifest.graph_step_base} of {manifest.path} it would "
                            f"hold global step {step}; not processed, left in place")
            continue
        source = steps.setdefault(step, StepSource(step))
        if source.raw_dir is not None:  # two folders claim the step (graph-mode TensorDump numbering)
            kept, skipped = (source.raw_dir, raw_dir) if source.complete or not complete else (raw_dir, source.raw_dir)
            problems.append(f"{skipped}: another raw folder ({kept}) holds step {step}; skipped")
            if kept is source.raw_dir:
                continue
        source.raw_dir, source.complete, source.refused = raw_dir, complete, state.refused
        source.discard = state.discard


def is_ours(name: str) -> bool:
    """Whether a file of this name in a raw step folder is one capture writes."""
    return (name == names.RECORDS_FILE or names.is_step_marker(name) or is_temp_name(name)
            or names.parse_raw_tensor_name(name) is not None)


def _only_foreign(step_dir: str) -> List[str]:
    """Names in ``step_dir`` when none of them is ours (it holds no capture data); else []."""
    found = []
    try:
        with os.scandir(step_dir) as entries:
            for entry in entries:
                if is_ours(entry.name):
                    return []
                found.append(entry.name)
    except OSError:  # unreadable: processing the step reports it
        return []
    return sorted(found)


def _kbk_iterations(root_real: str, rank_dir: str, manifest: Manifest, steps: Dict[int, StepSource],
                    problems: List[str]) -> None:
    kbk_root = os.path.join(rank_dir, names.KBK_DIR)
    if os.path.islink(kbk_root):
        problems.append(f"{kbk_root}: a symbolic link where MindSpore writes its statistics for mf_celldump; "
                        "refused, not followed, left in place")
        return
    if not os.path.isdir(kbk_root):
        return
    for folder, dirs, files in os.walk(kbk_root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not names.is_removing_dir_name(d))
        if names.KBK_STATISTIC_CSV not in files:
            continue
        iteration = names.kbk_iteration_from_dir_name(os.path.basename(folder))
        csv_path = os.path.join(folder, names.KBK_STATISTIC_CSV)
        if os.path.islink(csv_path):
            problems.append(f"{csv_path}: a symbolic link where MindSpore writes a file; refused, left in place")
            continue
        if iteration is None:
            problems.append(f"{csv_path}: not in a numbered iteration folder; skipped")
            continue
        child(root_real, folder, names.KBK_STATISTIC_CSV)
        step = manifest.graph_step_base + iteration
        steps.setdefault(step, StepSource(step)).kbk_csvs.append(csv_path)


def find_steps(root_real: str, rank_dir: str, manifest: Manifest,
               warnings: Optional[List[str]] = None) -> Tuple[Dict[int, StepSource], List[str]]:
    """Raw step folders and kbk iteration folders of one rank, keyed by global step.

    Returns the steps and problems; step folders holding only files that are not ours
    are skipped and named in ``warnings``.
    """
    steps: Dict[int, StepSource] = {}
    problems: List[str] = []
    _raw_step_folders(root_real, rank_dir, manifest, steps, problems, warnings if warnings is not None else [])
    _kbk_iterations(root_real, rank_dir, manifest, steps, problems)
    # A kbk-only iteration is complete once a later one exists (MindSpore has moved on).
    last = max(steps) if steps else None
    for step, source in steps.items():
        source.kbk_csvs.sort()
        if source.raw_dir is None and step != last:
            source.complete = True
    return steps, problems


def list_step_files(step_dir: str, root_real: str, read_records: Optional[RecordsReader] = None) -> StepFiles:
    """Every raw tensor file name of a step folder parsed, and its records read.

    Files that are not ours are listed in ``foreign`` and left alone; a link or folder
    under one of our names is a problem (the step's raw data is then kept). ``read_records``
    reads the records file once it is opened and checked (``read_records_stream`` by default).
    """
    out = StepFiles()
    records_path = None
    with os.scandir(step_dir) as entries:
        for entry in entries:
            name = entry.name
            if names.is_step_marker(name):
                if _extra_links(entry):
                    out.problems.append(_LINKED.format(entry.path))
                continue
            out.names.append(name)
            if not is_ours(name):
                out.foreign.append(name)
                out.warnings.append(_foreign_warning(entry.path, name))
            elif entry.is_symlink() or not entry.is_file(follow_symlinks=False):
                out.problems.append(f"{entry.path}: a symlink or non-file where mf_celldump expects its own "
                                    "file; refused")
            elif is_temp_name(name):
                if _extra_links(entry):
                    out.problems.append(_LINKED.format(entry.path))
                out.temps.append(name)
            elif name == names.RECORDS_FILE:
                records_path = entry.path
            else:
                parsed = names.parse_raw_tensor_name(name)
                out.captures.append(Capture(parsed.seq, len(out.captures), parsed.key, name, file=name,
                                            file_dtype=parsed.numpy_dtype, in_mode=parsed.tensordump_in_mode))
    out.names.sort()
    out.foreign.sort()
    if records_path is not None:
        _read_step_records(records_path, root_real, out, read_records or _read_in_memory)
    return out


def _read_in_memory(handle: BinaryIO, path: str, first_order: int, size: int) -> RecordsRead:
    return read_records_stream(handle, path, first_order)


_LINKED = "{} has another name (hard link); a file mf_celldump wrote has one: refused"


def _extra_links(entry: os.DirEntry) -> bool:
    info = entry.stat(follow_symlinks=False)
    return stat.S_ISREG(info.st_mode) and info.st_nlink > 1


def _foreign_warning(path: str, name: str) -> str:
    if _LOOSE_RAW_NAME.match(name):
        return (f"{path}: looks like a raw capture file, but a number in its name is not one capture writes "
                "(a leading zero, or out of the raw format's range); not read, left in place")
    return f"{path}: not a file mf_celldump writes; left in place"


def _read_step_records(path: str, root_real: str, out: StepFiles, read_records: RecordsReader) -> None:
    try:
        with open_own_file(path, root_real) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_RECORDS_BYTES:
                raise ValueError(f"{size} bytes, more than the {MAX_RECORDS_BYTES} a step's records can be")
            records = read_records(handle, path, len(out.captures), size)
    except (OSError, ValueError) as err:
        out.problems.append(f"{path}: unreadable ({str(err)[:300]})")
        return
    out.captures.extend(records.captures)
    out.problems.extend(records.problems)
    out.warnings.extend(records.warnings)
    out.records_size = records.size


def step_folder_digest(step_dir: str) -> str:
    """The digest of a step folder as it is now (same value as ``StepFiles.digest`` of it)."""
    listed = sorted(n for n in os.listdir(step_dir) if not names.is_step_marker(n))
    extra = {}
    if names.RECORDS_FILE in listed:
        extra[names.RECORDS_FILE] = os.lstat(os.path.join(step_dir, names.RECORDS_FILE)).st_size
    return source_digest(listed, extra)


def source_digest(file_names: List[str], extra: Dict[str, int]) -> str:
    """Identity of a step's raw input: file names (written once) plus sizes of append-only files."""
    digest = hashlib.sha256()
    for name in file_names:
        digest.update(name.encode("utf-8", "surrogateescape") + b"\0")
    for key in sorted(extra):
        digest.update(f"{key}={extra[key]}\0".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()
