"""The first NaN/Inf (or value past a magnitude) in execution order.

Works from the statistics every record carries (Max, Min, Mean, Norm, and nan_count /
inf_count when dumped), so statistics-task dumps are covered and no tensor is loaded.
Per step and rank the first anomalous cell is found in execution order, forward before
backward, descending into the earliest anomalous descendant as the compare report does
(so a dumper listing parents first still names the innermost cell): ``watch.first_in_order``, the
one reading of "first bad cell" that the watch and ``mf-celldump health`` use too. Across ranks, the
earliest step wins, then forward before backward and the earlier position; ranks tied
there are all named. The command is ``cli/anomalies.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from mf_celldump.config import IndexSelection
from mf_celldump.layout import stat_records
from mf_celldump.layout.naming import FORWARD, parse_entry_name
from mf_celldump.layout.reader import DumpError, DumpJson, find_rank_dumps
from mf_celldump.layout.slots import tensor_slots
from mf_celldump.layout.stat_records import slot_anomaly
from mf_celldump.watch import first_in_order


@dataclass
class Finding:
    step: Optional[int]
    rank: int
    direction: str
    pos: int
    entry: str
    cell: str
    slots: List[Dict[str, Any]] = field(default_factory=list)
    folder: str = ""

    @property
    def order(self) -> tuple:
        return (self.step if self.step is not None else -1, 0 if self.direction == FORWARD else 1, self.pos)

    @property
    def note(self) -> str:
        if any(s["slot"].startswith("param.") for s in self.slots):
            return "one of its own weights is bad"
        inputs = [s for s in self.slots if s["slot"].startswith(("input", "kwarg"))]
        if self.direction == FORWARD and inputs:
            return ("its inputs already have them: made before this cell, by its parent's code between cells "
                    "or in the input data")
        return ""


def slot_details(record: Dict[str, Any]) -> Dict[str, Any]:
    """What a report shows of an anomalous tensor: its extremes and, when dumped, its NaN/Inf counts."""
    out = {"Max": record.get("Max"), "Min": record.get("Min")}
    for key in ("nan_count", "inf_count"):
        value = stat_records.count(record, key)
        if value is not None:
            out[key] = value
    return out


def scan_rank(dump_json: str, step: Optional[int], rank: int, max_abs: Optional[float], folder: str = ""
              ) -> Dict[str, Any]:
    """First anomaly per direction of one rank folder (streamed), and how many tensors are anomalous."""
    counts = {"nan": 0, "inf": 0, "large": 0}

    def findings():
        for pos, (name, body) in enumerate(DumpJson(dump_json).entries()):
            parsed = parse_entry_name(name)
            if parsed is None:
                continue
            bad = []
            for slot, record in tensor_slots(parsed.direction, body, parameters=True):
                kind = slot_anomaly(record, max_abs)
                if kind:
                    counts[kind] += 1
                    bad.append({"slot": slot, "kind": kind, **slot_details(record)})
            if bad:
                yield parsed.direction, parsed.cell, Finding(step, rank, parsed.direction, pos, name, parsed.cell,
                                                             bad, folder)

    first = first_in_order(findings())  # the watch's reading of "first bad cell", and mf-celldump health's
    return {"step": step, "rank": rank, "folder": folder, "first": first, "counts": counts}


def scan(path: str, steps: IndexSelection, ranks: IndexSelection, max_abs: Optional[float]) -> Dict[str, Any]:
    results = []
    for dump in find_rank_dumps(path):
        if (dump.step is not None and dump.step not in steps) or (dump.rank or 0) not in ranks:
            continue
        results.append(scan_rank(dump.dump_json, dump.step, dump.rank or 0, max_abs, dump.label))
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


def _details(slot: Dict[str, Any]) -> str:
    counts = [f"{slot[key]} {name}" for key, name in (("nan_count", "NaN"), ("inf_count", "Inf")) if slot.get(key)]
    return ", ".join([*counts, f"Max {slot['Max']}", f"Min {slot['Min']}"])


def result_text(result: Dict[str, Any]) -> str:
    """The result of ``scan`` as the lines the command prints."""
    lines = []
    for item in result["ranks"]:
        where = f"step {item['step'] if item['step'] is not None else '-'} rank {item['rank']} ({item['folder']})"
        first: Optional[Finding] = item["first"]
        if first is None:
            lines.append(f"{where}: no anomaly")
            continue
        counts = ", ".join(f"{n} {k}" for k, n in item["counts"].items() if n)
        lines.append(f"{where}: {counts} tensors; first: {first.direction} {first.entry}")
        lines.extend(f"    {s['slot']}: {s['kind']} ({_details(s)})" for s in first.slots)
        if first.note:
            lines.append(f"    note: {first.note}")
    if result["first"]:
        names = "; ".join(f"step {f.step} rank {f.rank}: {f.direction} {f.entry}" for f in result["first"])
        lines.append(f"FIRST ANOMALY across ranks: {names}")
    else:
        lines.append("no NaN, Inf or out-of-range value found")
    return "\n".join(lines)
