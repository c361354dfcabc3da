"""``mf-celldump process DUMP_PATH``: offline processing, e.g. of a run that crashed.

Exit status: 0 all processed (or nothing to do), 1 processed with problems (their raw
data is kept), 2 bad input (missing path, not a capture dump, bad --steps/--ranks, or
--steps/--ranks that match no step or rank of the dump).
"""

from __future__ import annotations

import argparse
import logging
import sys

from mf_celldump.config import ConfigError, IndexSelection, resolve_jobs

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_BAD_INPUT = 2


def add_cli(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "process",
        help="turn raw capture files into msprobe's dump layout (step{N}/rank{R}/)",
        description="Process raw capture data of DUMP_PATH into msprobe's layout. Safe to re-run; "
        "a run that was interrupted is completed by the next one.",
    )
    parser.add_argument("dump_path", metavar="DUMP_PATH", help="the dump_path of the training run")
    parser.add_argument(
        "--steps", metavar="SPEC", default=None, help="steps to process, e.g. '0,5-7' (default: all)"
    )
    parser.add_argument(
        "--ranks", metavar="SPEC", default=None, help="ranks to process, e.g. '0-3' (default: all)"
    )
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
    from mf_celldump.processing.errors import ProcessingError, UnsafePathError
    from mf_celldump.processing.observer import ProgressObserver

    try:
        steps = IndexSelection.parse(args.steps, "--steps")
        ranks = IndexSelection.parse(args.ranks, "--ranks")
        resolve_jobs(args.jobs, "--jobs")
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
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
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(report.summary())
    if report.selection_matched_nothing:
        return EXIT_BAD_INPUT
    return EXIT_OK if report.ok else EXIT_PROBLEMS
