"""``mf-celldump compare TARGET BASELINE``: where do two runs first diverge?

Exit codes: 0 every compared pair within thresholds, 1 diverged, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from mf_celldump.cli.conventions import ExitCode, add_selection_arguments, parse_selection
from mf_celldump.compare import metrics, shards
from mf_celldump.compare.engine import CompareInputError, CompareRequest, run
from mf_celldump.compare.summary import format_summary, plain, to_json
from mf_celldump.config import ConfigError
from mf_celldump.layout.reader import DumpError
from mf_celldump.mapping import AUTO, MappingError

logger = logging.getLogger(__name__)


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
    add_selection_arguments(parser, "compare")
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
    for side in ("target", "baseline"):
        parser.add_argument(
            f"--{side}-tp",
            type=int,
            default=1,
            metavar="N",
            help=f"the {side} is tensor-parallel over N ranks: merge each group of N consecutive rank folders "
            "before comparing (shard rules: docs/compare.md); --ranks then selects the merged groups",
        )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run_compare)
    return parser


def run_compare(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    sizes = shards.ShardSizes(args.target_tp, args.baseline_tp)
    report = None
    try:
        request = _request(args)
        if sizes.target < 1 or sizes.baseline < 1:
            raise ValueError(f"--target-tp {sizes.target} / --baseline-tp {sizes.baseline}: give positive numbers")
        if sizes.merging:
            result, report = shards.run(request, sizes)
        else:
            result = run(request)
    except (CompareInputError, DumpError, MappingError, ConfigError, ValueError) as err:
        if args.json:
            print(json.dumps({"error": str(err), "exit_code": int(ExitCode.BAD_INPUT)}), file=out)
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    code = ExitCode.FOUND if result.diverged or (report and report.disagreements) else ExitCode.OK
    if not result.compared:
        code = ExitCode.BAD_INPUT  # nothing paired is not "no divergence" (msprobe says success there)
    if args.json:
        data = to_json(result, int(code))
        if report is not None:
            data["shards"] = report.to_json()
        print(json.dumps(data, indent=1, default=plain), file=out)
    else:
        print(format_summary(result), file=out)
        if report is not None:
            print(report.text(), file=out)
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
    steps, ranks = parse_selection(args)
    return CompareRequest(
        target=args.target,
        baseline=args.baseline,
        output=args.output,
        mapping=tuple(args.mapping or (AUTO,)),
        steps=steps,
        ranks=ranks,
        thresholds=thresholds,
        qkv_groups=args.qkv_groups,
        progress=not args.json,
    )
