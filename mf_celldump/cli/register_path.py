"""``mf-celldump register-path``: print the directory to pass to ``run_mindformer.py --register_path``."""

from __future__ import annotations

import argparse
import os
import sys

from mf_celldump.cli.conventions import ExitCode
from mf_celldump.integrations.registration import CALLBACK_CLASS, REGISTRATION_MODULE, registration_dir


def add_cli(subparsers) -> None:
    parser = subparsers.add_parser(
        "register-path",
        help="print the directory for run_mindformer.py --register_path",
        description=(
            "Print the directory that holds the MindFormers registration file of CellDumpCallback. "
            "Pass it as `run_mindformer.py --register_path DIR` (or export REGISTER_PATH=DIR) and add "
            f"`auto_register: {REGISTRATION_MODULE}.{CALLBACK_CLASS}` to the callback entry."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--yaml", action="store_true",
                        help="print the entry to add to the `callbacks:` list of your run config")
    parser.set_defaults(func=_run)


def callback_entry(path: str) -> str:
    """The one entry to add to an existing ``callbacks:`` list (its other entries stay as they are)."""
    return "\n".join([
        "# Add this entry to the `callbacks:` list of your run config, next to the callbacks already there",
        "# (e.g. MFLossMonitor); do not replace the list. Then run with:  --register_path " + path,
        f"  - type: {CALLBACK_CLASS}",
        f"    auto_register: {REGISTRATION_MODULE}.{CALLBACK_CLASS}",
        "    task: statistics            # or tensor",
        "    steps: \"0-2\"               # global steps, 0-based",
    ])


def _run(args) -> int:
    path = registration_dir()
    if not os.path.isfile(os.path.join(path, REGISTRATION_MODULE + ".py")):
        print(f"error: registration file missing under {path}; reinstall mf_celldump", file=sys.stderr)
        return ExitCode.BAD_INPUT
    print(callback_entry(path) if args.yaml else path)
    return ExitCode.OK
