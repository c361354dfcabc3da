"""The verdict ``msprobe compare`` (26.2) would write in its ``Result`` column, beside ours.

Read from msprobe/core/compare/indicator_analysis/ (algorithm.py, calculator.py) and
written here in our own terms. msprobe judges the rows of one entry together: every row
starts ``pass``; a rule may raise a row to ``warning`` or ``error`` (the worse one stays).
The rows of an entry split into "inputs" (everything but outputs: inputs, keyword inputs,
weights) and "outputs" (``.output.`` in the name). Rules by dump mode:

* every mode but md5: a row whose target Max or Min is NaN/Inf while the baseline's are
  finite is ``error``; a row whose dtype text or shape differs from the baseline's is
  ``error`` (msprobe compares the recorded spellings: ``Float32`` against
  ``torch.float32`` and [b, s, h] against [s, b, h] are errors there; a baseline named
  ``qkv``/``gate_up`` skips the dtype rule); differing ``requires_grad`` (both recorded)
  is ``error``;
* tensor mode: when the smallest one-thousandth ratio of the inputs is above 0.9 and that
  of the outputs below 0.1, the first output is ``error``; when the smallest input cosine
  is above 0.9 and exceeds the smallest output cosine by more than 0.1, the first output
  is ``warning``;
* statistics mode, with ``NormRelativeErr`` = |Norm diff / baseline Norm|: when the
  largest of the inputs is below 0.1, each output above 0.5 is ``error``; when the
  inputs' largest is 0 and the outputs' above 0.1, or the outputs' is more than 10 times
  the inputs', the first output is ``warning``;
* md5 mode (statistics dumps whose records carry ``md5``): differing CRC-32 is ``error``, a
  side without one ``warning``.

Missing values are skipped as msprobe skips them (smallest ratio or cosine defaults to 1,
largest relative error to 0). Only the rows we compared are judged.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

PASS, WARNING, ERROR = "pass", "warning", "error"
_LEVEL = {PASS: 0, WARNING: 1, ERROR: 2}
TENSOR_MODE, STATISTICS_MODE, MD5_MODE = "tensor", "statistics", "md5"


def dump_mode(target_task: str, baseline_task: str) -> str:
    """msprobe's mode for a pair of dumps: tensor when both are; statistics otherwise (msprobe refuses a
    mixed pair; we judge it by the statistics rules). Statistics records carrying ``md5`` on both sides
    are judged in md5 mode (msprobe's md5 mode is a statistics dump with CRC-32s)."""
    tasks = {str(target_task).lower(), str(baseline_task).lower()}
    return TENSOR_MODE if tasks == {"tensor"} else STATISTICS_MODE


def judge_entry(rows: List[Dict[str, Any]], mode: str) -> None:
    """Set ``msprobe_result`` and ``msprobe_message`` on the compared rows of one entry."""
    judged = [r for r in rows if r.get("status") in ("ok", "diverged")]
    if not judged:
        return
    for row in judged:
        row["msprobe_result"], row["_messages"] = PASS, []
    if mode == STATISTICS_MODE and all(r.get("target_md5") and r.get("baseline_md5") for r in judged):
        mode = MD5_MODE
    inputs = [r for r in judged if not str(r.get("slot", "")).startswith("output")]
    outputs = [r for r in judged if str(r.get("slot", "")).startswith("output")]
    if mode == MD5_MODE:
        _crc_rule(judged)
    else:
        _row_rules(judged)
        if mode == TENSOR_MODE:
            _tensor_rules(inputs, outputs)
        else:
            _statistics_rules(inputs, outputs)
    for row in judged:
        row["msprobe_message"] = "; ".join(row.pop("_messages"))


def _raise(row: Dict[str, Any], level: str, message: str) -> None:
    if _LEVEL[level] > _LEVEL[row["msprobe_result"]]:
        row["msprobe_result"] = level
    row["_messages"].append(message)


def _row_rules(rows: List[Dict[str, Any]]) -> None:
    for row in rows:
        if not _nonfinite(row, "baseline") and _nonfinite(row, "target"):
            _raise(row, ERROR, "NaN/Inf in the target's Max or Min")
        base_name = str(row.get("baseline_entry") or "")
        raw_dtypes = row.get("raw_dtype"), row.get("raw_baseline_dtype")
        if all(raw_dtypes) and raw_dtypes[0] != raw_dtypes[1] and not ("qkv" in base_name or "gate_up" in base_name):
            _raise(row, ERROR, "dtype differs")
        shapes = row.get("shape"), row.get("baseline_shape")
        if None not in shapes and str(shapes[0]) != str(shapes[1]):
            _raise(row, ERROR, "shape differs")
        grads = row.get("requires_grad"), row.get("baseline_requires_grad")
        if all(g is not None for g in grads) and grads[0] != grads[1]:
            _raise(row, ERROR, "requires_grad differs")


def _nonfinite(row: Dict[str, Any], side: str) -> bool:
    values = (row.get(f"{side}_max"), row.get(f"{side}_min"))
    return any(isinstance(v, float) and not math.isfinite(v) for v in values)


def _smallest(rows, key: str) -> float:
    values = [_finite(r.get(key)) for r in rows]
    return min([v for v in values if v is not None], default=1.0)


def _largest_abs(rows, key: str) -> float:
    values = [_finite(r.get(key)) for r in rows]
    return max([abs(v) for v in values if v is not None], default=0.0)


def _finite(value) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _tensor_rules(inputs, outputs) -> None:
    if not outputs:
        return
    if _smallest(inputs, "one_thousandth_ratio") > 0.9 and _smallest(outputs, "one_thousandth_ratio") < 0.1:
        _raise(outputs[0], ERROR, "inputs' one-thousandth ratio > 0.9, output's < 0.1")
    cos_in, cos_out = _smallest(inputs, "cosine"), _smallest(outputs, "cosine")
    if cos_in > 0.9 and cos_in - cos_out > 0.1:
        _raise(outputs[0], WARNING, "inputs' cosine > 0.9 and more than 0.1 above the output's")


def norm_relative(row: Dict[str, Any]) -> Optional[float]:
    """msprobe's NormRelativeErr as a fraction; inf for a zero baseline Norm that differs."""
    ours, theirs = row.get("target_norm"), row.get("baseline_norm")
    if ours is None or theirs is None or not (math.isfinite(ours) and math.isfinite(theirs)):
        return None
    if ours == theirs:
        return 0.0
    return math.inf if theirs == 0 else abs((ours - theirs) / theirs)


def _statistics_rules(inputs, outputs) -> None:
    for row in inputs + outputs:
        row["_norm_rel"] = norm_relative(row)
    most_in = _largest_abs(inputs, "_norm_rel")
    if most_in < 0.1:
        for row in outputs:
            value = row.get("_norm_rel")
            if value is not None and value > 0.5:
                _raise(row, ERROR, "output's Norm relative error > 0.5 while the inputs' < 0.1")
    most_out = _largest_abs(outputs, "_norm_rel")
    if outputs and ((most_in == 0 and most_out > 0.1) or (most_in and most_out / most_in > 10)):
        _raise(outputs[0], WARNING, "output's Norm relative error more than 10 times the inputs'")
    for row in inputs + outputs:
        row.pop("_norm_rel", None)


def _crc_rule(rows) -> None:
    for row in rows:
        ours, theirs = row.get("target_md5"), row.get("baseline_md5")
        if not ours or not theirs:
            _raise(row, WARNING, "a side has no CRC-32")
        elif ours != theirs:
            _raise(row, ERROR, "CRC-32 differs")
