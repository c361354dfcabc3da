"""The work done on each raw file: statistics or value, and linking it into the output.

A task is small and picklable and its result is a small tuple, so tasks can run in
worker processes (``worker_pool``) as cheaply as in this one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Sequence, Tuple

from mf_celldump.fsutil import link_or_copy
from mf_celldump.processing.errors import NpyReadError
from mf_celldump.processing.npystats import file_statistics, load_small
from mf_celldump.rawformat.keys import KIND_NONE, KIND_TENSOR, scalar_of_kind

OK = "ok"
FAILED = "failed"


class FileTask(NamedTuple):
    """One raw file: its name in the step folder, its output name (or None), what it holds."""

    index: int
    name: str
    out_name: Optional[str]
    kind: str


@dataclass(frozen=True)
class Folders:
    """Where a chunk's files are read from and linked to (sent once per chunk, not per file)."""

    src: str
    dst: Optional[str]


# (index, status, dtype or message, shape, stats or value)
FileResult = Tuple[int, str, str, Optional[Tuple[int, ...]], object]


def run_one(task: FileTask, wanted: Tuple[str, ...], folders: Folders) -> FileResult:
    """Process one file; any failure becomes a FAILED result naming the file, never an exception."""
    src = os.path.join(folders.src, task.name)
    try:
        if task.kind == KIND_TENSOR:
            dtype, shape, stats = file_statistics(src, wanted)
            if task.out_name is not None and folders.dst is not None:
                link_or_copy(src, os.path.join(folders.dst, task.out_name))
            return (task.index, OK, dtype, shape, stats)
        if task.kind == KIND_NONE:
            return (task.index, OK, "", None, None)
        array = load_small(src)
        return (task.index, OK, array.dtype.name, tuple(array.shape), scalar_of_kind(task.kind, array))
    except (NpyReadError, OSError, ValueError, MemoryError) as err:
        text = str(err)[:500]
        if src not in text:
            text = f"{src}: {text}"
        return (task.index, FAILED, text, None, None)


def run_chunk(tasks: Sequence[FileTask], wanted: Tuple[str, ...], folders: Folders) -> List[FileResult]:
    return [run_one(task, wanted, folders) for task in tasks]
