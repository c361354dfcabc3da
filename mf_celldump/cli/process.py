"""``mf-celldump process DUMP_PATH``: offline processing, e.g. of a run that crashed.

Exit status: 0 all processed (or nothing to do), 1 processed with problems (their raw
data is kept; a step the capture did not complete, e.g. the one a run died in, is one: its
output holds what was written and is named INCOMPLETE with its counts), 2 bad input
(missing path, not a capture dump, bad --steps/--ranks, or --steps/--ranks that match no
step or rank of the dump).
"""

from __future__ import annotations

import argparse
import logging
import sys

from mf_celldump.cli.conventions import ExitCode, add_selection_arguments, bad_input, parse_selection
from mf_celldump.errors import ConfigError, ProcessingError, UnsafePathError
from mf_celldump.userinput import resolve_jobs

logger = logging.getLogger(__name__)


def add_cli(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "process",
        help="turn raw capture files into msprobe's dump layout (step{N}/rank{R}/)",
        description="Process raw capture data of DUMP_PATH into msprobe's layout. Safe to re-run; "
        "a run that was interrupted is completed by the next one.",
    )
    parser.add_argument("dump_path", metavar="DUMP_PATH", help="the dump_path of the training run")
    add_selection_arguments(parser, "process")
    parser.add_argument(
        "--jobs", metavar="N", type=int, default=None, help="worker processes (default: CPU count)"
    )
    parser.add_argument("--keep-raw", action="store_true", help="keep the raw capture files after processing")
    parser.add_argument(
        "--only-complete",
        action="store_true",
        help="skip steps without a completion marker (_step_done.json)",
    )
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from mf_celldump.processing.driver import process_dump
    from mf_celldump.processing.observer import ProgressObserver

    try:
        steps, ranks = parse_selection(args)
        resolve_jobs(args.jobs, "--jobs")
    except ConfigError as err:
        return bad_input(err)
    try:
        report = process_dump(
            args.dump_path,
            steps=steps,
            ranks=ranks,
            jobs=args.jobs,
            only_complete=args.only_complete,
            remove_raw=not args.keep_raw,
            observer=ProgressObserver(show_bar=sys.stderr.isatty()),
        )
    except (ProcessingError, UnsafePathError) as err:
        return bad_input(err)
    print(report.summary())
    if report.selection_matched_nothing:
        return ExitCode.BAD_INPUT
    return ExitCode.OK if report.ok else ExitCode.FOUND
