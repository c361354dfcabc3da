"""One rank's step reduced to what the replicas are checked on: a few kilobytes per step.

Made from a rank folder's ``dump.json`` entries one at a time (statistics only, no tensor
file is opened): the processing worker makes it beside training from the entries it has
just written (``summarize_entries``), and the rank check makes it for any dump in
msprobe's layout by reading the file (``summarize``). A summary holds, in execution order
(forward before backward, then the dump's order):

* ``weight`` items: a digest of each captured weight's statistics (dtype, shape, Max, Min,
  Mean, Norm and md5 when dumped): bit-identical weights give the same digest;
* ``grad`` items: the same for each weight gradient (``parameters_grad``), with its size;
* ``act`` items: the size (log10 of Norm and of the largest magnitude) of every output of a
  forward call and every gradient of a backward call;
* the first NaN/Inf, per rank, in execution order (the innermost cell, as ``anomalies``);
* how many records could not be judged (a statistic that is no number, a shape that is no list
  of whole numbers: ``stat_records.record_problem``), with the first few named, so the rank
  check says so rather than pass them in silence.
"""

from __future__ import annotations

import json
import logging
import math
import os
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from mf_celldump.errors import SummaryError
from mf_celldump.layout.naming import (
    BACKWARD,
    DUMP_JSON,
    FORWARD,
    parse_entry_name,
    parse_parameters_grad_name,
)
from mf_celldump.layout.reader import DumpJson
from mf_celldump.layout.slots import is_tensor, tensor_slots
from mf_celldump.layout.stat_records import record_problem, slot_anomaly
from mf_celldump.statistics import record_number

logger = logging.getLogger(__name__)
FORMAT = "mf_celldump.rank_summary/1"
WEIGHT, GRAD, ACT = "weight", "grad", "act"
KINDS = (WEIGHT, GRAD, ACT)
LOG_FLOOR = -30.0  # log10 of a zero size
# Tensors smaller than this get no size: the norm of a bias gradient of one or a few elements
# crosses zero from batch to batch, and its log varies across replicas by orders of magnitude.
MIN_SIZED_ELEMENTS = 16
_DIGEST_KEYS = ("dtype", "shape", "Max", "Min", "Mean", "Norm", "md5")
SHOWN_UNJUDGED = 3  # records not judged named per summary; the rest are counted


@dataclass(frozen=True)
class Item:
    """One checked value of one cell: ``label`` says which (``param.weight``, ``forward.0 output.0``)."""

    cell: str
    label: str
    kind: str
    digest: Optional[str] = None  # weights and weight gradients
    log_norm: Optional[float] = None  # log10 Norm (None: not finite or not dumped)
    log_max: Optional[float] = None  # log10 of the largest magnitude

    @property
    def key(self) -> str:
        return f"{self.cell} {self.label}"


@dataclass
class Anomaly:
    """The first NaN/Inf of one rank's step, in execution order."""

    direction: str
    pos: int
    entry: str
    cell: str
    slots: List[Dict[str, str]] = field(default_factory=list)

    @property
    def order(self) -> Tuple[int, int]:
        return (0 if self.direction == FORWARD else 1, self.pos)

    @property
    def kind(self) -> str:
        return "NaN" if any(s["kind"] == "nan" for s in self.slots) else "Inf"


@dataclass
class RankSummary:
    step: Optional[int]
    rank: int
    items: List[Item] = field(default_factory=list)
    anomaly: Optional[Anomaly] = None
    entries: int = 0
    unjudged: int = 0  # records whose statistics or shape cannot be read
    unjudged_first: List[str] = field(default_factory=list)  # ``entry slot: problem``, the first few

    def note_unjudged(self, name: str, slot: str, record: Dict[str, Any]) -> None:
        problem = record_problem(record)
        if problem:
            self.unjudged += 1
            if len(self.unjudged_first) < SHOWN_UNJUDGED:
                self.unjudged_first.append(f"{name} {slot}: {problem}")

    def to_json(self) -> Dict[str, Any]:
        return {
            "format": FORMAT,
            "step": self.step,
            "rank": self.rank,
            "entries": self.entries,
            "items": [[i.cell, i.label, i.kind, i.digest, i.log_norm, i.log_max] for i in self.items],
            "anomaly": None if self.anomaly is None else vars(self.anomaly),
            "unjudged": [self.unjudged, self.unjudged_first],
        }

    def to_bytes(self) -> bytes:
        """Compressed JSON: what a rank sends to rank 0 at train end."""
        return zlib.compress(json.dumps(self.to_json(), separators=(",", ":")).encode("utf-8"), 6)


