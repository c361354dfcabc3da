"""Tensor statistics as msprobe reports them: the one place that computes and spells them.

Every source of statistics goes through here, so the numbers agree whatever produced
them: arrays on the host (host capture op, processing of small files), arrays read in
chunks (processing of large files), reductions done on the device (``device_stats``)
and rows of MindSpore's ``statistic.csv`` (``kbk_statistics``). Keys follow msprobe's
dump.json: ``Max``, ``Min``, ``Mean``, ``Norm``, plus ``md5`` (msprobe's name for a
CRC-32 of the array bytes, 8 hex digits), ``nan_count`` and ``inf_count``.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional, Tuple

import numpy as np

# Configuration name -> dump.json key, in msprobe's order.
STAT_KEYS = {"max": "Max", "min": "Min", "mean": "Mean", "norm": "Norm", "md5": "md5",
             "nan_count": "nan_count", "inf_count": "inf_count"}
STATISTICS = tuple(STAT_KEYS)  # the names the configuration accepts (config.py)
DEFAULT_STATISTICS = ("max", "min", "mean", "norm")  # what a statistics dump records unless told
TASKS = ("tensor", "statistics")  # what a capture writes of a value: the tensor, or its statistics
REDUCTIONS = ("max", "min", "mean", "norm")  # the ones computed by reducing the data
# numpy dtype kinds whose statistics we report: bool, signed, unsigned, float
SUPPORTED_KINDS = "biuf"


@dataclass
class StatValues:
    """Raw numbers of one tensor, whatever computed them (None = not available)."""

    max: Any = None
    min: Any = None
    mean: Optional[float] = None
    norm: Optional[float] = None
    md5: Optional[str] = None
    nan_count: Optional[int] = None
    inf_count: Optional[int] = None


def crc32_hex(array: np.ndarray) -> str:
    data = np.ascontiguousarray(array)
    return f"{zlib.crc32(data.tobytes()) & 0xFFFFFFFF:08x}"


def _typed(value: Any, kind: str) -> Any:
    """Max/Min as the tensor's own kind of number: bool, int or float."""
    if value is None:
        return None
    value = value.item() if hasattr(value, "item") else value
    if kind == "b":
        return bool(value)
    if kind in "iu" and not (isinstance(value, float) and not math.isfinite(value)):
        return int(value)
    return float(value) if not isinstance(value, bool) else value


def statistics_record(values: StatValues, wanted: Iterable[str], kind: str) -> Dict[str, Any]:
    """The dump.json statistics of a tensor of numpy dtype kind ``kind`` (``f``, ``i``, ``u``, ``b``)."""
    out: Dict[str, Any] = {}
    for name in wanted:
        value = getattr(values, name)
        if name in ("max", "min"):
            value = _typed(value, kind)
        elif name in ("mean", "norm") and value is not None:
            value = float(value)
        elif name in ("nan_count", "inf_count") and value is not None:
            value = int(value) if kind == "f" else 0
        if value is None and name in ("md5", "nan_count", "inf_count"):
            continue  # not available from this source (e.g. MindSpore's statistic.csv has no CRC-32)
        out[STAT_KEYS[name]] = value
    return out


def _nan_aware(pick, a, b):
    """``pick(a, b)`` (max or min) where NaN wins, as numpy's reductions do; None = no value yet."""
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b if a is None else a
    if isinstance(b, float) and math.isnan(b):
        return b
    return pick(a, b)


class StatsAccumulator:
    """Statistics of an array fed in chunks (or whole); memory stays at one chunk."""

    def __init__(self, dtype: np.dtype, wanted: Iterable[str]):
        self.dtype = np.dtype(dtype)
        self.wanted: Tuple[str, ...] = tuple(wanted)
        self.count = 0
        self._values = StatValues(nan_count=0, inf_count=0)
        self._sum = 0.0
        self._squares = 0.0
        self._crc = 0

    def add(self, chunk: np.ndarray) -> StatsAccumulator:
        if chunk.size == 0:
            return self
        wanted, values = self.wanted, self._values
        self.count += chunk.size
        if "md5" in wanted:
            self._crc = zlib.crc32(np.ascontiguousarray(chunk).tobytes(), self._crc)
        counts = self.dtype.kind == "f" and ("nan_count" in wanted or "inf_count" in wanted)
        high = chunk.max().item() if "max" in wanted or counts else None
        low = chunk.min().item() if "min" in wanted or counts else None
        if "max" in wanted:
            values.max = _nan_aware(max, values.max, high)
        if "min" in wanted:
            values.min = _nan_aware(min, values.min, low)
        if "mean" in wanted or "norm" in wanted:
            wide = chunk.astype(np.float64, copy=False).ravel()
            self._sum += float(wide.sum())
            self._squares += float(np.dot(wide, wide))
        if counts and not (math.isfinite(high) and math.isfinite(low)):
            self._count_non_finite(chunk)  # finite max and min: no NaN and no Inf (two passes saved)
        return self

    def _count_non_finite(self, chunk: np.ndarray) -> None:
        if "nan_count" in self.wanted:
            self._values.nan_count += int(np.count_nonzero(np.isnan(chunk)))
        if "inf_count" in self.wanted:
            self._values.inf_count += int(np.count_nonzero(np.isinf(chunk)))

    def result(self) -> Dict[str, Any]:
        values = self._values
        if self.count:
            values.mean = self._sum / self.count
            values.norm = math.sqrt(self._squares) if not math.isnan(self._squares) else self._squares
        values.md5 = f"{self._crc & 0xFFFFFFFF:08x}"
        return statistics_record(values, self.wanted, self.dtype.kind)


def compute_statistics(array: np.ndarray, wanted: Iterable[str]) -> Dict[str, Any]:
    """Statistics of a whole ``array`` for the configured names (see STATISTICS)."""
    array = np.asarray(array)
    return StatsAccumulator(array.dtype, wanted).add(array).result()


# -- reading a record's statistics back ------------------------------------------------
def record_number(value) -> Optional[float]:
    """A statistic of a dump record as a float (None when absent, a bool or not a number)."""
    if type(value) is float:  # the common case, first
        return value
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
