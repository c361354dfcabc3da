"""Pair the entries and tensors of one target side with one baseline side, and measure every pair.

Names go through the layer mapping exactly as ``msprobe compare -lm`` resolves them
(:mod:`mf_celldump.mapping.baseline_names`); the baseline entry is the one at that path
with the same direction and the same position among that path's entries. Inside a pair
of entries, tensors are lined up by slot and the entry's compare rules (which baseline
input each of ours is, which part of a fused output, layout).

Three kinds of rows: ``activation`` (inputs and outputs of forward and backward
entries), ``weight`` (a forward entry's ``parameters``: the cell's own weights) and
``weight_grad`` (a ``parameters_grad`` entry). Weights pair by name; a cell holding one
weight on each side pairs it whatever the two names are (``embedding_weight`` against
``weight``). Fused weights are split the way the cell's outputs are.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from tqdm import tqdm

from mf_celldump.analysis.compare import msprobe_rules, noise, transforms
from mf_celldump.analysis.compare.measure import Measured, measure_pair
from mf_celldump.analysis.compare.metrics import noise_floor
from mf_celldump.analysis.compare.sources import Unit
from mf_celldump.analysis.compare.store import ENTRIES, Store, pair_values
from mf_celldump.analysis.compare.thresholds import EXACT, Thresholds, thresholds_for
from mf_celldump.analysis.compare.workers import Workers, ranges
from mf_celldump.dtypes import canonical_dtype, dtype_names
from mf_celldump.errors import CompareInputError
from mf_celldump.layout.naming import BACKWARD, FORWARD, PARAMETERS_GRAD, layer_of, parse_entry_name
from mf_celldump.layout.slots import slot_record, tensor_slots, weight_records
from mf_celldump.layout.stat_records import record_problem, whole_shape
from mf_celldump.mapping.baseline_names import MsprobeView, type_lookup
from mf_celldump.mapping.compare_rules import CompareRules, parse_rules

logger = logging.getLogger(__name__)
BATCH = 256  # entries paired and written together (and sent to a worker process as one range)
ACTIVATION, WEIGHT, WEIGHT_GRAD = "activation", "weight", "weight_grad"
KINDS = (ACTIVATION, WEIGHT, WEIGHT_GRAD)
# Why a tensor was not compared, in three classes (coverage counts them apart).
NO_PARTNER, BY_DESIGN, NOT_COMPARABLE = "no_partner", "by_design", "not_comparable"


# A call number this far past the calls of its cell seen so far is no count of calls (a capture numbers
# them 0, 1, 2, ...): the entry is compared by its position, and a warning names it.
MAX_CALL_GAP = 1024
MAX_WARNINGS = 50
KNOWN_DTYPES = frozenset(canonical_dtype(name) for name in dtype_names())


@dataclass
class Warnings:
    """What was read but is not what a dump holds (a forged call number, a dtype no framework has, a statistic
    that is not a number): each is named once, so an answer never rests on it silently."""

    items: List[str] = field(default_factory=list)
    more: int = 0

    def add(self, text: str) -> None:
        if text in self.items:
            return
        if len(self.items) < MAX_WARNINGS:
            self.items.append(text)
        else:
            self.more += 1

    def lines(self) -> List[str]:
        return self.items + ([f"... and {self.more} more warnings"] if self.more else [])

    def merge(self, other: Warnings) -> None:
        """Add another collection's warnings (a worker process's)."""
        for text in other.items:
            self.add(text)
        self.more += other.more


@dataclass(frozen=True)
class PairOptions:
    thresholds: Dict[str, Thresholds]
    qkv_groups: Optional[int] = None
    msprobe_mode: str = msprobe_rules.TENSOR_MODE


@dataclass
class UnitSize:
    """How much pairing one side of a unit holds: entries, tensor records and their elements."""

    entries: int = 0
    tensors: int = 0
    elements: int = 0

    def count(self, direction: str, body: Dict[str, Any]) -> None:
        self.entries += 1
        for _, _, _, record, _ in _slots(direction, body):
            self.tensors += 1
            shape = whole_shape(record)
            if shape is not None:
                self.elements += math.prod(shape)


@dataclass
class LoadedUnit:
    """What loading a unit into the store found: our cell name -> class, and each side's size."""

    classes: Dict[str, str] = field(default_factory=dict)
    target: UnitSize = field(default_factory=UnitSize)
    baseline: UnitSize = field(default_factory=UnitSize)
    # our cell name -> its reductions (the noise bound's K), composite cells composed from their leaves
    reductions: Dict[str, noise.Reductions] = field(default_factory=dict)


