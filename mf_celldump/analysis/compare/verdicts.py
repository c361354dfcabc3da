"""What differs, in the user's terms: a common factor, and weights that differ only after the optimizer.

* **A common factor.** Gradient clipping, a loss scale, or a sum taken where the baseline
  takes a mean multiply every weight gradient (or every gradient of the backward pass) by
  one number: cosine stays 1.0 and ``rel_err`` is the factor's distance from 1. Every pair
  carries the factor that best maps its baseline onto it and the error left after it
  (``metrics.PairMetrics.factor``/``factor_rel``). The differing pairs of a kind (weight
  gradients, or one direction of activations) share a common factor when each is within its
  thresholds once scaled (``factor_rel`` at most its ``rel_err`` or ``stat_rel``), every
  factor lies within that same tolerance of their median, at least two pairs differ, and
  no pair within thresholds that determines a factor of its own (``factor_rel`` within
  tolerance) contradicts it. That is a verdict of its own, neither clean nor a first
  divergence.
* **When weights differ.** Each kind's pairs are counted per step. Weights that agree at the
  earliest compared step and differ later differ only after the optimizer has run: on
  gradients that differ when an earlier step's gradients differ, else in the optimizer
  itself. When every compared value of the steps before (activations, weights, weight
  gradients) agrees, the update of the last of them differs (``update_of``): its inputs
  agree, so its settings, its state, the learning-rate schedule or the loss scale differ.
  That is said before anything the changed weights compute later.
* **Where the dtype changes.** The first pair, in execution order, whose two sides are
  floating tensors of different dtypes (one run computes in float16 or bfloat16): said
  before the values, which are judged with the narrower dtype's noise from there on.
* **What a statistics dump cannot decide.** A pair compared on statistics whose statistics
  differ, but by no more than their bound and thresholds, may hide elements that differ:
  those before the first divergence (all of them when there is none) are listed.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from mf_celldump.analysis.compare.pairing import ACTIVATION, WEIGHT, WEIGHT_GRAD
from mf_celldump.analysis.compare.store import Store
from mf_celldump.layout.naming import DIRECTIONS

CAUSES = "gradient clipping, a loss scale, or a sum taken for a mean"
_LABELS = {WEIGHT_GRAD: "weight gradients", WEIGHT: "weights"}


def label(kind: str, direction: Optional[str] = None) -> str:
    """``weight gradients``, ``weights``, ``backward activations``."""
    return _LABELS.get(kind) or f"{direction} activations"


def common_factor(store: Store, kind: str, direction: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The factor every differing pair of ``kind`` (and ``direction``) shares, or None (see the module)."""
    where, params = "kind = ?", (kind,)
    if direction is not None:
        where, params = where + " and direction = ?", (kind, direction)
    rows = store.query(f"select status, factor, factor_rel, factor_tol from pairs where {where} "
                       "and status != 'skipped'", params)
    diverged = [r[1:] for r in rows if r[0] == "diverged"]
    if len(diverged) < 2 or any(f is None or e is None or t is None or not e <= t for f, e, t in diverged):
        return None
    factors = sorted(f for f, _, _ in diverged)
    median = factors[len(factors) // 2]
    if median == 0.0 or any(abs(f - median) > t * abs(median) for f, _, t in diverged):
        return None
    agreeing = [r[1:] for r in rows if r[0] == "ok" and r[1] is not None and r[2] is not None and r[2] <= r[3]]
    if any(abs(f - median) > t * abs(median) for f, _, t in agreeing):
        return None  # a tensor that determines its own factor and does not share it: not one common factor
    return {"kind": kind, "direction": direction, "what": label(kind, direction), "factor": median,
            "differ": len(diverged), "compared": len(rows), "spread": [factors[0], factors[-1]]}


def common_factors(store: Store) -> List[Dict[str, Any]]:
    """Every kind (and activation direction) whose differing pairs share one factor."""
    found = [common_factor(store, ACTIVATION, direction) for direction in DIRECTIONS]
    found.append(common_factor(store, WEIGHT_GRAD))
    return [item for item in found if item is not None]


def factor_text(item: Dict[str, Any]) -> str:
    """``weight gradients differ by one factor 0.483 (gradient clipping, ...): 21 of 21 compared``."""
    return (f"{item['what']} differ by one factor {item['factor']:.3g} ({CAUSES}): {item['differ']} of "
            f"{item['compared']} compared")


def per_step(store: Store, kind: str) -> List[Dict[str, Any]]:
    """Per step (in order) the compared pairs of ``kind`` within thresholds and differing."""
    rows = store.query(
        "select step, coalesce(sum(status = 'ok'), 0), coalesce(sum(status = 'diverged'), 0) from pairs "
        "where kind = ? and status != 'skipped' group by step order by coalesce(step, -1)", (kind,))
    return [{"step": step, "ok": ok, "diverged": bad} for step, ok, bad in rows]


def steps_text(steps: List[Optional[int]]) -> str:
    """``step 0``, ``steps 1-2``, ``steps 1, 3``; a folder without a step number is ``the step``."""
    numbers = [s for s in steps if s is not None]
    if not numbers:
        return "the step"
    if len(numbers) == 1:
        return f"step {numbers[0]}"
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"steps {numbers[0]}-{numbers[-1]}"
    return "steps " + ", ".join(map(str, numbers))


def per_step_text(steps: List[Dict[str, Any]]) -> str:
    """``step 0: 0 of 21 differ; step 1: 17 of 21 differ``."""
    return "; ".join(f"{steps_text([s['step']])}: {s['diverged']} of {s['ok'] + s['diverged']} differ"
                     for s in steps) or "no step"


def weight_timing(store: Store) -> Dict[str, Any]:
    """When the weights differ: the steps, whether only after the optimizer, and on what gradients."""
    steps, grads = per_step(store, WEIGHT), per_step(store, WEIGHT_GRAD)
    differ = [s["step"] for s in steps if s["diverged"]]
    out = {"steps": steps, "grad_steps": grads, "differ": differ, "after_optimizer": False,
           "gradients_differ_before": False, "update_of": None}
    if differ:
        out["after_optimizer"] = len(steps) > 1 and steps[0]["diverged"] == 0
        first_bad = differ[0] if differ[0] is not None else -1
        out["gradients_differ_before"] = any(g["diverged"] for g in grads
                                             if g["step"] is not None and g["step"] < first_bad)
        if out["after_optimizer"] and differ[0] is not None:
            out["update_of"] = update_of(store, differ[0])
    return out


def update_of(store: Store, step: int) -> Optional[int]:
    """The last compared step before ``step`` (where weights first differ) when every value compared before
    ``step`` agrees: the update of that step differs. None otherwise."""
    before, bad = store.query(
        "select max(step), coalesce(sum(status = 'diverged'), 0) from pairs where step < ? and status != 'skipped'",
        (step,))[0]
    return before if before is not None and not bad else None


UNIT_ORDER = "coalesce(step, -1), rank, case direction when 'forward' then 0 else 1 end, pos"
UNDECIDED_SHOWN = 5


def dtype_change(store: Store) -> Optional[Dict[str, Any]]:
    """The first compared pair whose sides are floating tensors of different dtypes, with how many differ."""
    where = ("status != 'skipped' and dtype != baseline_dtype and dtype like '%float%' "
             "and baseline_dtype like '%float%'")
    rows = store.query(f"select step, rank, entry, slot, dtype, baseline_dtype from pairs where {where} "
                       f"order by {UNIT_ORDER} limit 1")
    if not rows:
        return None
    step, rank, entry, slot, dtype, baseline_dtype = rows[0]
    count = store.query(f"select count(*) from pairs where {where}")[0][0]
    return {"step": step, "rank": rank, "entry": entry, "slot": slot, "dtype": dtype,
            "baseline_dtype": baseline_dtype, "pairs": count}


def statistics_undecided(store: Store, first: Optional[Any] = None) -> Optional[Dict[str, Any]]:
    """Pairs compared on statistics that are within thresholds although their statistics differ (a statistics
    dump cannot tell rounding there from a change its statistics do not show), before the first divergence."""
    where = ("basis = 'statistics' and status = 'ok' and kind = 'activation' "
             "and (max_diff != 0 or min_diff != 0 or mean_diff != 0 or norm_diff != 0)")
    params: tuple = ()
    if first is not None:
        where += " and (coalesce(step, -1) < coalesce(?, -1) or (step is ? and rank = ? and pos < ?))"
        params = (first.step, first.step, first.rank, first.pos)
    count = store.query(f"select count(*) from pairs where {where}", params)[0][0]
    if not count:
        return None
    shown = store.query(f"select step, rank, entry, slot, score from pairs where {where} order by {UNIT_ORDER} "
                        f"limit {UNDECIDED_SHOWN}", params)
    return {"count": count, "first": [{"step": r[0], "rank": r[1], "entry": r[2], "slot": r[3], "score": r[4]}
                                      for r in shown]}
