"""Pair the entries and tensors of one target rank folder with one baseline rank folder.

Names go through the layer mapping exactly as ``msprobe compare -lm`` resolves them
(:mod:`mf_celldump.mapping.baseline_names`); the baseline entry is the one at that path
with the same direction and the same position among that path's entries. Inside a pair
of entries, tensors are lined up by slot and the entry's compare rules (which baseline
input each of ours is, which part of a fused output, layout).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
from tqdm import tqdm

from mf_celldump.compare import metrics, tensors, transforms
from mf_celldump.compare.store import Store
from mf_celldump.layout.naming import FORWARD, parse_entry_name
from mf_celldump.layout.reader import DumpJson, RankDump
from mf_celldump.layout.slots import slot_record, tensor_slots
from mf_celldump.mapping.baseline_names import MsprobeView, type_lookup
from mf_celldump.mapping.compare_rules import CompareRules, parse_rules

logger = logging.getLogger(__name__)
FLUSH = 500


@dataclass(frozen=True)
class Unit:
    """One target rank folder and the baseline rank folder it is compared with."""

    target: RankDump
    baseline: RankDump

    @property
    def step(self) -> str:
        return "" if self.target.step is None else str(self.target.step)

    @property
    def rank(self) -> str:
        return self.target.label.rpartition("/")[2]


@dataclass(frozen=True)
class PairOptions:
    thresholds: Dict[str, metrics.Thresholds]
    qkv_groups: Optional[int] = None


def load_unit(store: Store, target: DumpJson, baseline: DumpJson) -> Dict[str, str]:
    """Stream both dump.json files into the store; returns our cell name -> class."""
    store.reset_unit()
    store.add_base(_numbered(baseline.entries(), None))
    classes: Dict[str, str] = {}
    store.add_target(
        (pos, name, cell, cls, d, o, body)
        for pos, (cell, d, o, name, body, cls) in enumerate(
            _numbered(target.entries(), classes, with_class=True)
        )
    )
    return classes


def _numbered(
    entries: Iterable[Tuple[str, Dict[str, Any]]], classes: Optional[Dict[str, str]], with_class=False
):
    """Cell entries with their position among the entries of the same cell and direction."""
    counters: Dict[Tuple[str, str], int] = {}
    for name, body in entries:
        parsed = parse_entry_name(name)
        if parsed is None:
            continue
        key = (parsed.cell, parsed.direction)
        ordinal = counters.get(key, 0)
        counters[key] = ordinal + 1
        if classes is not None:
            classes[parsed.cell] = parsed.cls
        row = (parsed.cell, parsed.direction, ordinal, name, body)
        yield (*row, parsed.cls) if with_class else row


def layer_of(cell: str) -> str:
    """Depth group of a cell: its name up to the first numbered part (``model.layers.1``), else itself."""
    parts = cell.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: index + 1])
    return cell


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


class UnitPairer:
    """Compares every target entry of one unit and writes the pair rows."""

    def __init__(
        self, store: Store, view: MsprobeView, classes: Dict[str, str], unit: Unit, options: PairOptions
    ):
        self.store, self.view, self.unit, self.options = store, view, unit, options
        self.type_of = type_lookup(classes)
        self.not_plotted = enclosing_groups(classes)
        self._resolved: Dict[str, Tuple[str, CompareRules]] = {}
        self._groups: Dict[str, Optional[int]] = {}

    def run(self, show_progress: bool = True) -> int:
        rows: List[Dict[str, Any]] = []
        count = 0
        total = self.store.target_count()
        bar = tqdm(
            total=total,
            desc=f"compare {self.unit.target.label}",
            unit="entry",
            disable=None if show_progress and total > 2000 else True,
            leave=False,
        )
        with bar:
            for pos, name, cell, cls, direction, ordinal, body in self.store.targets():
                rows.extend(self.pair_entry(pos, name, cell, cls, direction, ordinal, body))
                bar.update(1)
                if len(rows) >= FLUSH:
                    self.store.add_pairs(rows)
                    count += len(rows)
                    rows = []
        self.store.add_pairs(rows)
        return count + len(rows)

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
        common = {
            "step": self.unit.step,
            "rank": self.unit.rank,
            "pos": pos,
            "direction": direction,
            "entry": name,
            "cell": cell,
            "cell_class": cls,
            "layer": None if layer in self.not_plotted else layer,
        }
        rows = []
        for slot, record in tensor_slots(direction, body):
            row = dict(
                common,
                slot=slot,
                dtype=metrics.canonical_dtype(record.get("dtype")),
                shape=str(record.get("shape")),
            )
            if found is None:
                reason = (
                    "baseline cell has no such call"
                    if self.store.base_has_cell(base_cell)
                    else "no baseline cell at the mapped name"
                )
                rows.append(
                    dict(
                        row,
                        status="skipped",
                        baseline_entry=f"{base_cell} ({direction} #{ordinal})",
                        reason=reason,
                    )
                )
                continue
            rows.append(self.pair_slot(row, record, found, base_cell, rules))
        return rows

    def pair_slot(self, row, record, found, base_cell, rules: CompareRules) -> Dict[str, Any]:
        base_name, base_body = found
        row["baseline_entry"] = base_name
        base_slot, use_split, use_act, why_not = map_slot(row["slot"], row["direction"], rules)
        if why_not:
            return dict(row, status="skipped", reason=why_not)
        row["baseline_slot"] = base_slot
        base_record = slot_record(base_body, base_slot)
        if base_record is None:
            return dict(row, status="skipped", reason=f"baseline entry has no tensor {base_slot}")
        row.update(
            baseline_dtype=metrics.canonical_dtype(base_record.get("dtype")),
            baseline_shape=str(base_record.get("shape")),
            transform=transforms.describe(rules, use_split, use_act),
        )
        for key, value in metrics.stat_differences(record, base_record).items():
            row[f"{key.lower()}_diff"] = value
        limits = metrics.thresholds_for(row["dtype"], row["baseline_dtype"], self.options.thresholds)
        exact = limits == self.options.thresholds["exact"]
        try:
            result = self._measure(record, base_record, base_cell, rules, use_split, use_act, limits, exact)
        except (transforms.NotComparable, tensors.TensorFileError) as err:
            return dict(row, status="skipped", reason=str(err))
        row.update(
            cosine=result.cosine,
            max_abs_err=result.max_abs_err,
            max_rel_err=result.max_rel_err,
            rel_err=result.rel_err,
            stat_rel=result.stat_rel,
            status="diverged" if result.diverged else "ok",
            reason=result.note,
        )
        return row

    def _measure(self, record, base_record, base_cell, rules, use_split, use_act, limits, exact):
        target_path = tensors.data_path(self.unit.target.data_dir, record)
        base_path = tensors.data_path(self.unit.baseline.data_dir, base_record)
        if target_path is None or base_path is None:
            if (use_split and rules.split is not None) or (use_act and rules.act):
                raise transforms.NotComparable("statistics of a part of a fused tensor cannot be compared")
            return metrics.stats_metrics(record, base_record, limits, exact)
        target = tensors.load(target_path)
        groups = self.options.qkv_groups
        if use_split and rules.split is not None and rules.split.kind == "qkv" and not groups:
            groups = self.qkv_groups(base_cell)
        baseline = transforms.to_target(
            tensors.load(base_path), tuple(target.shape), rules, use_split, use_act, groups
        )
        return metrics.tensor_metrics(target, np.asarray(baseline), limits, exact)

    def qkv_groups(self, base_cell: str) -> Optional[int]:
        """Query groups from the key input of the baseline's ``core_attention`` ([s, b, groups, head dim])."""
        sibling = base_cell.rpartition(".")[0] + ".core_attention"
        if sibling not in self._groups:
            found = self.store.base_entry(sibling, FORWARD, 0)
            key = slot_record(found[1], "input.1") if found else None
            shape = key.get("shape") if key else None
            self._groups[sibling] = int(shape[-2]) if isinstance(shape, list) and len(shape) == 4 else None
        return self._groups[sibling]


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
