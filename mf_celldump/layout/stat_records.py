"""The statistics of one tensor record (Max, Min, Mean, Norm, nan_count, inf_count), read and judged.

Shared by ``compare`` (statistics verdicts, each side's numbers in the table) and
``anomalies`` (NaN/Inf without loading a tensor). NaN and Inf are told apart here, once:
a tensor holding +Inf and -Inf has ``Mean`` NaN (inf - inf) without holding a NaN, so a
NaN Mean alone is not a NaN when Max or Min is infinite; the counts, when dumped, win.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from mf_celldump.dtypes import canonical_dtype

STATS = ("Max", "Min", "Mean", "Norm")
NAN, INF = "nan", "inf"


def number(value: Any) -> Optional[float]:
    """A statistic as a float (``"inf"`` and numbers alike); None when absent or not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def whole_shape(record: Mapping[str, Any]) -> Optional[List[int]]:
    """The record's shape when it is a list of whole numbers (``[]``: a scalar), else None (absent or forged)."""
    shape = record.get("shape")
    if isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return shape
    return None


def record_stats(record: Mapping[str, Any]) -> Dict[str, Optional[float]]:
    """Max, Min, Mean, Norm of a record (None where absent)."""
    return {key: number(record.get(key)) for key in STATS}


def array_stats(array: np.ndarray) -> Dict[str, Optional[float]]:
    """Max, Min, Mean, Norm of an array, as a dumper would record them (NaN propagates)."""
    values = np.asarray(array, dtype=np.float64)
    if values.size == 0:
        return {key: None for key in STATS}
    with np.errstate(invalid="ignore", over="ignore"):
        return {
            "Max": float(values.max()),
            "Min": float(values.min()),
            "Mean": float(values.mean()),
            "Norm": float(np.linalg.norm(values.ravel())),
        }


def count(record: Mapping[str, Any], key: str) -> Optional[int]:
    value = number(record.get(key))
    return None if value is None or math.isnan(value) else int(value)


def nonfinite_kinds(record: Mapping[str, Any]) -> Dict[str, Optional[int]]:
    """``{"nan": count or None, "inf": count or None}`` for the kinds a record shows (empty: finite).

    A count is None when the dump has no ``nan_count``/``inf_count`` and the kind is read
    from Max/Min/Mean/Norm.
    """
    stats = record_stats(record)
    nan_count, inf_count = count(record, "nan_count"), count(record, "inf_count")
    extremes = [stats["Max"], stats["Min"]]
    has_inf = any(v is not None and math.isinf(v) for v in extremes)
    found: Dict[str, Optional[int]] = {}
    if nan_count is not None:
        if nan_count > 0:
            found[NAN] = nan_count
    elif any(v is not None and math.isnan(v) for v in (*extremes, stats["Norm"])) or (
        stats["Mean"] is not None and math.isnan(stats["Mean"]) and not has_inf
    ):
        found[NAN] = None
    if inf_count is not None:
        if inf_count > 0:
            found[INF] = inf_count
    elif has_inf:
        found[INF] = None
    return found


def describe_nonfinite(found: Mapping[str, Optional[int]]) -> str:
    """``3 NaN, Inf`` / ``finite``."""
    if not found:
        return "finite"
    names = {NAN: "NaN", INF: "Inf"}
    return ", ".join(f"{n} {names[k]}" if n is not None else names[k] for k, n in found.items())


def record_problem(record: Mapping[str, Any]) -> str:
    """What makes a tensor record unreadable as one ("" when nothing): a shape that is not a list of whole
    numbers, a statistic that is neither a number nor "inf"/"nan". Compare and anomalies both say so, by
    name, rather than judge what they cannot read."""
    shape = record.get("shape")
    if shape is not None and whole_shape(record) is None:
        return f"shape {_short(shape)} is not a list of whole numbers"
    for key in STATS:
        value = record.get(key)
        if value is not None and number(value) is None:
            return f"{key} {_short(value)} is not a number"
    return ""


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value) if not isinstance(value, (list, dict)) or len(value) < 50 else f"<{type(value).__name__} " \
        f"of {len(value)} items>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def slot_anomaly(record: Dict[str, Any], max_abs: Optional[float]) -> Optional[str]:
    """``nan``, ``inf``, ``large`` or None, from a tensor record's statistics.

    NaN and Inf are told apart by :func:`nonfinite_kinds` (a NaN Mean beside an
    infinite Max or Min is Inf, not NaN). ``large`` looks at floating-point tensors only
    (token ids and positions are integers) and leaves out additive masks: a tensor whose
    largest value is 0 and whose smallest is at most -``max_abs`` is the -10000 (or dtype
    minimum) fill MindFormers and Megatron add to masked attention scores.
    """
    kinds = nonfinite_kinds(record)
    if kinds:
        return NAN if NAN in kinds else INF
    if max_abs is None or not _floating(record):
        return None
    stats = record_stats(record)
    top, bottom = stats["Max"], stats["Min"]
    if top == 0.0 and bottom is not None and bottom <= -max_abs:
        return None
    extremes = [abs(v) for v in (top, bottom) if v is not None]
    return "large" if extremes and max(extremes) > max_abs else None


def _floating(record: Dict[str, Any]) -> bool:
    dtype = canonical_dtype(record.get("dtype"))
    return dtype.startswith(("float", "bfloat", "complex")) or dtype in ("half", "double")
