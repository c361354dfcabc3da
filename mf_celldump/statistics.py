"""Tensor statistics as msprobe reports them, from numpy data.

Used by the capture side (host capture op) and by processing, so both produce the
same numbers. Keys follow msprobe's dump.json: ``Max``, ``Min``, ``Mean``, ``Norm``,
plus ``md5`` (msprobe's name for a CRC-32 of the array bytes, 8 hex digits),
``nan_count`` and ``inf_count``.
"""

from __future__ import annotations

import zlib
from typing import Dict, Iterable, Optional

import numpy as np

STAT_KEYS = {"max": "Max", "min": "Min", "mean": "Mean", "norm": "Norm"}


def crc32_hex(array: np.ndarray) -> str:
    data = np.ascontiguousarray(array)
    return f"{zlib.crc32(data.tobytes()) & 0xFFFFFFFF:08x}"


def _plain(value) -> Optional[float]:
    value = value.item() if hasattr(value, "item") else value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return value


def compute_statistics(array: np.ndarray, wanted: Iterable[str]) -> Dict[str, object]:
    """Statistics of ``array`` for the configured names (see config.STATISTICS)."""
    wanted = tuple(wanted)
    out: Dict[str, object] = {}
    array = np.asarray(array)
    if array.size == 0:
        for name in wanted:
            if name in STAT_KEYS:
                out[STAT_KEYS[name]] = None
        if "md5" in wanted:
            out["md5"] = crc32_hex(array)
        return out
    is_bool = array.dtype == np.bool_
    numeric = array.astype(np.float64) if (is_bool or array.dtype.kind in "iu") else array
    if "max" in wanted:
        out["Max"] = _plain(array.max())
    if "min" in wanted:
        out["Min"] = _plain(array.min())
    if "mean" in wanted:
        out["Mean"] = _plain(numeric.mean(dtype=np.float64))
    if "norm" in wanted:
        flat = numeric.astype(np.float64, copy=False).ravel()
        out["Norm"] = float(np.sqrt(np.dot(flat, flat)))
    if "md5" in wanted:
        out["md5"] = crc32_hex(array)
    if "nan_count" in wanted:
        out["nan_count"] = int(np.isnan(array).sum()) if array.dtype.kind == "f" else 0
    if "inf_count" in wanted:
        out["inf_count"] = int(np.isinf(array).sum()) if array.dtype.kind == "f" else 0
    return out
