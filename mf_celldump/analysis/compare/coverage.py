"""How much of the two dumps a comparison actually compared, and whether that is enough for a verdict.

Counted per part (kind and direction: forward and backward activations, weights, weight
gradients): the target's tensors, how many were compared (on tensors or on statistics),
and why the others were not, in three classes:

* ``no_partner``: the mapped name, call, slot or weight is not in the baseline;
* ``by_design``: the mapping or the model says this tensor has no counterpart (``in=_``,
  the gradient of a fused projection's input, a gradient after an activation, an input
  the baseline records no gradient for);
* ``not_comparable``: a partner exists but cannot be lined up (shapes, unknown groups).

The baseline's side: how many of its tensors of that part were used by a comparison.

A verdict rests on a minimum coverage (``MIN_COVERAGE``, ``--min-coverage``): in each
activation direction the target has, the compared share of the tensors that could be
compared (all but ``by_design``) must reach it. Weights do not count towards it (a
baseline may record none); their coverage is reported.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List

from mf_celldump.analysis.compare.pairing import ACTIVATION, BY_DESIGN, KINDS, NO_PARTNER, NOT_COMPARABLE
from mf_celldump.analysis.compare.store import Store
from mf_celldump.layout.naming import BACKWARD, FORWARD

MIN_COVERAGE = 0.5
_PART_ORDER = [(ACTIVATION, FORWARD), (ACTIVATION, BACKWARD), ("weight", FORWARD), ("weight_grad", BACKWARD)]


@dataclass
class Part:
    kind: str
    direction: str
    target_tensors: int = 0
    compared: int = 0
    on_statistics: int = 0  # compared from statistics (no tensor data, or a file could not be read)
    no_partner: int = 0
    by_design: int = 0
    not_comparable: int = 0
    baseline_tensors: int = 0
    baseline_used: int = 0

    @property
    def label(self) -> str:
        names = {"weight": "weights", "weight_grad": "weight gradients"}
        return names.get(self.kind, self.direction)

    @property
    def fraction(self) -> float:
        """Compared share of all the target's tensors of this part."""
        return self.compared / self.target_tensors if self.target_tensors else 0.0

    @property
    def comparable(self) -> int:
        return self.target_tensors - self.by_design

    @property
    def comparable_fraction(self) -> float:
        """Compared share of the tensors that have a counterpart by design (what the minimum applies to)."""
        return self.compared / self.comparable if self.comparable else 0.0

    @property
    def baseline_fraction(self) -> float:
        return self.baseline_used / self.baseline_tensors if self.baseline_tensors else 0.0

    def to_json(self) -> Dict[str, Any]:
        return dict(asdict(self), label=self.label, comparable=self.comparable, fraction=round(self.fraction, 4),
                    comparable_fraction=round(self.comparable_fraction, 4),
                    baseline_fraction=round(self.baseline_fraction, 4))


@dataclass
class Coverage:
    parts: List[Part]
    reasons: List[Dict[str, Any]] = field(default_factory=list)  # {kind, class, reason, count}, most first
    minimum: float = MIN_COVERAGE

    @property
    def short(self) -> List[Part]:
        """Activation parts below the minimum."""
        return [p for p in self.parts if p.kind == ACTIVATION and p.comparable and p.comparable_fraction < self.minimum]

    @property
    def enough(self) -> bool:
        return not self.short and any(p.kind == ACTIVATION and p.compared for p in self.parts)

    @property
    def unreadable(self) -> int:
        return sum(r["count"] for r in self.reasons if r["class"] == "statistics_fallback")

    def to_json(self) -> Dict[str, Any]:
        return {
            "minimum": self.minimum,
            "enough": self.enough,
            "parts": [p.to_json() for p in self.parts],
            "not_compared": [r for r in self.reasons if r["class"] != "statistics_fallback"],
            "statistics_fallback": [r for r in self.reasons if r["class"] == "statistics_fallback"],
        }


def measure_coverage(store: Store, minimum: float = MIN_COVERAGE) -> Coverage:
    parts: Dict[tuple, Part] = {}
    for kind, direction, status, basis, skip_class, count in store.query(
        "select kind, direction, status, basis, skip_class, count(*) from pairs "
        "group by kind, direction, status, basis, skip_class"
    ):
        part = parts.setdefault((kind, direction), Part(kind, direction))
        part.target_tensors += count
        if status != "skipped":
            part.compared += count
            part.on_statistics += count if basis == "statistics" else 0
        elif skip_class in (NO_PARTNER, BY_DESIGN, NOT_COMPARABLE):
            setattr(part, skip_class, getattr(part, skip_class) + count)
    for kind, direction, total in store.query(
        "select kind, direction, sum(tensors) from base_totals group by kind, direction"
    ):
        parts.setdefault((kind, direction), Part(kind, direction)).baseline_tensors = total
    for kind, direction, used in store.query(
        "select kind, direction, count(*) from (select distinct kind, direction, step, rank, baseline_entry, "
        "baseline_slot from pairs where status != 'skipped') group by kind, direction"
    ):
        parts[(kind, direction)].baseline_used = used
    ordered = sorted(parts.values(), key=lambda p: _order(p.kind, p.direction))
    kept = [p for p in ordered if p.kind in KINDS and (p.target_tensors or p.baseline_tensors)]
    return Coverage(kept, _reasons(store), minimum)


def _order(kind: str, direction: str) -> int:
    return _PART_ORDER.index((kind, direction)) if (kind, direction) in _PART_ORDER else len(_PART_ORDER)


def _reasons(store: Store) -> List[Dict[str, Any]]:
    rows = store.query(
        "select kind, skip_class, reason, count(*) from pairs where status = 'skipped' "
        "group by kind, skip_class, reason order by count(*) desc"
    )
    out = [{"kind": k, "class": c, "reason": r, "count": n} for k, c, r, n in rows]
    fallback = store.query(
        "select kind, count(*), min(reason) from pairs where status != 'skipped' "
        "and reason like '%tensor unreadable%' group by kind"
    )
    out.extend({"kind": k, "class": "statistics_fallback", "count": n,
                "reason": "compared on statistics: a tensor file could not be read (first: "
                + example[example.find("statistics only:") + len("statistics only: "):] + ")"}
               for k, n, example in fallback)
    return out
