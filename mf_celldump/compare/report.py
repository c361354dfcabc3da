"""What a comparison found: the first divergent cell, counts, the CSV table and the depth plot.

The first divergence is searched in execution order: forward before backward, in the
earliest step/rank that diverges, at the earliest divergent entry of the dump; then, as
long as one of its descendants also diverges, the earliest such descendant. Dumpers list a
parent before its children (ours: order of first capture) or after them (msprobe: order
of completion); descending makes the answer the innermost cell either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from mf_celldump.compare.store import Store
from mf_celldump.layout.naming import FORWARD

NEXT_COUNT = 5
_DIRECTION_ORDER = f"case direction when '{FORWARD}' then 0 else 1 end"
_UNIT_ORDER = "cast(step as integer), rank"


@dataclass
class Divergence:
    entry: str
    cell: str
    direction: str
    step: str
    rank: str
    pos: int
    baseline: Optional[str] = None
    tensors: List[Dict[str, Any]] = field(default_factory=list)
    parents: List[Dict[str, str]] = field(default_factory=list)
    next: List[Dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        ranked = sorted(self.tensors, key=lambda t: (t["status"] != "diverged", _num(t.get("cosine"), 2.0)))
        worst = ranked[0] if ranked else {}
        return {
            "name": self.entry,
            "cell": self.cell,
            "direction": self.direction,
            "step": self.step,
            "rank": self.rank,
            "baseline": self.baseline,
            "metrics": {
                key: worst.get(key)
                for key in ("slot", "cosine", "max_abs_err", "max_rel_err", "rel_err", "stat_rel")
            },
            "tensors": self.tensors,
            "parents": self.parents,
            "next": self.next,
        }


def _num(value, default):
    return default if value is None or (isinstance(value, float) and math.isnan(value)) else value


def first_divergence(store: Store) -> Optional[Divergence]:
    row = store.query(
        f"select step, rank, direction, pos, entry, cell from pairs where status = 'diverged' "
        f"order by {_UNIT_ORDER}, {_DIRECTION_ORDER}, pos limit 1"
    )
    if not row:
        return None
    step, rank, direction, pos, entry, cell = row[0]
    while True:
        deeper = store.query(
            "select pos, entry, cell from pairs where status = 'diverged' and step = ? and rank = ? and "
            "direction = ? and substr(cell, 1, ?) = ? order by pos limit 1",
            (step, rank, direction, len(cell) + 1, cell + "."),
        )
        if not deeper:
            break
        pos, entry, cell = deeper[0]
    found = Divergence(entry, cell, direction, step, rank, pos)
    _fill(store, found)
    return found


def _fill(store: Store, found: Divergence) -> None:
    columns = (
        "slot",
        "baseline_slot",
        "status",
        "cosine",
        "max_abs_err",
        "max_rel_err",
        "rel_err",
        "stat_rel",
        "transform",
        "reason",
        "baseline_entry",
    )
    rows = store.query(
        f"select {', '.join(columns)} from pairs where step = ? and rank = ? and entry = ?",
        (found.step, found.rank, found.entry),
    )
    found.tensors = [dict(zip(columns[:-1], r[:-1])) for r in rows if r[2] != "skipped"]
    found.baseline = next((r[-1] for r in rows if r[-1]), None)
    parts = found.cell.split(".")
    for size in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:size])
        state = store.query(
            "select entry, sum(status = 'diverged'), sum(status = 'ok') from pairs "
            "where step = ? and rank = ? "
            "and direction = ? and cell = ? group by entry order by pos limit 1",
            (found.step, found.rank, found.direction, parent),
        )
        if state:
            entry, bad, good = state[0]
            verdict = "diverged" if bad else ("ok" if good else "not compared")
            found.parents.append({"name": entry, "cell": parent, "status": verdict})
    later = store.query(
        f"select entry, cell, direction, min(cosine), max(rel_err), max(stat_rel) from pairs "
        f"where status = 'diverged' and step = ? and rank = ? "
        f"and ({_DIRECTION_ORDER} * 1000000000 + pos) > ? "
        f"group by entry order by {_DIRECTION_ORDER}, pos limit ?",
        (
            found.step,
            found.rank,
            (0 if found.direction == FORWARD else 1) * 1000000000 + found.pos,
            NEXT_COUNT + len(found.parents),
        ),
    )
    ancestors = {p["cell"] for p in found.parents}
    found.next = [
        {"name": e, "direction": d, "cosine": c, "rel_err": r, "stat_rel": s}
        for e, cell, d, c, r, s in later
        if cell not in ancestors
    ][:NEXT_COUNT]


def unit_counts(store: Store) -> List[Dict[str, Any]]:
    rows = store.query(
        f"select step, rank, count(distinct entry), count(*), sum(status = 'ok'), sum(status = 'diverged'), "
        f"sum(status = 'skipped') from pairs group by step, rank order by {_UNIT_ORDER}"
    )
    keys = ("step", "rank", "entries", "tensors", "ok", "diverged", "skipped")
    return [dict(zip(keys, row)) for row in rows]


def skip_reasons(store: Store, limit: int = 6) -> List[tuple]:
    return store.query(
        "select reason, count(*) from pairs where status = 'skipped' "
        "group by reason order by count(*) desc limit ?",
        (limit,),
    )


def write_csv(store: Store, path: str) -> None:
    """Every pair row, in execution order, written by pandas in chunks."""
    import pandas as pd

    query = f"select * from pairs order by {_UNIT_ORDER}, {_DIRECTION_ORDER}, pos"
    first = True
    for chunk in pd.read_sql_query(query, store.db, chunksize=5000):
        chunk.to_csv(path, mode="w" if first else "a", header=first, index=False)
        first = False
    if first:
        pd.DataFrame(
            columns=[d[0] for d in store.db.execute("select * from pairs limit 0").description]
        ).to_csv(path, index=False)


def layer_table(store: Store, step: str, rank: str):
    """Per depth group and direction: worst cosine, rel_err, stat_rel; ordered along the forward pass."""
    import pandas as pd

    frame = pd.read_sql_query(
        "select layer, direction, min(pos) as pos, min(cosine) as cosine, max(rel_err) as rel_err, "
        "max(stat_rel) as stat_rel, sum(status = 'diverged') as diverged from pairs "
        "where layer is not null and status != 'skipped' and step = ? and rank = ? group by layer, direction",
        store.db,
        params=(step, rank),
    )
    forward = frame[frame.direction == FORWARD].sort_values("pos")
    order = {layer: i for i, layer in enumerate(forward.layer)}
    for layer in frame.sort_values("pos").layer:
        order.setdefault(layer, len(order))
    frame["depth"] = frame.layer.map(order)
    return frame.sort_values("depth")
