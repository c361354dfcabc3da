"""``mf-celldump compare TARGET BASELINE``: where do two runs first diverge?

Exit codes: 0 every compared pair within thresholds, 1 diverged, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from typing import Any, List

from mf_celldump.compare import metrics
from mf_celldump.compare.engine import CompareInputError, CompareRequest, CompareResult, run
from mf_celldump.config import ConfigError, IndexSelection
from mf_celldump.layout.reader import DumpError
from mf_celldump.mapping import AUTO, MappingError

logger = logging.getLogger(__name__)
EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT = 0, 1, 2


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "compare",
        help="compare two dumps and name the first divergent cell",
        description=(
            "Compare two dumps in msprobe's layout (ours or msprobe's, MindSpore or PyTorch, tensor or "
            "statistics task) and name the first cell, in execution order, whose tensors differ beyond the "
            "thresholds. Writes a CSV of every pair and a PNG of per-layer metrics along the depth. "
            "Exit 0 within thresholds, 1 diverged, 2 bad input."
        ),
    )
    parser.add_argument("target", metavar="TARGET", help="dump root, step folder or rank folder (your run)")
    parser.add_argument(
        "baseline", metavar="BASELINE", help="dump root, step folder or rank folder (the reference)"
    )
    parser.add_argument(
        "--mapping",
        action="append",
        metavar="NAME|FILE",
        help="layer mapping: 'auto' (default: bundled files when the frameworks differ), 'none', "
        "a bundled name (llama, mcore_gpt) or a YAML file; repeat to layer files",
    )
    parser.add_argument("-o", "--output", default="compare_out", help="folder for the CSV and the plot")
    parser.add_argument("--steps", default="all", help="steps to compare: all, 3, '0,5-7'")
    parser.add_argument("--ranks", default="all", help="ranks to compare: all, 0, '0-3'")
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="[DTYPE.]KEY=VALUE",
        help="override a threshold: cosine, rel_err, stat_rel; e.g. cosine=0.9999, bfloat16.rel_err=0.05",
    )
    parser.add_argument(
        "--qkv-groups",
        type=int,
        default=None,
        help="query groups of fused q/k/v baselines (default: from the baseline's core_attention)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run_compare)
    return parser


def run_compare(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    try:
        request = _request(args)
        result = run(request)
    except (CompareInputError, DumpError, MappingError, ConfigError, ValueError) as err:
        if args.json:
            print(json.dumps({"error": str(err), "exit_code": EXIT_BAD_INPUT}), file=out)
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    code = EXIT_DIVERGED if result.diverged else EXIT_OK
    if not result.compared:
        code = EXIT_BAD_INPUT  # nothing paired is not "no divergence" (msprobe says success there)
    if args.json:
        print(json.dumps(to_json(result, code), indent=1, default=_plain), file=out)
    else:
        print(format_summary(result), file=out)
    if not result.compared:
        print(
            "error: no tensor of the target found a baseline partner to compare with; check the names with "
            f"`mf-celldump mapping check MAPPING --target {args.target} --baseline {args.baseline}` "
            "and give --mapping",
            file=sys.stderr,
        )
    return code


def _request(args: argparse.Namespace) -> CompareRequest:
    thresholds = dict(metrics.DEFAULT_THRESHOLDS)
    for spec in args.threshold:
        thresholds = metrics.override(thresholds, spec)
    if args.qkv_groups is not None and args.qkv_groups <= 0:
        raise ValueError(f"--qkv-groups {args.qkv_groups}: give a positive number")
    return CompareRequest(
        target=args.target,
        baseline=args.baseline,
        output=args.output,
        mapping=tuple(args.mapping or (AUTO,)),
        steps=IndexSelection.parse(args.steps, "--steps"),
        ranks=IndexSelection.parse(args.ranks, "--ranks"),
        thresholds=thresholds,
        qkv_groups=args.qkv_groups,
        progress=not args.json,
    )


def _plain(value):
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
