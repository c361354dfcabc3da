"""The first bad cell: in dumps (the first NaN/Inf, or value past a magnitude, in execution order) and in
cell health records (``health/rank{R}.csv``), both read through ``watch.first_in_order``.

In dumps.

Works from the statistics every record carries (Max, Min, Mean, Norm, and nan_count /
inf_count when dumped), so statistics-task dumps are covered and no tensor is loaded: the
records of activations, of each cell's weights and of their gradients (``parameters_grad``
entries, judged with the backward pass they belong to). A record it cannot read (a statistic
that is no number, a shape that is no list of whole numbers) is not judged, and said so.
Per step and rank the first anomalous cell is found in execution order, forward before
backward, descending into the earliest anomalous descendant as the compare report does
(so a dumper listing parents first still names the innermost cell): ``watch.first_in_order``, the
one reading of "first bad cell" that the watch and ``mf-celldump health`` use too. Across ranks, the
earliest step wins, then forward before backward and the earlier position; ranks tied
there are all named. The command is ``cli/anomalies.py``.

In cell health records (``capture/health.py``; the command is ``cli/health.py``).

Per rank and step, the first bad cell is ``watch.first_in_order`` over the step's rows with a NaN or an
Inf (forward before backward, the innermost of a parent): the reading the watch fires on and
``mf-celldump anomalies`` reads dumps with. Across ranks, the earliest step wins, then forward before
backward, then the earlier row. The files are streamed row by row; what is kept is one step's rows, the
findings, and a heat map of at most ``MAX_COLUMNS`` step columns per rank (consecutive steps merged two by
two whenever there would be more), so memory is bounded by cells x ``MAX_COLUMNS``, not by the run's length.

The page (``heat_map_html``) is one self-contained HTML file: a table per rank, a row per cell in
execution order, a column per step (or merged steps); red where a value held a NaN or an Inf, else a
blue whose depth is the cell's largest |x| on a log scale within its own row, so a spike stands out.
"""

from __future__ import annotations

import csv
import html
import io
import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from mf_celldump.errors import DumpError
from mf_celldump.fsutil import open_own_file
from mf_celldump.layout import stat_records
from mf_celldump.layout.naming import BACKWARD, FORWARD, PARAMETERS_GRAD, parse_entry_name
from mf_celldump.layout.reader import DumpJson, find_rank_dumps
from mf_celldump.layout.slots import tensor_slots, weight_records
from mf_celldump.layout.stat_records import record_problem, slot_anomaly
from mf_celldump.userinput import IndexSelection
from mf_celldump.watch import CellReading, first_in_order

GRADIENT_SLOT = "param_grad."  # a weight gradient's slot label (its parameters_grad entry)
SHOWN_UNJUDGED = 3  # records not judged named per rank; the rest are counted


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
        if any(s["slot"].startswith(GRADIENT_SLOT) for s in self.slots):
            return "the gradient of one of its own weights is bad"
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
    unjudged: List[str] = []
    unjudged_count = 0

    def findings():
        nonlocal unjudged_count
        for pos, (name, body) in enumerate(DumpJson(dump_json).entries()):
            parsed = parse_entry_name(name, parameters_grad=True)
            if parsed is None:
                continue
            direction = BACKWARD if parsed.direction == PARAMETERS_GRAD else parsed.direction
            bad = []
            for slot, record in _records(parsed.direction, body):
                problem = record_problem(record)
                if problem:
                    unjudged_count += 1
                    if len(unjudged) < SHOWN_UNJUDGED:
                        unjudged.append(f"{name} {slot}: {problem}")
                    continue
                kind = slot_anomaly(record, max_abs)
                if kind:
                    counts[kind] += 1
                    bad.append({"slot": slot, "kind": kind, **slot_details(record)})
            if bad:
                yield direction, parsed.cell, Finding(step, rank, direction, pos, name, parsed.cell, bad, folder)

    first = first_in_order(findings())  # the watch's reading of "first bad cell", and mf-celldump health's
    return {"step": step, "rank": rank, "folder": folder, "first": first, "counts": counts,
            "unjudged": unjudged_count, "unjudged_first": unjudged}


