"""Turning file-system failures of a step into one message: what, where, and for a full disk how much.

A full disk (``ENOSPC``), an exhausted quota (``EDQUOT``) or a file-size limit
(``EFBIG``) while a step's output is written keeps the raw data; the message says where
space is missing, about how much the step needs there and how much is free, so a re-run
after freeing space finishes the step.
"""

from __future__ import annotations

import errno
import os
from typing import Iterable, Optional

SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# Per output: three JSON files, the folders, the processed marker; per tensor file a directory entry.
FIXED_OVERHEAD_BYTES = 64 << 10
PER_FILE_BYTES = 256


def is_space_error(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in SPACE_ERRNOS


def free_bytes(path: str) -> Optional[int]:
    """Bytes an unprivileged writer may still use on the file system of ``path`` (None if unknown)."""
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        info = os.statvfs(path or ".")
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def needed_bytes(text_chunks: Iterable[str], files: int, copied_bytes: int = 0) -> int:
    """About how much a step's output takes: its JSON text, directory entries, copies, a margin."""
    text = sum(len(chunk.encode("utf-8")) for chunk in text_chunks)
    return text + files * PER_FILE_BYTES + copied_bytes + FIXED_OVERHEAD_BYTES


def human(size: int) -> str:
    value = float(size)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} bytes"


def space_problem(err: OSError, where: str, needed: int) -> str:
    """The message for a step whose output did not fit."""
    free = free_bytes(where)
    free_text = "unknown" if free is None else human(free)
    what = "a file-size limit (ulimit -f) was reached" if err.errno == errno.EFBIG else \
        f"no space left ({os.strerror(err.errno)})"
    return (f"{what} while writing {err.filename or where}: this step's output needs about {human(needed)} "
            f"on the file system of {where} ({free_text} free now); the raw data is kept: free space and run "
            "`mf-celldump process` again")


def os_problem(err: OSError, doing: str) -> str:
    """A short message for any other file-system failure, naming the path and what was being done."""
    target = err.filename or ""
    if err.filename2:
        target = f"{target} -> {err.filename2}"
    reason = err.strerror or str(err)
    hint = ""
    if err.errno in (errno.EACCES, errno.EPERM):
        hint = " (check the owner and permissions; the dump may belong to another user)"
    elif err.errno == errno.EROFS:
        hint = " (the file system is read-only)"
    return f"{doing}: {reason}: {target}{hint}; the raw data is kept" if target else \
        f"{doing}: {reason}{hint}; the raw data is kept"