def load_unit(store: Store, unit: Unit, warnings: Optional[Warnings] = None,
              workers: Optional[Workers] = None) -> LoadedUnit:
    """Stream both sides' entries into the store (committed: worker processes read them). ``workers`` start
    while the target loads when the baseline's size says they will be worth it."""
    store.reset_unit()
    warnings = warnings if warnings is not None else Warnings()
    loaded = LoadedUnit()
    totals: Dict[Tuple[str, str], int] = {}
    base = _numbered(unit.baseline.entries(), None, totals, (warnings, f"baseline {unit.baseline.label}"))
    store.add_base(row[:5] for row in _counted(_noted(base, noise.Tracker()), loaded.baseline, 1, 4))
    store.add_base_totals(unit.step, unit.rank, totals)
    if workers is not None:
        workers.prepare(loaded.baseline.tensors, loaded.baseline.elements)
    ours = _numbered(unit.target.entries(), loaded.classes, None, (warnings, f"target {unit.target.label}"))
    tracker = noise.Tracker()
    store.add_target(_counted(_with_depth(ours, tracker), loaded.target, 4, 7))
    store.commit()
    loaded.reductions = tracker.finish()
    return loaded


def _with_depth(numbered, tracker: Optional[noise.Tracker] = None):
    """Target entries as the store holds them, each with its depth (``noise.bound``'s D): how many times
    the depth group changed, in execution order, up to and including it; ``tracker`` leaves in each body
    what its noise bound needs of the entries before it (``noise.Tracker``)."""
    depth, last = 0, None
    for pos, (cell, direction, ordinal, name, body, cls) in enumerate(numbered):
        layer = layer_of(cell)
        if layer != last:
            depth, last = depth + 1, layer
        if tracker is not None:
            tracker.see(cell, cls, direction, ordinal, depth, body)
        yield pos, name, cell, cls, direction, ordinal, depth, body


def _noted(numbered, tracker: noise.Tracker):
    """Baseline entries unchanged but for the floating dtypes computed in so far, left in each body."""
    for row in numbered:
        tracker.note_dtype(row[1], row[4])
        yield row


def _counted(rows, size: UnitSize, direction: int, body: int):
    """The rows unchanged, counted into ``size`` (each row's direction and body at the given indices)."""
    for row in rows:
        size.count(row[direction], row[body])
        yield row


def _numbered(entries: Iterable[Tuple[str, Dict[str, Any]]], classes: Optional[Dict[str, str]], totals=None,
              warn: Optional[Tuple[Warnings, str]] = None):
    """Cell entries (``parameters_grad`` included) with their position among the entries of the same
    cell and direction; ``totals`` counts the tensors per (kind, direction)."""
    counters: Dict[Tuple[str, str], int] = {}
    for name, body in entries:
        parsed = parse_entry_name(name, parameters_grad=True)
        if parsed is None:
            continue
        key = (parsed.cell, parsed.direction)
        ordinal = counters.get(key, 0)
        counters[key] = ordinal + 1
        if warn is not None and parsed.call > ordinal + MAX_CALL_GAP:
            warn[0].add(f"{warn[1]}: {name}: call number {parsed.call}, but it is call {ordinal} of this cell in "
                        "this direction (a dumper numbers calls 0, 1, 2, ...: a forged or corrupt name?); "
                        f"compared as call {ordinal}")
        if classes is not None and parsed.direction != PARAMETERS_GRAD:
            classes[parsed.cell] = parsed.cls
        if totals is not None:
            for kind, direction, count in _tensor_counts(parsed.direction, body):
                totals[(kind, direction)] = totals.get((kind, direction), 0) + count
        yield parsed.cell, parsed.direction, ordinal, name, body, parsed.cls


