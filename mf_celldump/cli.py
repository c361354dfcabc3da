"""The ``mf-celldump`` command: one sub-command per subsystem.

Each subsystem module exposes ``add_cli(subparsers)`` that registers its
sub-command and sets ``func`` (returning an exit code) on the parsed namespace.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional


def build_parser() -> argparse.ArgumentParser:
    from mf_celldump import __version__
    from mf_celldump.compare import anomalies as anomalies_cli
    from mf_celldump.compare import cli as compare_cli
    from mf_celldump.integrations import registration_cli
    from mf_celldump.mapping import cli as mapping_cli
    from mf_celldump.processing import cli as processing_cli

    parser = argparse.ArgumentParser(
        prog="mf-celldump",
        description="Cell-level precision dump for MindSpore/MindFormers in msprobe's layout.",
    )
    parser.add_argument("--version", action="version", version=f"mf-celldump {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    processing_cli.add_cli(sub)
    mapping_cli.add_cli(sub)
    registration_cli.add_cli(sub)
    compare_cli.add_cli(sub)
    anomalies_cli.add_cli(sub)
    return parser


EXIT_INTERRUPTED = 130
EXIT_INTERNAL = 3


def main(argv: Optional[List[str]] = None) -> int:
    """Run one sub-command; whatever happens, the user gets a message and an exit status, not a traceback.

    Sub-commands report bad input themselves (exit 1 or 2). What still escapes is a file
    system failure (a message naming the path) or a bug in mf_celldump (exit 3; ``-v``
    shows the traceback to report).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted; re-running the same command finishes the work safely", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # a bug: say so briefly, the traceback with -v
        logging.getLogger(__name__).debug("internal error", exc_info=True)
        print(f"internal error in mf-celldump ({type(err).__name__}: {str(err)[:300]}); run with -v for the "
              "traceback and report it", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
