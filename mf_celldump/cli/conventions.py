"""What every ``mf-celldump`` sub-command shares: exit codes, ``--steps``/``--ranks``, error lines.

Exit codes, the same for every sub-command: 0 fine; 1 the command ran and found
something (problems while processing, a divergence, an anomaly, a mapping that does not
match); 2 bad input (the command could not do what was asked); 3 a bug in mf_celldump;
4 (compare) every difference is one common factor (gradient clipping, a loss scale): neither
clean nor a divergence; 130 interrupted; 141 the reader of the output went away before all of it was written
(``| head``; 128 + SIGPIPE, as for a Unix tool it stops), except where the sub-command
prints through ``emit``, which keeps the status of what it found.
"""

from __future__ import annotations

import argparse
import os
import sys
from enum import IntEnum
from typing import TextIO, Tuple

from mf_celldump.userinput import IndexSelection

ALL = "all"


class ExitCode(IntEnum):
    OK = 0
    FOUND = 1  # problems, a divergence, an anomaly: the command ran and reports them
    BAD_INPUT = 2
    INTERNAL = 3
    COMMON_FACTOR = 4  # compare: every difference is one factor (clipping, a loss scale), neither 0 nor 1
    INTERRUPTED = 130
    READER_GONE = 141  # 128 + SIGPIPE: stdout's reader closed it (| head)


def add_selection_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    """``--steps`` and ``--ranks`` with one spelling and one default (``all``)."""
    parser.add_argument("--steps", metavar="SPEC", default=ALL,
                        help=f"steps to {verb}: all, 3, '0,5-7' (default: all)")
    parser.add_argument("--ranks", metavar="SPEC", default=ALL,
                        help=f"ranks to {verb}: all, 0, '0-3' (default: all)")


def parse_selection(args: argparse.Namespace) -> Tuple[IndexSelection, IndexSelection]:
    """The (steps, ranks) of ``add_selection_arguments``; raises ``ConfigError`` naming the option."""
    return IndexSelection.parse(args.steps, "--steps"), IndexSelection.parse(args.ranks, "--ranks")


def bad_input(message: object) -> ExitCode:
    """Print ``error: message`` on stderr; the exit code of bad input."""
    print(f"error: {message}", file=sys.stderr)
    return ExitCode.BAD_INPUT


def emit(text: str, out: TextIO) -> None:
    """Print ``text`` to ``out``; a reader that went away (``| head``) is not an error.

    The command still returns the exit status of what it found. Later writes to stdout
    (Python flushes it at exit) go to the null device instead of failing again.
    """
    try:
        print(text, file=out)
        out.flush()
    except BrokenPipeError:
        if out is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
