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

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Union

from mf_celldump.errors import UnsafePathError

logger = logging.getLogger(__name__)

DIR_MODE = 0o750
FILE_MODE = 0o640

_AT_FDCWD = -100
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_RENAME_EXCHANGE = 2
# errno values after which a hard link is replaced by a copy
_NO_LINK_ERRNOS = {errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES}


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


# Our temporary files: tempfile.mkstemp(prefix=TEMP_PREFIX) adds 8 characters of this set.
TEMP_PREFIX = ".tmp-"
_TEMP_RE = re.compile(r"^\.tmp-[a-z0-9_]{8}$")


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of our ``atomic_write_bytes`` temporary files (a killed run leaves them)."""
    return _TEMP_RE.match(name) is not None


def atomic_write_bytes(path: str, data: bytes, fsync: bool = True) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place.

    ``fsync=False`` skips the flush to stable storage: the file is still never seen
    half-written by a reader, but a power loss may lose it.
    """
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=folder)
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


def bytes_under(path: str) -> int:
    """Bytes of the regular files under ``path`` (links not followed); 0 when it does not exist."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                stat = os.lstat(os.path.join(folder, name))
            except OSError:
                continue
            total += stat.st_size if not os.path.islink(os.path.join(folder, name)) else 0
    return total


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
            f"{path} resolves to {real}, outside the dump folder {root_real}; refused (remove the symlink, "
            "or process the dump where it really is)"
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


def check_plain_dir(path: str) -> str:
    """Refuse ``path`` unless it is a real folder (not a symlink to one); a missing one is fine."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePathError(f"{path} exists and is not a plain folder (a symlink?); refused (move it away and "
                              "run again)")
    return path


def remove_empty_dir(path: str) -> bool:
    """Delete ``path`` if it is an empty real folder; True when it is gone."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def write_new_text(path: str, chunks: Iterable[str]) -> None:
    """Stream text chunks into a new file (memory stays at one chunk, not the whole file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    with os.fdopen(fd, "w", encoding="utf-8", buffering=1 << 20) as handle:
        for chunk in chunks:
            handle.write(chunk)


def link_or_copy(handle, src: str, dst: str) -> bool:
    """Put the raw file open as ``handle`` (checked by ``open_own_file``) at ``dst``: a hard link, else a copy.

    The raw file stays intact. Returns True when linked. The result has mode 0o640: for a
    link the shared inode is changed through ``handle``, which ``open_own_file`` has checked
    to be our own file (one link, inside the dump), so no file outside the dump can change.
    A link that turns out not to reach the inode we checked is undone and refused.
    """
    info = os.fstat(handle.fileno())
    if stat.S_IMODE(info.st_mode) != FILE_MODE:
        os.fchmod(handle.fileno(), FILE_MODE)
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError as err:
        if err.errno not in _NO_LINK_ERRNOS:
            raise
        _copy_from(handle, dst)
        return False
    linked = os.lstat(dst)
    if (linked.st_dev, linked.st_ino) != (info.st_dev, info.st_ino):
        os.unlink(dst)
        raise UnsafePathError(f"{src} changed while it was being read; refused (run again)")
    return True


def _copy_from(handle, dst: str) -> None:
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as out:
            handle.seek(0)
            shutil.copyfileobj(handle, out, 1 << 20)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(dst)
        raise


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


MAX_JSON_BYTES = 64 << 20  # a manifest of 100k cells is ~30 MB; markers are far smaller


def open_own_file(path: str, root_real: Optional[str], extra_links: Union[int, Mapping] = 0):
    """Open our own file at ``path`` for binary reading (unbuffered): a plain file inside the dump.

    Refused with an :class:`UnsafePathError` naming it: a symlink (``O_NOFOLLOW``), a file
    whose folder resolves outside ``root_real`` (None: the caller checked the folder), a
    FIFO/device/folder, or a file with more hard links than ours have: one, plus
    ``extra_links`` we made ourselves (a number, or a mapping (st_dev, st_ino) -> number).
    Another name of the same data may live outside the dump.
    """
    if root_real is not None:
        check_inside(root_real, os.path.dirname(path))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symbolic link where mf_celldump expects its own file; refused "
                                  "(replace the link by the file itself)") from None
        raise
    handle = os.fdopen(fd, "rb", buffering=0)
    try:
        info = os.fstat(fd)
        if not isinstance(extra_links, int):
            extra_links = extra_links.get((info.st_dev, info.st_ino), 0)
        check_own_file(info, path, extra_links)
    except BaseException:
        handle.close()
        raise
    return handle


def check_own_file(info: os.stat_result, path: str, extra_links: int = 0) -> None:
    """Refuse anything but a plain file with the links we expect (see ``open_own_file``)."""
    if not stat.S_ISREG(info.st_mode):
        raise UnsafePathError(f"{path} is not a plain file; refused")
    if info.st_nlink > 1 + extra_links:
        raise UnsafePathError(
            f"{path} has {info.st_nlink} hard links; a file mf_celldump wrote has one, so another name of "
            "this data may be outside the dump: refused (replace it by a copy if it is yours)")


def read_bytes_inside(path: str, root_real: str, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """Content of our own file at ``path`` (see ``open_own_file``), at most ``max_bytes``.

    A larger file is refused with a ValueError that names it; nothing is read beyond the limit.
    """
    with open_own_file(path, root_real) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_bytes:
            raise ValueError(f"{path}: {size} bytes, more than the {max_bytes} expected of this file")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path}: grew beyond {max_bytes} bytes while being read")
    return data


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


# What flock says when another process holds the lock.
_HELD_ERRNOS = (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES)


@dataclass
class FolderLock:
    """An exclusive ``flock`` on a lock file, so two processes never process the same rank together.

    The lock file is ours: it is opened with ``O_NOFOLLOW`` (a symlink in its place is
    refused, so nothing is created outside the dump) and must be a plain file with one
    link. ``release`` deletes it while still holding the lock, so a finished run leaves no
    lock file; an opener that raced with the deletion notices the file it locked is no
    longer the one at ``path`` and tries again.
    """

    path: str
    _handle: Optional[int] = field(default=None, repr=False)

    def acquire(self) -> bool:
        """True when locked; False when another process holds it. Unsafe lock files raise UnsafePathError."""
        for _ in range(10):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno in _HELD_ERRNOS:
                    return False
                # ENOLCK, ENOSYS, EINVAL...: the file system cannot lock, which is not "another process"
                raise OSError(err.errno, f"{self.path}: this file system cannot lock files ({err.strerror}); "
                              "process the dump from a file system that supports flock, or copy it to one") from None
            if self._still_at_path(fd):
                self._handle = fd
                return True
            os.close(fd)  # deleted by its previous holder meanwhile: lock the new one
        raise OSError(errno.EAGAIN, f"{self.path} keeps being replaced; run again")

    def _open(self) -> int:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, FILE_MODE)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise UnsafePathError(f"{self.path} is a symbolic link where mf_celldump keeps its lock file; "
                                      "refused (delete the link and run again)") from None
            raise
        try:
            check_own_file(os.fstat(fd), self.path)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _still_at_path(self, fd: int) -> bool:
        try:
            now = os.lstat(self.path)
        except FileNotFoundError:
            return False
        held = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def release(self, remove: bool = True) -> None:
        """Unlock; with ``remove`` the lock file is deleted first (only if it is still the one we hold)."""
        if self._handle is None:
            return
        fd, self._handle = self._handle, None
        try:
            if remove and self._still_at_path(fd):
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
