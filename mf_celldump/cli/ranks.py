"""``mf-celldump ranks DUMP...``: check data-parallel replicas against each other, step by step.

Exit codes: 0 the replicas agree (suspects and missing ranks are listed, not counted),
1 a NaN/Inf or a weight that is not bit-identical across replicas, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mf_celldump.analysis.replica_report import DEFAULT_OUTPUT, CheckRequest, CheckResult, default_output, run
from mf_celldump.cli.conventions import ExitCode, add_selection_arguments, bad_input, parse_selection
from mf_celldump.errors import ConfigError, RankCheckError, ReplicaSpecError
from mf_celldump.ranks.groups import SYNTAX, ReplicaGroups
from mf_celldump.ranks.replicas import GRAD_MODES, CheckOptions


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "ranks",
        help="check data-parallel replicas against each other: first NaN/Inf, first departure, suspects",
        description="Per step, over the ranks that hold the same shard of the model: the first weight (or "
        "reduced weight gradient) not bit-identical across replicas, the first rank and cell with a NaN/Inf, "
        "and ranks whose output or gradient sizes lie far outside the other replicas' (suspects). Inputs: "
        "dump roots and/or rank-summary files (--save-summaries) from other nodes. Exit 0 the replicas "
        "agree, 1 a NaN/Inf or a departure, 2 bad input.",
    )
    parser.add_argument("paths", nargs="+", metavar="DUMP_OR_SUMMARIES",
                        help="dump roots (step*/rank*/dump.json) or rank-summary files (.jsonl.gz)")
    add_selection_arguments(parser, "check")
    parser.add_argument("--replicas", default="all", metavar="SPEC", help=f"which ranks are replicas: {SYNTAX}")
    parser.add_argument("--grads", choices=GRAD_MODES, default="auto",
                        help="weight gradients in the dump: reduced (must be equal, graph mode), local (before "
                             "the reduction, PyNative), auto: decided from the data (default)")
    parser.add_argument("--factor", type=float, default=CheckOptions.factor,
                        help="a suspect's Norm or Max is off the other replicas' by at least this factor "
                             f"(default {CheckOptions.factor:g})")
    parser.add_argument("--sigmas", type=float, default=CheckOptions.sigmas,
                        help="... and by this many of their standard deviations, with 3 or more replicas "
                             f"(default {CheckOptions.sigmas:g})")
    parser.add_argument("-o", "--output", default=None, metavar="FOLDER",
                        help=f"folder for the table and heat maps (default: {DEFAULT_OUTPUT}/ in the first dump "
                             "root, or beside the first summary file)")
    parser.add_argument("--save-summaries", metavar="FILE",
                        help="also write every rank's summary to FILE (.jsonl.gz): run per node, check together")
    parser.add_argument("--summaries-only", action="store_true", help="only write --save-summaries, no check")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run_ranks)
    return parser


def run_ranks(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    try:
        request = _request(args)
        result = run(request)
    except (RankCheckError, ReplicaSpecError, ConfigError, ValueError) as err:
        return bad_input(err)
    if not request.check:
        print(f"{result.summaries} rank summaries written to {request.save_summaries}", file=out)
        return ExitCode.OK
    code = ExitCode.FOUND if result.diverged else ExitCode.OK
    if args.json:
        print(json.dumps(to_json(result, int(code)), indent=1, default=str), file=out)
    else:
        print(to_text(result), file=out)
    return code


def _request(args: argparse.Namespace) -> CheckRequest:
    steps, ranks = parse_selection(args)
    if args.summaries_only and not args.save_summaries:
        raise ValueError("--summaries-only needs --save-summaries FILE")
    if args.factor <= 1.0:
        raise ValueError(f"--factor {args.factor:g}: must be greater than 1")
    if args.sigmas <= 0.0:
        raise ValueError(f"--sigmas {args.sigmas:g}: must be greater than 0")
    options = CheckOptions(factor=args.factor, sigmas=args.sigmas, grads=args.grads)
    return CheckRequest(tuple(args.paths), steps, ranks, ReplicaGroups.parse(args.replicas, "--replicas"), options,
                        output=None if args.summaries_only else args.output or default_output(tuple(args.paths)),
                        save_summaries=args.save_summaries,
                        check=not args.summaries_only)


def to_text(result: CheckResult) -> str:
    lines = [f"{result.summaries} rank summaries; replicas: {result.request.replicas.describe()}"]
    lines.extend(result.lines)
    for group_result in result.results:
        lines.extend(f"  note (step {group_result.step}): {note}" for note in group_result.notes)
    if result.table:
        lines.append(f"table: {result.table}")
    lines.extend(f"heat map: {path}" for path in result.heatmaps)
    if result.heatmap_note:
        lines.append(result.heatmap_note)
    return "\n".join(lines)


def to_json(result: CheckResult, code: int) -> dict:
    steps = []
    for group_result in result.results:
        steps.append({
            "step": group_result.step,
            "group": result.group_labels.get(group_result.group) or "all",
            "ranks": group_result.ranks,
            "missing": result.missing.get((group_result.step, group_result.group), []),
            "first_anomaly": [dict(vars(a), rank=r, kind=a.kind) for r, a in group_result.anomaly],
            "first_departure": group_result.first_departure,
            "departures": group_result.departures,
            "suspects": group_result.suspects,
            "varying": group_result.varying,
            "grads_reduced": group_result.grads_reduced,
            "notes": group_result.notes,
        })
    return {"summaries": result.summaries, "replicas": result.request.replicas.describe(), "steps": steps,
            "lines": result.lines, "table": result.table, "heatmaps": result.heatmaps,
            "heatmap_note": result.heatmap_note, "unjudged": result.unjudged, "exit_code": code}