def _tensor_counts(direction: str, body: Dict[str, Any]):
    if direction == PARAMETERS_GRAD:
        yield WEIGHT_GRAD, BACKWARD, len(weight_records(body, gradients=True))
        return
    yield ACTIVATION, direction, sum(1 for _ in tensor_slots(direction, body))
    if direction == FORWARD:
        yield WEIGHT, FORWARD, len(weight_records(body))


def enclosing_groups(cells: Iterable[str]) -> set:
    """Cells that contain numbered layers (``model``): they span the whole depth and are not plotted."""
    out = set()
    for cell in cells:
        parts = cell.split(".")
        for index, part in enumerate(parts):
            if part.isdigit():
                out.update(".".join(parts[:i]) for i in range(1, index + 1))
                break
    return out


def gradient_points_apart(unit: Unit) -> Optional[str]:
    """Why the two sides' weight gradients are not comparable: their dump.json say they were read at different
    points (autodiff's gradient against the optimizer's input, which is after reduction, loss-scale division
    and clipping); None when they agree or a side does not say."""
    points = (unit.target.gradient_point, unit.baseline.gradient_point)
    if None in points or points[0] == points[1]:
        return None
    return (f"weight gradients recorded at different points: target {points[0]}, baseline {points[1]} "
            f"(optimizer_input is after the training wrapper's reduction, loss-scale division and clipping)")


