"""Statistics of one ``.npy`` file in a single streaming pass, with memory bounded by a chunk.

A small file is read in one call, a large one chunk by chunk into one buffer; both go
through ``statistics.StatsAccumulator`` (the capture side uses it too, so host-computed
and file-computed numbers agree), so memory does not grow with tensor size (an mmap
would: its pages count as resident memory). Only plain numeric arrays are read: no
pickled objects, strings, complex or datetime values, and the header's size must
match the file's, so a header claiming a trillion elements costs nothing.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, Optional, Tuple

import numpy as np
from numpy.lib import format as npformat

from mf_celldump.errors import NpyReadError
from mf_celldump.statistics import SUPPORTED_KINDS, StatsAccumulator

CHUNK_BYTES = 8 << 20
HEAD_BYTES = 64 << 10  # first read: header plus the whole data of a small file
_MAGIC = b"\x93NUMPY"
_HEADER_RE = re.compile(
    r"^\{'descr': '([<>|=]?[a-zA-Z]\d*)', 'fortran_order': (True|False), "
    r"'shape': \(((?:\d+, ?)*\d*)\), \} *\n$"
)


@dataclass(frozen=True)
class NpyHeader:
    dtype: np.dtype
    shape: Tuple[int, ...]
    fortran_order: bool
    data_offset: int

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize


def _numpy_header(handle, path: str) -> NpyHeader:
    """numpy's own header parser (any valid .npy file)."""
    try:
        version = npformat.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(handle)
        elif version == (2, 0):
            shape, fortran, dtype = npformat.read_array_header_2_0(handle)
        else:
            raise ValueError(f"unsupported .npy format version {version}")
    except (ValueError, OSError, SyntaxError, EOFError, TypeError) as err:
        raise NpyReadError(f"{path}: not a readable .npy file ({err})") from None
    if dtype.hasobject:
        raise NpyReadError(f"{path}: holds Python objects; such files are never loaded (no pickles)")
    return NpyHeader(dtype, tuple(shape), bool(fortran), handle.tell())


def _check_header(header: NpyHeader, path: str, file_size: int) -> NpyHeader:
    """Refuse what no capture writes: non-numeric data, or a header that disagrees with the file size."""
    if header.dtype.kind not in SUPPORTED_KINDS or header.dtype.fields is not None:
        raise NpyReadError(f"{path}: holds {header.dtype} values; a raw tensor holds bool, integer or "
                           "floating-point numbers")
    present = file_size - header.data_offset
    if present < header.nbytes:
        raise NpyReadError(f"{path}: truncated .npy file ({max(present, 0)} of {header.nbytes} data bytes present)")
    if present > header.nbytes:
        raise NpyReadError(f"{path}: {present - header.nbytes} bytes after the {header.nbytes} data bytes its "
                           "header declares; not written by a capture")
    return header


def _fast_header(head: bytes) -> Optional[NpyHeader]:
    """Parse the header numpy itself writes without ``literal_eval`` (a quarter of the per-file cost).

    Anything unusual returns None and goes through numpy's parser.
    """
    if len(head) < 10 or not head.startswith(_MAGIC):
        return None
    major = head[6]
    if major == 1:
        size, start = int.from_bytes(head[8:10], "little"), 10
    elif major == 2:
        size, start = int.from_bytes(head[8:12], "little"), 12
    else:
        return None
    if len(head) < start + size:
        return None
    match = _HEADER_RE.match(head[start : start + size].decode("latin1"))
    if match is None:
        return None
    dtype = _dtype(match.group(1))
    if dtype is None:
        return None
    shape = tuple(int(d) for d in match.group(3).split(",") if d.strip())
    return NpyHeader(dtype, shape, match.group(2) == "True", start + size)


def _dtype(descr: str) -> Optional[np.dtype]:
    try:
        dtype = np.dtype(descr)
    except TypeError:
        return None
    return None if dtype.hasobject or dtype.fields is not None else dtype


def read_header(handle, path: str, head: bytes = b"") -> NpyHeader:
    """Parse and check the header; a file that is not a plain numeric ``.npy`` raises NpyReadError."""
    header = _fast_header(head) if head else None
    if header is None:
        handle.seek(0)
        header = _numpy_header(handle, path)
    return _check_header(header, path, os.fstat(handle.fileno()).st_size)


SMALL_LIMIT_BYTES = 4096  # a non-tensor value travels as a one-element tensor


