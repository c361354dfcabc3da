"""Infer a tensor-parallel cell's shard rule from its own ranks' tensors, when no rule names it.

Only a tensor dump can show a layout: for each cell without a rule (neither in the mapping
file nor a class default), the first call's forward and backward entries and its weights are
read on every rank of the group, beside the shapes the unsharded side records for the same
cell, and each rule of ``SHARDS`` is tried in order (``none`` first). A rule fits when every
tensor is what it says:

* *same*: every rank holds the same values (within rounding of the tensor's dtype);
* *joined on an axis*: the parts fit together along it and give the other side's shape;
* *partial*: every rank holds the other side's shape and the parts differ; a replicated output
  whose inputs sum to it marks those inputs partial (``reduce``), and so does each rank's part
  of a reduce-scattered output (``reduce_scatter``).

The first rule that fits is used and reported (``inferred``); a cell that no rule fits keeps
``none`` and the merge reports what differs, as before. A rule in the mapping file always wins.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

from mf_celldump.analysis.compare import tensors
from mf_celldump.analysis.compare.shard_merge import PARTIAL, SAME, Group, plan
from mf_celldump.dtypes import canonical_dtype
from mf_celldump.layout.naming import BACKWARD, FORWARD, parse_entry_name
from mf_celldump.layout.reader import DumpJson
from mf_celldump.layout.slots import tensor_slots, weight_records

logger = logging.getLogger(__name__)

# Rounding allowed between copies of one value, in units of the dtype's epsilon times the tensor's largest
# magnitude: an all-reduce adds the parts in its own order.
_EPSILON = {"float64": 2.2e-16, "float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.8e-3}
_ROUNDING_UNITS = 64

# Tried in this order; the first that fits wins (``none`` first: a replicated cell fits nothing else).
ORDER = ("none", "column", "row", "vocab", "split", "reduce", "gather", "scatter", "reduce_scatter", "copy")

Shapes = Dict[Tuple[str, str], Dict[str, List[int]]]  # (cell, direction) of the first call -> slot -> shape
BaseName = Callable[[str], str]  # our cell name -> the other side's


@dataclass
class Inference:
    """What inference found for one side: cell -> rule, and the cells no rule fits."""

    rules: Dict[str, str] = field(default_factory=dict)
    unresolved: List[str] = field(default_factory=list)
    note: str = ""  # why nothing could be inferred (a statistics dump)


def other_shapes(entries: Iterable[Tuple[str, Dict[str, Any]]]) -> Shapes:
    """The shapes of every tensor of each cell's first forward and backward call on the unsharded side."""
    out: Shapes = {}
    for name, body in entries:
        parsed = parse_entry_name(name)
        if parsed is None or (parsed.cell, parsed.direction) in out:
            continue
        slots = {slot: record.get("shape") for slot, record in tensor_slots(parsed.direction, body)}
        if parsed.direction == FORWARD:
            slots.update({f"param.{k}": r.get("shape") for k, r in weight_records(body).items()})
        out[(parsed.cell, parsed.direction)] = slots
    return out


def infer_rules(group: Group, cells: Dict[str, str], shapes: Shapes, base_name: BaseName) -> Inference:
    """Rules for ``cells`` (cell -> class), from the first call of each on every rank of ``group``."""
    found = Inference()
    calls = _first_calls(group, set(cells))
    for cell in cells:
        entries = calls.get(cell, {})
        if FORWARD not in entries:
            continue
        other = {d: shapes.get((base_name(cell), d), {}) for d in (FORWARD, BACKWARD)}
        rule = next((r for r in ORDER if _fits(group, r, entries, other)), None)
        if rule is None:
            found.unresolved.append(cell)
        elif rule != "none":
            found.rules[cell] = rule
    return found


def _first_calls(group: Group, wanted: set) -> Dict[str, Dict[str, List[Dict[str, Any]]]]:
    """cell -> direction -> the bodies of its first call on every rank (the ranks run the same entries)."""
    out: Dict[str, Dict[str, List[Dict[str, Any]]]] = {}
    readers = [DumpJson(shard.dump_json).entries() for shard in group.shards]
    for items in zip(*readers):
        parsed = parse_entry_name(items[0][0])
        if parsed is None or parsed.cell not in wanted or parsed.direction in out.get(parsed.cell, {}):
            continue
        out.setdefault(parsed.cell, {})[parsed.direction] = [body for _, body in items]
    return out