class UnitPairer:
    """Compares every target entry of one unit and writes the pair rows."""

    def __init__(
        self, store: Store, view: MsprobeView, classes: Dict[str, str], unit: Unit, options: PairOptions,
        warnings: Optional[Warnings] = None,
    ):
        self.store, self.view, self.classes, self.unit, self.options = store, view, classes, unit, options
        self.warnings = warnings if warnings is not None else Warnings()
        self.type_of = type_lookup(classes)
        self.not_plotted = enclosing_groups(classes)
        self._resolved: Dict[str, Tuple[str, CompareRules]] = {}
        self._groups: Dict[str, Optional[int]] = {}
        self._depth = 0  # the entry's depth (noise.bound's D)
        self._bodies: Tuple[Dict[str, Any], Optional[Dict[str, Any]]] = ({}, None)  # the entry's, both sides
        self.reductions: Dict[str, noise.Reductions] = {}  # LoadedUnit.reductions

    def run(self, loaded: LoadedUnit, show_progress: bool = True, workers: Optional[Workers] = None) -> int:
        """Pair every target entry of the unit, in worker processes when they are worth it; the rows written."""
        total, count = loaded.target.entries, 0
        self.reductions = loaded.reductions
        bar = tqdm(
            total=total,
            desc=f"compare {self.unit.folder}",
            unit="entry",
            disable=None if show_progress and total > 2000 else True,
            leave=False,
        )
        if workers is not None and workers.worth(loaded.target.tensors, loaded.target.elements):
            task = PairTask(self.store.path, self.view, self.classes, self.unit, self.options, self.reductions)
            batches = workers.map(pair_in_worker, task, ranges(total, BATCH))
        else:
            batches = (self.pair_range(start, stop) for start, stop in ranges(total, BATCH))
        with bar:
            for (start, stop), (rows, warnings) in zip(ranges(total, BATCH), batches):
                self.store.add_pair_values(rows)
                if warnings is not self.warnings:
                    self.warnings.merge(warnings)
                count += len(rows)
                bar.update(stop - start)
        return count

    def pair_range(self, start: int, stop: int) -> Tuple[List[Tuple[Any, ...]], Warnings]:
        """The pair rows (as ``store.pair_values``) of the target entries at positions ``start`` to ``stop``."""
        rows: List[Tuple[Any, ...]] = []
        for pos, name, cell, cls, direction, ordinal, depth, body in self.store.targets(start, stop):
            self._depth = depth
            rows.extend(pair_values(row) for row in self.pair_entry(pos, name, cell, cls, direction, ordinal, body))
        return rows, self.warnings

    def resolve(self, cell: str, cls: str) -> Tuple[str, CompareRules]:
        if cell not in self._resolved:
            resolution = self.view.resolve(cell, self.type_of)
            items = ()
            own = self.view.self_entries.get(cls)
            if own is not None:
                items += own.rules
            if resolution.entry is not None:
                items += resolution.entry.rules
            self._resolved[cell] = (resolution.baseline, parse_rules(items))
        return self._resolved[cell]

    def pair_entry(self, pos, name, cell, cls, direction, ordinal, body) -> List[Dict[str, Any]]:
        base_cell, rules = self.resolve(cell, cls)
        found = self.store.base_entry(base_cell, direction, ordinal)
        layer = layer_of(cell)
        self._bodies = (body, found[1] if found else None)
        common = {
            "step": self.unit.step,
            "rank": self.unit.rank,
            "folder": self.unit.folder,
            "pos": pos,
            "entry": name,
            "cell": cell,
            "cell_class": cls,
            "layer": None if layer in self.not_plotted else layer,
            "baseline_entry": found[0] if found else f"{base_cell} ({direction} #{ordinal})",
        }
        if found is None:
            reason = (
                "baseline cell has no such call"
                if self.store.base_has_cell(base_cell)
                else "no baseline cell at the mapped name"
            )
        rows = []
        for kind, row_direction, slot, record, own in _slots(direction, body):
            row = dict(common, kind=kind, direction=row_direction, slot=slot, **_describe(record))
            if found is None:
                rows.append(dict(row, status="skipped", skip_class=NO_PARTNER, reason=reason))
            elif kind == ACTIVATION:
                rows.append(self.pair_slot(row, record, found[1], base_cell, rules))
            else:
                rows.append(self.pair_weight(row, record, own, found[1], base_cell, rules))
        msprobe_rules.judge_entry(rows, self.options.msprobe_mode)
        return rows

    def pair_slot(self, row, record, base_body, base_cell, rules: CompareRules) -> Dict[str, Any]:
        base_slot, use_split, use_act, why_not = map_slot(row["slot"], row["direction"], rules)
        if why_not:
            return dict(row, status="skipped", skip_class=BY_DESIGN, reason=why_not)
        row["baseline_slot"] = base_slot
        base_record = slot_record(base_body, base_slot)
        if base_record is None:
            why = f"baseline entry has no tensor {base_slot}"
            return dict(row, status="skipped", skip_class=NO_PARTNER, reason=why)
        plan = transforms.Plan(rules, use_split, use_act)
        return self.measure(row, record, base_record, base_cell, plan)

    def pair_weight(self, row, record, own, base_body, base_cell, rules: CompareRules) -> Dict[str, Any]:
        if row["kind"] == WEIGHT_GRAD:
            apart = gradient_points_apart(self.unit)
            if apart:
                return dict(row, status="skipped", skip_class=BY_DESIGN, reason=apart)
        name = row["slot"].partition(".")[2]
        theirs = weight_records(base_body, gradients=row["kind"] == WEIGHT_GRAD)
        partner, note = _weight_partner(name, own, theirs)
        if partner is None:
            return dict(row, status="skipped", skip_class=NO_PARTNER, reason=note)
        row["baseline_slot"] = f"param.{partner}"
        plan = transforms.Plan(rules, use_split=True, weight=True)
        result = self.measure(row, record, theirs[partner], base_cell, plan)
        if note and result["status"] != "skipped":
            result["reason"] = "; ".join(r for r in (result.get("reason"), note) if r)
        return result

    def measure(self, row, record, base_record, base_cell, plan: transforms.Plan) -> Dict[str, Any]:
        row.update(_describe(base_record, "baseline_"))
        row["baseline_transform"] = plan.describe()
        problem = self.malformed(row, record, base_record)
        if problem:
            return dict(row, status="skipped", skip_class=NOT_COMPARABLE, reason=problem)
        limits = thresholds_for(row["dtype"], row["baseline_dtype"], self.options.thresholds)
        exact = limits == self.options.thresholds[EXACT]
        if plan.split is not None and plan.split.kind == "qkv":
            plan = transforms.Plan(plan.rules, plan.use_split, plan.use_act, plan.weight, self.qkv_groups(base_cell))
        bound = self.noise_bound(row, record, base_record)
        row["noise_bound"] = bound
        try:
            measured = measure_pair(self.unit.target, record, self.unit.baseline, base_record, plan, limits, exact,
                                    bound)
        except transforms.NotComparable as err:
            return dict(row, status="skipped", skip_class=NOT_COMPARABLE, reason=str(err))
        return _measured_row(row, measured, limits)

    def noise_bound(self, row, record, base_record) -> float:
        """The slot's rounding-noise bound (``noise``): its dtypes (and those one side computed in so far and
        the other did not), its depth and the scale of what it depends on."""
        body, base_body = self._bodies
        cell = self.reductions.get(row["cell"])
        if row["kind"] == WEIGHT_GRAD:
            scale, depth = noise.weight_grad_scale(body, base_body, cell), self._depth
        else:
            scale, depth = noise.slot_scale(row["direction"], row["slot"], body, record, base_record, cell,
                                            self.reductions, self._depth)
        dtypes = (row["dtype"], row["baseline_dtype"], *noise.narrowest(body, base_body))
        return noise.bound(dtypes, depth, scale)

    def malformed(self, row, record, base_record) -> str:
        """Why a pair's records are not what a dump holds ("" when they are), warned by name; a dtype no
        framework has is warned too (judged as float32)."""
        problems = []
        for side, rec, label in (("target", record, self.unit.target.label),
                                 ("baseline", base_record, self.unit.baseline.label)):
            problem = record_problem(rec)
            if problem:
                problems.append(f"{side} record {problem}")
            dtype = canonical_dtype(rec.get("dtype"))
            if dtype and dtype not in KNOWN_DTYPES:
                self.warnings.add(f"{side} {label}: dtype {rec.get('dtype')!r} (first at {row['entry']} "
                                  f"{row['slot']}) is no dtype a framework has; judged with float32's thresholds")
        if not problems:
            return ""
        reason = "malformed record: " + "; ".join(problems)
        self.warnings.add(f"{row['folder']} {row['entry']} {row['slot']}: {reason}; not compared")
        return reason

    def qkv_groups(self, base_cell: str) -> Optional[int]:
        """Query groups: ``--qkv-groups``, checked against the key input of the baseline's
        ``core_attention`` ([s, b, groups, head dim]) when there is one."""
        sibling = base_cell.rpartition(".")[0] + ".core_attention"
        if sibling not in self._groups:
            found = self.store.base_entry(sibling, FORWARD, 0)
            key = slot_record(found[1], "input.1") if found else None
            shape = key.get("shape") if key else None
            self._groups[sibling] = int(shape[-2]) if isinstance(shape, list) and len(shape) == 4 else None
        detected, given = self._groups[sibling], self.options.qkv_groups
        if given and detected and given != detected:
            raise CompareInputError(
                f"--qkv-groups {given} does not match the baseline: the key input of {sibling} has "
                f"{detected} query groups (shape [s, b, groups, head dim]); leave --qkv-groups out or give {detected}"
            )
        return given or detected