def load_small(handle, path: str) -> np.ndarray:
    """The one-element array (a non-tensor value stored as a scalar tensor) in the open ``handle``."""
    head = handle.read(HEAD_BYTES) or b""
    header = read_header(handle, path, head)
    if header.nbytes > SMALL_LIMIT_BYTES or header.size != 1:
        raise NpyReadError(f"{path}: expected a single value for a non-tensor capture, got shape {header.shape}")
    data = head[header.data_offset : header.data_offset + header.nbytes]
    return np.frombuffer(data, dtype=header.dtype).reshape(header.shape)


def file_statistics(handle, path: str, wanted: Iterable[str]) -> Tuple[str, Tuple[int, ...], Dict[str, object]]:
    """(numpy dtype name, shape, statistics) of the array in the open ``handle``, in one pass over its data.

    ``path`` only names the file in messages; the data is read from ``handle`` (opened by
    the caller with its checks), never by name.
    """
    wanted = tuple(wanted)
    head = handle.read(HEAD_BYTES) or b""
    header = read_header(handle, path, head)
    if header.fortran_order:
        stats = _fortran_statistics(handle, header, wanted)
    elif header.nbytes <= CHUNK_BYTES:
        have = memoryview(head)[header.data_offset : header.data_offset + header.nbytes]
        if len(have) < header.nbytes:
            handle.seek(header.data_offset + len(have))
            data = bytes(have) + _read_exact(handle, header.nbytes - len(have), path, header.nbytes)
        else:
            data = have
        array = np.frombuffer(data, dtype=header.dtype).reshape(header.shape)
        stats = StatsAccumulator(header.dtype, wanted).add(array).result()
    else:
        handle.seek(header.data_offset)
        stats = _combine(_stream_chunks(handle, header, path), header, wanted)
    return header.dtype.name, header.shape, stats


def _read_exact(handle, count: int, path: str, total: int) -> bytes:
    data = handle.read(count) or b""
    while len(data) < count:
        more = handle.read(count - len(data))
        if not more:
            present = total - count + len(data)
            raise NpyReadError(f"{path}: truncated .npy file ({present} of {total} data bytes present)")
        data += more
    return data


def stream_chunks(handle, header: NpyHeader, path: str) -> Iterator[np.ndarray]:
    """The data of a C-ordered file, from its data offset, in chunks of at most ``CHUNK_BYTES``
    (each chunk is a view of one buffer the next chunk overwrites)."""
    handle.seek(header.data_offset)
    return _stream_chunks(handle, header, path)


def _stream_chunks(handle, header: NpyHeader, path: str) -> Iterator[np.ndarray]:
    itemsize = header.dtype.itemsize
    per_chunk = max(1, CHUNK_BYTES // itemsize) * itemsize
    buffer = bytearray(per_chunk)
    view = memoryview(buffer)
    remaining = header.nbytes
    while remaining > 0:
        want = min(per_chunk, remaining)
        got = 0
        while got < want:
            n = handle.readinto(view[got:want])
            if not n:
                raise NpyReadError(
                    f"{path}: truncated .npy file ({header.nbytes - remaining + got} of "
                    f"{header.nbytes} data bytes present)"
                )
            got += n
        remaining -= want
        yield np.frombuffer(buffer, dtype=header.dtype, count=want // itemsize)


def _fortran_statistics(handle, header: NpyHeader, wanted: Tuple[str, ...]) -> Dict[str, object]:
    """Fortran-ordered files (capture never writes them): C-ordered slabs along the first axis.

    The map is made from the open handle, so the file read is the one that was checked.
    """
    if header.nbytes == 0:
        empty = np.zeros(header.shape, dtype=header.dtype)
        return StatsAccumulator(header.dtype, wanted).add(empty).result()
    array = np.memmap(handle, dtype=header.dtype, mode="r", offset=header.data_offset, shape=header.shape,
                      order="F")
    if array.nbytes <= CHUNK_BYTES:
        return StatsAccumulator(array.dtype, wanted).add(np.ascontiguousarray(array)).result()

    def slabs() -> Iterator[np.ndarray]:
        row = max(1, array[0].nbytes)
        step = max(1, CHUNK_BYTES // row)
        for start in range(0, array.shape[0], step):
            yield np.ascontiguousarray(array[start : start + step]).ravel()

    return _combine(slabs(), header, wanted)


def _combine(chunks: Iterator[np.ndarray], header: NpyHeader, wanted: Tuple[str, ...]) -> Dict[str, object]:
    """Statistics of a large array from its chunks (converted to native byte order)."""
    native = header.dtype.newbyteorder("=") if header.dtype.byteorder not in ("=", "|") else None
    accumulator = StatsAccumulator(native or header.dtype, wanted)
    for chunk in chunks:
        accumulator.add(chunk.astype(native) if native is not None else chunk)
    return accumulator.result()
