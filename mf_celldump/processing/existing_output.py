"""Processed output already in a dump: which steps have a complete ``step{N}/rank[R]`` folder.

No link is followed: an output folder is a real folder with a real ``dump.json``.
"""

from __future__ import annotations

import os
import stat
from typing import Dict, List, Optional, Sequence, Set, Tuple

from mf_celldump.layout import naming


def is_output(folder: str) -> bool:
    """A real output rank folder (no link followed) with its dump.json."""
    try:
        return stat.S_ISDIR(os.lstat(folder).st_mode) and \
            stat.S_ISREG(os.lstat(os.path.join(folder, naming.DUMP_JSON)).st_mode)
    except OSError:
        return False


def has_output(root: str) -> bool:
    """Whether any step folder of ``root`` holds a processed output (unreadable ones do not count)."""
    for entry in os.scandir(root):
        if naming.parse_step_dir_name(entry.name) is None or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            names = [sub.name for sub in os.scandir(entry.path)]
        except OSError:
            continue
        if any(naming.parse_output_rank_dir_name(n) is not None and is_output(os.path.join(entry.path, n))
               for n in names):
            return True
    return False


def output_steps(root: str, out_rank_names: Set[str]) -> Set[int]:
    """Steps with a processed output folder of one of the given ranks."""
    steps = set()
    for entry in os.scandir(root):
        step = naming.parse_step_dir_name(entry.name)
        if step is None or not entry.is_dir(follow_symlinks=False):
            continue
        if any(is_output(os.path.join(entry.path, name)) for name in out_rank_names):
            steps.add(step)
    return steps


OUTPUT_FILES = (naming.DUMP_JSON, naming.CONSTRUCT_JSON, naming.STACK_JSON, naming.TENSOR_DIR)


def foreign_in_output(folder: str) -> List[str]:
    """Files in an output rank folder that processing does not write there (relative names, sorted)."""
    found = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    for entry in entries:
        if entry.name not in OUTPUT_FILES:
            found.append(entry.name)
        elif entry.name == naming.TENSOR_DIR and entry.is_dir(follow_symlinks=False):
            found.extend(f"{naming.TENSOR_DIR}/{sub.name}" for sub in os.scandir(entry.path)
                         if not (sub.name.startswith("Cell.") and sub.name.endswith(".npy")))
    return sorted(found)


def _extra_names(info: os.stat_result, known: Dict[Tuple[int, int], int]) -> bool:
    return info.st_nlink > known.get((info.st_dev, info.st_ino), 1)


def _inode_names(folder: Optional[str]) -> Dict[Tuple[int, int], int]:
    """(device, inode) -> names in ``folder`` (no link followed); empty when there is no such folder."""
    names: Dict[Tuple[int, int], int] = {}
    if folder is None:
        return names
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_file(follow_symlinks=False):
                    info = entry.stat(follow_symlinks=False)
                    names[(info.st_dev, info.st_ino)] = names.get((info.st_dev, info.st_ino), 0) + 1
    except OSError:
        pass
    return names


def _names_in(folders: Sequence[Optional[str]]) -> Dict[Tuple[int, int], int]:
    names: Dict[Tuple[int, int], int] = {}
    for folder in folders:
        for key, count in _inode_names(folder).items():
            names[key] = names.get(key, 0) + count
    return names


def links_in_output(folder: str, own_folders: Sequence[Optional[str]]) -> List[str]:
    """Links in an output rank folder about to be replaced, where processing writes its own files:
    a symlink in place of a JSON file, ``dump_tensor_data`` or a tensor file, and a file with a name
    outside this output and ``own_folders`` (the step's raw folder and the output being assembled:
    the hard links processing itself makes)."""
    found = []
    for name in (naming.DUMP_JSON, naming.CONSTRUCT_JSON, naming.STACK_JSON):
        try:
            info = os.lstat(os.path.join(folder, name))
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode) or info.st_nlink > 1:
            found.append(name)
    data_dir = os.path.join(folder, naming.TENSOR_DIR)
    if os.path.islink(data_dir):
        return found + [naming.TENSOR_DIR]
    ours = _inode_names(data_dir)
    if not ours:
        return found
    raw = None
    with os.scandir(data_dir) as entries:
        for entry in entries:
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                found.append(f"{naming.TENSOR_DIR}/{entry.name}")
            elif stat.S_ISREG(info.st_mode) and _extra_names(info, ours):
                raw = _names_in(own_folders) if raw is None else raw
                key = (info.st_dev, info.st_ino)
                if info.st_nlink > ours.get(key, 0) + raw.get(key, 0):
                    found.append(f"{naming.TENSOR_DIR}/{entry.name}")
    return sorted(found)
