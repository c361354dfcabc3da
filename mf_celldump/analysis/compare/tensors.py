"""Load the tensor file a dump record names: ``.npy`` (MindSpore dumpers) or ``.pt`` (msprobe PyTorch).

Files are data from other people's clusters: ``.npy`` is read with ``allow_pickle=False``,
``.pt`` with ``torch.load(weights_only=True)`` (tensors only, no code); the name must be a
plain file name inside the rank folder's ``dump_tensor_data``, and neither the file nor
that folder may be a symlink (the only way a plain name could lead outside the dump): the
folder is checked when the path is made, the file when it is opened (``O_NOFOLLOW``, so
no check can go stale before the open).
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from typing import Any, Mapping, Optional

import numpy as np
from numpy.lib import format as npformat

from mf_celldump.errors import TensorFileError


class TensorFolder:
    """A rank folder's ``dump_tensor_data``: the tensor file a record names and its array. Whether the folder
    is a symlink is looked at once, when this is made (a comparison reads thousands of files from it)."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.is_link = os.path.islink(data_dir)

    def path(self, record: Mapping[str, Any]) -> Optional[str]:
        """Path of the record's tensor file, or None when the record names none (statistics task)."""
        name = record.get("data_name")
        if not isinstance(name, str) or not name or name == "-1":
            return None
        if os.sep in name or (os.altsep and os.altsep in name) or name in (".", ".."):
            raise TensorFileError(f"data_name {name!r}", "is not a plain file name")
        path = os.path.join(self.data_dir, name)
        if self.is_link:  # a plain name can only leave through a link (the file's own: see _open)
            raise TensorFileError(path, f"is inside a symlink; tensor files must be plain files inside {self.data_dir}")
        return path

    def load(self, record: Mapping[str, Any]) -> Optional[np.ndarray]:
        """The record's array, None when it names no file; :class:`TensorFileError` when it cannot be read."""
        path = self.path(record)
        return None if path is None else load(path)


def data_path(data_dir: str, record: Mapping[str, Any]) -> Optional[str]:
    """Path of the record's tensor file in ``data_dir``, or None when the record names none."""
    return TensorFolder(data_dir).path(record)


def _open(path: str):
    """(the file opened for reading, its size), refusing a symlink in the same system call (``O_NOFOLLOW``)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise TensorFileError(path, "missing") from None
    except OSError as err:
        if err.errno == errno.ELOOP or os.path.islink(path):
            raise TensorFileError(path, "is a symlink; tensor files must be plain files") from None
        raise
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):  # a folder or a device opens too
        os.close(fd)
        raise TensorFileError(path, "is not a regular file")
    return os.fdopen(fd, "rb", buffering=0), status.st_size


def _check_npy_size(path: str, handle) -> None:
    """Refuse an ``.npy`` whose header claims more data than the file holds, before anything is allocated
    (a header claiming 10**12 elements would otherwise end in MemoryError)."""
    version = npformat.read_magic(handle)
    if version not in ((1, 0), (2, 0)):
        return  # numpy's reader checks the rest
    read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
    shape, _, dtype = read(handle)  # numpy's own header parser: nothing allocated for the data
    declared = math.prod(shape) * dtype.itemsize
    present = os.fstat(handle.fileno()).st_size - handle.tell()
    if present != declared and not dtype.hasobject:
        raise TensorFileError(path, _size_mismatch(declared, present, shape, dtype))


def _size_mismatch(declared: int, present: int, shape: tuple, dtype: np.dtype) -> str:
    return (f"its header declares {declared} data bytes ({'x'.join(map(str, shape))} {dtype}), "
            f"the file holds {max(present, 0)}; not a whole tensor file")


def load(path: str) -> np.ndarray:
    """The array in ``path``; bfloat16 and other torch-only dtypes come back as float32."""
    try:
        handle, size = _open(path)
        with handle:
            if path.endswith(".pt"):
                return _load_pt(path, handle)
            array = _load_npy(path, handle, size)
    except TensorFileError:
        raise
    except (OSError, ValueError, EOFError, SyntaxError, TypeError) as err:
        raise TensorFileError(path, f"unreadable: {err}") from None
    except MemoryError:
        raise TensorFileError(path, "too large for the memory available") from None
    if array.dtype.kind not in "biuf":
        raise TensorFileError(path, f"holds {array.dtype} values, not numbers")
    return array


# The header of a version 1-3 .npy file holding a plain array of numbers, as numpy writes it
# (numpy/lib/format.py: a dict literal with descr, fortran_order, shape).
_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER = re.compile(
    r"^\{'descr': '([<>|=][biuf][0-9]+)', 'fortran_order': (True|False), 'shape': \(([0-9, ]*)\), \} *\n$"
)


def _load_npy(path: str, handle, size: int) -> np.ndarray:
    """A .npy file of numbers, its header parsed by a regular expression (numpy's own parser evaluates
    it as a Python literal, the larger part of the time for small tensors) and its data read straight
    into the array; any other header goes to ``np.load(allow_pickle=False)``. Nothing is ever unpickled."""
    prefix = handle.read(10)
    if len(prefix) == 10 and prefix[:6] == _NPY_MAGIC and prefix[6] == 1:
        header = int.from_bytes(prefix[8:10], "little")
        match = _NPY_HEADER.match(handle.read(header).decode("latin1"))
        if match:
            descr, fortran, dims = match.groups()
            shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
            dtype = np.dtype(descr)
            declared = math.prod(shape) * dtype.itemsize
            present = size - 10 - header
            if present != declared:  # checked before anything is allocated
                raise TensorFileError(path, _size_mismatch(declared, present, shape, dtype))
            array = np.empty(shape, dtype=dtype, order="F" if fortran == "True" else "C")
            view = memoryview(array.reshape(-1, order="A")).cast("B")
            got = 0
            while got < declared:  # a raw read may return less than asked
                chunk = handle.readinto(view[got:])
                if not chunk:
                    raise ValueError(f"{declared} data bytes expected, {got} found")
                got += chunk
            return array
    handle.seek(0)
    _check_npy_size(path, handle)
    handle.seek(0)
    return np.load(handle, allow_pickle=False)


def _load_pt(path: str, handle) -> np.ndarray:
    try:
        import torch
    except ImportError:
        raise TensorFileError(path, "reading PyTorch .pt files needs torch installed") from None
    try:
        value = torch.load(handle, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for a bad file; all mean "unreadable"
        raise TensorFileError(path, f"unreadable: {type(err).__name__}: {err}") from None
    if not isinstance(value, torch.Tensor):
        raise TensorFileError(path, f"holds {type(value).__name__}, not a tensor")
    if value.dtype in (torch.bfloat16, torch.float16) or not value.dtype.is_floating_point:
        value = value.float() if value.dtype.is_floating_point else value
    return value.detach().cpu().numpy()
