"""``mf-celldump health DUMP``: the first bad cell per rank and step of a run's cell health, and its heat map.

Exit codes: 0 no cell held a NaN or an Inf, 1 one did, 2 bad input (``conventions.ExitCode``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from mf_celldump.analysis.anomalies import health_files, health_json, health_text, heat_map_html, scan_health
from mf_celldump.cli.conventions import ExitCode, add_selection_arguments, bad_input, emit, parse_selection
from mf_celldump.errors import ConfigError, DumpError
from mf_celldump.fsutil import atomic_write_bytes


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "health",
        help="the first bad cell per rank and step of a run's cell health (watch: {cells: true}), and a heat map",
        description="Read health/rank{R}.csv (written by a run with watch: {cells: true}), print the first cell "
        "whose value held a NaN or an Inf per rank and step, in execution order (forward, then backward), and "
        "write a self-contained HTML heat map (cell x step). Exit 0 nothing found, 1 found, 2 bad input.",
    )
    parser.add_argument("dump", metavar="DUMP", help="dump root (its health folder), a health folder or one file")
    parser.add_argument("--html", metavar="PATH", default=None,
                        help="where the heat map goes (default: health.html beside the health files); '-' for none")
    add_selection_arguments(parser, "read")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run_health)
    return parser


def run_health(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    try:
        steps, ranks = parse_selection(args)
        result = scan_health(args.dump, steps, ranks)
        page = args.html
        if page is None:
            page = os.path.join(os.path.dirname(health_files(args.dump)[0][1]), "health.html")
    except (DumpError, ConfigError) as err:
        return bad_input(err)
    if page == "-":
        page = None
    else:
        try:
            atomic_write_bytes(page, heat_map_html(result).encode("utf-8"))
        except OSError as err:
            return bad_input(f"--html {page}: cannot write the heat map: {err.strerror or err}")
    code = ExitCode.FOUND if result.first else ExitCode.OK
    if args.json:
        emit(json.dumps(health_json(result, int(code), page), indent=1), out)
    else:
        emit(health_text(result, page), out)
    return code