def _records(direction: str, body: Dict[str, Any]):
    """(slot, record) of every tensor an entry holds: a weight-gradient entry's gradients, else its weights,
    inputs and outputs."""
    if direction == PARAMETERS_GRAD:
        for name, record in weight_records(body, gradients=True).items():
            yield f"{GRADIENT_SLOT}{name}", record
        return
    yield from tensor_slots(direction, body, parameters=True)


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
        if item.get("unjudged"):
            more = item["unjudged"] - len(item["unjudged_first"])
            lines.append(f"{where}: {item['unjudged']} tensor record(s) not judged, their statistics unreadable: "
                         + "; ".join(item["unjudged_first"]) + (f"; and {more} more" if more > 0 else ""))
        first: Optional[Finding] = item["first"]
        if first is None:
            lines.append(f"{where}: no anomaly" + (" in the records judged" if item.get("unjudged") else ""))
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
        unjudged = sum(item.get("unjudged", 0) for item in result["ranks"])
        lines.append("no NaN, Inf or out-of-range value found" + (
            f" in the records judged; {unjudged} record(s) could not be judged (above)" if unjudged else ""))
    return "\n".join(lines)


# Cell health records.

MAX_COLUMNS = 400
MAX_PROBLEMS = 20
_FILE = re.compile(r"^rank(\d+)\.csv$")
_NEEDED = ("step", "order", "direction", "cell", "kind", "index", "call", "nan", "inf", "max_abs")


@dataclass
class BadCell:
    rank: int
    step: int
    direction: str
    cell: str
    kind: str
    index: int
    call: int
    nan: int
    inf: int
    order: int

    @property
    def key(self) -> tuple:
        return (self.step, 0 if self.direction == "forward" else 1, self.order)

    def text(self) -> str:
        return (f"step {self.step} rank {self.rank}: {self.direction} {self.cell} {self.kind} {self.index} "
                f"(call {self.call}): {self.nan} NaN, {self.inf} Inf")


