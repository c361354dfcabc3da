"""What a comparison found: the first divergent cell, the first differing weight, the CSV table.

The first divergence is searched among activations (inputs and outputs of cells) in
execution order: forward before backward, in the earliest step/rank that diverges, at
the earliest divergent entry of the dump; then, as long as one of its descendants also
diverges, the earliest such descendant. Dumpers list a parent before its children (ours:
order of first capture) or after them (msprobe: order of completion); descending makes the
answer the innermost cell either way. Weights and weight gradients are reported apart: a
weight that differs when the step starts is a different diagnosis (conversion, loading,
an optimizer step) from a computation that differs.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from mf_celldump.analysis.compare import thresholds
from mf_celldump.analysis.compare.coverage import MIN_COVERAGE, Coverage
from mf_celldump.analysis.compare.pairing import ACTIVATION, WEIGHT, WEIGHT_GRAD
from mf_celldump.analysis.compare.store import Store
from mf_celldump.config import IndexSelection
from mf_celldump.layout.naming import FORWARD
from mf_celldump.mapping import AUTO

NEXT_COUNT = 5
UPSTREAM_COUNT = 20
DIRECTION_ORDER = f"case direction when '{FORWARD}' then 0 else 1 end"
UNIT_ORDER = "coalesce(step, -1), rank"
_TENSOR_COLUMNS = (
    "slot", "baseline_slot", "kind", "status", "basis", "cosine", "max_abs_err", "max_rel_err", "rel_err",
    "stat_rel", "score", "baseline_transform", "reason",
)
METRIC_KEYS = ("slot", "cosine", "max_abs_err", "max_rel_err", "rel_err", "stat_rel")


@dataclass
class Divergence:
    entry: str
    cell: str
    direction: str
    step: Optional[int]
    rank: int
    folder: str
    pos: int
    kind: str = ACTIVATION
    baseline: Optional[str] = None
    tensors: List[Dict[str, Any]] = field(default_factory=list)
    parents: List[Dict[str, str]] = field(default_factory=list)
    next: List[Dict[str, Any]] = field(default_factory=list)
    inputs_differ: bool = False
    last_ok: Optional[str] = None
    upstream_unpaired: List[Dict[str, str]] = field(default_factory=list)

    @property
    def worst(self) -> Dict[str, Any]:
        ranked = sorted(self.tensors, key=lambda t: (t["status"] != "diverged", t["kind"] != self.kind,
                                                     _num(t.get("cosine"), 2.0), -_num(t.get("score"), 0.0)))
        return ranked[0] if ranked else {}

    @property
    def cause_note(self) -> str:
        """Where to look when the cell's own inputs already differ ("" when they do not)."""
        if not self.inputs_differ:
            return ""
        what = "its inputs already differ" if self.direction == FORWARD else "the gradient it receives already differs"
        if self.upstream_unpaired:
            cells = ", ".join(item["cell"] for item in self.upstream_unpaired)
            return (f"{what}: the cause lies upstream, in a cell without a compared partner ({cells}) "
                    "or in code between cells")
        return f"{what}: the cause lies upstream, in code between cells (the parent's construct)"

    def to_json(self) -> Dict[str, Any]:
        return {
            "name": self.entry,
            "cell": self.cell,
            "kind": self.kind,
            "direction": self.direction,
            "step": self.step,
            "rank": self.rank,
            "folder": self.folder,
            "baseline": self.baseline,
            "metrics": {key: self.worst.get(key) for key in METRIC_KEYS},
            "tensors": self.tensors,
            "parents": self.parents,
            "next": self.next,
            "inputs_differ": self.inputs_differ,
            "cause": self.cause_note,
            "last_ok": self.last_ok,
            "upstream_unpaired": self.upstream_unpaired,
        }


def _num(value, default):
    return default if value is None or (isinstance(value, float) and math.isnan(value)) else value


def first_divergence(store: Store, kind: str = ACTIVATION) -> Optional[Divergence]:
    """The first divergent entry of ``kind`` rows, innermost cell first (see the module docstring)."""
    row = store.query(
        f"select step, rank, folder, direction, pos, entry, cell from pairs where status = 'diverged' "
        f"and kind = ? order by {UNIT_ORDER}, {DIRECTION_ORDER}, pos limit 1",
        (kind,),
    )
    if not row:
        return None
    step, rank, folder, direction, pos, entry, cell = row[0]
    while kind == ACTIVATION:
        deeper = store.query(
            "select pos, entry, cell from pairs where status = 'diverged' and kind = ? and step is ? and rank = ? "
            "and direction = ? and substr(cell, 1, ?) = ? order by pos limit 1",
            (kind, step, rank, direction, len(cell) + 1, cell + "."),
        )
        if not deeper:
            break
        pos, entry, cell = deeper[0]
    found = Divergence(entry, cell, direction, step, rank, folder, pos, kind)
    _fill_tensors(store, found)
    if kind == ACTIVATION:
        found.parents = parents(store, found)
        _fill_upstream(store, found)
        found.next = next_divergent(store, found)
    return found