def from_json(data: Any, source: str = "summary") -> RankSummary:
    """The inverse of ``RankSummary.to_json``; raises :class:`SummaryError` for anything else."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise SummaryError(f"{source}: not a rank summary (expected format {FORMAT!r})")
    try:
        items = [_item(row) for row in data["items"]]
        anomaly = data.get("anomaly")
        step = data.get("step")
        unjudged, unjudged_first = data.get("unjudged") or (0, [])  # absent from summaries written before it
        return RankSummary(
            None if step is None else int(step),
            int(data["rank"]),
            items,
            None if anomaly is None else Anomaly(**anomaly),
            int(data.get("entries") or 0),
            int(unjudged),
            [str(text) for text in unjudged_first][:SHOWN_UNJUDGED],
        )
    except (KeyError, TypeError, ValueError) as err:
        raise SummaryError(f"{source}: malformed rank summary: {err}") from None


def from_bytes(payload: bytes, source: str = "summary") -> RankSummary:
    try:
        text = zlib.decompress(payload)
        return from_json(json.loads(text), source)
    except (zlib.error, ValueError) as err:
        if isinstance(err, SummaryError):
            raise
        raise SummaryError(f"{source}: unreadable rank summary: {err}") from None


def _item(row) -> Item:
    cell, label, kind, digest, log_norm, log_max = row
    if kind not in KINDS or not isinstance(cell, str) or not isinstance(label, str):
        raise ValueError(f"bad item {row!r}")
    return Item(cell, label, kind, digest, _opt_float(log_norm), _opt_float(log_max))


def _opt_float(value) -> Optional[float]:
    return None if value is None else float(value)


# -- making one -------------------------------------------------------------------------
def summarize(dump_json: str, step: Optional[int], rank: int) -> RankSummary:
    """Summary of one rank folder's ``dump.json`` (streamed: memory of one entry at a time)."""
    return summarize_entries(DumpJson(dump_json).entries(), step, rank)


def summarize_entries(entries: Iterable[Tuple[str, Dict[str, Any]]], step: Optional[int], rank: int) -> RankSummary:
    """Summary of a rank folder's ``dump.json`` entries, (name, body) in the file's order; memory holds the
    summary and one entry, so a step of any size can be streamed through it."""
    summary = RankSummary(step, rank)
    forward: List[Tuple[int, Item]] = []
    backward: List[Tuple[int, Item]] = []
    first = FirstAnomaly()
    seen_weights = set()
    for pos, (name, body) in enumerate(entries):
        summary.entries += 1
        parsed = parse_entry_name(name)
        if parsed is None:
            grads = parse_parameters_grad_name(name)
            if grads is not None:
                backward.extend((pos, item) for item in _grad_items(grads.cell, body, summary, name))
            continue
        slots = list(tensor_slots(parsed.direction, body, parameters=True))
        for slot, record in slots:
            summary.note_unjudged(name, slot, record)
        first.add_slots(pos, name, parsed.cell, parsed.direction, slots)
        target = forward if parsed.direction == FORWARD else backward
        weights = parsed.direction == FORWARD and parsed.cell not in seen_weights
        seen_weights.add(parsed.cell)  # the weights every call of the step reads: from its first call
        call = f"{parsed.direction}.{parsed.call}"
        for slot, record in slots:
            if slot.startswith("param."):
                if weights:
                    target.append((pos, Item(parsed.cell, slot, WEIGHT, record_digest(record))))
            elif parsed.direction == BACKWARD or slot.startswith("output"):
                target.append((pos, _size_item(parsed.cell, f"{call} {slot}", ACT, record)))
    summary.items = [item for _, item in forward] + [item for _, item in backward]
    summary.anomaly = first.result()
    return summary


