"""A compare result as people read it (text) and as programs read it (JSON).

The headline and the advice (what to check when the verdict cannot be trusted) are
written here once and shown alike in the terminal, the JSON and the HTML report.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from mf_celldump.analysis.compare.coverage import Coverage, Part
from mf_celldump.analysis.compare.pairing import WEIGHT, WEIGHT_GRAD
from mf_celldump.analysis.compare.report import json_ready
from mf_celldump.analysis.compare.request import COMMON_FACTOR, DIVERGED, LOW_COVERAGE, NOTHING, WITHIN, CompareResult
from mf_celldump.analysis.compare.verdicts import factor_text, per_step_text, steps_text

REASON_LINES = 8
_CLASS_NAMES = {"no_partner": "no partner", "by_design": "by design", "not_comparable": "not comparable"}


def plain(value):
    """JSON fallback: anything else as its text."""
    return str(value)


def header(result: CompareResult) -> Dict[str, Any]:
    """What was compared and what came of it, as every output states it first."""
    return {
        "target": result.request.target,
        "baseline": result.request.baseline,
        "frameworks": list(result.frameworks),
        "tasks": list(result.tasks),
        "mapping": list(result.mapping_sources),
        "verdict": result.verdict,
        "headline": headline(result),
        "advice": advice(result),
        "warnings": result.warnings,
    }


def to_json(result: CompareResult, code: int) -> dict:
    return json_ready({
        **header(result),
        "units": result.units,
        "unpaired": result.unpaired,
        "coverage": result.coverage.to_json(),
        "first_divergence": result.first.to_json() if result.first else None,
        "common_factors": result.factors,
        "weight_timing": result.weight_timing,
        "weights": result.weights,
        "crc": result.crc,
        "dtype_change": result.dtype_change,
        "statistics_undecided": result.statistics_undecided,
        "thresholds": {k: vars(v) for k, v in result.request.thresholds.items()},
        "output": result.request.output,
        "csv": result.csv_path,
        "plot": result.plot_path,
        "plot_note": result.plot_note,
        "html": result.html_path,
        "exit_code": code,
    })


def fmt(value, cosine: bool = False) -> str:
    """A metric for people: cosine always with 6 decimals, anything else with 3 significant digits."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, str):
        return value
    return f"{value:.6f}" if cosine else f"{value:.3g}"


def metric_text(item: Dict[str, Any]) -> str:
    """The numbers a verdict rests on: cosine and errors for tensors, stat_rel for statistics."""
    if item.get("basis") == "statistics" or (item.get("cosine") is None and item.get("stat_rel") is not None):
        return f"stat_rel {fmt(item.get('stat_rel'))} (statistics)"
    text = f"cosine {fmt(item.get('cosine'), cosine=True)}  rel_err {fmt(item.get('rel_err'))}"
    if "max_abs_err" in item:
        text += f"  max_abs_err {fmt(item.get('max_abs_err'))}"
    return text


def headline(result: CompareResult) -> str:
    """The verdict in one line. Causes found across steps come first: an update that differs on values that
    agree (the optimizer), then data that differ, then the first divergent cell."""
    verdict, first = result.verdict, result.first
    causes = _causes(result) if verdict == DIVERGED else []
    if verdict == DIVERGED and first is not None and (not result.factors or first.direction not in [
            f["direction"] for f in result.factors]):
        return "; ".join(causes + [f"FIRST DIVERGENCE ({first.direction}, step {_step(first.step)} "
                                   f"{first.rank_text}): {first.entry}"])
    if causes:
        return "; ".join(causes + [_what_differs(result)])
    if verdict in (DIVERGED, COMMON_FACTOR):
        return _what_differs(result)
    if verdict == NOTHING:
        return "NOTHING COMPARED: no target tensor found a baseline partner (see the reasons above)"
    if verdict == LOW_COVERAGE:
        short = ", ".join(f"{p.label} {p.comparable_fraction:.0%}" for p in result.coverage.short) or "activations 0%"
        return (f"NO VERDICT: too little compared ({short} of the comparable tensors; the minimum is "
                f"{result.coverage.minimum:.0%}); {result.compared} compared pairs are within thresholds")
    return f"no divergence: all {result.compared} compared pairs are within thresholds"


