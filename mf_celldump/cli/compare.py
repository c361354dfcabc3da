"""``mf-celldump compare TARGET BASELINE``: where do two runs first diverge?

Exit codes: 0 every compared pair within thresholds (and enough compared), 1 diverged,
2 bad input or too little compared for a verdict, 4 every difference is one common factor.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from typing import Any

from mf_celldump.analysis.compare import shards, thresholds, workers
from mf_celldump.analysis.compare.coverage import MIN_COVERAGE
from mf_celldump.analysis.compare.engine import run
from mf_celldump.analysis.compare.request import (
    COMMON_FACTOR,
    DEFAULT_OUTPUT,
    DIVERGED,
    WITHIN,
    CompareRequest,
    RankFolders,
)
from mf_celldump.analysis.compare.summary import advice, format_summary, plain, to_json
from mf_celldump.cli.conventions import ExitCode, add_selection_arguments, emit, parse_selection
from mf_celldump.errors import CompareInputError, ConfigError, DumpError, MappingError
from mf_celldump.mapping import AUTO

logger = logging.getLogger(__name__)


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "compare",
        help="compare two dumps and name the first divergent cell",
        description=(
            "Compare two dumps in msprobe's layout (ours or msprobe's, MindSpore or PyTorch, tensor or "
            "statistics task) and name the first cell, in execution order, whose tensors differ beyond the "
            "thresholds; weights and weight gradients are compared too. Writes a CSV of every pair, a PNG of "
            "per-layer metrics and a self-contained report.html. Exit 0 within thresholds, 1 diverged, 2 bad "
            "input or too little compared for a verdict, 4 every difference is one common factor (gradient "
            "clipping, a loss scale)."
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
    parser.add_argument(
        "-o", "--output", default=DEFAULT_OUTPUT, metavar="FOLDER",
        help=f"folder for compare_pairs.csv, compare_depth.png and report.html (default: ./{DEFAULT_OUTPUT})",
    )
    add_selection_arguments(parser, "compare")
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="[DTYPE.]KEY=VALUE",
        help="override a threshold: cosine (0 to 1), rel_err, stat_rel, abs_err (0 or more; abs_err: a pair "
        "differing by no more than it is within; default: each pair's rounding-noise bound, 0: off); "
        "e.g. cosine=0.9999, bfloat16.rel_err=0.05; "
        "DTYPE: float64, float32, float16, bfloat16, int (exact)",
    )
    parser.add_argument(
        "--qkv-groups",
        type=int,
        default=None,
        help="query groups of fused q/k/v baselines (default: from the baseline's core_attention, which "
        "must agree when both are known)",
    )
    parser.add_argument(
        "--min-coverage",
        type=float,
        default=MIN_COVERAGE,
        metavar="FRACTION",
        help="share of the comparable activations, in each direction, that must be compared for a verdict "
        f"(default: {MIN_COVERAGE}); below it the exit status is 2",
    )
    for side in ("target", "baseline"):
        parser.add_argument(
            f"--{side}-tp",
            type=int,
            default=None,
            metavar="N",
            help=f"the {side} is tensor-parallel over N ranks: merge each group of N consecutive rank folders "
            "before comparing (shard rules: docs/compare.md); --ranks then selects the merged groups. Default: "
            "the size capture recorded in the dump (mf_celldump_parallel), else 1",
        )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="pair the entries of each rank folder in N processes (1: all in this process). Default: the CPUs "
        f"available, at most {workers.MAX_DEFAULT_JOBS}, for a rank folder large enough to gain from them "
        "(starting them takes a few tenths of a second)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run_compare)
    return parser


def run_compare(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    report = None
    try:
        request = _request(args)
        bad = [f"--{side}-tp {given}" for side, given in (("target", args.target_tp), ("baseline", args.baseline_tp))
               if given is not None and given < 1]
        if bad:
            raise ValueError(f"{' / '.join(bad)}: give a positive number of ranks")
        folders = RankFolders.find(request)  # the one pass over both sides' rank folders
        sizes = shards.ShardSizes(*(shards.recorded_tp(path, found) if given is None else given
                                    for path, found, given in ((args.target, folders.target, args.target_tp),
                                                               (args.baseline, folders.baseline, args.baseline_tp))))
        if sizes.merging:
            result, report = shards.run(request, sizes, folders)
        else:
            result = run(request, folders)
    except (CompareInputError, DumpError, MappingError, ConfigError, ValueError) as err:
        if args.json:
            emit(json.dumps({"error": str(err), "exit_code": int(ExitCode.BAD_INPUT)}), out)
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    code = {DIVERGED: ExitCode.FOUND, WITHIN: ExitCode.OK,
            COMMON_FACTOR: ExitCode.COMMON_FACTOR}.get(result.verdict, ExitCode.BAD_INPUT)
    if code == ExitCode.OK and report is not None and report.disagreements:
        code = ExitCode.FOUND
    if args.json:
        data = to_json(result, int(code))
        if report is not None:
            data["shards"] = report.to_json()
        emit(json.dumps(data, indent=1, default=plain, allow_nan=False), out)
    else:
        emit(format_summary(result), out)
        if report is not None:
            emit(report.text(), out)
    if code == ExitCode.BAD_INPUT:
        print(f"error: {result.verdict}: " + "; ".join(advice(result)), file=sys.stderr)
    return code


def _request(args: argparse.Namespace) -> CompareRequest:
    table = dict(thresholds.DEFAULT_THRESHOLDS)
    for spec in args.threshold:
        table = thresholds.override(table, spec)
    if args.qkv_groups is not None and args.qkv_groups <= 0:
        raise ValueError(f"--qkv-groups {args.qkv_groups}: give a positive number")
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: give 1 or more (1: pair in this process)")
    if not (math.isfinite(args.min_coverage) and 0.0 <= args.min_coverage <= 1.0):
        raise ValueError(f"--min-coverage {args.min_coverage}: give a fraction between 0 and 1 (e.g. 0.5)")
    steps, ranks = parse_selection(args)
    return CompareRequest(
        target=args.target,
        baseline=args.baseline,
        output=args.output,
        mapping=tuple(args.mapping or (AUTO,)),
        steps=steps,
        ranks=ranks,
        thresholds=table,
        qkv_groups=args.qkv_groups,
        min_coverage=args.min_coverage,
        progress=not args.json,
        jobs=args.jobs,
    )