def _fill_tensors(store: Store, found: Divergence) -> None:
    rows = store.query(
        f"select {', '.join(_TENSOR_COLUMNS)}, baseline_entry from pairs where step is ? and rank = ? and entry = ? "
        "order by case kind when 'weight' then 0 else 1 end",
        (found.step, found.rank, found.entry),
    )
    found.tensors = [dict(zip(_TENSOR_COLUMNS, r[:-1])) for r in rows if r[3] != "skipped"]
    found.baseline = next((r[-1] for r in rows if r[3] != "skipped" and r[-1]), None)
    found.inputs_differ = any(
        t["kind"] == ACTIVATION and t["status"] == "diverged" and t["slot"].startswith(("input", "kwarg"))
        for t in found.tensors
    )


def parents(store: Store, found: Divergence) -> List[Dict[str, str]]:
    """The ancestors of the found cell with their verdicts, and why an ancestor is not diverged."""
    out = []
    parts = found.cell.split(".")
    for size in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:size])
        rows = store.query(
            "select entry, slot, status, basis, cosine, rel_err, stat_rel, reason from pairs where step is ? "
            "and rank = ? and direction = ? and kind = ? and cell = ? order by pos",
            (found.step, found.rank, found.direction, ACTIVATION, parent),
        )
        if rows:
            entry = rows[0][0]
            mine = [r for r in rows if r[0] == entry]
            status, why = _parent_verdict(mine)
            out.append({"name": entry, "cell": parent, "status": status, "why": why})
    return out


def _parent_verdict(rows) -> tuple:
    diverged = [r[1] for r in rows if r[2] == "diverged"]
    if diverged:
        return "diverged", f"diverged at {', '.join(diverged)}"
    compared = [r for r in rows if r[2] == "ok"]
    skipped = [f"{r[1]} ({r[7]})" for r in rows if r[2] == "skipped"]
    if not compared:
        return "not compared", "not compared: " + "; ".join(skipped)
    worst = max(compared, key=lambda r: _badness(r))
    metric = "stat_rel" if worst[3] == "statistics" else "rel_err"
    value = worst[6] if metric == "stat_rel" else worst[5]
    why = (f"within thresholds at {', '.join(r[1] for r in compared)} (largest {metric} {_short(value)} at "
           f"{worst[1]}): the child's difference is below this cell's thresholds where it is compared")
    if skipped:
        why += "; not compared: " + "; ".join(skipped)
    return "ok", why


def _badness(row) -> float:
    values = [v for v in (row[5], row[6]) if isinstance(v, float) and not math.isnan(v)]
    return max(values, default=0.0)


def _short(value) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3g}"


def _fill_upstream(store: Store, found: Divergence) -> None:
    """The last cell whose outputs were compared and within thresholds before the found one, and the
    cells between them whose outputs were not compared (with why)."""
    ancestors = {".".join(found.cell.split(".")[:i]) for i in range(1, found.cell.count(".") + 1)}
    entries = store.query(
        "select pos, entry, cell, sum(status = 'diverged'), sum(status = 'ok' and slot like 'output%'), "
        "max(case when status = 'skipped' and slot like 'output%' then reason end), max(reason) from pairs "
        "where step is ? and rank = ? and direction = ? and kind = ? and pos < ? group by pos order by pos desc",
        (found.step, found.rank, found.direction, ACTIVATION, found.pos),
    )
    between = []
    for _pos, entry, cell, bad, outputs_ok, output_reason, reason in entries:
        if bad or cell in ancestors or cell.startswith(found.cell + "."):
            continue
        if outputs_ok:
            found.last_ok = entry
            break
        between.append({"name": entry, "cell": cell, "reason": "outputs not compared: " + (output_reason or reason
                                                                                           or "no output")})
    found.upstream_unpaired = list(reversed(between))[-UPSTREAM_COUNT:]


