"""The rounding noise a pair may carry, from its dtype and the computation that produced it: one formula.

Two runs of the same computation that add in another order (tensor-parallel ranks, graph
against PyNative kernels, another batch split) differ by rounding. A sum of ``K`` terms of
magnitude ``M`` computed in a precision of unit roundoff ``u`` is off by about
``u * sqrt(K) * M`` (the rounding errors of its additions add up like a random walk), and
each step of the path from the inputs adds its own. Half precisions round each result once
and accumulate in float32 at least. So a pair's noise bound is

    bound = SAFETY * sqrt(D) * (u + u_acc * sqrt(K)) * M

* ``u``: the unit roundoff of the less precise dtype of the two sides (float64 2**-53,
  float32 2**-24, float16 2**-11, bfloat16 2**-8; integers are compared exactly);
  ``u_acc`` = min(u, 2**-24): accumulation is never coarser than float32;
* ``K``: the reduction length, bounded by the largest element count of a tensor of the
  entry (every value a reduction of the entry adds comes from one of them);
* ``M``: the magnitude of what was added: the largest root mean square (Norm / sqrt(elements))
  of the entry's tensors on either side. A value zero in exact arithmetic (the gradient of a
  key projection's bias: softmax ignores a constant added to a row of scores) holds only the
  noise of the terms that cancelled, whose size is the entry's, not its own;
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
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional, Tuple

from mf_celldump.dtypes import canonical_dtype
from mf_celldump.layout.slots import tensor_slots, weight_records
from mf_celldump.layout.stat_records import number, whole_shape

SAFETY = 4.0
UNIT_ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
ACCUMULATION = UNIT_ROUNDOFF["float32"]


def unit_roundoff(*dtypes: Optional[str]) -> float:
    """The coarsest unit roundoff of the floating dtypes given (float32's when none is known)."""
    found = [UNIT_ROUNDOFF[canonical_dtype(d)] for d in dtypes if canonical_dtype(d) in UNIT_ROUNDOFF]
    return max(found, default=UNIT_ROUNDOFF["float32"])


@dataclass(frozen=True)
class EntryScale:
    """What the bound needs of an entry: its reduction length ``K`` and magnitude ``M``."""

    reduction: int = 1
    magnitude: float = 0.0


def entry_scale(bodies: Iterable[Optional[Dict[str, Any]]], direction: str) -> EntryScale:
    """``K`` and ``M`` over every tensor record of the entry's bodies (ours and the baseline's)."""
    reduction, magnitude = 1, 0.0
    for body in bodies:
        if not body:
            continue
        for record in _records(body, direction):
            elements, rms = _elements_and_rms(record)
            reduction = max(reduction, elements)
            magnitude = max(magnitude, rms)
    return EntryScale(reduction, magnitude)


def _records(body: Dict[str, Any], direction: str):
    if direction == "parameters_grad":
        yield from weight_records(body, gradients=True).values()
        return
    for _, record in tensor_slots(direction, body, parameters=True):
        yield record


def _elements_and_rms(record: Dict[str, Any]) -> Tuple[int, float]:
    shape = whole_shape(record)
    if shape is None:
        return 1, 0.0
    elements = math.prod(shape) if shape else 1
    norm = number(record.get("Norm"))
    if norm is None or not math.isfinite(norm) or elements == 0:
        return elements, 0.0
    return elements, norm / math.sqrt(elements)


def bound(dtypes: Tuple[Optional[str], ...], depth: int, scale: EntryScale) -> float:
    """The noise bound of the module docstring, in the entry's units (an absolute difference)."""
    u = unit_roundoff(*dtypes)
    accumulated = min(u, ACCUMULATION)
    return SAFETY * math.sqrt(max(depth, 1)) * (u + accumulated * math.sqrt(scale.reduction)) * scale.magnitude
