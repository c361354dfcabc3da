"""The work done on each raw file: statistics or value, and linking it into the output.

A task is small and picklable and its result is a small tuple, so tasks can run in
worker processes (``worker_pool``) as cheaply as in this one. Each file is opened once,
without following a symlink, and checked to be our own (a plain file with one link, or
with the links a killed run of ours made into the output); everything after that reads
and links through the open file, so no name in the dump can make us read or change a
file outside it.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from mf_celldump.errors import NpyReadError, UnsafePathError
from mf_celldump.fsutil import link_or_copy, open_own_file
from mf_celldump.processing.npystats import file_statistics, load_small
from mf_celldump.processing.part_sums import sum_files
from mf_celldump.rawformat.keys import KIND_NONE, KIND_TENSOR, scalar_of_kind
from mf_celldump.rawformat.names import parse_raw_tensor_name

OK = "ok"
FAILED = "failed"


class FileTask(NamedTuple):
    """One raw file: its name in the step folder, its output name (or None), what it holds; ``parts``:
    more raw files summed with it into a new output file (a gradient in per-consumer parts)."""

    index: int
    name: str
    out_name: Optional[str]
    kind: str
    parts: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Folders:
    """Where a chunk's files are read from and linked to (sent once per chunk, not per file).

    ``our_links`` counts, per (device, inode), the names an earlier, killed run of ours
    gave a raw file inside the existing output of this step: those links are expected.
    """

    src: str
    dst: Optional[str]
    our_links: Dict[Tuple[int, int], int] = field(default_factory=dict)


# (index, status, dtype or message, shape, stats or value); a FAILED result carries the errno (or 0)
FileResult = Tuple[int, str, str, Optional[Tuple[int, ...]], object]


def run_one(task: FileTask, wanted: Tuple[str, ...], folders: Folders) -> FileResult:
    """Process one file; any failure becomes a FAILED result naming the file, never an exception."""
    src = os.path.join(folders.src, task.name)
    try:
        if task.kind == KIND_NONE:
            return (task.index, OK, "", None, None)
        if task.parts:
            out = os.path.join(folders.dst, task.out_name) if task.out_name and folders.dst else None
            paths = [src] + [os.path.join(folders.src, name) for name in task.parts]
            parsed = parse_raw_tensor_name(task.name)
            bfloat16 = parsed is not None and parsed.numpy_dtype == "bfloat16"
            return (task.index, OK) + sum_files(paths, out, wanted, bfloat16, folders.our_links)
        with open_own_file(src, None, folders.our_links) as handle:
            if task.kind == KIND_TENSOR:
                dtype, shape, stats = file_statistics(handle, src, wanted)
                if task.out_name is not None and folders.dst is not None:
                    link_or_copy(handle, src, os.path.join(folders.dst, task.out_name))
                return (task.index, OK, dtype, shape, stats)
            array = load_small(handle, src)
        return (task.index, OK, array.dtype.name, tuple(array.shape), scalar_of_kind(task.kind, array))
    except MemoryError:
        return (task.index, FAILED, f"{src}: out of memory while reading it", None, errno.ENOMEM)
    except (NpyReadError, UnsafePathError, OSError, ValueError) as err:
        text = str(err)[:500]
        if src not in text:
            text = f"{src}: {text}"
        return (task.index, FAILED, text, None, getattr(err, "errno", None) or 0)


def run_chunk(tasks: Sequence[FileTask], wanted: Tuple[str, ...], folders: Folders) -> List[FileResult]:
    return [run_one(task, wanted, folders) for task in tasks]