def next_divergent(store: Store, found: Divergence) -> List[Dict[str, Any]]:
    later = store.query(
        f"select entry, cell, direction, min(cosine), max(rel_err), max(stat_rel), max(basis) from pairs "
        f"where status = 'diverged' and kind = ? and step is ? and rank = ? "
        f"and ({DIRECTION_ORDER} * 1000000000 + pos) > ? "
        f"group by entry order by {DIRECTION_ORDER}, pos limit ?",
        (
            ACTIVATION,
            found.step,
            found.rank,
            (0 if found.direction == FORWARD else 1) * 1000000000 + found.pos,
            NEXT_COUNT + len(found.parents),
        ),
    )
    ancestors = {p["cell"] for p in found.parents}
    return [
        {"name": e, "direction": d, "cosine": c, "rel_err": r, "stat_rel": s, "basis": b}
        for e, cell, d, c, r, s, b in later
        if cell not in ancestors
    ][:NEXT_COUNT]


def unit_counts(store: Store) -> List[Dict[str, Any]]:
    rows = store.query(
        f"select step, rank, folder, count(distinct entry), count(*), sum(status = 'ok'), "
        f"sum(status = 'diverged'), sum(status = 'skipped') from pairs group by step, rank order by {UNIT_ORDER}"
    )
    keys = ("step", "rank", "folder", "entries", "tensors", "ok", "diverged", "skipped")
    return [dict(zip(keys, row)) for row in rows]


def weight_summary(store: Store) -> Dict[str, Any]:
    """Counts of the weight and weight-gradient rows, and the first of each kind that differs."""
    out: Dict[str, Any] = {}
    for kind in (WEIGHT, WEIGHT_GRAD):
        ok, bad, skipped = store.query(
            "select coalesce(sum(status = 'ok'), 0), coalesce(sum(status = 'diverged'), 0), "
            "coalesce(sum(status = 'skipped'), 0) from pairs where kind = ?",
            (kind,),
        )[0]
        first = first_divergence(store, kind)
        out[kind] = {
            "ok": ok,
            "diverged": bad,
            "skipped": skipped,
            "first": first.to_json() if first else None,
            "diverged_cells": [r[0] for r in store.query(
                f"select cell || ':' || slot from pairs where kind = ? and status = 'diverged' "
                f"order by {UNIT_ORDER}, pos limit ?", (kind, NEXT_COUNT))],
        }
    return out


def crc_summary(store: Store) -> Dict[str, Any]:
    """Pairs whose records both carry a CRC-32 (msprobe's ``md5``): how many are bit-identical, and the
    first, in execution order, that is not."""
    same, differ = store.query(
        "select coalesce(sum(crc_match = 'yes'), 0), coalesce(sum(crc_match = 'no'), 0) from pairs"
    )[0]
    first = store.query(
        f"select entry, slot from pairs where crc_match = 'no' order by {UNIT_ORDER}, {DIRECTION_ORDER}, pos limit 1"
    )
    return {"identical": same, "different": differ, "first_different": " ".join(first[0]) if first else None}


def write_csv(store: Store, path: str) -> None:
    """Every pair row, in execution order, streamed from the store (memory stays at one row).

    A missing value is an empty field, an integer column holds integers and a float is written
    at full precision (its repr), so a script reading the table gets back the numbers compared.
    """
    cursor = store.db.execute(f"select * from pairs order by {UNIT_ORDER}, {DIRECTION_ORDER}, pos")
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([column[0] for column in cursor.description])
        for row in cursor:
            writer.writerow(["" if value is None else value for value in row])


@dataclass
class LayerRow:
    """One depth group (``model.layers.N``, the embedding, the head) in one direction: its worst metrics.

    ``depth`` is the group's place along the forward pass (groups only seen backward come after).
    """

    layer: str
    direction: str
    pos: int
    cosine: Optional[float]
    rel_err: Optional[float]
    stat_rel: Optional[float]
    diverged: int
    depth: int = 0


def layer_table(store: Store, step: Optional[int], rank: int) -> List[LayerRow]:
    """Per depth group and direction: worst cosine, rel_err, stat_rel; ordered along the forward pass."""
    rows = [LayerRow(*values) for values in store.query(
        "select layer, direction, min(pos) as pos, min(cosine) as cosine, max(rel_err) as rel_err, "
        "max(stat_rel) as stat_rel, sum(status = 'diverged') as diverged from pairs "
        "where layer is not null and status != 'skipped' and kind = ? and step is ? and rank = ? "
        "group by layer, direction",
        (ACTIVATION, step, rank),
    )]
    order: Dict[str, int] = {}
    for row in sorted((r for r in rows if r.direction == FORWARD), key=lambda r: r.pos):
        order.setdefault(row.layer, len(order))
    for row in sorted(rows, key=lambda r: r.pos):
        order.setdefault(row.layer, len(order))
    for row in rows:
        row.depth = order[row.layer]
    return sorted(rows, key=lambda r: (r.depth, r.pos))


