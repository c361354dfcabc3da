"""Compare a tensor-parallel dump with its unsharded baseline: merge the shards first, then name the rank.

``mf-celldump compare TARGET BASELINE --target-tp T [--baseline-tp B]``: the rank folders of
each step are taken in groups of T consecutive ranks (tensor-parallel rank innermost, as
Megatron and MindSpore number them; the group index is the data-parallel rank); each group
is merged into one rank folder of the whole model (``shard_merge``) under the output
folder, and the comparison runs on the merged folders as on any dump. The baseline is
merged the same way with B (Megatron at another TP size).

Each cell's shard rule comes from the mapping's compare rules: ``shard=`` on the entry of
that cell, else on its class's ``""`` entry, else ``DEFAULT_SHARDS`` for the class, else
``none`` (replicated). Afterwards:

* a merged cell whose tensors do not have the baseline's shape is an error naming the cell,
  its rule and both shapes (the rule does not fit the cell);
* for the first divergent cell, each rank's part is compared with the same part of the
  baseline (tensor dumps): the ranks whose part diverges are named; through the cell's
  weights when its output is a sum of the ranks' parts;
* replicated tensors that differ between the ranks of a group are listed.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from mf_celldump.analysis.compare import engine, metrics, tensors, transforms
from mf_celldump.analysis.compare import thresholds as thresholds_mod
from mf_celldump.analysis.compare.pairing import map_slot
from mf_celldump.analysis.compare.report import LaunchedRanks
from mf_celldump.analysis.compare.request import CompareRequest, CompareResult, RankFolders
from mf_celldump.analysis.compare.shard_infer import Inference, infer_rules, other_shapes
from mf_celldump.analysis.compare.shard_merge import PARTIAL, SAME, Group, GroupMerger, MergeNotes, plan
from mf_celldump.dtypes import canonical_dtype
from mf_celldump.errors import CompareInputError, DumpError, ShardError
from mf_celldump.layout.naming import FORWARD, PARALLEL_KEY, parse_entry_name, parse_parameters_grad_name
from mf_celldump.layout.reader import DumpJson, RankDump
from mf_celldump.layout.slots import slot_record
from mf_celldump.mapping.baseline_names import MsprobeView, type_lookup
from mf_celldump.mapping.compare_rules import DEFAULT_SHARDS, CompareRules, parse_rules

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardSizes:
    target: int = 1
    baseline: int = 1

    @property
    def merging(self) -> bool:
        return self.target > 1 or self.baseline > 1


@dataclass
class Side:
    """One side's groups, rules and what merging it found."""

    name: str
    size: int
    groups: Dict[Tuple[Optional[int], int], Group] = field(default_factory=dict)
    notes: MergeNotes = field(default_factory=MergeNotes)
    rules: Optional[RuleBook] = None
    inference: Inference = field(default_factory=Inference)


@dataclass
class ShardReport:
    target: Side
    baseline: Side
    attribution: Optional[Dict[str, Any]] = None

    @property
    def disagreements(self) -> List[Dict[str, Any]]:
        return self.target.notes.disagreements + self.baseline.notes.disagreements

    def text(self) -> str:
        """Lines printed after the comparison's summary."""
        lines = []
        for side in (self.target, self.baseline):
            if side.size == 1:
                continue
            counts: Dict[str, int] = {}
            for rule in side.notes.rules.values():
                counts[rule] = counts.get(rule, 0) + 1
            rules = ", ".join(f"{n} {rule}" for rule, n in sorted(counts.items())) or "none"
            lines.append(f"{side.name}: tensor parallel over {side.size} ranks, {len(side.groups)} group(s) merged; "
                         f"cells merged by rule: {rules}")
            if side.inference.rules:
                lines.append("  inferred from the ranks' tensors (a rule in a mapping file wins): " + ", ".join(
                    f"{cell} {rule}" for cell, rule in side.inference.rules.items()))
            if side.inference.unresolved:
                lines.append(f"  no rule fits the ranks' tensors of: {', '.join(side.inference.unresolved[:10])} "
                             "(merged as none)")
            if side.inference.note:
                lines.append(f"  {side.inference.note}")
            for item in side.notes.disagreements[:5]:
                lines.append(f"  REPLICATED BUT DIFFERENT: step {item['step']} {item['entry']} {item['slot']} "
                             f"(shard={item['rule']}): rank(s) {item['ranks']} differ from rank {item['reference']}")
            if side.notes.dropped:
                lines.append(f"  {len(side.notes.dropped)} partial sums of a statistics dump not merged (not "
                             f"compared), e.g. {side.notes.dropped[0]}")
        found = self.attribution
        if found is not None:
            if found["ranks"]:
                why = "; ".join(f"{e['slot']}: rank(s) {e['diverged']} diverge, {e['within']} within thresholds"
                                for e in found["evidence"] if e["diverged"])
                lines.append(f"FIRST DIVERGENCE ON RANK(S) {', '.join(str(r) for r in found['ranks'])} of "
                             f"{found['group']}: {found['cell']} (shard={found['rule']}): {why}")
            else:
                lines.append(f"first divergence {found['cell']}: no single rank's part diverges on its own")
        return "\n".join(lines)

    def to_json(self) -> Dict[str, Any]:
        return {side.name: {"tp": side.size, "groups": {f"step{s}/rank{i}": g.ranks for (s, i), g in
                                                        side.groups.items()},
                            "rules": side.notes.rules, "inferred": side.inference.rules,
                            "not_inferred": side.inference.unresolved, "inference_note": side.inference.note,
                            "disagreements": side.notes.disagreements,
                            "not_merged": side.notes.dropped} for side in (self.target, self.baseline)} | {
            "attribution": self.attribution}


