"""Deleting consumed raw data and what a killed run of ours left: only files we wrote.

A consumed raw step folder is renamed to ``.step{N}.removing`` in one step (so no run
ever sees a half-deleted step folder), then the files capture wrote are deleted from it:
names that ``scan.is_ours`` recognises, and of those only symlinks (the link goes, never
its target) and plain files without a name elsewhere, apart from the links processing
itself made into the step's output. Files we did not write stay: the folder then gets its
name back holding just them, and the scanner skips it from then on as "no capture data".
A file of ours that cannot be deleted safely (another hard link) keeps the folder under
its ``.removing`` name, reported, so the step is never processed again from a remnant.
A run killed meanwhile leaves the ``.removing`` folder, which the next run finishes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from mf_celldump import fsutil
from mf_celldump.errors import UnsafePathError
from mf_celldump.rawformat import names
from mf_celldump.rawformat.scan import is_ours

logger = logging.getLogger(__name__)

Links = Dict[Tuple[int, int], int]


@dataclass
class Removal:
    """What was left of a raw step folder: files that are not ours, and ours we could not delete."""

    foreign: List[str] = field(default_factory=list)
    refused: List[str] = field(default_factory=list)

    def describe(self, folder: str) -> Optional[str]:
        if self.refused:
            return (f"{folder}: kept (as {names.removing_dir_name(os.path.basename(folder))}): "
                    f"{', '.join(self.refused[:5])} also has a name outside this folder (hard link); "
                    "refused to delete it")
        if self.foreign:
            return (f"{folder}: kept, with only the files mf_celldump did not write "
                    f"({', '.join(self.foreign[:5])}{', ...' if len(self.foreign) > 5 else ''})")
        return None


def output_links(*data_dirs: str) -> Links:
    """(st_dev, st_ino) -> count of the data files in existing output folders (ours: linked from raw files)."""
    links: Links = {}
    for folder in data_dirs:
        try:
            fsutil.check_plain_dir(os.path.dirname(folder))
            fsutil.check_plain_dir(folder)
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_file(follow_symlinks=False):
                        info = entry.stat(follow_symlinks=False)
                        key = (info.st_dev, info.st_ino)
                        links[key] = links.get(key, 0) + 1
        except (FileNotFoundError, NotADirectoryError, UnsafePathError):
            continue
    return links


def _deletable(entry: os.DirEntry, our_links: Links) -> bool:
    info = entry.stat(follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        return True
    return stat.S_ISREG(info.st_mode) and info.st_nlink <= 1 + our_links.get((info.st_dev, info.st_ino), 0)


def remove_raw_step(rank_dir: str, raw_dir: str, our_links: Links) -> Removal:
    """Delete our files of a consumed raw step folder; says what was left in place."""
    removing = os.path.join(rank_dir, names.removing_dir_name(os.path.basename(raw_dir)))
    if os.path.lexists(removing):
        finish_removal(removing, None, our_links)
    if os.path.lexists(removing):  # an earlier removal's folder still holds files that are not ours
        return Removal(foreign=[os.path.basename(removing)])
    if os.path.lexists(raw_dir):
        os.rename(raw_dir, removing)
    return finish_removal(removing, raw_dir, our_links)


def finish_removal(removing: str, original: Optional[str], our_links: Links) -> Removal:
    """Delete our files in a ``.removing`` folder; when only foreign files are left they go back to ``original``.

    A symlink in place of the folder is only unlinked (inside the dump; its target stays);
    anything else that is not a folder is not ours and stays (named in ``foreign``).
    """
    try:
        info = os.lstat(removing)
    except FileNotFoundError:
        return Removal()
    if stat.S_ISLNK(info.st_mode):
        os.unlink(removing)
        return Removal()
    if not stat.S_ISDIR(info.st_mode):
        return Removal(foreign=[os.path.basename(removing)])
    result = Removal()
    with os.scandir(removing) as entries:
        for entry in entries:
            if not is_ours(entry.name) or entry.is_dir(follow_symlinks=False):
                result.foreign.append(entry.name)
            elif _deletable(entry, our_links):
                os.unlink(entry.path)
            else:
                result.refused.append(entry.name)
    result.foreign.sort()
    result.refused.sort()
    if not result.foreign and not result.refused:
        os.rmdir(removing)
    elif not result.refused and original is not None and not os.path.lexists(original):
        os.rename(removing, original)
    return result


def clean_leftovers(rank_dir: str, data_dirs_of: Callable[[int], List[str]]) -> List[str]:
    """Finish removals a killed run left (``.step{N}.removing``); returns what is said about them.

    ``data_dirs_of(step)`` names the output data folders of that step (their links to raw
    files are ours).
    """
    notes = []
    with os.scandir(rank_dir) as entries:
        found = [e.name for e in entries if names.is_removing_dir_name(e.name)]
    for name in sorted(found):
        original = name[1 : -len(".removing")]
        step = names.parse_step_dir_name(original)
        if step is None:
            continue  # not a name we give
        original_path = os.path.join(rank_dir, original)
        path = os.path.join(rank_dir, name)
        result = finish_removal(path, original_path, output_links(*data_dirs_of(step)))
        if result.foreign == [name]:
            notes.append(f"{path}: not a folder mf_celldump made; left in place")
            continue
        text = result.describe(original_path)
        if text:
            notes.append(text)
    return notes


def clean_processed_dir(folder: str) -> None:
    """Delete our temporary files a killed run left in ``_processed/`` (we hold the rank's lock)."""
    try:
        fsutil.check_plain_dir(folder)
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for entry in entries:
        if fsutil.is_temp_name(entry.name) and _deletable(entry, {}):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def remove_kbk_csvs(csv_paths: List[str], kbk_root: str) -> List[str]:
    """Delete consumed ``statistic.csv`` files, then their folders up to ``kbk_root`` once empty.

    Returns the files left because they have another name (hard link) elsewhere.
    """
    refused = []
    for path in csv_paths:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            refused.append(path)
            continue
        os.unlink(path)
        folder = os.path.dirname(path)
        while folder.startswith(kbk_root + os.sep) and fsutil.remove_empty_dir(folder):
            folder = os.path.dirname(folder)
    return refused