def _fits(group: Group, rule: str, entries: Dict[str, List[Dict[str, Any]]], other: Dict[str, Dict]) -> bool:
    try:
        for direction, bodies in entries.items():
            slots = list(tensor_slots(direction, bodies[0]))
            if direction == FORWARD:
                slots += [(f"param.{k}", r) for k, r in weight_records(bodies[0]).items()]
            arrays: Dict[str, List[np.ndarray]] = {}
            dtype = "float32"
            for slot, record in slots:
                parts = _arrays(group, bodies, direction, slot)
                if parts is None:
                    return False
                arrays[slot] = parts
                dtype = canonical_dtype(record.get("dtype"))
                how = plan(rule, direction, slot, len(record.get("shape") or []))
                if not _tensor_fits(how, parts, other[direction].get(slot), dtype):
                    return False
            if direction == FORWARD and not _sums_fit(rule, arrays, dtype):
                return False
        return True
    except (tensors.TensorFileError, ValueError):
        return False


def _arrays(group: Group, bodies: List[Dict[str, Any]], direction: str, slot: str) -> Optional[List[np.ndarray]]:
    records = []
    for body in bodies:
        if slot.startswith("param."):
            record = weight_records(body).get(slot[len("param."):])
        else:
            record = dict(tensor_slots(direction, body)).get(slot)
        if record is None:
            return None
        records.append(record)
    paths = [tensors.data_path(s.data_dir, r) for s, r in zip(group.shards, records)]
    if not all(paths):
        return None
    return [np.asarray(tensors.load(p), dtype=np.float64) for p in paths]


def _close(a: np.ndarray, b: np.ndarray, dtype: str) -> bool:
    if a.shape != b.shape:
        return False
    scale = max(float(np.max(np.abs(a))) if a.size else 0.0, float(np.max(np.abs(b))) if b.size else 0.0)
    tolerance = _ROUNDING_UNITS * _EPSILON.get(dtype, 0.0) * scale
    return bool(np.all(np.abs(a - b) <= tolerance))


def _tensor_fits(how, parts: List[np.ndarray], other: Optional[List[int]], dtype: str) -> bool:
    if how == SAME:
        return all(_close(parts[0], p, dtype) for p in parts[1:]) and (other is None or list(parts[0].shape) == other)
    if how == PARTIAL:
        same_shape = all(p.shape == parts[0].shape for p in parts)
        differ = not all(_close(parts[0], p, dtype) for p in parts[1:])
        return same_shape and differ and other is not None and list(parts[0].shape) == other
    if other is None:
        return False
    ndim = parts[0].ndim
    axis = how if how >= 0 else ndim + how
    if not 0 <= axis < ndim or any(p.ndim != ndim for p in parts):
        return False
    joined = list(parts[0].shape)
    joined[axis] = sum(p.shape[axis] for p in parts)
    rest = [[d for i, d in enumerate(p.shape) if i != axis] for p in parts]
    return joined == list(other) and all(r == rest[0] for r in rest)


def _sums_fit(rule: str, arrays: Dict[str, List[np.ndarray]], dtype: str) -> bool:
    """A reduction's inputs must add up to its output: replicated (``reduce``) or split on axis 0
    (``reduce_scatter``); other rules have nothing to check here."""
    if rule not in ("reduce", "reduce_scatter"):
        return True
    inputs, outputs = arrays.get("input.0"), arrays.get("output.0")
    if inputs is None or outputs is None:
        return False
    total = np.sum(np.stack(inputs), axis=0)
    whole = outputs[0] if rule == "reduce" else np.concatenate(outputs, axis=0)
    if total.shape != whole.shape:
        return False
    scale = max(float(np.max(np.abs(total))) if total.size else 0.0, math.ulp(1.0))
    return bool(np.all(np.abs(total - whole) <= _ROUNDING_UNITS * _EPSILON.get(dtype, _EPSILON["float32"]) * scale))