def _causes(result: CompareResult) -> List[str]:
    """What differs before the first divergent cell computes: where the dtypes part, the update of a step, the
    data."""
    out = []
    timing, first = result.weight_timing, result.first
    if result.dtype_change:
        out.append(dtype_text(result.dtype_change))
    if timing.get("update_of") is not None:
        out.append(update_text(timing))
    if first is not None and first.data_differ:
        out.append(f"DATA DIFFER at step {_step(first.step)}: the model's inputs differ (another batch, another "
                   "shuffle or order of the dataset)")
    return out


def update_text(timing: Dict[str, Any]) -> str:
    """``THE UPDATE OF STEP 0 DIFFERS: ...``: every value of step 0 agrees, weights differ when step 1 starts."""
    step, start = timing["update_of"], timing["differ"][0]
    at_start = next((s for s in timing["steps"] if s["step"] == start), {"ok": 0, "diverged": 0})
    return (f"THE UPDATE OF STEP {step} DIFFERS: every compared value of {steps_text([step])} agrees and "
            f"{at_start['diverged']} of {at_start['ok'] + at_start['diverged']} weights differ at the start of "
            f"{steps_text([start])}: look at the optimizer (its settings, its state), the learning-rate schedule, "
            "the loss scale")


def _what_differs(result: CompareResult) -> str:
    """Weights, weight gradients or activations: named as what they are, never one for another."""
    differs, factored = [], []
    for item in result.factors:
        factored.append(factor_text(item))
    for direction in result.diverged_directions:
        if result.factor_of("activation", direction) is None:
            differs.append(f"{direction.upper()} ACTIVATIONS DIFFER")
    grads = result.weights.get(WEIGHT_GRAD) or {}
    if grads.get("diverged") and result.factor_of(WEIGHT_GRAD) is None:
        differs.append(f"WEIGHT GRADIENTS DIFFER: {grads['diverged']} of {grads['ok'] + grads['diverged']} "
                       f"({per_step_text(result.weight_timing.get('grad_steps') or [])})")
    weights = result.weights.get(WEIGHT) or {}
    timing = result.weight_timing
    if weights.get("diverged"):
        differs.append(_weights_phrase(weights, timing))
    same = [label for label, kinds in (("activation", ("activation",)), ("weight gradient", (WEIGHT_GRAD,)),
                                       ("weight", (WEIGHT,)))
            if not _differs(result, kinds[0]) and _compared(result, kinds[0])]
    tail = f"; every compared {' and '.join(same)} is within thresholds" if same else ""
    if result.verdict == COMMON_FACTOR:
        return "COMMON FACTOR: " + "; ".join(factored + [d for d in differs if "optimizer" in d]) + tail
    shouted = [d.replace("weights differ", "WEIGHTS DIFFER", 1) for d in differs]
    return "; ".join(shouted + factored) + tail


def _weights_phrase(weights: Dict[str, Any], timing: Dict[str, Any]) -> str:
    count = f"{weights['diverged']} of {weights['ok'] + weights['diverged']}"
    steps = steps_text(timing.get("differ") or [])
    if timing.get("after_optimizer"):
        start = timing["steps"][0]
        on = ("on diverged gradients" if timing.get("gradients_differ_before") else
              "on gradients that agree: look at the optimizer (its settings, its state)")
        return (f"weights differ only after the optimizer has run {on}: {count} at {steps}; at "
                f"{steps_text([start['step']])} all {start['ok']} agree")
    return f"WEIGHTS DIFFER at the start of {steps}: {count}"


def _differs(result: CompareResult, kind: str) -> bool:
    if kind == "activation":
        return bool(result.diverged_directions)
    return bool((result.weights.get(kind) or {}).get("diverged"))


def _compared(result: CompareResult, kind: str) -> bool:
    if kind == "activation":
        return any(p.kind == "activation" and p.compared for p in result.coverage.parts)
    info = result.weights.get(kind) or {}
    return bool((info.get("ok") or 0) + (info.get("diverged") or 0))


def advice(result: CompareResult) -> List[str]:
    """What to check when the verdict rests on too little (empty when nothing is to check)."""
    out = []
    if result.swapped:
        out.append(f"the target is a PyTorch dump and the baseline a {result.frameworks[1]} one: give your MindSpore "
                   f"run first (mf-celldump compare {result.request.baseline} {result.request.target})")
    if result.verdict in (NOTHING, LOW_COVERAGE):
        out.append(
            "check that the two dumps are of the same model, and the names with `mf-celldump mapping check MAPPING "
            f"--target {result.request.target} --baseline {result.request.baseline}`; give --mapping (or fix it) "
            "so the cells pair; --min-coverage lowers the minimum when a partial comparison is what you want"
        )
    if result.coverage.unreadable:
        needs_torch = any("needs torch" in r["reason"] for r in result.coverage.reasons
                          if r["class"] == "statistics_fallback")
        count = result.coverage.unreadable
        torch_hint = "; install torch to read PyTorch .pt files" if needs_torch else ""
        out.append(f"{count} {'pair was' if count == 1 else 'pairs were'} compared on statistics because a tensor "
                   f"file could not be read (see statistics_fallback){torch_hint}")
    return out


