"""Raw ``.npy`` files written fast, byte for byte as ``np.save`` or MindSpore's TensorDump writes them.

A raw tensor file is one header and the array's bytes. Writing it costs one ``open``,
one ``writev`` of both parts (no copy of the data into a buffer first), and the rename
that keeps a half-written file from ever carrying its final name. Headers repeat (a
network's tensors have few shapes), so they are built once per (dtype, shape, order).

Two header spellings exist:

* ``numpy_header``: what ``np.save`` writes (numpy's own ``write_array_header_1_0``,
  or ``_2_0`` when the header does not fit 1.0, as ``np.save`` chooses).
* ``tensordump_header``: what ``ops.TensorDump`` writes. MindSpore builds its header
  itself (``mindspore/ccsrc/debug/data_dump/npy_header.cc`` ``GenerateNpyHeader``):
  shape as ``(2,3,4,)`` (every dimension followed by a comma, no spaces), padded with
  spaces to ``64 - total % 64`` (a full 64 when already aligned) and a newline, version
  2.0 only above 65535 bytes. Checked on MindSpore 2.9 (CPU) against the op itself
  (``tests/test_rawformat.py``). bfloat16 data is written as float32 (the name keeps
  ``bfloat16``).
"""

from __future__ import annotations

import functools
import io
import itertools
import os
from typing import List, Tuple

import numpy as np

from mf_celldump.fsutil import FILE_MODE, TEMP_PREFIX

_ALIGN = 64
_MAGIC = b"\x93NUMPY"
_OPEN_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _fortran_only(array: np.ndarray) -> bool:
    """numpy saves such an array with ``fortran_order: True`` and its data in Fortran order."""
    return bool(array.flags.f_contiguous and not array.flags.c_contiguous)


@functools.lru_cache(maxsize=4096)
def _numpy_header(descr, fortran: bool, shape: Tuple[int, ...]) -> bytes:
    fields = {"descr": descr, "fortran_order": fortran, "shape": shape}
    buffer = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(buffer, fields)
    except ValueError:  # too large for version 1.0: np.save takes 2.0 then
        buffer = io.BytesIO()
        np.lib.format.write_array_header_2_0(buffer, fields)
    return buffer.getvalue()


def numpy_header(array: np.ndarray) -> bytes:
    """The header ``np.save(file, array)`` writes."""
    return _numpy_header(np.lib.format.dtype_to_descr(array.dtype), _fortran_only(array), tuple(array.shape))


@functools.lru_cache(maxsize=4096)
def _tensordump_header(descr: str, shape: Tuple[int, ...]) -> bytes:
    dims = "".join(f"{d}," for d in shape)
    text = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }"
    version, length_bytes = b"\x01\x00", 2
    total = len(_MAGIC) + 2 + length_bytes + len(text) + 1
    if total > 65535:
        version, length_bytes = b"\x02\x00", 4
        total = len(_MAGIC) + 2 + length_bytes + len(text) + 1
    pad = _ALIGN - total % _ALIGN
    length = (len(text) + pad + 1).to_bytes(length_bytes, "little")
    return _MAGIC + version + length + text.encode("latin1") + b" " * pad + b"\n"


def tensordump_header(array: np.ndarray) -> bytes:
    """The header MindSpore's TensorDump writes for ``array`` (its data always in C order)."""
    return _tensordump_header(np.lib.format.dtype_to_descr(array.dtype), tuple(array.shape))


def numpy_data(array: np.ndarray) -> memoryview:
    """The bytes ``np.save`` writes after the header: Fortran order for a Fortran-only array, else C order."""
    return c_order_data(array.T) if _fortran_only(array) else c_order_data(array)


def c_order_data(array: np.ndarray) -> memoryview:
    """The array's bytes in C order (what TensorDump writes); no copy when it is C-contiguous."""
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    return memoryview(array.reshape(-1)).cast("B")


class NpyFileWriter:
    """Writes whole files under a temporary name, then renames them into place (one instance per thread)."""

    def __init__(self):
        self._names = itertools.count()

    def write(self, path: str, parts: List) -> None:
        """``parts`` (bytes-like) written in order to ``path``, which appears only once complete."""
        folder = os.path.dirname(path) or "."
        while True:
            tmp = os.path.join(folder, f"{TEMP_PREFIX}{next(self._names) % 16**8:08x}")
            try:
                fd = os.open(tmp, _OPEN_FLAGS, FILE_MODE)
                break
            except FileExistsError:  # left by a killed run (processing deletes it): take the next name
                continue
        try:
            try:
                os.fchmod(fd, FILE_MODE)  # whatever the umask
                _write_all(fd, parts)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def _write_all(fd: int, parts: List) -> None:
    views = [memoryview(part).cast("B") for part in parts]
    views = [view for view in views if view.nbytes]
    while views:
        written = os.writev(fd, views)
        while views and written >= views[0].nbytes:
            written -= views[0].nbytes
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]