class RuleBook:
    """Shard rules of one side's cells: the mapping's ``shard=`` rules, then the class defaults, then the
    rules inferred from the ranks' tensors (``shard_infer``), else ``none``.

    The mapping's sections are keyed by class: walking the baseline's own tree, sections keyed
    by the baseline's classes (Megatron's) give its cells their rules.
    """

    def __init__(self, view: MsprobeView, classes: Dict[str, str]):
        self.view, self.type_of = view, type_lookup(classes)
        self.classes = classes
        self.inferred: Dict[str, str] = {}
        self._cache: Dict[Tuple[str, str], Optional[str]] = {}

    def explicit(self, cell: str, cls: str) -> Optional[str]:
        """The rule the mapping file or the class default gives the cell; None when neither names it."""
        key = (cell, cls)
        if key not in self._cache:
            items: tuple = ()
            own = self.view.self_entries.get(cls)
            if own is not None:
                items += own.rules
            entry = self.view.resolve(cell, self.type_of).entry  # the entry that names this cell
            if entry is not None:
                items += entry.rules
            self._cache[key] = parse_rules(items).shard or DEFAULT_SHARDS.get(cls)
        return self._cache[key]

    def rule_of(self, cell: str, cls: str) -> str:
        return self.explicit(cell, cls) or self.inferred.get(cell, "none")

    def baseline_name(self, cell: str) -> str:
        return self.view.resolve(cell, self.type_of).baseline

    def compare_rules(self, cell: str) -> CompareRules:
        entry = self.view.resolve(cell, self.type_of).entry
        return parse_rules(entry.rules if entry is not None else ())


