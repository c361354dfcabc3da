"""Numbers for one tensor pair, per-dtype thresholds, and the verdict.

Tensor pairs: cosine similarity, max absolute error, max relative error (element-wise,
against the baseline), and ``rel_err`` = ||target - baseline|| / ||baseline||. Statistics
(Max, Min, Mean, Norm) are compared in every case, and alone when either side has no
tensor data. A pair diverges when cosine is below ``cosine`` or ``rel_err`` above
``rel_err`` (tensors), or when the relative difference of Max, Min or Norm is above
``stat_rel`` (statistics only); integer and bool tensors must match exactly. Non-finite
values diverge unless both sides have them at the same places with the same values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, Mapping, Optional

import numpy as np

STATS = ("Max", "Min", "Mean", "Norm")
TINY = 1e-30


@dataclass(frozen=True)
class Thresholds:
    cosine: float
    rel_err: float
    stat_rel: float


# Starting points: fp32 runs of the same function agree to ~1e-6; half precisions to their epsilon.
DEFAULT_THRESHOLDS: Dict[str, Thresholds] = {
    "float64": Thresholds(0.99999, 1e-4, 1e-4),
    "float32": Thresholds(0.99999, 1e-3, 1e-3),
    "float16": Thresholds(0.999, 1e-2, 5e-3),
    "bfloat16": Thresholds(0.995, 3e-2, 2e-2),
    "exact": Thresholds(1.0, 0.0, 0.0),
}
THRESHOLD_KEYS = ("cosine", "rel_err", "stat_rel")
_PRECISION_ORDER = ("exact", "float64", "float32", "float16", "bfloat16")

_DTYPE_ALIASES = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "fp16": "float16",
    "long": "int64",
    "int": "int32",
    "bool_": "bool",
}


def canonical_dtype(dtype: Optional[str]) -> str:
    """``Float32``, ``torch.float32``, ``float32`` -> ``float32``."""
    text = str(dtype or "").strip().lower()
    text = text.rpartition(".")[2]
    return _DTYPE_ALIASES.get(text, text)


def threshold_class(dtype: str) -> str:
    if dtype in DEFAULT_THRESHOLDS:
        return dtype
    if dtype.startswith(("int", "uint", "bool")):
        return "exact"
    return "float32"


def thresholds_for(target_dtype: str, baseline_dtype: str, table: Mapping[str, Thresholds]) -> Thresholds:
    """The looser thresholds of the two sides' dtypes (a bf16 run against fp32 is held to bf16)."""
    classes = [threshold_class(canonical_dtype(d)) for d in (target_dtype, baseline_dtype) if d]
    loosest = max(classes or ["float32"], key=_PRECISION_ORDER.index)
    return table[loosest]


def override(table: Mapping[str, Thresholds], spec: str) -> Dict[str, Thresholds]:
    """Apply ``[dtype.]key=value`` (key: cosine, rel_err, stat_rel); raises ValueError with the fix."""
    key, sep, value = spec.partition("=")
    dtype, dot, name = key.strip().rpartition(".")
    if not sep or name not in THRESHOLD_KEYS:
        raise ValueError(
            f"--threshold {spec!r}: expected [dtype.]KEY=VALUE with KEY one of {', '.join(THRESHOLD_KEYS)}"
        )
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"--threshold {spec!r}: {value!r} is not a number") from None
    dtypes = [threshold_class(canonical_dtype(dtype))] if dot else list(table)
    result = dict(table)
    for item in dtypes:
        result[item] = replace(result[item], **{name: number})
    return result


@dataclass
class PairMetrics:
    cosine: float = math.nan
    max_abs_err: float = math.nan
    max_rel_err: float = math.nan
    rel_err: float = math.nan
    stat_rel: float = math.nan
    diverged: bool = False
    note: str = ""


def tensor_metrics(target: np.ndarray, baseline: np.ndarray, limits: Thresholds, exact: bool) -> PairMetrics:
    t = np.asarray(target, dtype=np.float64).ravel()
    b = np.asarray(baseline, dtype=np.float64).ravel()
    finite_t, finite_b = np.isfinite(t), np.isfinite(b)
    result = PairMetrics()
    if not (finite_t.all() and finite_b.all()):
        same = np.array_equal(finite_t, finite_b) and np.array_equal(
            t[~finite_t], b[~finite_b], equal_nan=True
        )
        if not same:
            result.diverged = True
            result.note = (
                f"non-finite values: {int((~finite_t).sum())} in target, {int((~finite_b).sum())} in baseline"
            )
        t, b = t[finite_t & finite_b], b[finite_t & finite_b]
    diff = np.abs(t - b)
    norm_t, norm_b = float(np.linalg.norm(t)), float(np.linalg.norm(b))
    if t.size:
        result.max_abs_err = float(diff.max())
        result.max_rel_err = float((diff / np.maximum(np.abs(b), TINY)).max()) if result.max_abs_err else 0.0
    result.rel_err = (
        float(np.linalg.norm(t - b)) / norm_b if norm_b > TINY else (0.0 if norm_t <= TINY else math.inf)
    )
    if norm_t <= TINY and norm_b <= TINY:
        result.cosine = 1.0
    elif norm_t <= TINY or norm_b <= TINY:
        result.cosine = 0.0
    else:
        result.cosine = max(-1.0, min(1.0, float(np.dot(t, b)) / (norm_t * norm_b)))
    if exact:
        result.diverged = result.diverged or bool(result.max_abs_err and result.max_abs_err > 0)
    else:
        result.diverged = result.diverged or result.cosine < limits.cosine or result.rel_err > limits.rel_err
    return result


def stat_differences(target: Mapping, baseline: Mapping) -> Dict[str, float]:
    """target - baseline for each statistic both records have."""
    out = {}
    for key in STATS:
        a, b = _number(target.get(key)), _number(baseline.get(key))
        if a is not None and b is not None:
            out[key] = a - b if not (math.isinf(a) and math.isinf(b) and a == b) else 0.0
    return out


def stats_metrics(target: Mapping, baseline: Mapping, limits: Thresholds, exact: bool) -> PairMetrics:
    """Verdict from statistics alone: relative difference of Max, Min and Norm."""
    result = PairMetrics(note="statistics only")
    worst = 0.0
    for key in ("Max", "Min", "Norm"):
        a, b = _number(target.get(key)), _number(baseline.get(key))
        if a is None or b is None:
            continue
        if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
            if not (a == b or (math.isnan(a) and math.isnan(b))):
                worst = math.inf
            continue
        scale = max(abs(b), abs(a), TINY)
        worst = max(worst, abs(a - b) / scale)
    result.stat_rel = worst
    result.diverged = worst > (0.0 if exact else limits.stat_rel)
    return result


def _number(value) -> Optional[float]:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
