"""File-system rules every writer follows: stay inside the dump root, 0o750/0o640, atomic.

Dump folders hold data from other people's clusters, so a name read from a file or
derived from a cell never decides where something is written: every path is joined
here, checked for ``..``/absolute parts, and resolved to make sure no symlink leads
out of the root.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

DIR_MODE = 0o750
FILE_MODE = 0o640


class UnsafePathError(ValueError):
    """A path would leave the dump root."""


def safe_join(root: str, *parts: str) -> str:
    """Join ``parts`` under ``root``; refuse ``..``, absolute parts and symlink escapes."""
    for part in parts:
        if not part or os.path.isabs(part) or any(p in ("..",) for p in part.replace("\\", "/").split("/")):
            raise UnsafePathError(f"refusing path component {part!r} under {root}: it would leave the root")
    path = os.path.join(root, *parts)
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root + os.sep):
        raise UnsafePathError(f"{path} resolves to {real}, outside the dump root {real_root}")
    return path


def ensure_dir(path: str) -> str:
    """Create ``path`` (and parents) with mode 0o750; an existing folder is kept as is."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    return path


def atomic_write_bytes(path: str, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place.

    ``fsync=False`` skips the flush to stable storage: the file is still never seen
    half-written by a reader, but a power loss may lose it.
    """
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if fsync:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str, value: Any, indent: int = 1) -> None:
    atomic_write_bytes(path, json.dumps(value, indent=indent).encode("utf-8"))


def open_append(path: str):
    """Open ``path`` for appending text lines (created 0o640)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    return os.fdopen(fd, "a", encoding="utf-8", buffering=1)