# -- merging -------------------------------------------------------------------------------------------
def _groups(found: List[RankDump], path: str, size: int, request: CompareRequest,
            out_root: str) -> Dict[Tuple[Optional[int], int], Group]:
    dumps = [d for d in found if d.step is None or d.step in request.steps]
    by_step: Dict[Optional[int], List[RankDump]] = {}
    for dump in dumps:
        by_step.setdefault(dump.step, []).append(dump)
    groups = {}
    for step, folders in by_step.items():
        ranks = {d.rank or 0: d for d in folders}
        for index in range((max(ranks) // size) + 1):
            members = [ranks.get(index * size + part) for part in range(size)]
            if not any(members):
                continue
            if not all(members):
                absent = [index * size + p for p, m in enumerate(members) if m is None]
                raise CompareInputError(f"{path}: step {step}: tensor-parallel group {index} (ranks "
                                        f"{index * size}-{index * size + size - 1}) has no folder for rank(s) "
                                        f"{absent}; every rank of a group is needed to merge it")
            out = os.path.join(out_root, *([f"step{step}"] if step is not None else []), f"rank{index}")
            groups[(step, index)] = Group(step, index, members, out)
    return groups


def recorded_tp(path: str, dumps: List[RankDump]) -> int:
    """The tensor-parallel size capture recorded in the first ``dump.json`` (``PARALLEL_KEY``) of ``dumps`` (the
    rank folders of ``path``), when they are several; 1 otherwise (or when it cannot be read: the comparison
    says why)."""
    if len({d.rank or 0 for d in dumps}) < 2:
        return 1
    try:
        layout = DumpJson(dumps[0].dump_json).header.get(PARALLEL_KEY)
    except (DumpError, OSError):
        return 1
    size = layout.get("tensor_parallel") if isinstance(layout, dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and size > 1:
        logger.info("%s: tensor parallel over %d ranks, as capture recorded (%s)", path, size, layout.get("source"))
        return size
    return 1


def _classes(dump: RankDump) -> Dict[str, str]:
    classes = {}
    for name, _ in DumpJson(dump.dump_json).entries():
        parsed = parse_entry_name(name) or parse_parameters_grad_name(name)
        if parsed is not None:
            classes[parsed.cell] = parsed.cls
    return classes


def rule_view(request: CompareRequest, folders: RankFolders) -> MsprobeView:
    """The layer mapping compare uses for this request (chosen from the target's classes), as msprobe reads it."""
    target, baseline = folders.target[0], folders.baseline[0]
    frameworks = (DumpJson(target.dump_json).framework, DumpJson(baseline.dump_json).framework)
    return MsprobeView(engine.choose_mapping(request.mapping, set(_classes(target).values()), frameworks))


def merge_side(side: Side, found: List[RankDump], path: str, request: CompareRequest, view: MsprobeView, work: str,
               other: Optional[List[RankDump]] = None) -> Tuple[str, List[RankDump]]:
    """Merge every group of one side (``found``: the rank folders of ``path``) under ``work``; returns the merged
    dump root and its rank folders (or ``path`` and ``found`` as they are). ``other``: the rank folders of the
    unsharded other side, whose shapes let the rules of cells no rule names be inferred."""
    root = os.path.join(work, side.name)
    side.groups = _groups(found, path, side.size, request, root) if side.size > 1 else {}
    first = next(iter(side.groups.values())).shards[0] if side.groups else found[0]
    side.rules = RuleBook(view, _classes(first))
    if side.size == 1:
        return path, found
    if other is not None:
        _infer(side, next(iter(side.groups.values())), other)
    merged = []
    for group in side.groups.values():
        try:
            dump = GroupMerger(group, side.rules.rule_of, side.notes).run()
        except (ShardError, tensors.TensorFileError) as err:
            raise CompareInputError(str(err)) from None
        folder = f"rank{group.index}"  # the label the reader gives the folder: ``step1/rank0``
        merged.append(dataclasses.replace(dump, label=folder if group.step is None else f"step{group.step}/{folder}"))
    return root, merged


def _infer(side: Side, group: Group, other: List[RankDump]) -> None:
    """Rules for the cells no rule names, from the ranks' tensors of one group (every group runs the same
    cells) against the unsharded other side's shapes; the mapping's names lead the target's cells to the
    baseline's."""
    rules = side.rules
    cells = {cell: cls for cell, cls in rules.classes.items() if rules.explicit(cell, cls) is None}
    if not cells:
        return
    if DumpJson(group.shards[0].dump_json).task != "tensor":
        side.inference.note = (f"a statistics dump cannot show a cell's layout: {len(cells)} cell(s) without a rule "
                               "are merged as replicated (none); give their rules in a mapping file")
        return
    dumps = [d for d in other if d.step in (group.step, None)] or other
    shapes = other_shapes(DumpJson(dumps[0].dump_json).entries())
    base_name = rules.baseline_name if side.name == "target" else (lambda cell: cell)
    side.inference = infer_rules(group, cells, shapes, base_name)
    rules.inferred.update(side.inference.rules)
    for cell, rule in side.inference.rules.items():
        logger.info("%s cell %s: shard=%s inferred from its ranks' tensors", side.name, cell, rule)


def run(request: CompareRequest, sizes: ShardSizes, folders: RankFolders) -> Tuple[CompareResult, ShardReport]:
    """Merge, compare, name the ranks of the first divergence (before the reports are written: they name the
    launched rank), then check the merged shapes. ``folders``: both sides' rank folders, found once."""
    report = ShardReport(Side("target", sizes.target), Side("baseline", sizes.baseline))
    view = rule_view(request, folders)
    os.makedirs(request.output, mode=0o750, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".shards-", dir=request.output) as work:
        target, targets = merge_side(report.target, folders.target, request.target, request, view, work,
                                     folders.baseline if sizes.baseline == 1 else None)
        baseline, baselines = merge_side(report.baseline, folders.baseline, request.baseline, request, view, work,
                                         folders.target if sizes.target == 1 else None)
        attribution = Attribution(report, baselines, request.thresholds)
        result = engine.run(dataclasses.replace(request, target=target, baseline=baseline),
                            RankFolders(targets, baselines), attribution.complete)
        result.request = request
        try:
            _check_shapes(result, report)
        except CompareInputError as err:  # a statistics dump could not show the layout: say so beside it
            notes = [side.inference.note for side in (report.target, report.baseline) if side.inference.note]
            if not notes:
                raise
            raise CompareInputError(f"{err}; {'; '.join(notes)}") from None
    return result, report


def _check_shapes(result: CompareResult, report: ShardReport) -> None:
    """A merged cell that does not have the other side's shape: its rule does not fit it. Cells without a
    rule whose ranks hold different tensors count too (they were taken as replicated)."""
    rules = {}
    for side in (report.target, report.baseline):
        for item in side.notes.disagreements:
            parsed = parse_entry_name(item["entry"]) or parse_parameters_grad_name(item["entry"])
            if parsed is not None:
                rules[(side.name, parsed.cell)] = f"{item['rule']}, its ranks' tensors differ"
        rules.update({(side.name, cell): rule for cell, rule in side.notes.rules.items()})
    if not rules or not os.path.isfile(result.csv_path):
        return
    for row in _shape_mismatches(result.csv_path):
        base = parse_entry_name(row["baseline_entry"]) or parse_parameters_grad_name(row["baseline_entry"])
        for side, cell in (("target", row["cell"]), ("baseline", base.cell if base else None)):
            if (side, cell) in rules:
                raise CompareInputError(
                    f"{side} cell {cell} (shard={rules[(side, cell)]}): merged, {row['entry']} {row['slot']} does "
                    f"not have the other side's shape ({row['reason']}): the cell is not split the way its rule "
                    "says; give its rule in a mapping file (--mapping FILE with shard=column|row|vocab|split|none "
                    "on its entry or on its class's \"\" entry)")


def _shape_mismatches(csv_path: str) -> Iterator[Dict[str, str]]:
    """The pairs of the written table skipped because the two sides' shapes differ, read one row at a time."""
    with open(csv_path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["status"] == "skipped" and row["reason"].startswith("shape "):
                yield row


class Attribution:
    """Which ranks' parts of the first divergent cell diverge from the baseline (tensor dumps)."""

    def __init__(self, report: ShardReport, baselines: List[RankDump],
                 thresholds: Dict[str, thresholds_mod.Thresholds]):
        self.report = report
        self.baselines = baselines  # the rank folders compared as the baseline (merged when it is sharded)
        self.thresholds = thresholds

    def complete(self, result: CompareResult) -> None:
        """Name the ranks of the first divergence in the report and on the divergence itself: the rank the user
        launched (``rank``, all of them in ``ranks``), the merged group's index apart (``group``); each compared
        unit of a merged target gets the launched ranks of its group (``ranks``)."""
        for unit in result.units:
            group = self.report.target.groups.get((unit["step"], unit["rank"] or 0))
            if group is not None:
                unit["ranks"] = group.ranks
        self.report.attribution = found = self.of(result)
        first, side = result.first, self.report.target
        if first is None or side.size == 1:
            return
        group = side.groups.get((first.step, first.rank or 0))
        if group is None:
            return
        named = found["ranks"] if found else []
        first.launched = LaunchedRanks(group=group.index, ranks=named or group.ranks, attributed=bool(named))

    def of(self, result: CompareResult) -> Optional[Dict[str, Any]]:
        first, side = result.first, self.report.target
        if first is None or side.size == 1:
            return None
        step, index = first.step, first.rank or 0  # the merged folder's rank is the group's index
        group = side.groups.get((step, index))
        baseline = self._baseline_folder(step, index)
        if group is None or baseline is None or not first.baseline:
            return None
        parsed = parse_entry_name(first.entry)
        rule = side.rules.rule_of(first.cell, parsed.cls if parsed else "")
        evidence = self._slots(first, group, baseline, rule)
        forward = first.entry.replace(f".{first.direction}.", f".{FORWARD}.")
        base_forward = first.baseline.replace(f".{first.direction}.", f".{FORWARD}.")
        evidence += self._weights(forward, base_forward, group, baseline, rule)
        ranks = sorted({r for item in evidence for r in item["diverged"]})
        return {"cell": first.cell, "entry": first.entry, "rule": rule, "group": group.ranks, "ranks": ranks,
                "evidence": evidence}

    def _baseline_folder(self, step, index) -> Optional[RankDump]:
        dumps = self.baselines
        if len(dumps) == 1:
            return dumps[0]
        found = {(d.step, d.rank or 0): d for d in dumps}
        return found.get((step, index)) or found.get((step, 0))

    def _slots(self, first, group: Group, baseline: RankDump, rule: str) -> List[Dict[str, Any]]:
        bodies = _bodies(group, first.entry)
        base_body = _body(baseline, first.baseline)
        rules = self.report.target.rules.compare_rules(first.cell)
        out = []
        for tensor in first.tensors:
            if tensor.get("status") != "diverged" or bodies is None or base_body is None:
                continue
            slot, how = tensor["slot"], None
            records = [slot_record(b, slot) for b in bodies]
            base_slot, use_split, use_act, why = map_slot(slot, first.direction, rules)
            base_record = slot_record(base_body, base_slot) if not why else None
            if base_record is None or not all(records):
                continue
            how = plan(rule, first.direction, slot, len(records[0].get("shape") or []))
            arrays = _arrays(group, records, baseline, base_record)
            if arrays is None or how == PARTIAL:
                continue
            parts, base = arrays
            merged_shape = parts[0].shape if how == SAME else _joined_shape(parts, how)
            try:
                base = transforms.to_target(base, tuple(merged_shape), rules, use_split, use_act)
            except transforms.NotComparable:
                continue
            out.append(_judge(slot, how, parts, base, group, self.thresholds))
        return out

    def _weights(self, forward: str, base_forward: str, group: Group, baseline: RankDump, rule: str):
        bodies = _bodies(group, forward)
        base_body = _body(baseline, base_forward)
        if bodies is None or base_body is None:
            return []
        out = []
        for name, record in (bodies[0].get("parameters") or {}).items():
            records = [(b.get("parameters") or {}).get(name) for b in bodies]
            base_record = (base_body.get("parameters") or {}).get(name)
            if base_record is None or not all(records):
                continue
            how = plan(rule, FORWARD, f"param.{name}", len(record.get("shape") or []))
            arrays = _arrays(group, records, baseline, base_record)
            if arrays is None:
                continue
            parts, base = arrays
            if (base.shape if how == SAME else _joined_shape(parts, how)) != tuple(base.shape):
                continue
            out.append(_judge(f"param.{name}", how, parts, base, group, self.thresholds))
        return out


def _bodies(group: Group, entry: str) -> Optional[List[Dict[str, Any]]]:
    bodies = [_body(shard, entry) for shard in group.shards]
    return bodies if all(b is not None for b in bodies) else None


def _body(dump: RankDump, entry: str) -> Optional[Dict[str, Any]]:
    for name, body in DumpJson(dump.dump_json).entries():
        if name == entry:
            return body
    return None


def _arrays(group: Group, records, baseline: RankDump, base_record):
    try:
        paths = [tensors.data_path(s.data_dir, r) for s, r in zip(group.shards, records)]
        base_path = tensors.data_path(baseline.data_dir, base_record)
        if base_path is None or not all(paths):
            return None
        return [tensors.load(p) for p in paths], tensors.load(base_path)
    except tensors.TensorFileError:
        return None


def _joined_shape(parts: List[np.ndarray], axis: int) -> tuple:
    shape = list(parts[0].shape)
    axis = axis if axis >= 0 else len(shape) + axis
    shape[axis] = sum(p.shape[axis] for p in parts)
    return tuple(shape)


def _judge(slot: str, how, parts: List[np.ndarray], base: np.ndarray, group: Group, thresholds) -> Dict[str, Any]:
    """Each rank's part against the baseline's same part: which diverge."""
    if how == SAME:
        pieces = [base] * len(parts)
    else:
        axis = how if how >= 0 else base.ndim + how
        bounds = np.cumsum([p.shape[axis] for p in parts])[:-1]
        pieces = np.split(base, bounds, axis=axis)
    diverged, within = [], []
    for rank, part, piece in zip(group.ranks, parts, pieces):
        dtype = canonical_dtype(str(part.dtype))
        limits = thresholds_mod.thresholds_for(dtype, dtype, thresholds)
        verdict = metrics.tensor_metrics(part, piece, limits, limits == thresholds[thresholds_mod.EXACT])
        (diverged if verdict.diverged else within).append(rank)
    return {"slot": slot, "merge": "same" if how == SAME else f"axis {how}", "diverged": diverged, "within": within}