@dataclass(frozen=True)
class PairTask:
    """What a worker process needs to pair a range of one unit's entries (sent with each range)."""

    store_path: str
    view: MsprobeView
    classes: Dict[str, str]
    unit: Unit
    options: PairOptions
    reductions: Dict[str, noise.Reductions] = field(default_factory=dict)


def pair_in_worker(task: PairTask, start: int, stop: int) -> Tuple[List[Tuple[Any, ...]], Warnings]:
    """In a worker process: the rows and warnings of the entries at positions ``start`` to ``stop``."""
    store = Store.reader(task.store_path, ENTRIES)
    try:
        pairer = UnitPairer(store, task.view, task.classes, task.unit, task.options)
        pairer.reductions = task.reductions
        return pairer.pair_range(start, stop)
    finally:
        store.close()


def _slots(direction: str, body: Dict[str, Any]):
    """(kind, direction, slot, record, the entry's weight names) of every tensor of an entry,
    weights first as msprobe lists them."""
    if direction == PARAMETERS_GRAD:
        own = weight_records(body, gradients=True)
        for name, record in own.items():
            yield WEIGHT_GRAD, BACKWARD, f"param.{name}", record, tuple(own)
        return
    if direction == FORWARD:
        own = weight_records(body)
        for name, record in own.items():
            yield WEIGHT, FORWARD, f"param.{name}", record, tuple(own)
    for slot, record in tensor_slots(direction, body):
        yield ACTIVATION, direction, slot, record, ()


