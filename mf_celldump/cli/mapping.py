"""``mf-celldump mapping``: list, show and check layer-mapping files.

Exit codes: 0 fine, 1 a checked file is invalid or has entries matching no cell,
2 the command cannot run (missing file, unknown name, model that does not build).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import tempfile
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from mf_celldump.cli.conventions import ExitCode, bad_input
from mf_celldump.errors import MappingError, ModelSpecError
from mf_celldump.mapping.baseline_names import resolve_cells
from mf_celldump.mapping.check import cells_with_classes, check_mapping, dump_cells
from mf_celldump.mapping.modes import format_mapping
from mf_celldump.mapping.partners import find_partners, format_partners
from mf_celldump.mapping.resolve import AUTO, bundled_classes, bundled_names, load_one, named_classes, resolve_mapping
from mf_celldump.mapping.sample_networks import BUILTIN_MODELS, build_model

logger = logging.getLogger(__name__)


def add_cli(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``mapping {list,show,check}`` on an argparse sub-parsers object."""
    parser = subparsers.add_parser(
        "mapping",
        help="list, show and check layer-mapping files",
        description="Layer-mapping files set per-cell dump modes (in/out) and baseline names.",
    )
    actions = parser.add_subparsers(dest="mapping_action", metavar="ACTION")
    actions.required = True

    list_parser = actions.add_parser("list", help="bundled mappings and the classes they cover")
    list_parser.set_defaults(func=run_list)

    show = actions.add_parser("show", help="print a mapping as parsed (bundled name or file)")
    show.add_argument("source", metavar="NAME|FILE", help="bundled name (see 'mapping list') or YAML file")
    show.set_defaults(func=run_show)

    check = actions.add_parser(
        "check",
        help="validate mapping files; with --model, match them against a real network",
        description=(
            "Without --model, only the syntax is checked. With --model, the files are layered as the "
            "layer_mapping setting would (bundled first, user files over them; 'auto' allowed) and matched "
            "against the model's cells. Exit 1 when problems are found, 2 on bad input."
        ),
    )
    check.add_argument("files", nargs="+", metavar="FILE", help="mapping files, bundled names, or 'auto'")
    check.add_argument(
        "--model",
        metavar="SPEC",
        help=f"a built-in tiny MindFormers model ({', '.join(BUILTIN_MODELS)}) or "
        "'package.module:callable' returning an nn.Cell",
    )
    check.add_argument(
        "--target",
        metavar="DIR",
        help="one of our dumps (msprobe layout): take the cells and classes from it instead of --model",
    )
    check.add_argument(
        "--baseline",
        metavar="DIR",
        help="a baseline dump (e.g. msprobe's PyTorch dump of Megatron): list which of our cells find a "
        "partner under msprobe compare -lm, and why not",
    )
    check.set_defaults(func=run_check)
    return parser


def run_list(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    for name in bundled_names():
        print(f"{name}: {', '.join(sorted(bundled_classes(name)))}", file=out)
    return ExitCode.OK


def run_show(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    try:
        mapping = load_one(args.source)
    except MappingError as err:
        return bad_input(err)
    print(format_mapping(mapping), file=out)
    return ExitCode.OK


def run_check(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    specs: List[str] = list(args.files)
    missing = [s for s in specs if s != AUTO and s not in bundled_names() and not os.path.exists(s)]
    if missing:
        return bad_input(f"not found: {', '.join(missing)}; give existing files or bundled names "
                         f"({', '.join(bundled_names())})")
    if args.model is None and args.target is None:
        if args.baseline:
            return bad_input("--baseline needs --model or --target (our cells)")
        return _check_syntax(specs, out)
    try:
        pairs = _our_cells(args)
        baseline = dump_cells(args.baseline) if args.baseline else None
    except (ModelSpecError, ValueError) as err:
        return bad_input(err)
    try:
        mapping = resolve_mapping(tuple(specs), {cls for _, cls in pairs})
    except MappingError as err:
        print(f"error: {err}", file=sys.stderr)
        return ExitCode.FOUND
    report = check_mapping(mapping, pairs, whole_network=args.target is None)
    print(report.format(), file=out)
    classes = dict(pairs)
    partners = find_partners(resolve_cells(mapping, pairs), classes, baseline)
    print(format_partners(partners, args.baseline), file=out)
    return ExitCode.FOUND if report.has_problems else ExitCode.OK


def _our_cells(args: argparse.Namespace) -> List[Tuple[str, str]]:
    if args.target:
        return cells_with_classes(args.target)
    try:
        with library_output(shown=getattr(args, "verbose", False)):
            network = build_model(args.model)
    except ModelSpecError as err:
        raise ModelSpecError(f"--model {args.model}: {err}") from None
    return named_classes(network.cells_and_names())


@contextlib.contextmanager
def library_output(shown: bool) -> Iterator[None]:
    """Keep what MindSpore and MindFormers print while a model is built (dozens of log lines, some from
    C++ straight to the file descriptors) out of the report; ``-v`` shows it afterwards on stderr.

    File descriptors 1 and 2 point at a temporary file meanwhile, which catches Python's and the
    C++ runtime's output alike.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as captured:
        try:
            os.dup2(captured.fileno(), 1)
            os.dup2(captured.fileno(), 2)
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, original in zip((1, 2), saved):
                os.dup2(original, fd)
                os.close(original)
            if shown:
                captured.seek(0)
                sys.stderr.write(captured.read().decode("utf-8", "replace"))
                sys.stderr.flush()


def _check_syntax(specs: Sequence[str], out) -> int:
    status = ExitCode.OK
    for spec in specs:
        if spec == AUTO:
            print("auto: needs --model to pick bundled mappings; skipped", file=out)
            continue
        try:
            mapping = load_one(spec)
        except MappingError as err:
            print(f"error: {err}", file=out)
            status = ExitCode.FOUND
            continue
        print(
            f"ok: {spec}: {len(mapping.classes)} class sections, {mapping.entry_count()} entries "
            "(syntax only: class and cell names not checked; add --model NAME, or --target DUMP for a dump's "
            "cells, to check them)",
            file=out,
        )
    return status


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``mapping`` on its own: ``python -m mf_celldump.cli.mapping check FILE``."""
    parser = argparse.ArgumentParser(prog="mf-celldump")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_cli(sub)
    args = parser.parse_args(["mapping", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
