"""A compare result as people read it (text) and as programs read it (JSON)."""

from __future__ import annotations

import math
from typing import List

from mf_celldump.compare.engine import CompareResult


def plain(value):
    """JSON fallback: NaN as null, anything else as its text."""
    return None if isinstance(value, float) and math.isnan(value) else str(value)


def to_json(result: CompareResult, code: int) -> dict:
    return {
        "target": result.request.target,
        "baseline": result.request.baseline,
        "frameworks": list(result.frameworks),
        "tasks": list(result.tasks),
        "mapping": list(result.mapping_sources),
        "units": result.units,
        "unpaired": result.unpaired,
        "first_divergence": result.first.to_json() if result.first else None,
        "thresholds": {k: vars(v) for k, v in result.request.thresholds.items()},
        "csv": result.csv_path,
        "plot": result.plot_path,
        "exit_code": code,
    }


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return (
        f"{value:.6f}"
        if isinstance(value, float) and 0.0 <= value <= 1.0 and value > 0.99
        else f"{value:.3g}"
    )


def format_summary(result: CompareResult) -> str:
    lines = [
        f"target:   {result.request.target} ({result.frameworks[0]}, {result.tasks[0]})",
        f"baseline: {result.request.baseline} ({result.frameworks[1]}, {result.tasks[1]})",
        f"mapping:  {', '.join(result.mapping_sources) or 'none (names compared as they are)'}",
    ]
    for unit in result.units:
        lines.append(
            f"step {unit['step'] or '-'} {unit['rank']}: {unit['entries']} entries, "
            f"{unit['tensors']} tensors: "
            f"{unit['ok']} within thresholds, {unit['diverged']} diverged, {unit['skipped']} not compared"
        )
    if result.unpaired:
        lines.append(f"no baseline partner for: {', '.join(result.unpaired)}")
    if result.skipped:
        lines.append("not compared, most frequent reasons:")
        lines.extend(f"  {count:5d}  {reason}" for reason, count in result.skipped)
    lines.extend(_divergence_lines(result))
    lines.append(f"table: {result.csv_path}")
    if result.plot_path:
        lines.append(f"plot:  {result.plot_path}")
    return "\n".join(lines)


def _divergence_lines(result: CompareResult) -> List[str]:
    first = result.first
    if not result.compared:
        return ["NOTHING COMPARED: no target tensor found a baseline partner (see the reasons above)"]
    if first is None:
        return [f"no divergence: all {result.compared} compared pairs are within thresholds"]
    lines = [
        f"FIRST DIVERGENCE ({first.direction}, step {first.step or '-'} {first.rank}): {first.entry}",
        f"  baseline: {first.baseline or '-'}",
    ]
    for tensor in first.tensors:
        mark = "DIVERGED" if tensor["status"] == "diverged" else "ok"
        lines.append(
            f"  {tensor['slot']:<12} {mark:<8} cosine {_fmt(tensor['cosine'])}  "
            f"rel_err {_fmt(tensor['rel_err'])}  "
            f"max_abs_err {_fmt(tensor['max_abs_err'])}  stat_rel {_fmt(tensor['stat_rel'])}"
            + (f"  [{tensor['transform']}]" if tensor.get("transform") else "")
            + (f"  {tensor['reason']}" if tensor.get("reason") else "")
        )
    if first.parents:
        lines.append("  parents: " + ", ".join(f"{p['cell']} ({p['status']})" for p in first.parents))
    if first.next:
        lines.append("  next divergent cells:")
        lines.extend(
            f"    {item['direction']:<8} {item['name']}  cosine {_fmt(item['cosine'])}  "
            f"rel_err {_fmt(item['rel_err'])}"
            for item in first.next
        )
    return lines