def _weight_partner(name: str, ours: Tuple[str, ...], theirs: Dict[str, Any]) -> Tuple[Optional[str], str]:
    """The baseline weight ours pairs with (and a note), or None and the reason."""
    if name in theirs:
        return name, ""
    if len(ours) == 1 and len(theirs) == 1:
        (only,) = theirs
        return only, f"the only weight of each cell ({name} against {only})"
    if not theirs:
        return None, "the baseline records no weights for this cell"
    return None, f"baseline cell has no weight {name!r} (it has: {', '.join(theirs)})"


def _describe(record: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    return {
        f"{prefix}dtype": canonical_dtype(record.get("dtype")),
        f"raw_{prefix}dtype": record.get("dtype"),
        f"{prefix}shape": str(record.get("shape")),
        f"{prefix}requires_grad": record.get("requires_grad"),
        f"{prefix}md5" if prefix else "target_md5": record.get("md5"),
    }


def _measured_row(row, measured: Measured, limits: Thresholds) -> Dict[str, Any]:
    result = measured.metrics
    row.update(result.columns())
    row["score"] = score(result, limits, row.get("noise_bound") or 0.0)
    row["factor_tol"] = limits.stat_rel if measured.basis == "statistics" else limits.rel_err
    for side, stats in (("target", measured.target_stats), ("baseline", measured.baseline_stats)):
        row.update({f"{side}_{key.lower()}": value for key, value in stats.items()})
    for key in ("max", "min", "mean", "norm"):
        ours, theirs = row.get(f"target_{key}"), row.get(f"baseline_{key}")
        if ours is not None and theirs is not None:
            row[f"{key}_diff"] = 0.0 if (ours == theirs) else ours - theirs
    if measured.crc_match is not None:
        row["crc_match"] = "yes" if measured.crc_match else "no"
    row.update(status="diverged" if result.diverged else "ok", basis=measured.basis, reason=measured.reason)
    return row


def score(result, limits: Thresholds, bound: float = 0.0) -> float:
    """The largest ratio of a metric to its threshold (above 1: diverged): one scale for every dtype."""
    ratios = []
    for value, limit in ((1.0 - result.cosine, 1.0 - limits.cosine), (result.rel_err, limits.rel_err),
                         (result.stat_rel, limits.stat_rel)):
        if value == value:  # not NaN
            ratios.append(value / limit if limit > 0 else (math.inf if value > 0 else 0.0))
    worst = max(ratios, default=0.0)
    if not result.diverged and worst > 1.0:  # within as rounding noise: how close to its bound it came
        floor = noise_floor(limits, bound)
        return result.max_abs_err / floor if floor > 0 and result.max_abs_err == result.max_abs_err else 1.0
    return math.inf if result.diverged and worst <= 1.0 else worst  # non-finite values that differ


def map_slot(slot: str, direction: str, rules: CompareRules) -> Tuple[str, bool, bool, str]:
    """(baseline slot, apply split, apply activation, reason it is not compared or "")."""
    head, _, rest = slot.partition(".")
    index, _, sub = rest.partition(".")
    sub = f".{sub}" if sub else ""
    if head == "kwarg":
        return slot, False, False, ""
    if head == "input" and direction == FORWARD:
        mapped = rules.baseline_input(int(index)) if index.isdigit() else index
        if mapped is None:
            return "", False, False, "not compared (in=_ in the mapping)"
        return (f"input.{mapped}{sub}" if mapped.isdigit() else f"kwarg.{mapped}{sub}"), False, False, ""
    if head == "output" and direction == FORWARD:
        return slot, True, True, ""
    if head == "input":  # backward: gradient w.r.t. our forward output
        if rules.act:
            return "", False, False, "the gradient after the activation has no baseline counterpart"
        return slot, True, False, ""
    mapped = rules.baseline_input(int(index)) if index.isdigit() else None  # backward: w.r.t. our input
    if mapped is None or not mapped.isdigit():
        return "", False, False, "the baseline records no gradient for this input"
    if rules.split is not None:
        return (
            "",
            False,
            False,
            "partial gradient: the baseline input gradient sums every part of the fused projection",
        )
    return f"output.{mapped}{sub}", False, False, ""