@dataclass
class HeatMap:
    """One rank's cells x steps, merged two columns into one whenever there would be more than MAX_COLUMNS."""

    width: int = 1  # steps per column
    cells: Dict[str, int] = field(default_factory=dict)  # cell -> its row (first seen, execution order)
    values: Dict[Tuple[str, int], list] = field(default_factory=dict)  # (cell, column) -> [bad, max |x|]

    def add(self, step: int, reading: CellReading) -> None:
        self.cells.setdefault(reading.cell, len(self.cells))
        column = step // self.width
        slot = self.values.setdefault((reading.cell, column), [0, 0.0])
        slot[0] += reading.nan + reading.inf
        if math.isfinite(reading.max_abs):
            slot[1] = max(slot[1], reading.max_abs)
        if len({c for _, c in self.values}) > MAX_COLUMNS:
            self._merge()

    def _merge(self) -> None:
        self.width *= 2
        merged: Dict[Tuple[str, int], list] = {}
        for (cell, column), (bad, largest) in self.values.items():
            slot = merged.setdefault((cell, column // 2), [0, 0.0])
            slot[0] += bad
            slot[1] = max(slot[1], largest)
        self.values = merged


@dataclass
class HealthResult:
    files: List[str] = field(default_factory=list)
    first_per_step: List[BadCell] = field(default_factory=list)  # per rank and step with a bad cell
    first: List[BadCell] = field(default_factory=list)  # across ranks (ranks tied there: all of them)
    steps_read: Dict[int, int] = field(default_factory=dict)  # rank -> steps read
    maps: Dict[int, HeatMap] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)


def health_files(path: str) -> List[Tuple[int, str]]:
    """``(rank, file)`` of a dump root (its ``health`` folder), a health folder, or one ``rank{R}.csv``."""
    if os.path.isfile(path):
        match = _FILE.match(os.path.basename(path))
        if not match:
            raise DumpError(f"{path}: not a cell health file (health/rank{{R}}.csv)")
        return [(int(match.group(1)), path)]
    folder = os.path.join(path, "health") if os.path.isdir(os.path.join(path, "health")) else path
    if not os.path.isdir(folder):
        raise DumpError(f"{path}: no such dump folder or health file")
    found = sorted((int(m.group(1)), os.path.join(folder, name)) for name in os.listdir(folder)
                   if (m := _FILE.match(name)))
    if not found:
        raise DumpError(f"{path}: no cell health record (health/rank{{R}}.csv); a run writes one with watch: "
                        "{cells: true} (docs/watch.md)")
    return found


def _rows(path: str, problems: List[str]) -> Iterator[Tuple[int, CellReading]]:
    """``(step, reading)`` of each row; a malformed row is named (file:line) and skipped; a last line cut by a
    crash (no newline at its end) is skipped too."""
    with open_own_file(path, None) as raw:
        size = os.fstat(raw.fileno()).st_size
        cut = size > 0 and os.pread(raw.fileno(), 1, size - 1) != b"\n"
        text = io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", newline="")
        reader = csv.reader(text)
        header = next(reader, None)
        if header is None:
            return
        missing = [name for name in _NEEDED if name not in header]
        if missing:
            raise DumpError(f"{path}:1: not a cell health file: columns {', '.join(missing)} missing")
        at = {name: header.index(name) for name in _NEEDED}
        for line, row in enumerate(_all_but_last(reader) if cut else reader, start=2):  # one line per row
            try:
                get = {name: row[i] for name, i in at.items()}
                reading = CellReading(int(get["order"]), get["direction"], get["cell"], get["kind"],
                                      int(get["index"]), int(get["call"]), int(get["nan"]), int(get["inf"]),
                                      float(get["max_abs"]))
                step = int(get["step"])
            except (IndexError, ValueError) as err:
                if len(problems) < MAX_PROBLEMS:
                    problems.append(f"{path}:{line}: row skipped ({err})")
                continue
            yield step, reading


def _all_but_last(rows):
    previous = None
    for row in rows:
        if previous is not None:
            yield previous
        previous = row


def _steps(rows: Iterator[Tuple[int, CellReading]]) -> Iterator[Tuple[int, List[CellReading]]]:
    """The rows grouped by step: a step's rows are one block (one write per step)."""
    step, block = None, []
    for row_step, reading in rows:
        if row_step != step and block:
            yield step, block
            block = []
        step = row_step
        block.append(reading)
    if block:
        yield step, block


def scan_health(path: str, steps: IndexSelection, ranks: IndexSelection) -> HealthResult:
    result = HealthResult()
    for rank, file in health_files(path):
        if rank not in ranks:
            continue
        result.files.append(file)
        heat = result.maps.setdefault(rank, HeatMap())
        for step, block in _steps(_rows(file, result.problems)):
            if step not in steps:
                continue
            result.steps_read[rank] = result.steps_read.get(rank, 0) + 1
            for reading in block:
                heat.add(step, reading)
            bad = first_in_order((r.direction, r.cell, r) for r in sorted(block, key=lambda r: r.order) if r.bad)
            if bad is not None:
                result.first_per_step.append(BadCell(rank, step, bad.direction, bad.cell, bad.kind, bad.index,
                                                     bad.call, bad.nan, bad.inf, bad.order))
    if not result.files:
        raise DumpError(f"{path}: no health file of ranks {ranks.describe()}")
    earliest = min((b.key for b in result.first_per_step), default=None)
    result.first = [b for b in result.first_per_step if b.key == earliest]
    return result


def health_text(result: HealthResult, page: Optional[str] = None) -> str:
    lines = [f"rank {rank}: {count} step(s) of cell health read" for rank, count in sorted(result.steps_read.items())]
    lines += [f"first bad cell: {b.text()}" for b in result.first_per_step]
    if result.first:
        lines.append("FIRST BAD CELL across ranks: " + "; ".join(b.text() for b in result.first))
    else:
        lines.append("no cell held a NaN or an Inf")
    lines += [f"problem: {p}" for p in result.problems]
    if page:
        lines.append(f"heat map: {page}")
    return "\n".join(lines)


def health_json(result: HealthResult, code: int, page: Optional[str] = None) -> dict:
    return {"first": [asdict(b) for b in result.first], "first_per_step": [asdict(b) for b in result.first_per_step],
            "steps_read": {str(k): v for k, v in result.steps_read.items()}, "problems": result.problems,
            "files": result.files, "page": page, "exit_code": code}


_STYLE = """body{font:13px sans-serif;margin:16px}table{border-collapse:collapse;margin-bottom:24px}
td,th{border:1px solid #ddd;padding:0;min-width:10px;height:14px}th{font-weight:normal;font-size:10px;padding:1px 3px}
td.name{padding:1px 6px;white-space:nowrap;text-align:left}td.bad{background:#d62728}
.legend span{display:inline-block;width:14px;height:10px;margin:0 4px 0 12px}"""


def _cell_color(largest: float, low: float, high: float) -> str:
    if largest <= 0 or high <= low:
        return "#eef3fb"
    depth = (math.log10(largest) - low) / (high - low)
    shade = int(235 - 190 * max(0.0, min(1.0, depth)))
    return f"rgb({shade},{shade + 10 if shade < 245 else 255},255)"


def _rank_table(rank: int, heat: HeatMap) -> List[str]:
    columns = sorted({c for _, c in heat.values})
    label = (lambda c: str(c)) if heat.width == 1 else (lambda c: f"{c * heat.width}-{(c + 1) * heat.width - 1}")
    out = [f"<h2>rank {rank}</h2>", f'<table data-rank="{rank}"><tr><th>cell</th>']
    out += [f'<th>{label(c)}</th>' for c in columns]
    out.append("</tr>")
    for cell in sorted(heat.cells, key=heat.cells.get):
        logs = [math.log10(v[1]) for (name, _), v in heat.values.items() if name == cell and v[1] > 0]
        low, high = (min(logs), max(logs)) if logs else (0.0, 0.0)
        row = [f'<tr data-cell="{html.escape(cell)}"><td class="name">{html.escape(cell)}</td>']
        for column in columns:
            value = heat.values.get((cell, column))
            if value is None:
                row.append("<td></td>")
                continue
            tip = html.escape(f"{cell}, step {label(column)}: {value[0]} NaN/Inf, largest |x| {value[1]:.6g}")
            if value[0]:
                row.append(f'<td class="bad" data-step="{label(column)}" title="{tip}"></td>')
            else:
                row.append(f'<td data-step="{label(column)}" style="background:{_cell_color(value[1], low, high)}" '
                           f'title="{tip}"></td>')
        out.append("".join(row) + "</tr>")
    out.append("</table>")
    return out


def heat_map_html(result: HealthResult) -> str:
    """The self-contained page: no script, no external resource."""
    first = "; ".join(html.escape(b.text()) for b in result.first) or "no cell held a NaN or an Inf"
    parts = ["<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>mf_celldump cell health</title>",
             f"<style>{_STYLE}</style></head><body><h1>Cell health</h1>",
             f'<p id="first">First bad cell: {first}</p>',
             '<p class="legend">cells in execution order, steps left to right:<span style="background:#d62728">'
             '</span>NaN or Inf<span style="background:rgb(45,55,255)"></span>largest |x| of the cell\'s row'
             '<span style="background:rgb(235,245,255)"></span>smallest</p>']
    for rank, heat in sorted(result.maps.items()):
        parts += _rank_table(rank, heat)
    parts.append("</body></html>")
    return "\n".join(parts)
