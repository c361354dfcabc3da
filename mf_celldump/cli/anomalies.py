"""``mf-celldump anomalies DUMP``: the first NaN/Inf (or value past a magnitude) in execution order.

Exit codes: 0 nothing found, 1 anomalies, 2 bad input (``conventions.ExitCode``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from mf_celldump.analysis.anomalies import result_json, result_text, scan
from mf_celldump.cli.conventions import ExitCode, add_selection_arguments, bad_input, emit, parse_selection
from mf_celldump.errors import ConfigError, DumpError


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "anomalies",
        help="find the first NaN/Inf (or too large value) in execution order",
        description="Scan a dump (ours or msprobe's, tensor or statistics task) for NaN, Inf and, with "
        "--max-abs, values whose magnitude exceeds it. Exit 0 nothing found, 1 found, 2 bad input.",
    )
    parser.add_argument("dump", metavar="DUMP", help="dump root, step folder or rank folder")
    parser.add_argument(
        "--max-abs", type=float, default=None, metavar="VALUE",
        help="also report floating-point tensors whose |values| exceed VALUE (a positive number; integer "
        "tensors and additive attention masks, largest value 0, are left out)",
    )
    add_selection_arguments(parser, "scan")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run_anomalies)
    return parser


def run_anomalies(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    if args.max_abs is not None and not (math.isfinite(args.max_abs) and args.max_abs > 0):
        return bad_input(f"--max-abs {args.max_abs}: give a positive finite magnitude (e.g. 1e4)")
    try:
        steps, ranks = parse_selection(args)
        result = scan(args.dump, steps, ranks, args.max_abs)
    except (DumpError, ConfigError) as err:
        return bad_input(err)
    code = ExitCode.FOUND if result["first"] else ExitCode.OK
    if args.json:
        emit(json.dumps(result_json(result, int(code)), indent=1, default=str), out)
    else:
        emit(result_text(result), out)
    return code
