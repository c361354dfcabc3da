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
from typing import Any, Dict, List, Optional

from mf_celldump.analysis.compare.pairing import ACTIVATION, WEIGHT, WEIGHT_GRAD
from mf_celldump.analysis.compare.store import Store
from mf_celldump.layout.naming import FORWARD

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
class LaunchedRanks:
    """The ranks, as launched, behind a divergence found in a merged tensor-parallel group."""

    group: int  # the merged group's index (its merged rank folder is the divergence's ``folder``)
    ranks: List[int]  # the ranks whose own part diverges; every rank of the group when none does alone
    attributed: bool  # a rank's own part diverges (``shards.Attribution``)


@dataclass
class Divergence:
    """``rank`` is the rank of the compared folder (the merged group's index when shards were merged, as the
    pairs table holds it); ``launched`` names the ranks the user launched, which every output shows."""

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
    launched: Optional[LaunchedRanks] = None
    data_differ: bool = False  # the cell's inputs are the model's inputs at the step, and they differ

    @property
    def ranks(self) -> List[int]:
        """The launched ranks of the divergence: the folder's rank, or those ``launched`` names."""
        return list(self.launched.ranks) if self.launched else [self.rank]

    @property
    def launched_rank(self) -> Optional[int]:
        """The one launched rank (None when the divergence lies in a merged group and no rank's part diverges
        alone: ``ranks`` then lists the group)."""
        if self.launched is None:
            return self.rank
        return self.launched.ranks[0] if self.launched.attributed else None

    @property
    def rank_text(self) -> str:
        """``rank 1``, ``ranks 0, 1``, ``ranks 0, 1 together`` (a merged group whose ranks no part tells apart)."""
        ranks = self.ranks
        if len(ranks) == 1:
            return f"rank {ranks[0]}"
        together = " together" if self.launched and not self.launched.attributed else ""
        return f"ranks {', '.join(map(str, ranks))}{together}"

    @property
    def worst(self) -> Dict[str, Any]:
        ranked = sorted(self.tensors, key=lambda t: (t["status"] != "diverged", t["kind"] != self.kind,
                                                     _num(t.get("cosine"), 2.0), -_num(t.get("score"), 0.0)))
        return ranked[0] if ranked else {}

    @property
    def weights_differ(self) -> List[str]:
        """The cell's own weights that differ (at the start of its step)."""
        return [t["slot"] for t in self.tensors if t["kind"] == WEIGHT and t["status"] == "diverged"]

    @property
    def cause_note(self) -> str:
        """Where to look: the data, the weights the cell computes with, or upstream when its inputs already
        differ ("" when none of them does)."""
        if self.data_differ:
            return (f"its inputs are the model's inputs at {_step_words(self.step)} and they already differ: the data "
                    "differ (another batch, another shuffle or order of the dataset), not the code")
        if not self.inputs_differ:
            if self.weights_differ:
                return (f"it computes with weights that differ at the start of {_step_words(self.step)} "
                        f"({', '.join(self.weights_differ)}), on inputs that agree")
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
            "rank": self.launched_rank,
            "ranks": self.ranks,
            "rank_text": self.rank_text,
            "group": self.launched.group if self.launched else None,
            "folder": self.folder,
            "baseline": self.baseline,
            "metrics": {key: self.worst.get(key) for key in METRIC_KEYS},
            "tensors": self.tensors,
            "parents": self.parents,
            "next": self.next,
            "inputs_differ": self.inputs_differ,
            "data_differ": self.data_differ,
            "weights_differ": self.weights_differ,
            "cause": self.cause_note,
            "last_ok": self.last_ok,
            "upstream_unpaired": self.upstream_unpaired,
        }


def _step_words(step: Optional[int]) -> str:
    return "the step" if step is None else f"step {step}"


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
        found = _computes_with_changed_weight(store, found)
        found.data_differ = _model_inputs_differ(store, found)
        found.parents = parents(store, found)
        _fill_upstream(store, found)
        found.next = next_divergent(store, found)
    return found


def _computes_with_changed_weight(store: Store, found: Divergence) -> Divergence:
    """A cell whose inputs already differ, after a cell of the same forward pass that computes with a weight that
    differs (its own outputs within thresholds): that earlier cell is where the step diverges."""
    if found.direction != FORWARD or not found.inputs_differ:
        return found
    row = store.query(
        "select pos, entry, cell from pairs where status = 'diverged' and kind = ? and step is ? and rank = ? "
        "and direction = ? and pos < ? order by pos limit 1",
        (WEIGHT, found.step, found.rank, FORWARD, found.pos),
    )
    if not row:
        return found
    pos, entry, cell = row[0]
    earlier = Divergence(entry, cell, FORWARD, found.step, found.rank, found.folder, pos, ACTIVATION)
    _fill_tensors(store, earlier)
    return earlier


def _model_inputs_differ(store: Store, found: Divergence) -> bool:
    """The found cell's inputs differ and no cell but its ancestors runs before it in the step's forward pass:
    its inputs are the model's, so the data differ."""
    if found.direction != FORWARD or not found.inputs_differ:
        return False
    parts = found.cell.split(".")
    ancestors = {".".join(parts[:size]) for size in range(1, len(parts))}
    before = store.query(
        "select distinct cell from pairs where step is ? and rank = ? and direction = ? and pos < ? limit ?",
        (found.step, found.rank, FORWARD, found.pos, len(ancestors) + 1),
    )
    return all(cell in ancestors for (cell,) in before)


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
