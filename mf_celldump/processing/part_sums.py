"""A gradient recorded in parts (one per redistributing consumer, processing/consumer_parts.py), summed.

The parts are read chunk by chunk side by side, so memory stays at a chunk per part; each
chunk is summed in float64 and rounded once to the parts' dtype (bfloat16 data, stored as
float32, to the nearest bfloat16), and written to a new output file while its statistics
accumulate. Parts that differ in dtype, shape or layout are refused (never summed).
"""

from __future__ import annotations

import contextlib
import os
from typing import Dict, List, Optional, Tuple

import numpy as np
from numpy.lib import format as npformat

from mf_celldump.errors import NpyReadError
from mf_celldump.fsutil import FILE_MODE, open_own_file
from mf_celldump.processing.npystats import NpyHeader, read_header, stream_chunks
from mf_celldump.statistics import StatsAccumulator

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def round_to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float64 values rounded once, half to even, to bfloat16 precision (8 significant bits), as float32."""
    mantissa, exponent = np.frexp(values)
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = np.ldexp(np.round(mantissa * 256.0) / 256.0, exponent)
    return np.where(np.isfinite(values), rounded, values).astype(np.float32)


def _rounded(total: np.ndarray, dtype: np.dtype, bfloat16: bool) -> np.ndarray:
    if bfloat16:
        return round_to_bfloat16(total)
    return total.astype(dtype)


def _headers(handles, paths: List[str]) -> NpyHeader:
    headers = [read_header(handle, path) for handle, path in zip(handles, paths)]
    first = headers[0]
    for header, path in zip(headers[1:], paths[1:]):
        if (header.dtype, header.shape, header.fortran_order) != (first.dtype, first.shape, first.fortran_order):
            raise NpyReadError(f"{path}: a part of {paths[0]} with another dtype, shape or layout; not summed")
    if first.fortran_order or first.dtype.kind != "f":
        raise NpyReadError(f"{paths[0]}: only C-ordered floating-point parts are summed")
    return first


def sum_files(paths: List[str], out_path: Optional[str], wanted: Tuple[str, ...], bfloat16: bool,
              our_links) -> Tuple[str, Tuple[int, ...], Dict[str, object]]:
    """(dtype name, shape, statistics) of the sum of the raw files ``paths``, written to ``out_path`` (if any)."""
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open_own_file(path, None, our_links)) for path in paths]
        header = _headers(handles, paths)
        dtype = header.dtype.newbyteorder("=")
        accumulator = StatsAccumulator(dtype, wanted)
        out = None
        if out_path is not None:
            fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, FILE_MODE)
            out = stack.enter_context(os.fdopen(fd, "wb"))
            npformat.write_array_header_1_0(out, {"descr": npformat.dtype_to_descr(dtype), "fortran_order": False,
                                                  "shape": header.shape})
        streams = [stream_chunks(handle, header, path) for handle, path in zip(handles, paths)]
        for chunks in zip(*streams):
            total = np.zeros(chunks[0].shape, np.float64)
            for chunk in chunks:
                total += chunk
            result = _rounded(total, dtype, bfloat16)
            accumulator.add(result)
            if out is not None:
                out.write(result.tobytes())
    return dtype.name, header.shape, accumulator.result()
