"""Measure one pair of tensor records: element by element when both tensors can be read, else statistics.

* Both tensors readable: the baseline is brought into our layout (:class:`transforms.Plan`)
  and compared element by element (``basis`` = ``tensor``).
* Otherwise (a statistics dump on either side, or a tensor file missing or unreadable,
  e.g. a PyTorch ``.pt`` without torch installed): the statistics the records carry are
  compared (``basis`` = ``statistics``) and the reason is kept, so a missing file never
  moves the first divergence silently. When the baseline is a part of a fused tensor (or
  our cell applies an activation to it), its recorded statistics are the fused tensor's:
  the part's statistics are computed from the baseline tensor if it can be read, and the
  pair is not compared otherwise.
* Both records carry ``md5`` (msprobe's CRC-32) and nothing is reordered: ``crc_match``
  says whether the bytes are identical.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

import numpy as np

from mf_celldump.analysis.compare import metrics, tensors
from mf_celldump.analysis.compare.sources import DumpSide
from mf_celldump.analysis.compare.thresholds import Thresholds
from mf_celldump.analysis.compare.transforms import Plan
from mf_celldump.errors import NotComparable
from mf_celldump.layout import stat_records

TENSOR, STATISTICS = "tensor", "statistics"


@dataclass
class Measured:
    """A compared pair: its numbers, the basis of its verdict and each side's statistics."""

    metrics: metrics.PairMetrics
    basis: str
    target_stats: Dict[str, Optional[float]]
    baseline_stats: Dict[str, Optional[float]]
    crc_match: Optional[bool] = None
    notes: list = field(default_factory=list)

    @property
    def reason(self) -> str:
        return "; ".join(n for n in [self.metrics.note, *self.notes] if n)


def measure_pair(
    target: DumpSide,
    record: Mapping[str, Any],
    baseline: DumpSide,
    base_record: Mapping[str, Any],
    plan: Plan,
    limits: Thresholds,
    exact: bool,
    noise: float = 0.0,
) -> Measured:
    """Raises :class:`NotComparable` when the pair cannot be compared at all (the message says why)."""
    ours, our_error = _read(target, record)
    theirs, their_error = _read(baseline, base_record)
    shape = tuple(record.get("shape") or ()) if ours is None else tuple(ours.shape)
    if theirs is not None:
        theirs = np.asarray(plan.apply(theirs, shape))
    crc = _crc(record, base_record, plan)
    if ours is not None and theirs is not None:
        result = metrics.tensor_metrics(ours, theirs, limits, exact, noise)
        t_stats = stat_records.record_stats(record)
        b_stats = stat_records.array_stats(theirs) if plan.partial else stat_records.record_stats(base_record)
        if not exact and not result.diverged:
            _judge_statistics_too(result, t_stats, b_stats, ours.size, limits, noise)
        return Measured(result, TENSOR, t_stats, b_stats, crc)
    if plan.partial and theirs is None:
        raise NotComparable(
            "statistics of a part of a fused tensor cannot be compared"
            + (f" (the baseline tensor: {their_error.why})" if their_error else " (the baseline has no tensor data)")
        )
    t_stats = stat_records.record_stats(record) if ours is None else stat_records.array_stats(ours)
    b_stats = stat_records.array_stats(theirs) if plan.partial else stat_records.record_stats(base_record)
    elements = math.prod(int(d) for d in shape) if shape else None  # Python ints: no overflow
    result = metrics.stats_metrics(t_stats, b_stats, elements, limits, exact, noise)
    measured = Measured(result, STATISTICS, t_stats, b_stats, crc)
    if math.isinf(result.stat_rel):
        kinds = stat_records.nonfinite_kinds
        result.note = (
            f"non-finite values: target {stat_records.describe_nonfinite(kinds(_as_record(record, t_stats)))}, "
            f"baseline {stat_records.describe_nonfinite(kinds(_as_record(base_record, b_stats, plan.partial)))}"
        )
    for side, error in (("target", our_error), ("baseline", their_error)):
        if error:
            measured.notes.append(f"statistics only: {side} tensor unreadable: {error}")
    return measured


def _judge_statistics_too(result: metrics.PairMetrics, t_stats, b_stats, elements: int, limits: Thresholds,
                          noise: float) -> None:
    """A pair whose statistics differ beyond their bound diverges on tensors too: a statistics dump of the same
    runs calls it diverged, and both dumps must name the same first divergence (a weight update's Max moving by
    more than the threshold while its norm-relative error stays below it)."""
    if any(value is None for value in (*t_stats.values(), *b_stats.values())):
        return
    by_stats = metrics.stats_metrics(t_stats, b_stats, elements, limits, False, noise)
    if by_stats.diverged:
        result.diverged = True
        result.stat_rel = by_stats.stat_rel
        result.note = "; ".join(n for n in (result.note, "statistics differ beyond their bound") if n)


def _read(side: DumpSide, record: Mapping[str, Any]):
    """(array or None, the error that kept it from being read or None)."""
    try:
        return side.tensor(record), None
    except tensors.TensorFileError as err:
        return None, err


def _as_record(record: Mapping[str, Any], stats: Mapping[str, Optional[float]], computed: bool = False):
    """The record's counts with the statistics that were compared (computed ones replace the record's)."""
    if computed:
        return dict(stats)
    return {**stats, **{k: record[k] for k in ("nan_count", "inf_count") if k in record}}


def _crc(record: Mapping[str, Any], base_record: Mapping[str, Any], plan: Plan) -> Optional[bool]:
    ours, theirs = record.get("md5"), base_record.get("md5")
    if not (isinstance(ours, str) and isinstance(theirs, str) and ours and theirs and plan.identity):
        return None
    if record.get("shape") != base_record.get("shape"):
        return None
    return ours.lower() == theirs.lower()
