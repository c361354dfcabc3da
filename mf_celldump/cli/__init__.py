"""The ``mf-celldump`` command: one module per sub-command, conventions in ``conventions``.

Each sub-command module exposes ``add_cli(subparsers)``, which registers it and sets
``func`` (returning an exit code) on the parsed namespace. The logic each one runs lives
in its subsystem (processing, mapping, compare, integrations); these modules only parse
arguments and print.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from mf_celldump.cli.conventions import ExitCode


def build_parser() -> argparse.ArgumentParser:
    from mf_celldump import __version__
    from mf_celldump.cli import anomalies, compare, health, mapping, process, ranks, register_path

    parser = argparse.ArgumentParser(
        prog="mf-celldump",
        description="Cell-level precision dump for MindSpore/MindFormers in msprobe's layout.",
    )
    parser.add_argument("--version", action="version", version=f"mf-celldump {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in (process, mapping, register_path, compare, anomalies, health, ranks):
        module.add_cli(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run one sub-command; whatever happens, the user gets a message and an exit status, not a traceback.

    Sub-commands report bad input themselves (``conventions.ExitCode``). What still escapes
    is a reader of the output that went away (quiet, exit 141), a file system failure (a
    message naming the path) or a bug in mf_celldump (exit 3; ``-v`` shows the traceback to
    report).
    """
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # here, not at exit (``--help`` too): a reader gone by now is handled below
    except BrokenPipeError:
        return _reader_gone()


def _run(argv: Optional[List[str]]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        raise
    except KeyboardInterrupt:
        print("interrupted; re-running the same command finishes the work safely", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except Exception as err:  # a bug: say so briefly, the traceback with -v
        logging.getLogger(__name__).debug("internal error", exc_info=True)
        print(f"internal error in mf-celldump ({type(err).__name__}: {str(err)[:300]}); run with -v for the "
              "traceback and report it", file=sys.stderr)
        return ExitCode.INTERNAL


def _reader_gone() -> int:
    """The reader of stdout went away (``| head -3``): stop quietly, as a Unix tool stopped by SIGPIPE does.

    What is still buffered, and anything written at exit, goes to the null device instead of
    failing again with a message about a pipe the user closed on purpose.
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return ExitCode.READER_GONE

if __name__ == "__main__":
    sys.exit(main())