def _step(step: Optional[int]) -> str:
    return "-" if step is None else str(step)


def format_summary(result: CompareResult) -> str:
    lines = [
        f"target:   {result.request.target} ({result.frameworks[0]}, {result.tasks[0]})",
        f"baseline: {result.request.baseline} ({result.frameworks[1]}, {result.tasks[1]})",
        f"mapping:  {', '.join(result.mapping_sources) or 'none (names compared as they are)'}",
    ]
    for unit in result.units:
        lines.append(
            f"step {_step(unit['step'])} {_unit_ranks(unit)} ({unit['folder']}): {unit['entries']} entries, "
            f"{unit['tensors']} tensors: "
            f"{unit['ok']} within thresholds, {unit['diverged']} diverged, {unit['skipped']} not compared"
        )
    if result.unpaired:
        lines.append(f"no baseline partner for: {', '.join(result.unpaired)}")
    lines.extend(coverage_lines(result.coverage))
    lines.extend(precision_lines(result))
    lines.extend(_divergence_lines(result))
    lines.extend(weight_lines(result))
    lines.extend(crc_lines(result.crc))
    lines.extend(f"warning: {item}" for item in result.warnings)
    lines.extend(f"check: {item}" for item in advice(result))
    lines.append(f"output:   {result.request.output}/")
    lines.append(f"table:    {result.csv_path}")
    lines.append(f"plot:     {result.plot_path}" if result.plot_path else result.plot_note)
    if result.html_path:
        lines.append(f"report:   {result.html_path}")
    return "\n".join(lines)


def _unit_ranks(unit: Dict[str, Any]) -> str:
    """``rank 3``; a merged tensor-parallel group: ``ranks 0, 1 merged``."""
    if unit.get("ranks"):
        return f"ranks {', '.join(map(str, unit['ranks']))} merged"
    return f"rank {unit['rank']}"


def dtype_text(change: Dict[str, Any]) -> str:
    """``DTYPE CHANGES first at ...``: the first pair whose two sides compute in different floating dtypes."""
    return (f"DTYPE CHANGES first at {change['entry']} {change['slot']} (step {_step(change['step'])} rank "
            f"{change['rank']}): {change['dtype']} against {change['baseline_dtype']}, {change['pairs']} pairs in "
            f"all; values from there are judged with the narrower dtype's rounding noise")


def precision_lines(result: CompareResult) -> List[str]:
    """Said before the values: where the two runs' dtypes part (values are judged with the narrower one's noise
    from there), and the pairs a statistics dump cannot decide."""
    lines = []
    if result.dtype_change and result.verdict != DIVERGED:  # a divergence's headline says it first
        lines.append(dtype_text(result.dtype_change))
    undecided = result.statistics_undecided
    if undecided:
        names = ", ".join(f"{item['entry']} {item['slot']}" for item in undecided["first"])
        more = f" and {undecided['count'] - len(undecided['first'])} more" if undecided["count"] > len(
            undecided["first"]) else ""
        where = "before the first divergence" if result.first else "in all"
        lines.append(
            f"statistics cannot decide {undecided['count']} pairs {where}: their statistics differ, but within their "
            f"bound; elements may differ there unseen (a tensor dump decides): {names}{more}")
    return lines


def coverage_lines(coverage: Coverage) -> List[str]:
    lines = [f"compared (of the target's tensors; a verdict needs {coverage.minimum:.0%} of the comparable "
             "activations in each direction):"]
    lines.extend(f"  {p.label:<17} {_part_text(p)}" for p in coverage.parts)
    reasons = [r for r in coverage.reasons if r["class"] != "statistics_fallback"]
    if reasons:
        lines.append("not compared, by reason:")
        lines.extend(
            f"  {r['count']:5d}  [{_CLASS_NAMES.get(r['class'], r['class'])}, {r['kind']}] {r['reason']}"
            for r in reasons[:REASON_LINES]
        )
        if len(reasons) > REASON_LINES:
            lines.append(f"  ... {len(reasons) - REASON_LINES} more reasons in the CSV and --json")
    lines.extend(f"  {r['count']:5d}  [{r['kind']}] {r['reason']}"
                 for r in coverage.reasons if r["class"] == "statistics_fallback")
    return lines


