"""Statistics of one ``.npy`` file in a single streaming pass, with memory bounded by a chunk.

A small file is read in one call and handed to the shared ``compute_statistics`` (the
capture side uses it too, so host-computed and file-computed numbers agree). A large
file is read chunk by chunk into one buffer and the statistics are combined, so memory
does not grow with tensor size (an mmap would: its pages count as resident memory).
Pickled object arrays are never loaded.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, Optional, Tuple

import numpy as np
from numpy.lib import format as npformat

from mf_celldump.processing.errors import NpyReadError
from mf_celldump.statistics import STAT_KEYS, compute_statistics

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
    """Parse the header; a file that is not a plain-data ``.npy`` raises NpyReadError."""
    header = _fast_header(head) if head else None
    if header is None:
        handle.seek(0)
        header = _numpy_header(handle, path)
    return header


def load_small(path: str) -> np.ndarray:
    """Load a whole (small) array, as for non-tensor values stored as scalar tensors."""
    try:
        return np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise NpyReadError(f"{path}: truncated or corrupt .npy file ({err})") from None


def file_statistics(path: str, wanted: Iterable[str]) -> Tuple[str, Tuple[int, ...], Dict[str, object]]:
    """(numpy dtype name, shape, statistics) of the array in ``path``, in one pass over its data."""
    wanted = tuple(wanted)
    with open(path, "rb", buffering=0) as handle:
        head = handle.read(HEAD_BYTES) or b""
        header = read_header(handle, path, head)
        if header.fortran_order:
            stats = _mmap_statistics(path, header, wanted)
        elif header.nbytes <= CHUNK_BYTES:
            have = memoryview(head)[header.data_offset : header.data_offset + header.nbytes]
            if len(have) < header.nbytes:
                handle.seek(header.data_offset + len(have))
                data = bytes(have) + _read_exact(handle, header.nbytes - len(have), path, header.nbytes)
            else:
                data = have
            array = np.frombuffer(data, dtype=header.dtype).reshape(header.shape)
            stats = compute_statistics(array, wanted)
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


def _mmap_statistics(path: str, header: NpyHeader, wanted: Tuple[str, ...]) -> Dict[str, object]:
    """Fortran-ordered files (capture never writes them): C-ordered slabs along the first axis."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise NpyReadError(f"{path}: truncated or corrupt .npy file ({err})") from None
    if array.nbytes <= CHUNK_BYTES:
        return compute_statistics(np.ascontiguousarray(array), wanted)

    def slabs() -> Iterator[np.ndarray]:
        row = max(1, array[0].nbytes)
        step = max(1, CHUNK_BYTES // row)
        for start in range(0, array.shape[0], step):
            yield np.ascontiguousarray(array[start : start + step]).ravel()

    return _combine(slabs(), header, wanted)


def _nan_aware(pick, a, b):
    """``pick(a, b)`` (max or min) where NaN wins, as numpy's reductions do; None = no value yet."""
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b if a is None else a
    if isinstance(b, float) and math.isnan(b):
        return b
    return pick(a, b)


def _combine(chunks: Iterator[np.ndarray], header: NpyHeader, wanted: Tuple[str, ...]) -> Dict[str, object]:
    """Statistics of a large array from its chunks; same keys and meaning as ``compute_statistics``."""
    is_float = header.dtype.kind in "fc"
    native = header.dtype.newbyteorder("=") if header.dtype.byteorder not in ("=", "|") else None
    hi: Optional[object] = None
    lo: Optional[object] = None
    total = 0.0
    squares = 0.0
    crc = 0
    nans = 0
    infs = 0
    for chunk in chunks:
        if native is not None:
            chunk = chunk.astype(native)
        if "md5" in wanted:
            crc = zlib.crc32(chunk.tobytes() if native is not None else chunk.data, crc)
        if "max" in wanted:
            hi = _nan_aware(max, hi, chunk.max().item())
        if "min" in wanted:
            lo = _nan_aware(min, lo, chunk.min().item())
        if "mean" in wanted or "norm" in wanted:
            wide = chunk.astype(np.float64)
            total += float(wide.sum())
            squares += float(np.dot(wide, wide))
        if is_float and "nan_count" in wanted:
            nans += int(np.count_nonzero(np.isnan(chunk)))
        if is_float and "inf_count" in wanted:
            infs += int(np.count_nonzero(np.isinf(chunk)))
    out: Dict[str, object] = {}
    if "max" in wanted:
        out[STAT_KEYS["max"]] = hi
    if "min" in wanted:
        out[STAT_KEYS["min"]] = lo
    if "mean" in wanted:
        out[STAT_KEYS["mean"]] = total / header.size
    if "norm" in wanted:
        out[STAT_KEYS["norm"]] = math.sqrt(squares) if not math.isnan(squares) else squares
    if "md5" in wanted:
        out["md5"] = f"{crc & 0xFFFFFFFF:08x}"
    if "nan_count" in wanted:
        out["nan_count"] = nans
    if "inf_count" in wanted:
        out["inf_count"] = infs
    return out
