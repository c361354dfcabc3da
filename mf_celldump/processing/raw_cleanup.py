"""Deleting consumed raw data and what a killed run of ours left: only files we wrote.

A consumed raw step folder is renamed to ``.step{N}.removing`` in one step (so no run
ever sees a half-deleted step folder), then the files capture wrote are deleted from it
(names that ``scan.is_ours`` recognises, links included, never followed). Files we did
not write stay: the folder then gets its name back holding just them, and the scanner
skips it from then on as "no capture data". A run killed meanwhile leaves the
``.removing`` folder, which the next run finishes the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from typing import List, Optional

from mf_celldump import fsutil
from mf_celldump.rawformat import names
from mf_celldump.rawformat.scan import is_ours

logger = logging.getLogger(__name__)


def remove_raw_step(rank_dir: str, raw_dir: str) -> List[str]:
    """Delete our files of a consumed raw step folder; returns the names of the files left in place."""
    name = os.path.basename(raw_dir)
    removing = os.path.join(rank_dir, names.removing_dir_name(name))
    if os.path.lexists(removing):
        finish_removal(removing, None)
    if os.path.lexists(raw_dir):
        os.rename(raw_dir, removing)
    return finish_removal(removing, raw_dir)


def finish_removal(removing: str, original: Optional[str]) -> List[str]:
    """Delete our files in a ``.removing`` folder; what is left goes back to ``original`` (if free).

    Returns the names left. A symlink in place of the folder is only unlinked.
    """
    try:
        info = os.lstat(removing)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(removing)  # not a folder of ours: a link in its place (inside the dump) goes, its target stays
        return []
    left = []
    with os.scandir(removing) as entries:
        for entry in entries:
            if is_ours(entry.name) and not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
            else:
                left.append(entry.name)
    if not left:
        os.rmdir(removing)
        return []
    if original is not None and not os.path.lexists(original):
        os.rename(removing, original)
    else:
        logger.warning("%s: kept, it holds files mf_celldump did not write: %s", removing, ", ".join(sorted(left)))
    return sorted(left)


def clean_leftovers(rank_dir: str) -> List[str]:
    """Finish removals a killed run left (``.step{N}.removing`` folders); returns what is said about them."""
    notes = []
    with os.scandir(rank_dir) as entries:
        found = [e.name for e in entries if names.is_removing_dir_name(e.name)]
    for name in sorted(found):
        original = name[1 : -len(".removing")]
        if names.parse_step_dir_name(original) is None:
            continue  # not a name we give
        left = finish_removal(os.path.join(rank_dir, name), os.path.join(rank_dir, original))
        if left:
            notes.append(f"{os.path.join(rank_dir, original)}: kept with files mf_celldump did not write "
                         f"({', '.join(left[:5])})")
    return notes


def clean_processed_dir(folder: str) -> None:
    """Delete our temporary files a killed run left in ``_processed/`` (we hold the rank's lock)."""
    try:
        fsutil.check_plain_dir(folder)
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return
    for entry in entries:
        if fsutil.is_temp_name(entry.name) and not entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def remove_kbk_csvs(csv_paths: List[str], kbk_root: str) -> None:
    """Delete consumed ``statistic.csv`` files, then their folders up to ``kbk_root`` once empty."""
    for path in csv_paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        folder = os.path.dirname(path)
        while folder.startswith(kbk_root + os.sep) and fsutil.remove_empty_dir(folder):
            folder = os.path.dirname(folder)
