"""Check the data-parallel replicas of one step against each other, one rank at a time.

Replicas see different data, so their activations differ; what must agree bit for bit
is what the reduction made equal: the weights at the start of a step and, when the dump
holds them after the reduction (graph mode), the weight gradients. So, per step and
replica group:

* the first weight (or reduced weight gradient) that is not identical on every replica,
  in execution order, and the ranks that hold a minority value (with two replicas there is
  no majority: the lower rank is the reference);
* the first NaN/Inf: the earliest (forward before backward, then dump order) over the
  ranks; ranks tied there are all named;
* suspects: ranks whose size (log10 of Norm or of the largest magnitude) of an output or
  gradient lies far outside the other replicas' spread (leave-one-out mean and standard
  deviation). Not a divergence: data differ.

Memory does not grow with the number of ranks: a first pass keeps, per item, counts of
the distinct weight digests (at most ``max_values``) and sums of the sizes, and writes
each rank's row (8 bytes per digest, 4 per size) to a spill file; the second pass reads
the rows back one at a time. The heat map (ranks x layers) is the only per-rank array.

A step's result is said in one line (``step_line``), the line rank 0 logs at train end and
``mf-celldump ranks`` prints::

    step 3: rank 2: first NaN at layers.2 (forward); rank 1 departs first at layers.0.up
    param.weight (3 of 4 replicas agree); suspect: rank 2 at layers.1 forward.0 output.0
    (Norm x1e+03 the other replicas'); rank 3 missing
    step 0: clean (4 replicas)
    step 0: no NaN/Inf; rank 0 is the only replica: nothing to compare it with
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from mf_celldump.layout.naming import layer_of
from mf_celldump.ranks.groups import GroupKey, ReplicaGroups
from mf_celldump.ranks.rank_summary import ACT, GRAD, WEIGHT, Item, RankSummary

GRAD_MODES = ("auto", "reduced", "local")


@dataclass(frozen=True)
class CheckOptions:
    factor: float = 10.0  # a suspect's size is off the others' by at least this factor
    sigmas: float = 6.0  # ... and by this many of their standard deviations (3 or more replicas)
    grads: str = "auto"  # weight gradients: reduced (must be equal), local, or auto (decided from the data)
    max_values: int = 8  # distinct values kept per weight: beyond, the weight varies across replicas
    max_listed: int = 50  # departing ranks and suspects listed per step and group

    @property
    def log_factor(self) -> float:
        return math.log10(self.factor)


@dataclass
class _Value:
    count: int
    lowest: int


@dataclass
class Index:
    """The items of the first summary seen, in its order: what every later rank is aligned to."""

    equal: List[Item] = field(default_factory=list)  # weights and weight gradients (digests)
    sizes: List[Item] = field(default_factory=list)  # weight gradients and activations (two sizes each)
    positions: Dict[Tuple[str, str], Tuple[int, int]] = field(default_factory=dict)  # key -> (equal, size)
    order: Dict[Tuple[str, str], int] = field(default_factory=dict)
    layers: List[str] = field(default_factory=list)
    equal_layer: List[int] = field(default_factory=list)
    size_layer: List[int] = field(default_factory=list)

    @classmethod
    def of(cls, summary: RankSummary) -> Index:
        index = cls()
        layer_ids: Dict[str, int] = {}
        for item in summary.items:
            key = (item.cell, item.label)
            if key in index.positions:
                continue
            layer = layer_ids.setdefault(layer_of(item.cell), len(layer_ids))
            eq = sz = -1
            if item.kind in (WEIGHT, GRAD):
                eq = len(index.equal)
                index.equal.append(item)
                index.equal_layer.append(layer)
            if item.kind in (GRAD, ACT):
                sz = len(index.sizes)
                index.sizes.append(item)
                index.size_layer.append(layer)
            index.positions[key] = (eq, sz)
            index.order[key] = len(index.order)
        index.layers = list(layer_ids)
        return index


class GroupCheck:
    """The replicas of one replica group in one step: ``add`` each rank's summary, then ``finish``."""

    def __init__(self, step: Optional[int], group: str, options: CheckOptions, spill_dir: str):
        self.step, self.group, self.options = step, group, options
        self.index: Optional[Index] = None
        self.ranks: List[int] = []
        self.unaligned: Dict[int, int] = {}  # rank -> items the first rank does not have
        self._spill_path = os.path.join(spill_dir, f"replicas-{id(self)}.bin")
        self._values: List[Optional[Dict[int, _Value]]] = []
        self._sums: Optional[np.ndarray] = None  # [sizes, 2 metrics, (n, sum, sum of squares)]
        self._anomaly: Tuple[Optional[tuple], List[Tuple[int, Any]]] = (None, [])

    # -- pass 1 ------------------------------------------------------------------------------
    def add(self, summary: RankSummary) -> None:
        if self.index is None:
            self.index = Index.of(summary)
            self._values = [{} for _ in self.index.equal]
            self._sums = np.zeros((len(self.index.sizes), 2, 3))
        digests, sizes = self._row(summary)
        self._count(summary.rank, digests)
        present = ~np.isnan(sizes)
        self._sums[:, :, 0] += present
        self._sums[:, :, 1] += np.where(present, sizes, 0.0)
        self._sums[:, :, 2] += np.where(present, sizes * sizes, 0.0)
        with open(self._spill_path, "ab") as spill:  # opened per rank: many steps and groups may be open at once
            spill.write(digests.tobytes())
            spill.write(sizes.astype(np.float32).tobytes())
        self.ranks.append(summary.rank)
        self._note_anomaly(summary)

    def _row(self, summary: RankSummary) -> Tuple[np.ndarray, np.ndarray]:
        index = self.index
        digests = np.zeros(len(index.equal), dtype=np.uint64)  # 0: absent; else digest + 1
        sizes = np.full((len(index.sizes), 2), np.nan)
        extra = 0
        for item in summary.items:
            slot = index.positions.get((item.cell, item.label))
            if slot is None:
                extra += 1
                continue
            eq, sz = slot
            if eq >= 0 and item.digest is not None:
                digests[eq] = int(item.digest, 16) + 1
            if sz >= 0:
                sizes[sz] = (_nan(item.log_norm), _nan(item.log_max))
        if extra:
            self.unaligned[summary.rank] = extra
        return digests, sizes

    def _count(self, rank: int, digests: np.ndarray) -> None:
        for position, digest in enumerate(digests.tolist()):
            values = self._values[position]
            if values is None or digest == 0:
                continue
            found = values.get(digest)
            if found is None:
                if len(values) >= self.options.max_values:
                    self._values[position] = None  # varies across replicas: not a replicated value
                    continue
                values[digest] = _Value(1, rank)
            else:
                found.count += 1
                found.lowest = min(found.lowest, rank)

    def _note_anomaly(self, summary: RankSummary) -> None:
        found = summary.anomaly
        if found is None:
            return
        best, ranks = self._anomaly
        if best is None or found.order < best:
            self._anomaly = (found.order, [(summary.rank, found)])
        elif found.order == best and len(ranks) < self.options.max_listed:
            ranks.append((summary.rank, found))

    # -- pass 2 ------------------------------------------------------------------------------
    def finish(self) -> GroupResult:
        try:
            return self._finish()
        finally:
            if os.path.exists(self._spill_path):
                os.unlink(self._spill_path)

    def _finish(self) -> GroupResult:
        result = GroupResult(self.step, self.group, sorted(self.ranks))
        if self.index is None:
            return result
        result.layers = self.index.layers
        result.anomaly = self._anomaly_result()
        equal_mask, result.grads_reduced = self._equal_mask()
        majority = self._majorities(equal_mask, result)
        heat = np.zeros((len(self.ranks), len(self.index.layers)), dtype=np.float32)
        marks = np.zeros_like(heat, dtype=np.uint8)
        rank_row = {rank: row for row, rank in enumerate(result.ranks)}
        n_eq, n_sz = len(self.index.equal), len(self.index.sizes)
        with open(self._spill_path, "rb") as spill:
            for rank in self.ranks:
                digests = np.frombuffer(spill.read(8 * n_eq), dtype=np.uint64)
                sizes = np.frombuffer(spill.read(8 * n_sz), dtype=np.float32).reshape(n_sz, 2).astype(np.float64)
                row = rank_row[rank]
                self._departures(rank, digests, majority, result, marks[row])
                self._suspect(rank, sizes, len(self.ranks), result, heat[row])
        layer_column = {layer: column for column, layer in enumerate(self.index.layers)}
        for rank, anomaly in result.anomaly:
            column = layer_column.get(layer_of(anomaly.cell))
            if column is not None:
                marks[rank_row[rank], column] |= MARK_ANOMALY
        result.heat, result.marks = heat, marks
        result.suspects.sort(key=lambda s: (s["order"], -abs(s["deviation"])))
        del result.suspects[self.options.max_listed:]
        result.departures.sort(key=lambda d: (d["order"], d["rank"]))
        del result.departures[self.options.max_listed:]
        for rank, extra in sorted(self.unaligned.items()):
            result.notes.append(f"rank {rank}: {extra} tensors that rank {self.ranks[0]}'s dump does not have")
        return result

    def _anomaly_result(self) -> List[Tuple[int, Any]]:
        return sorted(self._anomaly[1], key=lambda pair: pair[0])

    def _equal_mask(self) -> Tuple[np.ndarray, Optional[bool]]:
        """Which equality items must agree: weights always; weight gradients when reduced."""
        kinds = np.array([item.kind == GRAD for item in self.index.equal], dtype=bool)
        mask = ~kinds
        if not kinds.any():
            return mask, None
        if self.options.grads == "reduced":
            reduced = True
        elif self.options.grads == "local":
            reduced = False
        else:  # reduced gradients agree almost everywhere; local ones almost nowhere
            agree = [values is not None and len(values) == 1 for values, grad in zip(self._values, kinds) if grad]
            reduced = len(self.ranks) > 1 and sum(agree) * 2 >= len(agree)
        return (mask | kinds) if reduced else mask, reduced

    def _majorities(self, mask: np.ndarray, result: GroupResult) -> np.ndarray:
        """Per equality item, the digest most replicas hold (0: no check) and the first departure."""
        majority = np.zeros(len(self.index.equal), dtype=np.uint64)
        for position, values in enumerate(self._values):
            if not mask[position]:
                continue
            item = self.index.equal[position]
            if values is None:
                result.varying.append(item.key)
                continue
            if not values:
                continue
            best = max(values.items(), key=lambda kv: (kv[1].count, -kv[1].lowest))
            majority[position] = best[0]
            if len(values) > 1 and result.first_departure is None:
                result.first_departure = {
                    "cell": item.cell, "label": item.label, "kind": item.kind,
                    "order": self.index.order[(item.cell, item.label)],
                    "majority": best[1].count, "replicas": len(self.ranks),
                    "no_majority": sum(1 for v in values.values() if v.count == best[1].count) > 1,
                    "reference": best[1].lowest, "ranks": [],
                }
        return majority

    def _departures(self, rank: int, digests: np.ndarray, majority: np.ndarray, result: GroupResult,
                    marks: np.ndarray) -> None:
        differs = (majority != 0) & (digests != 0) & (digests != majority)
        if not differs.any():
            return
        positions = np.flatnonzero(differs)
        for position in positions:
            marks[self.index.equal_layer[position]] |= MARK_DEPARTURE
        item = self.index.equal[positions[0]]
        order = self.index.order[(item.cell, item.label)]
        first = result.first_departure
        if first is not None and order == first["order"]:
            first["ranks"].append(rank)
        result.departures.append({"rank": rank, "cell": item.cell, "label": item.label, "kind": item.kind,
                                  "order": order, "count": int(len(positions))})

    def _suspect(self, rank: int, sizes: np.ndarray, replicas: int, result: GroupResult, heat: np.ndarray) -> None:
        if replicas < 2:
            return
        n, total, squares = self._sums[:, :, 0], self._sums[:, :, 1], self._sums[:, :, 2]
        present = ~np.isnan(sizes) & (n >= 2)
        others = np.maximum(n - 1, 1)
        values = np.where(present, sizes, 0.0)
        mean = (total - values) / others
        spread = np.sqrt(np.maximum((squares - values * values) / others - mean * mean, 0.0))
        deviation = np.where(present, values - mean, 0.0)
        flagged = present & (np.abs(deviation) >= self.options.log_factor)
        flagged &= (n < 3) | (np.abs(deviation) >= self.options.sigmas * spread)
        if replicas == 2 and rank == min(self.ranks):
            flagged[:] = False  # two replicas: no majority, the lower rank is the reference
        worst = np.abs(deviation).max(axis=1)
        np.maximum.at(heat, np.asarray(self.index.size_layer, dtype=np.int64), worst.astype(np.float32))
        if not flagged.any():
            return
        positions = np.flatnonzero(flagged.any(axis=1))
        first = positions[0]
        metric = 0 if flagged[first, 0] else 1
        item = self.index.sizes[first]
        result.suspects.append({
            "rank": rank, "cell": item.cell, "label": item.label, "kind": item.kind,
            "metric": ("Norm", "Max")[metric], "deviation": float(deviation[first, metric]),
            "order": self.index.order[(item.cell, item.label)], "count": int(len(positions)),
            "no_majority": replicas == 2,
        })


