"""Put the rank folders of one tensor-parallel group back together: one rank folder of the whole model.

The ranks of a group run the same cells in the same order, so their ``dump.json`` files are
read side by side, entry by entry (memory: one entry's tensors). Each tensor is merged as
its cell's shard rule says (``mapping.compare_rules.SHARDS``):

=========  ==================  =====================  ===================  ===================  ==============
rule       forward input       forward output         grad w.r.t. output   grad w.r.t. input    weights, grads
=========  ==================  =====================  ===================  ===================  ==============
column     same                join last axis         join last axis       partial              join axis 0
row        join last axis      partial                same                 join last axis       join axis 1 (1-D: same)
vocab      same                partial                same                 same                 join axis 0
split      join last axis      join last axis         join last axis       join last axis       same
none       same                same                   same                 same                 same
reduce     partial             same                   same                 same                 same
gather     join last axis      same                   same                 join last axis       same
scatter    same                join last axis         join last axis       same                 same
red._sc.   partial             join axis 0            join axis 0          same                 same
copy       same                same                   partial              same                 same
=========  ==================  =====================  ===================  ===================  ==============

``same``: the tensor is replicated; every rank's copy must be equal (a copy that differs is
reported, rank 0's is kept). ``partial``: a partial sum before the reduction, added; when
every rank holds the same values it was reduced already and is taken once. A statistics dump
joins Max, Min, Mean and Norm exactly; a partial sum of statistics cannot be added and is
left out (reported).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from mf_celldump import fsutil
from mf_celldump.analysis.compare import tensors
from mf_celldump.errors import ShardError
from mf_celldump.layout.naming import (
    BACKWARD,
    DUMP_JSON,
    FORWARD,
    PARAMETERS,
    TENSOR_DIR,
    parse_entry_name,
    parse_parameters_grad_name,
)
from mf_celldump.layout.reader import DumpJson, RankDump
from mf_celldump.layout.slots import is_tensor
from mf_celldump.statistics import STAT_KEYS, compute_statistics

SAME, PARTIAL = "same", "partial"
_PLANS = {  # rule -> (forward input, forward output, grad w.r.t. output, grad w.r.t. input, weight)
    "column": (SAME, -1, -1, PARTIAL, 0),
    "row": (-1, PARTIAL, SAME, -1, 1),
    "vocab": (SAME, PARTIAL, SAME, SAME, 0),
    "split": (-1, -1, -1, -1, SAME),
    "none": (SAME, SAME, SAME, SAME, SAME),
    # Communication regions: all-reduce (input partial sums, output replicated), all-gather and split on the
    # last axis, reduce-scatter on the first axis, and the copy whose backward all-reduces the gradient.
    "reduce": (PARTIAL, SAME, SAME, SAME, SAME),
    "gather": (-1, SAME, SAME, -1, SAME),
    "scatter": (SAME, -1, -1, SAME, SAME),
    "reduce_scatter": (PARTIAL, 0, 0, SAME, SAME),
    "copy": (SAME, SAME, PARTIAL, SAME, SAME),
}
_STAT_NAMES = {key: name for name, key in STAT_KEYS.items()}


def plan(rule: str, direction: str, slot: str, ndim: int):
    """How one tensor is merged: ``SAME``, ``PARTIAL`` or the axis to join along."""
    fwd_in, fwd_out, grad_out, grad_in, weight = _PLANS[rule]
    head = slot.split(".", 1)[0]
    if head in ("param", "grad"):
        if rule == "row" and ndim < 2:
            return SAME
        return weight
    if direction == FORWARD:
        return fwd_in if head in ("input", "kwarg") else fwd_out
    return grad_out if head in ("input", "kwarg") else grad_in


@dataclass
class MergeNotes:
    """What merging found besides the merged tensors."""

    disagreements: List[Dict[str, Any]] = field(default_factory=list)  # replicated tensors that differ
    dropped: List[str] = field(default_factory=list)  # partial sums of statistics: not comparable
    rules: Dict[str, str] = field(default_factory=dict)  # cell -> rule, for the cells merged by a rule


@dataclass
class Group:
    """One tensor-parallel group of one step: its rank folders in shard order, and where the merge goes."""

    step: Optional[int]
    index: int  # the data-parallel index: the merged folder is rank{index}
    shards: List[RankDump]
    out_dir: str

    @property
    def ranks(self) -> List[int]:
        return [s.rank or 0 for s in self.shards]


RuleOf = Callable[[str, str], str]  # (cell, class) -> shard rule


class GroupMerger:
    """Merges one group's rank folders into ``group.out_dir``."""

    def __init__(self, group: Group, rule_of: RuleOf, notes: MergeNotes):
        self.group, self.rule_of, self.notes = group, rule_of, notes
        self.data_dir: Optional[str] = None

    def run(self) -> RankDump:
        readers = [DumpJson(shard.dump_json) for shard in self.group.shards]
        header = dict(readers[0].header)
        os.makedirs(self.group.out_dir, mode=fsutil.DIR_MODE, exist_ok=True)  # inside our own temporary folder
        if header.get("task") == "tensor":
            self.data_dir = fsutil.make_dir(os.path.join(self.group.out_dir, TENSOR_DIR))
        header["dump_data_dir"] = self.data_dir
        with open(os.path.join(self.group.out_dir, DUMP_JSON), "w", encoding="utf-8") as handle:
            handle.write(json.dumps(header)[:-1] + (", " if header else "") + '"data": {\n')
            first = True
            for name, bodies in self._entries(readers):
                merged = self._entry(name, bodies)
                handle.write(("" if first else ",\n") + json.dumps(name) + ": " + json.dumps(merged))
                first = False
            handle.write("\n}}\n")
        return RankDump(self.group.out_dir, self.group.step, self.group.index, f"merged rank{self.group.index}")

    def _entries(self, readers):
        iterators = [reader.entries() for reader in readers]
        shards = self.group.shards
        while True:
            items = [next(iterator, None) for iterator in iterators]
            if all(item is None for item in items):
                return
            names = [item[0] if item else None for item in items]
            for shard, name in zip(shards[1:], names[1:]):
                if name != names[0]:
                    raise ShardError(f"{shard.dump_json}: entry {name!r} where {shards[0].dump_json} has "
                                     f"{names[0]!r}: the ranks of a tensor-parallel group must run the same cells "
                                     f"(ranks {self.group.ranks} of step {self.group.step})")
            yield names[0], [item[1] for item in items]

    def _entry(self, name: str, bodies: List[Dict[str, Any]]) -> Dict[str, Any]:
        parsed = parse_entry_name(name) or parse_parameters_grad_name(name)
        if parsed is None:
            return bodies[0]
        rule = self.rule_of(parsed.cell, parsed.cls)
        if rule != "none":
            self.notes.rules[parsed.cell] = rule
        context = (name, parsed.direction, rule)
        if parsed.direction not in (FORWARD, BACKWARD):  # parameters_grad: {weight name: [tensor]}
            return {key: self._node(context, f"grad.{key}", [b.get(key) for b in bodies]) for key in bodies[0]}
        out = {}
        for key, value in bodies[0].items():
            values = [b.get(key) for b in bodies]
            if key in ("input_args", "input"):
                out[key] = self._node(context, "input", values)
            elif key == "input_kwargs":
                out[key] = self._node(context, "kwarg", values)
            elif key == "output":
                out[key] = self._node(context, "output", values)
            elif key == PARAMETERS and isinstance(value, dict):
                out[key] = {k: self._node(context, f"param.{k}", [v.get(k) for v in values]) for k in value}
            else:
                out[key] = value
        return out

    def _node(self, context, slot: str, nodes: List[Any]) -> Any:
        first = nodes[0]
        if is_tensor(first):
            return self._tensor(context, slot, nodes)
        if isinstance(first, list):
            return [self._node(context, f"{slot}.{i}", [n[i] if isinstance(n, list) and i < len(n) else None
                                                        for n in nodes]) for i in range(len(first))]
        if isinstance(first, dict) and "type" not in first:
            return {k: self._node(context, f"{slot}.{k}", [n.get(k) if isinstance(n, dict) else None
                                                           for n in nodes]) for k in first}
        return first

    def _tensor(self, context, slot: str, records: List[Any]) -> Any:
        name, direction, rule = context
        if not all(is_tensor(r) for r in records):
            raise ShardError(f"{name} {slot}: a tensor on rank {self.group.ranks[0]} but not on every rank of "
                             f"{self.group.ranks}")
        shape = records[0].get("shape") or []
        how = plan(rule, direction, slot, len(shape))
        paths = [tensors.data_path(s.data_dir, r) for s, r in zip(self.group.shards, records)]
        if self.data_dir is not None and all(paths):
            return self._merge_arrays(context, slot, how, records, [tensors.load(p) for p in paths])
        return self._merge_stats(context, slot, how, records)

    # -- tensors ---------------------------------------------------------------------------
    def _merge_arrays(self, context, slot, how, records, arrays) -> Dict[str, Any]:
        name, _, rule = context
        if how in (SAME, PARTIAL):
            shapes = [list(a.shape) for a in arrays]
            if any(shape != shapes[0] for shape in shapes):
                raise ShardError(f"{name} {slot}: shard={rule} takes it as the same tensor on every rank (or partial "
                                 f"sums), but the ranks {self.group.ranks} hold shapes {shapes}; set the cell's rule "
                                 "in a mapping file (shard=column|row|vocab|split|none)")
            differ = [rank for rank, a in zip(self.group.ranks[1:], arrays[1:]) if not _equal(arrays[0], a)]
            merged = arrays[0]
            if how == SAME and differ:
                self._disagree(name, slot, rule, differ)
            elif differ:  # partial sums: add them
                merged = np.sum(np.stack(arrays).astype(np.float64), axis=0).astype(arrays[0].dtype)
        else:
            merged = np.concatenate(arrays, axis=self._axis(name, slot, rule, how, [list(a.shape) for a in arrays]))
        record = dict(records[0])
        data_name = fsutil.check_component(str(record["data_name"]))
        if not data_name.endswith(".npy"):  # a PyTorch dump's .pt: the merged tensor is written as .npy
            data_name = os.path.splitext(data_name)[0] + ".npy"
        np.save(os.path.join(self.data_dir, data_name), merged, allow_pickle=False)
        record["data_name"] = data_name
        wanted = [_STAT_NAMES[key] for key in record if key in _STAT_NAMES]
        record.update(compute_statistics(merged, wanted), shape=list(merged.shape))
        return record

    def _axis(self, name: str, slot: str, rule: str, axis: int, shapes: List[list]) -> int:
        ndim = len(shapes[0])
        resolved = axis if axis >= 0 else ndim + axis
        problem = ndim == 0 or resolved >= ndim or any(
            len(s) != ndim or [d for i, d in enumerate(s) if i != resolved] !=
            [d for i, d in enumerate(shapes[0]) if i != resolved] for s in shapes)
        if problem:
            raise ShardError(f"{name} {slot}: shard={rule} joins the ranks' parts along axis {axis}, but their shapes "
                             f"{shapes} (ranks {self.group.ranks}) do not fit together that way; set the cell's rule "
                             "in a mapping file (shard=column|row|vocab|split|none)")
        return resolved

    # -- statistics only ---------------------------------------------------------------------
    def _merge_stats(self, context, slot, how, records) -> Any:
        name, _, rule = context
        keys = ("Max", "Min", "Mean", "Norm", "md5")
        differ = [rank for rank, r in zip(self.group.ranks[1:], records[1:])
                  if [r.get(k) for k in keys] != [records[0].get(k) for k in keys]]
        if how in (SAME, PARTIAL) and not differ:
            return records[0]
        if how == SAME:
            self._disagree(name, slot, rule, differ)
            return records[0]
        if how == PARTIAL:  # left out (None keeps the positions of the other tensors)
            self.notes.dropped.append(f"{name} {slot}")
            return None
        axis = self._axis(name, slot, rule, how, [list(r.get("shape") or []) for r in records])
        return _joined_stats(records, axis)

    def _disagree(self, name: str, slot: str, rule: str, ranks: List[int]) -> None:
        self.notes.disagreements.append({"step": self.group.step, "entry": name, "slot": slot, "rule": rule,
                                         "ranks": ranks, "reference": self.group.ranks[0],
                                         "group": self.group.ranks})


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def _joined_stats(records: List[Dict[str, Any]], axis: int) -> Dict[str, Any]:
    """Statistics of the concatenation, from each part's: exact for Max, Min, Mean, Norm; md5 cannot be."""
    out = {k: v for k, v in records[0].items() if k not in ("md5",)}
    shape = list(records[0]["shape"])
    shape[axis] = sum(r["shape"][axis] for r in records)
    out["shape"] = shape
    sizes = [math.prod(r["shape"]) for r in records]
    if all(r.get("Max") is not None for r in records):
        out["Max"] = max(r["Max"] for r in records)
    if all(r.get("Min") is not None for r in records):
        out["Min"] = min(r["Min"] for r in records)
    if all(r.get("Mean") is not None for r in records) and sum(sizes):
        out["Mean"] = sum(r["Mean"] * n for r, n in zip(records, sizes)) / sum(sizes)
    if all(r.get("Norm") is not None for r in records):
        out["Norm"] = math.sqrt(sum(r["Norm"] ** 2 for r in records))
    for key in ("nan_count", "inf_count"):
        if all(isinstance(r.get(key), int) for r in records):
            out[key] = sum(r[key] for r in records)
    return out
