"""File-system rules every writer follows: stay inside the dump root, 0o750/0o640, atomic.

Dump folders hold data from other people's clusters, so a name read from a file or
derived from a cell never decides where something is written: every path is a checked
child of the resolved dump folder (no ``..``, no separators, no symlink leading out).
Folders are created 0o750 and files 0o640. Output is assembled under a temporary name
and swapped into place in one rename; raw data is renamed away before it is deleted,
so a run killed at any moment leaves either the old or the new state. Capture and
processing both use this module.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

logger = logging.getLogger(__name__)

DIR_MODE = 0o750
FILE_MODE = 0o640

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
# errno values after which a hard link is replaced by a copy
_NO_LINK_ERRNOS = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES}


class UnsafePathError(ValueError):
    """A name or symlink would place a file outside the dump folder."""


def safe_join(root: str, *parts: str) -> str:
    """``root/part/...`` after checking each part is one component and the result stays in ``root``."""
    path = root
    for part in parts:
        path = os.path.join(path, check_component(part))
    return check_inside(os.path.realpath(root), path)


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


def check_component(name: str) -> str:
    """Refuse a name that is not exactly one path component inside its folder."""
    if (
        not name
        or name in (".", "..")
        or "/" in name
        or "\0" in name
        or (os.altsep is not None and os.altsep in name)
    ):
        raise UnsafePathError(
            f"refusing file or folder name {name!r}: it must be one path component "
            "(check the cell names in manifest.json)"
        )
    return name


def check_inside(root_real: str, path: str) -> str:
    """Return ``path`` if it resolves inside ``root_real`` (symlinks followed); raise otherwise."""
    real = os.path.realpath(path)
    if real != root_real and not real.startswith(root_real + os.sep):
        raise UnsafePathError(
            f"{path} resolves to {real}, outside the dump folder {root_real}; "
            "remove the symlink or process the dump where it really is"
        )
    return path


def child(root_real: str, parent: str, name: str) -> str:
    """``parent/name`` after checking ``name`` and that the result stays in the dump folder."""
    return check_inside(root_real, os.path.join(parent, check_component(name)))


def make_dir(path: str) -> str:
    """Create one folder 0o750 (an existing real folder is fine, a symlink is not)."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if os.path.islink(path) or not os.path.isdir(path):
            raise UnsafePathError(
                f"{path} exists and is not a plain folder; move it away and re-run"
            ) from None
    return path


def write_new_text(path: str, chunks: Iterable[str]) -> None:
    """Stream text chunks into a new file (memory stays at one chunk, not the whole file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8", buffering=1 << 20) as handle:
        for chunk in chunks:
            handle.write(chunk)


def link_or_copy(src: str, dst: str) -> bool:
    """Hard-link ``src`` as ``dst`` (the raw file stays intact), copying when linking is impossible.

    Returns True when linked. The result has mode 0o640 (for a link this is the shared inode).
    """
    try:
        os.link(src, dst, follow_symlinks=False)
        linked = True
    except OSError as err:
        if err.errno not in _NO_LINK_ERRNOS:
            raise
        shutil.copyfile(src, dst, follow_symlinks=False)
        linked = False
    os.chmod(dst, FILE_MODE)
    return linked


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths with Linux ``renameat2(RENAME_EXCHANGE)``; False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):
        return False
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if func(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(code, f"cannot swap {a} and {b}: {os.strerror(code)}")


def swap_into_place(new_dir: str, target: str, retired: str) -> None:
    """Make ``new_dir`` appear at ``target``; an older ``target`` is replaced and then deleted.

    With a previous output present the two folders are exchanged in one atomic rename
    where the kernel supports it; elsewhere the old one is renamed to ``retired`` first
    (a run killed between the two renames leaves the raw data, so re-running redoes it).
    """
    if not os.path.lexists(target):
        os.rename(new_dir, target)
        return
    if os.path.islink(target) or not os.path.isdir(target):
        raise UnsafePathError(f"{target} exists and is not a plain folder; move it away and re-run")
    if _exchange(new_dir, target):
        remove_tree(new_dir)
        return
    remove_tree(retired)
    os.rename(target, retired)
    os.rename(new_dir, target)
    remove_tree(retired)


def remove_tree(path: str) -> None:
    """Delete a folder we created or retired (never following symlinks); a missing one is fine."""
    if os.path.islink(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def retire_and_remove(path: str, removing: str) -> None:
    """Rename ``path`` to ``removing`` in one step, then delete it: no half-deleted ``path`` is ever seen."""
    if os.path.lexists(path):
        remove_tree(removing)
        os.rename(path, removing)
    remove_tree(removing)


MAX_JSON_BYTES = 256 << 20  # manifests and markers are far smaller; refuse to load more


def read_bytes_inside(path: str, root_real: str, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """Content of our own file at ``path``: a plain file inside ``root_real``, never through a link.

    A symlink (``O_NOFOLLOW``), a folder or device, a file whose folder resolves outside
    the dump, or a file larger than ``max_bytes`` is refused with an OSError/ValueError
    that names it.
    """
    check_inside(root_real, os.path.dirname(path))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path}: not a plain file")
        if info.st_size > max_bytes:
            raise ValueError(f"{path}: {info.st_size} bytes, more than the {max_bytes} expected of this file")
        return handle.read(max_bytes + 1)[:max_bytes]


def read_json_inside(path: str, root_real: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parse our own JSON file (see ``read_bytes_inside``); bad JSON raises ValueError."""
    return json.loads(read_bytes_inside(path, root_real, max_bytes))


def writable_dir_problem(path: str, create: bool) -> Optional[str]:
    """Why ``path`` cannot serve as a dump folder (None when it can); creates it when ``create``."""
    if create:
        try:
            os.makedirs(path, mode=DIR_MODE, exist_ok=True)
        except OSError as err:
            return f"{path!r} cannot be created: {err.strerror}"
    elif not os.path.exists(path):
        return None
    if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
        return f"{path!r} is not a writable directory"
    return None


@dataclass
class FolderLock:
    """An exclusive ``flock`` on a file, so two processes never process the same rank together."""

    path: str
    _fd: Optional[int] = field(default=None, repr=False)

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