MARK_DEPARTURE = 1
MARK_ANOMALY = 2


@dataclass
class GroupResult:
    step: Optional[int]
    group: str
    ranks: List[int]
    layers: List[str] = field(default_factory=list)
    anomaly: List[Tuple[int, Any]] = field(default_factory=list)  # (rank, Anomaly) tied first
    first_departure: Optional[Dict[str, Any]] = None
    departures: List[Dict[str, Any]] = field(default_factory=list)  # first departing item per rank
    suspects: List[Dict[str, Any]] = field(default_factory=list)
    varying: List[str] = field(default_factory=list)  # must-equal items with more than max_values values
    grads_reduced: Optional[bool] = None
    notes: List[str] = field(default_factory=list)
    heat: Optional[np.ndarray] = None  # ranks x layers: largest |log10 deviation| from the other replicas
    marks: Optional[np.ndarray] = None  # ranks x layers: MARK_DEPARTURE | MARK_ANOMALY

    @property
    def clean(self) -> bool:
        return not (self.anomaly or self.first_departure or self.suspects or self.varying)


def _nan(value: Optional[float]) -> float:
    return math.nan if value is None else value


class ReplicaChecks:
    """Every step's replica groups, fed one rank summary at a time in any order."""

    def __init__(self, replicas: ReplicaGroups, options: CheckOptions, world: int, spill_dir: str):
        self.replicas, self.options, self.world, self.spill_dir = replicas, options, world, spill_dir
        self.checks: Dict[Tuple[Optional[int], str], GroupCheck] = {}
        self.labels: Dict[str, str] = {}

    def group(self, rank: int) -> Optional[str]:
        key: Optional[GroupKey] = self.replicas.group_of(rank, self.world)
        if key is None:
            return None
        group = ",".join(str(k) for k in key)
        self.labels[group] = self.replicas.label(key)
        return group

    def add(self, summary: RankSummary) -> None:
        group = self.group(summary.rank)
        if group is None:
            return
        check = self.checks.get((summary.step, group))
        if check is None:
            check = self.checks[(summary.step, group)] = GroupCheck(summary.step, group, self.options, self.spill_dir)
        check.add(summary)

    def finish(self, expected=None, steps=None) -> Tuple[List[GroupResult], Dict[tuple, List[int]]]:
        """Results by step and group, and the ranks missing in each: of ``expected`` ranks when given,
        else of the ranks seen in any step. ``steps``: also report these when no rank had them."""
        wanted: Dict[str, set] = {}
        if expected is not None:
            for rank in expected:
                group = self.group(rank)
                if group is not None:
                    wanted.setdefault(group, set()).add(rank)
        else:
            for (_, group), check in self.checks.items():
                wanted.setdefault(group, set()).update(check.ranks)
        keys = set(self.checks) | {(step, group) for step in (steps or ()) for group in wanted}
        results, missing = [], {}
        for step, group in sorted(keys, key=lambda k: (_step_key(k[0]), k[1])):
            check = self.checks.get((step, group))
            result = check.finish() if check else GroupResult(step, group, [])
            results.append(result)
            absent = sorted(wanted.get(group, set()) - set(result.ranks))
            if absent:
                missing[(step, group)] = absent
        return results, missing


