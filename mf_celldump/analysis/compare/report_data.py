"""Everything the HTML report shows, as one JSON-ready dict read from the store and the result.

Kept apart from the page itself (``html_report``) so the page is a view of data that tests
and other tools can read too. Numbers that JSON cannot hold (NaN, Inf) become ``null`` and
``"inf"``. The pair table holds every diverged pair first, then the others in execution
order, up to ``MAX_TABLE_ROWS`` (the CSV has them all). The heat map is generic: rows
(one per compared rank folder), columns (depth groups) and a value per cell, so any
ranks x layers data (shards merged or not) can be drawn by the same page.
"""

from __future__ import annotations

import datetime
import heapq
import math
from typing import Any, Dict, Iterator, List, Optional

from mf_celldump import __version__
from mf_celldump.analysis.compare.pairing import ACTIVATION
from mf_celldump.analysis.compare.plot import dominant_limits
from mf_celldump.analysis.compare.report import DIRECTION_ORDER, UNIT_ORDER, json_number, json_ready, layer_table
from mf_celldump.analysis.compare.request import CompareResult
from mf_celldump.analysis.compare.store import Store
from mf_celldump.analysis.compare.summary import crc_lines, header, weight_lines
from mf_celldump.layout.naming import DIRECTIONS

MAX_TABLE_ROWS = 20000
TABLE_COLUMNS = (  # status near the left: a 1280 px wide window shows it beside the long entry names
    "status", "folder", "kind", "direction", "entry", "slot", "baseline_entry", "baseline_slot", "basis",
    "cosine", "rel_err", "max_abs_err", "max_rel_err", "stat_rel", "euc_dist", "one_thousandth_ratio",
    "five_thousandths_ratio", "crc_match", "msprobe_result", "baseline_transform", "dtype", "shape", "reason",
)


def report_data(store: Store, result: CompareResult) -> Dict[str, Any]:
    request, first = result.request, result.first
    step, rank = (first.step, first.rank) if first else (result.units[0]["step"], result.units[0]["rank"])
    dtype, limits = dominant_limits(store, step, rank, request.thresholds)
    data = {
        "tool": f"mf-celldump {__version__}",
        "generated": datetime.datetime.now().isoformat(timespec="seconds"),
        **header(result),
        "findings": [line for line in weight_lines(result)
                     if line.startswith("WEIGHTS DIFFER") or (" DIFFER" in line and first is None)],
        "notes": crc_lines(result.crc),
        "units": result.units,
        "unpaired": result.unpaired,
        "coverage": result.coverage.to_json(),
        "first": first.to_json() if first else None,
        "weights": result.weights,
        "limits": {"dtype": dtype, "cosine": limits.cosine, "rel_err": limits.rel_err,
                   "stat_rel": limits.stat_rel},
        "chart": {"step": step, "rank": rank, "layers": _layers(store, step, rank)},
        "heatmap": heatmap(store),
        "table": pair_table(store),
        "csv": result.csv_path,
    }
    return json_ready(data)


def _layers(store: Store, step, rank) -> Dict[str, List[Dict[str, Any]]]:
    table = layer_table(store, step, rank)
    labels = list(dict.fromkeys(row.layer for row in table))  # in depth order
    out: Dict[str, Any] = {"labels": labels}
    for direction in DIRECTIONS:
        part = [row for row in table if row.direction == direction]
        out[direction] = [
            {"layer": r.layer, "x": r.depth, "cosine": _float(r.cosine), "rel_err": _float(r.rel_err),
             "stat_rel": _float(r.stat_rel), "diverged": int(r.diverged or 0)}
            for r in part
        ]
    return out


def _float(value) -> Optional[float]:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def heatmap(store: Store) -> Optional[Dict[str, Any]]:
    """Ranks x layers: per compared folder and depth group, the largest score (metric / threshold) of its
    activations, forward and backward; None when a single folder was compared."""
    units = store.query(f"select distinct folder from pairs order by {UNIT_ORDER}")
    if len(units) < 2:
        return None
    columns = [r[0] for r in store.query(
        "select layer from pairs where layer is not null and kind = ? group by layer order by min(pos)",
        (ACTIVATION,))]
    rows = [r[0] for r in units]
    panels = []
    for direction in DIRECTIONS:
        values = {(f, layer): s for f, layer, s in store.query(
            "select folder, layer, max(score) from pairs where kind = ? and direction = ? and layer is not null "
            "and status != 'skipped' group by folder, layer", (ACTIVATION, direction))}
        panels.append({"title": direction, "values": [[values.get((f, c)) for c in columns] for f in rows]})
    return {"rows": rows, "columns": columns, "panels": panels,
            "metric": "largest metric / threshold (above 1: diverged)", "threshold": 1.0}


class TableRows:
    """The rows of the pair table, streamed from the store when the page is written (memory stays at one
    row): every diverged pair (up to ``MAX_TABLE_ROWS``), then the others, merged in execution order
    (``n``)."""

    def __init__(self, store: Store):
        self.store = store

    def __iter__(self) -> Iterator[List[Any]]:
        columns = ", ".join(TABLE_COLUMNS)
        numbered = (f"select row_number() over (order by {UNIT_ORDER}, {DIRECTION_ORDER}, pos) as n, {columns} "
                    "from pairs")
        diverged = self.store.query("select count(*) from pairs where status = 'diverged'")[0][0]
        kept = min(diverged, MAX_TABLE_ROWS)
        first = self.store.db.execute(
            f"select * from ({numbered}) where status = 'diverged' order by n limit ?", (kept,))
        rest = self.store.db.execute(
            f"select * from ({numbered}) where status != 'diverged' order by n limit ?", (MAX_TABLE_ROWS - kept,))
        for row in heapq.merge(first, rest, key=lambda r: r[0]):
            yield [v if type(v) is not float or v - v == 0.0 else json_number(v) for v in row]  # Inf, NaN


def pair_table(store: Store) -> Dict[str, Any]:
    """The table of pairs: ``n`` is the execution order; ``rows`` stream (:class:`TableRows`)."""
    total = store.query("select count(*) from pairs")[0][0]
    return {"columns": ["n", *TABLE_COLUMNS], "rows": TableRows(store), "total": total}
