"""The first NaN/Inf (or value past a magnitude) in execution order.

Works from the statistics every record carries (Max, Min, Mean, Norm, and nan_count /
inf_count when dumped), so statistics-task dumps are covered and no tensor is loaded.
Per step and rank the first anomalous cell is found in execution order, forward before
backward, descending into the earliest anomalous descendant as the compare report does
(so a dumper listing parents first still names the innermost cell). Across ranks, the
earliest step wins, then forward before backward and the earlier position; ranks tied
there are all named. The command is ``cli/anomalies.py``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from mf_celldump.config import IndexSelection
from mf_celldump.layout.naming import BACKWARD, FORWARD, parse_entry_name
from mf_celldump.layout.reader import DumpError, DumpJson, find_rank_dumps
from mf_celldump.layout.slots import tensor_slots


@dataclass
class Finding:
    step: Optional[int]
    rank: str
    direction: str
    pos: int
    entry: str
    cell: str
    slots: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def order(self) -> tuple:
        return (self.step if self.step is not None else -1, 0 if self.direction == FORWARD else 1, self.pos)

    @property
    def note(self) -> str:
        if any(s["slot"].startswith("param.") for s in self.slots):
            return "one of its own weights is bad"
        inputs = [s for s in self.slots if s["slot"].startswith(("input", "kwarg"))]
        if self.direction == FORWARD and inputs:
            return "its inputs are already bad: produced between cells, in its parent's code"
        return ""


def slot_anomaly(record: Dict[str, Any], max_abs: Optional[float]) -> Optional[str]:
    """``nan``, ``inf``, ``large`` or None, from a tensor record's statistics."""
    values = [_float(record.get(k)) for k in ("Max", "Min", "Mean", "Norm")]
    if any(v is not None and math.isnan(v) for v in values) or _count(record, "nan_count"):
        return "nan"
    if any(v is not None and math.isinf(v) for v in values) or _count(record, "inf_count"):
        return "inf"
    extremes = [abs(v) for v in values[:2] if v is not None]
    if max_abs is not None and extremes and max(extremes) > max_abs:
        return "large"
    return None


def _float(value) -> Optional[float]:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _count(record, key) -> bool:
    value = _float(record.get(key))
    return bool(value and value > 0)


def scan_rank(dump_json: str, step: Optional[int], rank: str, max_abs: Optional[float]) -> Dict[str, Any]:
    """First anomaly per direction of one rank folder (streamed), and how many tensors are anomalous."""
    current: Dict[str, Finding] = {}
    counts = {"nan": 0, "inf": 0, "large": 0}
    for pos, (name, body) in enumerate(DumpJson(dump_json).entries()):
        parsed = parse_entry_name(name)
        if parsed is None:
            continue
        bad = []
        for slot, record in tensor_slots(parsed.direction, body, parameters=True):
            kind = slot_anomaly(record, max_abs)
            if kind:
                counts[kind] += 1
                bad.append({"slot": slot, "kind": kind, "Max": record.get("Max"), "Min": record.get("Min")})
        if not bad:
            continue
        found = current.get(parsed.direction)
        if found is None or parsed.cell.startswith(found.cell + "."):
            current[parsed.direction] = Finding(step, rank, parsed.direction, pos, name, parsed.cell, bad)
    first = current.get(FORWARD) or current.get(BACKWARD)
    return {"step": step, "rank": rank, "first": first, "counts": counts}


def scan(path: str, steps: IndexSelection, ranks: IndexSelection, max_abs: Optional[float]) -> Dict[str, Any]:
    results = []
    for dump in find_rank_dumps(path):
        if (dump.step is not None and dump.step not in steps) or (dump.rank or 0) not in ranks:
            continue
        results.append(scan_rank(dump.dump_json, dump.step, dump.label.rpartition("/")[2], max_abs))
    if not results:
        raise DumpError(f"{path}: no rank folder matches steps {steps.describe()}, ranks {ranks.describe()}")
    bad = [r["first"] for r in results if r["first"] is not None]
    earliest = min((f.order[:2] for f in bad), default=None)
    first_ranks = []
    if earliest is not None:
        candidates = [f for f in bad if f.order[:2] == earliest]
        best = min(f.pos for f in candidates)
        first_ranks = [f for f in candidates if f.pos == best] or candidates
    return {"ranks": results, "first": first_ranks}


def result_json(result: Dict[str, Any], code: int) -> dict:
    """The result of ``scan`` as JSON-ready data, with the exit code the command returns."""
    def finding(item: Optional[Finding]):
        return None if item is None else dict(asdict(item), note=item.note)

    return {
        "first": [finding(f) for f in result["first"]],
        "ranks": [dict(r, first=finding(r["first"])) for r in result["ranks"]],
        "exit_code": code,
    }


def result_text(result: Dict[str, Any]) -> str:
    """The result of ``scan`` as the lines the command prints."""
    lines = []
    for item in result["ranks"]:
        where = f"step {item['step'] if item['step'] is not None else '-'} {item['rank']}"
        first: Optional[Finding] = item["first"]
        if first is None:
            lines.append(f"{where}: no anomaly")
            continue
        counts = ", ".join(f"{n} {k}" for k, n in item["counts"].items() if n)
        lines.append(f"{where}: {counts} tensors; first: {first.direction} {first.entry}")
        lines.extend(f"    {s['slot']}: {s['kind']} (Max {s['Max']}, Min {s['Min']})" for s in first.slots)
        if first.note:
            lines.append(f"    note: {first.note}")
    if result["first"]:
        names = "; ".join(f"step {f.step} {f.rank}: {f.direction} {f.entry}" for f in result["first"])
        lines.append(f"FIRST ANOMALY across ranks: {names}")
    else:
        lines.append("no NaN, Inf or out-of-range value found")
    return "\n".join(lines)