def _grad_items(cell: str, body: Dict[str, Any], summary: RankSummary, entry: str) -> Iterator[Item]:
    for name, value in body.items():
        records = value if isinstance(value, list) else [value]
        for index, record in enumerate(records):
            if is_tensor(record):
                label = f"grad.{name}" if len(records) == 1 else f"grad.{name}.{index}"
                summary.note_unjudged(entry, label, record)
                yield _size_item(cell, label, GRAD, record, record_digest(record))


def _size_item(cell: str, label: str, kind: str, record: Dict[str, Any], digest: Optional[str] = None) -> Item:
    if _elements(record.get("shape")) < MIN_SIZED_ELEMENTS:
        return Item(cell, label, kind, digest)
    norm = record_number(record.get("Norm"))
    extremes = [abs(v) for v in (record_number(record.get("Max")), record_number(record.get("Min"))) if v is not None]
    return Item(cell, label, kind, digest, _log10(norm), _log10(max(extremes)) if extremes else None)


def _elements(shape) -> int:
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return 0
    return math.prod(shape)


def _log10(value: Optional[float]) -> Optional[float]:
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return round(max(LOG_FLOOR, math.log10(value)) if value > 0 else LOG_FLOOR, 5)


def record_digest(record: Dict[str, Any]) -> str:
    """8 hex digits that differ when any statistic (or the md5 msprobe records) differs."""
    picked = [record.get(key) for key in _DIGEST_KEYS]
    text = json.dumps(picked, sort_keys=True, default=str)
    return f"{zlib.crc32(text.encode('utf-8')) & 0xFFFFFFFF:08x}"


class FirstAnomaly:
    """The first entry with a NaN/Inf per direction, descending into the innermost such cell.

    Dumpers list a parent before its children (ours) or after them (msprobe's); taking a
    later anomalous entry when it is a descendant of the one found gives the innermost cell
    either way, as the compare report does.
    """

    def __init__(self, max_abs: Optional[float] = None):
        self.max_abs = max_abs
        self.found: Dict[str, Anomaly] = {}
        self.counts = {"nan": 0, "inf": 0, "large": 0}

    def add(self, pos: int, name: str, cell: str, direction: str, body: Dict[str, Any]) -> None:
        self.add_slots(pos, name, cell, direction, tensor_slots(direction, body, parameters=True))

    def add_slots(self, pos: int, name: str, cell: str, direction: str, slots) -> None:
        """As ``add``, with the entry's (slot, record) pairs (``tensor_slots`` with parameters) already walked."""
        bad = []
        for slot, record in slots:
            kind = slot_anomaly(record, self.max_abs)
            if kind:
                self.counts[kind] += 1
                bad.append({"slot": slot, "kind": kind, "Max": record.get("Max"), "Min": record.get("Min")})
        if not bad:
            return
        found = self.found.get(direction)
        if found is None or cell.startswith(found.cell + "."):
            self.found[direction] = Anomaly(direction, pos, name, cell, bad)

    def result(self) -> Optional[Anomaly]:
        return self.found.get(FORWARD) or self.found.get(BACKWARD)


def summarize_outputs(dump_path: str, outputs, made: Optional[Dict[Tuple[int, int], RankSummary]] = None
                      ) -> Iterator[RankSummary]:
    """Summaries of processed output folders: ``outputs`` yields (step, rank, folder relative to dump_path);
    ``made``: (rank, step) -> the summary already made of a folder's entries, its ``dump.json`` not read.

    A folder that cannot be read is skipped (its step then has no summary; the verdict says so).
    """
    for step, rank, folder in outputs:
        if made is not None and (rank, step) in made:
            yield made[(rank, step)]
            continue
        try:
            yield summarize(os.path.join(dump_path, folder, DUMP_JSON), step, rank)
        except (OSError, ValueError) as err:
            logger.warning("no rank summary for step %s rank %s: %s", step, rank, err)