def json_number(value: Any) -> Any:
    """NaN -> None, +-Inf -> "inf"/"-inf", anything else unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def json_ready(value: Any) -> Any:
    """``value`` with every number JSON can hold (see :func:`json_number`), dict keys as text."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return json_number(value)


NONE = "none"
DEFAULT_OUTPUT = "compare_out"
PYTORCH = "pytorch"

# What a comparison concludes (the command turns it into an exit status).
DIVERGED, WITHIN, LOW_COVERAGE, NOTHING = "diverged", "within thresholds", "too little compared", "nothing compared"
COMMON_FACTOR = "common factor"  # every difference is one factor (clipping, a loss scale): neither clean nor diverged

@dataclass
class CompareRequest:
    target: str
    baseline: str
    output: str = DEFAULT_OUTPUT
    mapping: Tuple[str, ...] = (AUTO,)
    steps: IndexSelection = field(default_factory=IndexSelection)
    ranks: IndexSelection = field(default_factory=IndexSelection)
    thresholds: Dict[str, thresholds.Thresholds] = field(
        default_factory=lambda: dict(thresholds.DEFAULT_THRESHOLDS)
    )
    qkv_groups: Optional[int] = None
    min_coverage: float = MIN_COVERAGE
    progress: bool = True
    html: bool = True
    jobs: Optional[int] = 1  # processes pairing each unit; None: the CPUs available, for large units only


@dataclass
class CompareResult:
    request: CompareRequest
    units: List[Dict]
    unpaired: List[str]
    mapping_sources: Tuple[str, ...]
    frameworks: Tuple[str, str]
    tasks: Tuple[str, str]
    first: Optional[Divergence]
    weights: Dict[str, Any]
    coverage: Coverage
    crc: Dict[str, Any]
    csv_path: str
    plot_path: Optional[str] = None
    plot_note: str = ""
    html_path: Optional[str] = None
    warnings: List[str] = field(default_factory=list)  # input read but not what a dump holds, named
    factors: List[Dict[str, Any]] = field(default_factory=list)  # verdicts.common_factors
    weight_timing: Dict[str, Any] = field(default_factory=dict)  # verdicts.weight_timing
    diverged_directions: List[str] = field(default_factory=list)  # activation directions with a diverged pair
    dtype_change: Optional[Dict[str, Any]] = None  # verdicts.dtype_change
    statistics_undecided: Optional[Dict[str, Any]] = None  # verdicts.statistics_undecided

    @property
    def compared(self) -> int:
        """Tensor pairs that were compared (within thresholds or not), every kind."""
        return sum((unit["ok"] or 0) + (unit["diverged"] or 0) for unit in self.units)

    @property
    def weights_diverged(self) -> int:
        return sum(self.weights[kind]["diverged"] for kind in self.weights)

    def factor_of(self, kind: str, direction: Optional[str] = None) -> Optional[Dict[str, Any]]:
        return next((f for f in self.factors if f["kind"] == kind and f["direction"] == direction), None)

    @property
    def explained_by_factors(self) -> bool:
        """Every difference found is a common factor (weights differing only after the optimizer ran on
        gradients that differed by one count as its consequence)."""
        if any(self.factor_of(ACTIVATION, d) is None for d in self.diverged_directions):
            return False
        if self.weights.get(WEIGHT_GRAD, {}).get("diverged") and self.factor_of(WEIGHT_GRAD) is None:
            return False
        timing = self.weight_timing
        late = timing.get("after_optimizer") and timing.get("gradients_differ_before")
        return not (self.weights.get(WEIGHT, {}).get("diverged") and not late)

    @property
    def verdict(self) -> str:
        if self.first is not None or self.weights_diverged:
            return COMMON_FACTOR if self.factors and self.explained_by_factors else DIVERGED
        if not self.compared:
            return NOTHING
        return WITHIN if self.coverage.enough else LOW_COVERAGE

    @property
    def swapped(self) -> bool:
        """The target is a PyTorch dump and the baseline a MindSpore one: the arguments look reversed."""
        return self.frameworks[0] == PYTORCH and self.frameworks[1] != PYTORCH
