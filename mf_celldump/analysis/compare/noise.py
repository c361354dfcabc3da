"""The rounding noise a pair may carry, from its dtype and the computation that produced it: one formula.

Two runs of the same computation that add in another order (tensor-parallel ranks, graph
against PyNative kernels, another batch split) differ by rounding. A sum of ``K`` terms of
magnitude ``M`` computed in a precision of unit roundoff ``u`` is off by about
``u * sqrt(K) * M`` (the rounding errors of its additions add up like a random walk), and
each step of the path from the inputs adds its own. Half precisions round each result once
and accumulate in float32 at least. So a slot's noise bound is

    bound = SAFETY * sqrt(D) * (u + u_acc * sqrt(K)) * M

* ``u``: the unit roundoff of the less precise dtype of the two sides (float64 2**-53,
  float32 2**-24, float16 2**-11, bfloat16 2**-8; integers are compared exactly), and of a
  dtype one side has computed in so far and the other has not (a float32 value computed from
  a float16 one carries float16's rounding); ``u_acc`` = min(u, 2**-24):
  accumulation is never coarser than float32;
* ``K``: the length of the reductions that produced the slot's value, from the cell's own
  shapes (:func:`cell_reductions`): 1 for a lookup, a copy or an elementwise cell; a matmul's
  inner dimension (its input gradient: the outer one; its weight gradient: the tokens); a
  norm's normalised dimension. A composite cell (one that holds others) composes from its
  children: ``sqrt(K)`` is the sum of ``sqrt(K)`` over the leaf cells inside it (every path
  through it is among them, so the longest is covered). A value a cell received (a forward
  input, the gradient of a backward entry's output) keeps the bound of the cell that produced
  it, found by its statistics among the outputs seen before (:class:`Tracker`);
* ``M``: the magnitude of what was added: the largest root mean square (Norm / sqrt(elements))
  of what the slot adds up and of the slot itself on either side: a matmul's partial sums
  (the RMS of its weights times its input's times sqrt(K), forward and backward alike), a
  norm's weights (times the gradient it receives, backward), else the largest RMS of what
  the entry computes from (its floating inputs and weights; backward, the gradients it
  receives and the cell's weights); a weight or a received value: itself, or its producer's.
  Integer and bool tensors (token ids, masks) and additive attention masks (largest value 0,
  smallest -1e3 or below: softmax makes zeros of them) never set it. A value zero in exact arithmetic
  (the gradient of a key projection's bias: softmax ignores a constant added to a row of
  scores) holds only the noise of the terms that cancelled, whose size is its siblings', so a
  weight gradient's ``M`` is the largest of its entry's;
* ``D``: the depth of the path: the number of steps from one depth group (``model.layers.N``,
  or a cell of its own) to another in the execution order up to this entry, forward then
  backward, plus one;
* ``SAFETY`` = 4: four standard deviations of the random walk.

A pair whose largest absolute difference (of elements, or of statistics) is within its bound
is within thresholds whatever its cosine and relative error: the difference is rounding
noise. Above it, the relative thresholds of its dtype decide. ``--threshold abs_err=X`` gives
the floor by hand instead (0 turns it off).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from mf_celldump.dtypes import canonical_dtype
from mf_celldump.layout.naming import BACKWARD, FORWARD, PARAMETERS_GRAD
from mf_celldump.layout.slots import tensor_slots, weight_records
from mf_celldump.layout.stat_records import STATS, number, whole_shape

SAFETY = 4.0
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
ACCUMULATION = UNIT_ROUNDOFF["float32"]
# What load time leaves in an entry body for pairing (the store keeps bodies as they are given): the links of
# its received values to their producers and the floating dtypes its side has computed in so far.
CONTEXT_KEY = "mf_celldump_noise"
MASK_FILL = -1e3
RECENT_OUTPUTS = 4096  # outputs remembered for linking (a value is received soon after it is produced)


def unit_roundoff(*dtypes: Optional[str]) -> float:
    """The coarsest unit roundoff of the floating dtypes given (float32's when none is known)."""
    found = [UNIT_ROUNDOFF[canonical_dtype(d)] for d in dtypes if canonical_dtype(d) in UNIT_ROUNDOFF]
    return max(found, default=UNIT_ROUNDOFF["float32"])


def floating(record: Optional[Dict[str, Any]]) -> bool:
    return bool(record) and canonical_dtype(record.get("dtype")) in UNIT_ROUNDOFF


def elements(record: Dict[str, Any]) -> int:
    shape = whole_shape(record)
    return math.prod(shape) if shape else 1


def additive_mask(record: Dict[str, Any]) -> bool:
    """The -10000 (or dtype minimum) fill MindFormers and Megatron add to masked attention scores: largest
    value 0, smallest at most ``MASK_FILL``. Softmax turns it into zeros: it adds nothing to a sum."""
    top, bottom = number(record.get("Max")), number(record.get("Min"))
    return top == 0.0 and bottom is not None and bottom <= MASK_FILL


def magnitude(record: Optional[Dict[str, Any]]) -> float:
    """A record's RMS as a term of what its consumers add: none for integers, bools and additive masks."""
    return 0.0 if not record or additive_mask(record) else rms(record)


def rms(record: Optional[Dict[str, Any]]) -> float:
    """Norm / sqrt(elements) of a floating record; 0 for integers, bools and records without a Norm."""
    if not floating(record):
        return 0.0
    norm, count = number(record.get("Norm")), elements(record)
    return norm / math.sqrt(count) if norm is not None and math.isfinite(norm) and count else 0.0


@dataclass(frozen=True)
class Scale:
    """What the bound needs of a slot: its reduction length ``K`` and magnitude ``M``."""

    reduction: float = 1.0
    magnitude: float = 0.0


@dataclass(frozen=True)
class Reductions:
    """The reduction lengths of one cell, read from the shapes of its first forward call."""

    forward: float = 1.0  # K of its outputs
    backward: float = 1.0  # K of the gradients w.r.t. its inputs
    tokens: float = 1.0  # K of its weights' gradients (a sum over the tokens)
    weights: float = 0.0  # the largest RMS of its weights (M of its input gradients)
    kind: str = "elementwise"


def _shapes(records: Iterable[Dict[str, Any]]) -> List[List[int]]:
    return [whole_shape(r) or [] for r in records if floating(r)]


def cell_reductions(cls: str, body: Dict[str, Any]) -> Reductions:
    """A leaf cell's kind and reductions, from its own forward record's shapes (class names only tell
    attention apart from an elementwise cell: both keep their input's shape)."""
    weights = [r for r in weight_records(body).values() if floating(r)]
    records = [(slot, r) for slot, r in tensor_slots(FORWARD, body)]
    inputs = [r for slot, r in records if not slot.startswith("output")]
    outputs = _shapes(r for slot, r in records if slot.startswith("output"))
    x = _shapes(inputs)
    top = max((magnitude(w) for w in weights), default=0.0)
    out_last = max((s[-1] for s in outputs if s), default=1)
    if weights:
        return _weighted(weights, inputs, x, out_last, top)
    if "attention" in cls.lower() and x and len(x[0]) >= 2:
        seq, head = max(x[0][:-1]), x[0][-1]
        k = (math.sqrt(seq) + math.sqrt(head)) ** 2  # scores over the head dim, then their sum over the sequence
        return Reductions(k, k, 1.0, 0.0, "attention")
    largest_in = max((math.prod(s) for s in x), default=1)
    largest_out = max((math.prod(s) for s in outputs), default=1)
    if outputs and largest_out < largest_in and not any(s in x for s in outputs):
        k = largest_in / max(largest_out, 1)  # a reduction to a smaller tensor (a loss, a mean)
        return Reductions(k, 1.0, 1.0, 0.0, "reduction")
    return Reductions(kind="elementwise")


def _weighted(weights, inputs, x, out_last: int, top: float) -> Reductions:
    matrices = [whole_shape(w) or [] for w in weights if len(whole_shape(w) or []) >= 2]
    if matrices and not x and any(not floating(r) for r in inputs):
        ids = max((elements(r) for r in inputs if not floating(r)), default=1)
        return Reductions(1.0, 1.0, float(ids), top, "lookup")  # rows copied; their gradient summed per id
    if matrices:
        last = x[0][-1] if x and x[0] else 1
        inner = next((last for m in matrices if last in m), max(m[-1] for m in matrices))
        tokens = max(math.prod(x[0]) // max(last, 1), 1) if x and x[0] else 1
        return Reductions(float(inner), float(max(out_last, 1)), float(tokens), top, "matmul")
    last = x[0][-1] if x and x[0] else 1
    tokens = max(math.prod(x[0]) // max(last, 1), 1) if x and x[0] else 1
    return Reductions(float(last), float(last), float(tokens), top, "norm")


def compose(cells: Dict[str, Reductions]) -> Dict[str, Reductions]:
    """Each cell's reductions with the composite cells' composed from the leaves inside them:
    sqrt(K) of a composite is the sum of its leaves' sqrt(K) (its own, if it computes, added)."""
    ancestors = {name: [a for a in _prefixes(name) if a in cells] for name in cells}
    parents = {a for found in ancestors.values() for a in found}
    sums = {name: [0.0, 0.0] for name in parents}
    for name, found in ancestors.items():
        if name in parents:
            continue
        for parent in found:
            sums[parent][0] += math.sqrt(cells[name].forward)
            sums[parent][1] += math.sqrt(cells[name].backward)
    out = dict(cells)
    for name, (fwd, bwd) in sums.items():
        own = cells[name]
        if own.kind != "elementwise":
            fwd, bwd = fwd + math.sqrt(own.forward), bwd + math.sqrt(own.backward)
        out[name] = Reductions(fwd * fwd, bwd * bwd, own.tokens, own.weights, "composite")
    return out


def _prefixes(name: str) -> List[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _fingerprint(direction: str, record: Dict[str, Any]) -> Optional[Tuple[Any, ...]]:
    if not floating(record) or elements(record) < 2:
        return None
    stats = tuple(number(record.get(k)) for k in STATS)
    if None in stats:
        return None
    return (direction, canonical_dtype(record.get("dtype")), tuple(whole_shape(record) or ())) + stats


@dataclass
class Tracker:
    """Load-time state of one side's entry stream: the cells' reductions, the producers of the outputs
    seen lately (to link a received value to them) and the floating dtypes computed in so far."""

    cells: Dict[str, Reductions] = field(default_factory=dict)
    recent: OrderedDict[Tuple[Any, ...], list] = field(default_factory=OrderedDict)
    dtypes: set = field(default_factory=set)

    def see(self, cell: str, cls: str, direction: str, ordinal: int, depth: int, body: Dict[str, Any]) -> None:
        """Note what ``body`` tells and leave its context (links, dtypes so far) in it."""
        if not isinstance(body, dict):
            return
        if direction == FORWARD and ordinal == 0 and cell not in self.cells:
            self.cells[cell] = cell_reductions(cls, body)
        if direction in (FORWARD, BACKWARD):
            links = self._link(cell, direction, depth, body)
            if links:
                body.setdefault(CONTEXT_KEY, {})["links"] = links
        self.note_dtype(direction, body)

    def note_dtype(self, direction: str, body: Dict[str, Any]) -> None:
        """Leave in ``body`` the floating dtypes its side has computed in up to it."""
        if not isinstance(body, dict):
            return
        for _, record in (tensor_slots(direction, body) if direction != PARAMETERS_GRAD else ()):
            if floating(record):
                self.dtypes.add(canonical_dtype(record.get("dtype")))
        if self.dtypes:
            body.setdefault(CONTEXT_KEY, {})["dtypes"] = sorted(self.dtypes)

    def _link(self, cell: str, direction: str, depth: int, body: Dict[str, Any]) -> Dict[str, list]:
        links, deps = {}, dependencies(direction, body, self.cells.get(cell))
        for slot, record in tensor_slots(direction, body):
            key = _fingerprint(direction, record)
            if key is None:
                continue
            if not slot.startswith("output"):
                if key in self.recent:
                    links[slot] = self.recent[key]
                continue
            known = self.recent.get(key)
            if known is None or not cell.startswith(known[0] + "."):  # the innermost producer wins
                self.recent[key] = [cell, direction, max(deps, rms(record)), depth]
                self.recent.move_to_end(key)
                if len(self.recent) > RECENT_OUTPUTS:
                    self.recent.popitem(last=False)
        return links

    def finish(self) -> Dict[str, Reductions]:
        return compose(self.cells)


def dependencies(direction: str, body: Dict[str, Any], cell: Optional[Reductions]) -> float:
    """The magnitude of what an entry's outputs add up: a matmul's partial sums (the RMS of its weights times
    its input's times sqrt(K): its output may cancel to far less), a norm's weights times what it receives,
    else the largest RMS of what it is computed from (its floating inputs and weights forward, the gradients it
    receives and the cell's weights backward)."""
    weights = cell.weights if cell is not None else 0.0
    if direction == FORWARD:
        weights = max([weights] + [magnitude(r) for r in weight_records(body).values()])
    received = max((magnitude(r) for slot, r in tensor_slots(direction, body) if not slot.startswith("output")),
                   default=0.0)
    kind = cell.kind if cell is not None else ""
    if kind == "matmul":
        return weights * received * math.sqrt(cell.forward if direction == FORWARD else cell.backward)
    if kind == "norm":
        return weights * (1.0 if direction == FORWARD else received)
    return max(weights, received)


def weight_grad_scale(body: Dict[str, Any], base_body: Optional[Dict[str, Any]], cell: Optional[Reductions]
                      ) -> Scale:
    """A weight gradient's: the tokens it sums over (the largest element count of the entry when the cell's
    forward call is unknown), and the largest RMS of its entry's gradients on either side."""
    records = list(weight_records(body, gradients=True).values())
    records += list(weight_records(base_body, gradients=True).values()) if base_body else []
    magnitude = max((rms(r) for r in records), default=0.0)
    if cell is not None:
        return Scale(cell.tokens, magnitude)
    return Scale(float(max((elements(r) for r in records if floating(r)), default=1)), magnitude)


def slot_scale(direction: str, slot: str, body: Dict[str, Any], record: Dict[str, Any],
               base_record: Optional[Dict[str, Any]], cell: Optional[Reductions],
               cells: Dict[str, Reductions], depth: int) -> Tuple[Scale, int]:
    """(the slot's scale, the depth its bound takes) for a forward or backward slot of a target entry."""
    own = max(rms(record), rms(base_record))
    if slot.startswith("param."):
        return Scale(1.0, own), depth
    link = (body.get(CONTEXT_KEY) or {}).get("links", {}).get(slot)
    if link is not None:
        producer, produced_in, magnitude, produced_at = link
        found = cells.get(producer)
        reduction = 1.0 if found is None else (found.forward if produced_in == FORWARD else found.backward)
        return Scale(reduction, max(magnitude, own)), produced_at
    if not slot.startswith("output"):
        return Scale(1.0, own), depth  # received from code between cells, or the data
    deps = max(dependencies(direction, body, cell), own)
    if cell is None:
        return Scale(1.0, deps), depth
    return Scale(cell.forward if direction == FORWARD else cell.backward, deps), depth


def narrowest(*bodies: Optional[Dict[str, Any]]) -> Tuple[Optional[str], ...]:
    """The floating dtypes one side has computed in up to these entries and the other has not (a dtype change
    upstream: values are then judged with the narrowest one's noise); () when they agree."""
    found = [set(((b or {}).get(CONTEXT_KEY) or {}).get("dtypes") or ()) for b in bodies]
    return tuple(sorted(set.union(*found) - set.intersection(*found))) if found else ()


def bound(dtypes: Tuple[Optional[str], ...], depth: int, scale: Scale) -> float:
    """The noise bound of the module docstring, in the slot's units (an absolute difference)."""
    u = unit_roundoff(*dtypes)
    accumulated = min(u, ACCUMULATION)
    return SAFETY * math.sqrt(max(depth, 1)) * (u + accumulated * math.sqrt(scale.reduction)) * scale.magnitude