def _part_text(part: Part) -> str:
    text = f"{part.compared} of {part.target_tensors} ({part.fraction:.0%}"
    if part.by_design:
        text += f"; {part.comparable_fraction:.0%} of the {part.comparable} comparable"
    text += ")"
    if part.on_statistics:
        text += f", {part.on_statistics} on statistics"
    if part.baseline_tensors:
        text += f"; baseline: {part.baseline_used} of {part.baseline_tensors} used ({part.baseline_fraction:.0%})"
    return text


def _divergence_lines(result: CompareResult) -> List[str]:
    first = result.first
    if first is None:
        return [headline(result)] if result.verdict != DIVERGED or _causes(result) else []
    lines = [headline(result), f"  baseline: {first.baseline or '-'}"]
    for tensor in first.tensors:
        mark = "DIVERGED" if tensor["status"] == "diverged" else "ok"
        lines.append(
            f"  {tensor['slot']:<12} {mark:<8} {metric_text(tensor)}"
            + (f"  [{tensor['baseline_transform']}]" if tensor.get("baseline_transform") else "")
            + (f"  {tensor['reason']}" if tensor.get("reason") else "")
        )
    if first.cause_note:
        lines.append(f"  note: {first.cause_note}")
    if first.inputs_differ and not first.data_differ:
        if first.last_ok:
            lines.append(f"  last cell within thresholds before it: {first.last_ok}")
        lines.extend(f"  not compared in between: {u['name']} ({u['reason']})" for u in first.upstream_unpaired)
    if first.parents:
        lines.append("  parents:")
        lines.extend(f"    {p['cell']}: {p['status']} - {p['why']}" for p in first.parents)
    if first.next:
        lines.append("  next divergent cells:")
        lines.extend(f"    {item['direction']:<8} {item['name']}  {metric_text(item)}" for item in first.next)
    return lines


def crc_lines(crc: Dict[str, Any]) -> List[str]:
    """The CRC-32 compare, when both dumps carry them (``md5``)."""
    total = crc["identical"] + crc["different"]
    if not total:
        return []
    line = f"CRC-32: {crc['identical']} of {total} pairs bit-identical"
    if crc["different"]:
        line += f"; first that differs: {crc['first_different']}"
    return [line]


def weight_lines(result: CompareResult) -> List[str]:
    lines = []
    timing = result.weight_timing
    for kind, label in ((WEIGHT, "WEIGHTS"), (WEIGHT_GRAD, "WEIGHT GRADIENTS")):
        info = result.weights.get(kind) or {}
        compared = (info.get("ok") or 0) + (info.get("diverged") or 0)
        if not compared and not info.get("skipped"):
            continue
        if not info.get("diverged"):
            lines.append(f"{label.lower()}: {compared} compared, all within thresholds")
            continue
        factor = result.factor_of(WEIGHT_GRAD) if kind == WEIGHT_GRAD else None
        if factor is not None:
            lines.append(f"COMMON FACTOR: {factor_text(factor)}")
            continue
        first = info["first"]
        worst = first["metrics"]
        where = f"{first['cell']} {worst['slot']} (step {_step(first['step'])}; {metric_text(worst)})"
        steps = per_step_text(timing.get("steps" if kind == WEIGHT else "grad_steps") or [])
        if kind == WEIGHT_GRAD and result.first is not None:
            lines.append(f"{label.lower()}: {info['diverged']} of {compared} differ ({steps}), after the divergent "
                         "computation above")
        elif kind == WEIGHT_GRAD:
            lines.append(f"{label} DIFFER: {info['diverged']} of {compared} ({steps}); first {where}")
        elif timing.get("after_optimizer"):
            phrase = _weights_phrase(info, timing).replace("weights differ", "WEIGHTS DIFFER", 1)
            lines.append(f"{phrase}; first {where}")
        else:
            lines.append(
                f"{label} DIFFER at step start: {info['diverged']} of {compared}; first {where}; {steps}; a weight "
                "that differs at step start is a different diagnosis from a computation that differs (conversion, "
                "loading, an optimizer step)")
    return lines


__all__ = ["DIVERGED", "WITHIN", "format_summary", "to_json", "plain", "fmt", "headline", "advice"]
