"""Processed output already in a dump: which steps have a complete ``step{N}/rank[R]`` folder.

No link is followed: an output folder is a real folder with a real ``dump.json``.
"""

from __future__ import annotations

import os
import stat
from typing import List, Set

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