def _step_key(step: Optional[int]) -> int:
    return -1 if step is None else step


# -- the one line per step ---------------------------------------------------------------------------

MAX_NAMED = 8


def ranks_text(ranks: Iterable[int], limit: int = MAX_NAMED) -> str:
    ranks = sorted(ranks)
    shown = ", ".join(str(r) for r in ranks[:limit])
    more = f" and {len(ranks) - limit} more" if len(ranks) > limit else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + shown + more


def findings(result: GroupResult) -> List[str]:
    """The parts of a step's line, most decisive first: NaN/Inf, departure, suspects."""
    parts = []
    if result.anomaly:
        first = result.anomaly[0][1]
        parts.append(f"{ranks_text(r for r, _ in result.anomaly)}: first {first.kind} at {first.cell} "
                     f"({first.direction})")
    departure = result.first_departure
    if departure is not None:
        what = "weight gradient" if departure["kind"] == "grad" else "weight"
        agree = (f"no majority among {departure['replicas']} replicas, shown against rank {departure['reference']}"
                 if departure["no_majority"] else
                 f"{departure['majority']} of {departure['replicas']} replicas agree")
        parts.append(f"{ranks_text(departure['ranks'])} departs first at {departure['cell']} "
                     f"{departure['label']} ({what} not bit-identical; {agree})")
    if result.varying:
        parts.append(f"{len(result.varying)} weights differ on every replica (first: {result.varying[0]}): "
                     "are these ranks replicas? see --replicas / replica_groups")
    for suspect in result.suspects[:3]:
        factor = 10 ** abs(suspect["deviation"])
        side = "x" if suspect["deviation"] > 0 else "/"
        parts.append(f"suspect: rank {suspect['rank']} at {suspect['cell']} {suspect['label']} "
                     f"({suspect['metric']} {side}{factor:.3g} the other replicas'"
                     + ("; two replicas: shown against the lower rank" if suspect["no_majority"] else "") + ")")
    if len(result.suspects) > 3:
        parts.append(f"{len(result.suspects) - 3} more suspects")
    return parts


def step_line(result: GroupResult, missing: Iterable[int] = (), group_label: Optional[str] = None) -> str:
    """One line: ``step N[, GROUP]: clean (K replicas)`` or the findings, then the ranks without data.

    A single replica has no other to agree with: its line says only that it holds no NaN/Inf.
    """
    where = f"step {'-' if result.step is None else result.step}"
    if group_label:
        where += f", {group_label}"
    parts = findings(result)
    missing = sorted(missing)
    if missing:
        parts.append(f"{ranks_text(missing)} missing (no data for this step)")
    if not parts:
        if len(result.ranks) == 1:
            return f"{where}: no NaN/Inf; {ranks_text(result.ranks)} is the only replica: nothing to compare it with"
        return f"{where}: clean ({len(result.ranks)} replicas)"
    return f"{where}: " + "; ".join(parts)
