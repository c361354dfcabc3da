"""Numbers for one tensor pair and the verdict they give.

Tensor pairs: cosine similarity, max absolute error, max relative error (element-wise,
against the baseline), ``rel_err`` = ||target - baseline|| / ||baseline||, and msprobe's
own columns: Euclidean distance ||target - baseline||, and the share of elements whose
relative error is below 1/1000 and 5/1000 (msprobe 26.2's ``One Thousandth Err Ratio``
and ``Five Thousandths Err Ratio``: |t - b| / |b|, a zero baseline element counted with
the float epsilon added to both sides). A pair diverges when cosine is below ``cosine``
or ``rel_err`` above ``rel_err``, unless no element differs by more than the pair's rounding-noise
bound (``noise``; ``abs_err`` given by hand replaces it); integer and bool tensors must match
exactly; non-finite values diverge unless both
sides have the same ones at the same places.

Statistics pairs (when a side has no tensor data): ``stat_rel`` = the largest relative
difference of every statistic both sides have, Max, Min, Mean and Norm. Max, Min and
Norm are relative to the larger magnitude of the two sides. Mean is relative to the
larger of |Mean| and 1% of the tensor's root mean square (Norm / sqrt(elements)): a
change inside a tensor often moves its Mean by percents while Max, Min and Norm barely
move, and a Mean near zero must not turn rounding into a divergence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

import numpy as np

from mf_celldump.analysis.compare.thresholds import Thresholds
from mf_celldump.layout.stat_records import STATS

TINY = 1e-30
MEAN_FLOOR = 0.01  # Mean is compared relative to at least this share of the RMS
ONE_THOUSANDTH, FIVE_THOUSANDTHS = 0.001, 0.005


@dataclass
class PairMetrics:
    cosine: float = math.nan
    euc_dist: float = math.nan
    max_abs_err: float = math.nan
    max_rel_err: float = math.nan
    rel_err: float = math.nan
    one_thousandth_ratio: float = math.nan
    five_thousandths_ratio: float = math.nan
    stat_rel: float = math.nan
    # The one factor that best maps the baseline onto the target (least squares; for statistics, the ratio of
    # the norms), and what is left after it: rel_err (tensors) or stat_rel (statistics) of target vs factor x
    # baseline. A gradient clipped, loss-scaled or summed for a mean differs from its baseline by one factor.
    factor: float = math.nan
    factor_rel: float = math.nan
    diverged: bool = False
    note: str = ""

    def columns(self) -> Dict[str, float]:
        """The numeric columns of a pair row."""
        return {key: value for key, value in vars(self).items() if key not in ("diverged", "note")}


def tensor_metrics(target: np.ndarray, baseline: np.ndarray, limits: Thresholds, exact: bool,
                   noise: float = 0.0) -> PairMetrics:
    """``noise``: the pair's rounding-noise bound (``noise.bound``), used unless ``abs_err`` is given by hand.

    Norms and the cosine come from three dot products (``np.linalg.norm`` of a vector is the square root
    of one); their sum is finite exactly when every element is, which spares a pass for the usual case."""
    t = np.asarray(target, dtype=np.float64).ravel()
    b = np.asarray(baseline, dtype=np.float64).ravel()
    result = PairMetrics()
    tt, bb = float(np.dot(t, t)), float(np.dot(b, b))
    if not math.isfinite(tt + bb):  # a NaN or an Inf somewhere (or squares past float64's range)
        finite_t, finite_b = np.isfinite(t), np.isfinite(b)
        same = np.array_equal(finite_t, finite_b) and np.array_equal(t[~finite_t], b[~finite_b], equal_nan=True)
        if not same:
            result.diverged = True
            result.note = f"non-finite values differ: target {_nonfinite(t)}, baseline {_nonfinite(b)}"
        t, b = t[finite_t & finite_b], b[finite_t & finite_b]
        tt, bb = float(np.dot(t, t)), float(np.dot(b, b))
    tb = float(np.dot(t, b))
    diff = t - b
    norm_t, norm_b = math.sqrt(tt), math.sqrt(bb)
    result.euc_dist = math.sqrt(float(np.dot(diff, diff)))
    if t.size:
        np.abs(diff, out=diff)
        magnitude = np.abs(b)
        result.max_abs_err = float(diff.max())
        result.max_rel_err = float((diff / np.maximum(magnitude, TINY)).max()) if result.max_abs_err else 0.0
        result.one_thousandth_ratio, result.five_thousandths_ratio = _error_ratios(diff, magnitude)
    result.rel_err = result.euc_dist / norm_b if norm_b > TINY else (0.0 if norm_t <= TINY else math.inf)
    result.cosine = _cosine(tb, norm_t, norm_b)
    if not exact and norm_b > TINY and norm_t > TINY:
        result.factor = tb / bb
        if result.factor != 0.0:
            rest = t - result.factor * b
            result.factor_rel = math.sqrt(float(np.dot(rest, rest))) / (abs(result.factor) * norm_b)
    if exact:
        result.diverged = result.diverged or bool(result.max_abs_err and result.max_abs_err > 0)
    elif not within_noise(result.max_abs_err, limits, noise):
        result.diverged = result.diverged or result.cosine < limits.cosine or result.rel_err > limits.rel_err
    return result


def noise_floor(limits: Thresholds, noise: float) -> float:
    """The absolute difference a pair may have as rounding noise: ``abs_err`` given by hand, else its bound."""
    return noise if limits.abs_err is None else limits.abs_err


def within_noise(max_abs_err: float, limits: Thresholds, noise: float) -> bool:
    floor = noise_floor(limits, noise)
    return floor > 0 and math.isfinite(max_abs_err) and max_abs_err <= floor


def _cosine(dot: float, norm_t: float, norm_b: float) -> float:
    if norm_t <= TINY and norm_b <= TINY:
        return 1.0
    if norm_t <= TINY or norm_b <= TINY:
        return 0.0
    return max(-1.0, min(1.0, dot / (norm_t * norm_b)))


def _error_ratios(diff: np.ndarray, magnitude: np.ndarray):
    """Shares of elements with |t - b| / |b| below 1/1000 and 5/1000; where b is 0, msprobe adds the
    float epsilon to both sides, i.e. divides |t| by epsilon. ``magnitude`` (|b|) is changed in place."""
    if not magnitude.all():
        magnitude[magnitude == 0] = np.finfo(np.float64).eps
    size = diff.size
    return (float(np.count_nonzero(diff < ONE_THOUSANDTH * magnitude)) / size,
            float(np.count_nonzero(diff < FIVE_THOUSANDTHS * magnitude)) / size)


def _nonfinite(values: np.ndarray) -> str:
    nan, inf = int(np.isnan(values).sum()), int(np.isinf(values).sum())
    parts = [f"{nan} NaN" if nan else "", f"{inf} Inf" if inf else ""]
    return " and ".join(p for p in parts if p) or "finite"


def stats_metrics(
    target: Mapping[str, Optional[float]],
    baseline: Mapping[str, Optional[float]],
    elements: Optional[int],
    limits: Thresholds,
    exact: bool,
    noise: float = 0.0,
) -> PairMetrics:
    """Verdict from statistics alone: the largest relative difference of Max, Min, Mean and Norm."""
    result = PairMetrics()
    worst = largest = 0.0
    for key in STATS:
        a, b = target.get(key), baseline.get(key)
        if a is None or b is None:
            continue
        if not (math.isfinite(a) and math.isfinite(b)):
            if not (a == b or (math.isnan(a) and math.isnan(b))):
                worst = math.inf
            continue
        relative = abs(a - b) / _scale(key, a, b, target, baseline, elements)
        worst, largest = max(worst, relative), max(largest, abs(a - b))
    result.stat_rel = worst
    rounding = not exact and math.isfinite(worst) and within_noise(largest, limits, noise)
    result.diverged = not rounding and worst > (0.0 if exact else limits.stat_rel)
    _stats_factor(result, target, baseline, elements, exact)
    return result


def _stats_factor(result: PairMetrics, target, baseline, elements, exact: bool) -> None:
    """The ratio of the norms, and how far the other statistics are from the baseline's times it."""
    norm_t, norm_b = target.get("Norm"), baseline.get("Norm")
    if exact or not (norm_t and norm_b and math.isfinite(norm_t) and math.isfinite(norm_b) and norm_b > TINY):
        return
    factor = norm_t / norm_b
    scaled = {key: (value * factor if value is not None else None) for key, value in baseline.items()}
    worst = 0.0
    for key in STATS:
        a, b = target.get(key), scaled.get(key)
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            continue
        worst = max(worst, abs(a - b) / _scale(key, a, b, target, scaled, elements))
    result.factor, result.factor_rel = factor, worst


def _scale(key, a, b, target, baseline, elements) -> float:
    scale = max(abs(a), abs(b))
    if key == "Mean" and elements:
        norms = [n for n in (target.get("Norm"), baseline.get("Norm")) if n is not None and math.isfinite(n)]
        if norms:
            scale = max(scale, MEAN_FLOOR * max(norms) / math.sqrt(elements))
    return max(scale, TINY)
