"""Per-dtype thresholds of a verdict, and the ``--threshold [DTYPE.]KEY=VALUE`` overrides.

A pair is held to the looser thresholds of its two dtypes (a bf16 run against an fp32
baseline is judged as bf16). Integers and bools must match exactly. Overrides are checked
here, so a value that would silently change every verdict (``cosine=nan`` passes
everything, ``cosine=2`` fails everything, a negative error) is refused with the range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Dict, Mapping, Optional

from mf_celldump.dtypes import canonical_dtype


@dataclass(frozen=True)
class Thresholds:
    cosine: float  # at least
    rel_err: float  # at most
    stat_rel: float  # at most
    # A pair whose largest absolute difference is at most this is within, whatever its cosine and relative
    # errors: rounding noise of a value that is zero in exact arithmetic (a key bias's gradient, summed in
    # another order by tensor-parallel ranks) has no meaningful direction. None (the default): each pair's own
    # noise bound (``noise``); a number given by hand replaces it (0: off).
    abs_err: Optional[float] = None


EXACT = "exact"
# Starting points: fp32 runs of the same function agree to ~1e-6; half precisions to their epsilon.
DEFAULT_THRESHOLDS: Dict[str, Thresholds] = {
    "float64": Thresholds(0.99999, 1e-4, 1e-4),
    "float32": Thresholds(0.99999, 1e-3, 1e-3),
    "float16": Thresholds(0.999, 1e-2, 5e-3),
    "bfloat16": Thresholds(0.995, 3e-2, 2e-2),
    EXACT: Thresholds(1.0, 0.0, 0.0),
}
THRESHOLD_KEYS = ("cosine", "rel_err", "stat_rel", "abs_err")
_PRECISION_ORDER = (EXACT, "float64", "float32", "float16", "bfloat16")
# Names a user may give before the key: the float classes, and exact for integers and bools.
_INTEGER_NAMES = ("int", "uint", "bool", EXACT)



def threshold_class(dtype: str) -> str:
    if dtype in DEFAULT_THRESHOLDS:
        return dtype
    if dtype.startswith(("int", "uint", "bool")):
        return EXACT
    return "float32"


def thresholds_for(target_dtype: str, baseline_dtype: str, table: Mapping[str, Thresholds]) -> Thresholds:
    """The looser thresholds of the two sides' dtypes (a bf16 run against fp32 is held to bf16)."""
    classes = [threshold_class(canonical_dtype(d)) for d in (target_dtype, baseline_dtype) if d]
    loosest = max(classes or ["float32"], key=_PRECISION_ORDER.index)
    return table[loosest]


def override(table: Mapping[str, Thresholds], spec: str) -> Dict[str, Thresholds]:
    """Apply ``[dtype.]key=value``; raises ValueError naming the option and what is valid."""
    key, sep, value = spec.partition("=")
    dtype, dot, name = key.strip().rpartition(".")
    if not sep or name not in THRESHOLD_KEYS:
        raise ValueError(
            f"--threshold {spec!r}: expected [dtype.]KEY=VALUE with KEY one of {', '.join(THRESHOLD_KEYS)}"
        )
    number = _number(spec, name, value)
    result = dict(table)
    for item in _dtype_classes(spec, dtype) if dot else list(table):
        result[item] = replace(result[item], **{name: number})
    return result


def _number(spec: str, name: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"--threshold {spec!r}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"--threshold {spec!r}: give a finite number")
    if name == "cosine" and not 0.0 <= number <= 1.0:
        raise ValueError(f"--threshold {spec!r}: cosine is a similarity between 0 and 1 (e.g. 0.9999)")
    if name != "cosine" and number < 0:
        raise ValueError(f"--threshold {spec!r}: {name} is an error, 0 or more (e.g. 1e-3)")
    return number


def _dtype_classes(spec: str, dtype: str):
    text = canonical_dtype(dtype)
    if text in DEFAULT_THRESHOLDS:
        return [text]
    if text.startswith(_INTEGER_NAMES):
        return [EXACT]
    known = ", ".join([name for name in DEFAULT_THRESHOLDS if name != EXACT] + ["int/bool (exact)"])
    raise ValueError(f"--threshold {spec!r}: unknown dtype {dtype!r}; known: {known}")
