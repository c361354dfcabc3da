"""``mf-celldump mapping``: list, show and check layer-mapping files.

Exit codes: 0 fine, 1 a checked file is invalid or has entries matching no cell,
2 the command cannot run (missing file, unknown name, model that does not build).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from mf_celldump.mapping.baseline_names import NOT_DUMPED, resolve_cells
from mf_celldump.mapping.bundled import bundled_classes, bundled_name_of, bundled_names, load_bundled
from mf_celldump.mapping.check import check_mapping
from mf_celldump.mapping.entries import TOP_LAYER, LayerMapping, MappingError
from mf_celldump.mapping.parser import load_mapping_file
from mf_celldump.mapping.partners import find_partners, format_partners
from mf_celldump.mapping.resolve import AUTO, named_classes, resolve_mapping
from mf_celldump.mapping.sample_networks import (
    BUILTIN_MODELS,
    ModelSpecError,
    build_builtin,
    stdout_to_stderr,
)

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_BAD_INPUT = 2


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
    return EXIT_OK


def run_show(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    try:
        mapping = _load_one(args.source)
    except MappingError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(format_mapping(mapping), file=out)
    return EXIT_OK


def run_check(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    specs: List[str] = list(args.files)
    missing = [s for s in specs if s != AUTO and s not in bundled_names() and not os.path.exists(s)]
    if missing:
        print(
            f"error: not found: {', '.join(missing)}; give existing files or bundled names "
            f"({', '.join(bundled_names())})",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    if args.model is None and args.target is None:
        if args.baseline:
            print("error: --baseline needs --model or --target (our cells)", file=sys.stderr)
            return EXIT_BAD_INPUT
        return _check_syntax(specs, out)
    try:
        pairs = _our_cells(args)
        baseline = dump_cells(args.baseline) if args.baseline else None
    except (ModelSpecError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        mapping = resolve_mapping(tuple(specs), {cls for _, cls in pairs})
    except MappingError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_PROBLEMS
    report = check_mapping(mapping, pairs)
    print(report.format(), file=out)
    classes = dict(pairs)
    partners = find_partners(resolve_cells(mapping, pairs), classes, baseline)
    print(format_partners(partners, args.baseline), file=out)
    return EXIT_PROBLEMS if report.has_problems else EXIT_OK


def _our_cells(args: argparse.Namespace) -> List[Tuple[str, str]]:
    if args.target:
        return _with_classes(args.target)
    try:
        network = build_model(args.model)
    except ModelSpecError as err:
        raise ModelSpecError(f"--model {args.model}: {err}") from None
    return named_classes(network.cells_and_names())


def _with_classes(path: str) -> List[Tuple[str, str]]:
    """(cell, class) of every cell with entries in a dump, in first-seen order."""
    from mf_celldump.layout.naming import parse_entry_name
    from mf_celldump.layout.reader import DumpError, DumpJson, find_rank_dumps

    try:
        first = find_rank_dumps(path)[0]
        found: Dict[str, str] = {}
        for name, _ in DumpJson(first.dump_json).entries():
            parsed = parse_entry_name(name)
            if parsed is not None:
                found.setdefault(parsed.cell, parsed.cls)
    except DumpError as err:
        raise ValueError(str(err)) from None
    for cell in list(found):  # ancestors without entries (a CellList is never called) still exist
        parts = cell.split(".")
        for size in range(1, len(parts)):
            found.setdefault(".".join(parts[:size]), NOT_DUMPED)
    return list(found.items())


def dump_cells(path: str) -> Dict[str, Set[str]]:
    """Cell -> directions with entries, from the first rank folder of a dump (streamed)."""
    from mf_celldump.layout.naming import parse_entry_name
    from mf_celldump.layout.reader import DumpError, DumpJson, find_rank_dumps

    cells: Dict[str, Set[str]] = {}
    try:
        first = find_rank_dumps(path)[0]
        for name, _ in DumpJson(first.dump_json).entries():
            parsed = parse_entry_name(name)
            if parsed is not None:
                cells.setdefault(parsed.cell, set()).add(parsed.direction)
    except DumpError as err:
        raise ValueError(str(err)) from None
    return cells


def _check_syntax(specs: Sequence[str], out) -> int:
    status = EXIT_OK
    for spec in specs:
        if spec == AUTO:
            print("auto: needs --model to pick bundled mappings; skipped", file=out)
            continue
        try:
            mapping = _load_one(spec)
        except MappingError as err:
            print(f"error: {err}", file=out)
            status = EXIT_PROBLEMS
            continue
        print(
            f"ok: {spec}: {len(mapping.classes)} class sections, {mapping.entry_count()} entries "
            "(syntax only; add --model to match against a network)",
            file=out,
        )
    return status


def _load_one(spec: str) -> LayerMapping:
    if spec in bundled_names() and not os.path.exists(spec):
        return load_bundled(spec)
    same = bundled_name_of(spec) if os.path.isfile(spec) else None
    if same is not None:
        return load_bundled(same)
    if not os.path.exists(spec):
        raise MappingError(
            f"{spec!r} is neither a bundled mapping ({', '.join(bundled_names())}) nor an existing file"
        )
    return load_mapping_file(spec)


def format_mapping(mapping: LayerMapping) -> str:
    """Readable view: one line per entry with effective modes and where it came from."""
    lines = [f"# from: {', '.join(mapping.sources)}"]
    sections: List[Tuple[str, dict]] = list(mapping.classes.items())
    if mapping.top_layer:
        sections.append((TOP_LAYER, mapping.top_layer))
    for section, entries in sections:
        lines.append(f"{section}:")
        if not entries:
            lines.append("  (no entries)")
        for key, modes in entries.items():
            inputs = ", ".join(modes.input_modes) or "-"
            outputs = ", ".join(modes.output_modes) or "-"
            lines.append(
                f"  {key or '(the cell itself)'} -> {modes.bench_name}  inputs: {inputs}  outputs: {outputs}"
                f"  [{modes.where}]"
            )
    return "\n".join(lines)


def build_model(spec: str) -> Any:
    """Build the network named by ``--model``: a built-in name or ``package.module:callable``."""
    if spec in BUILTIN_MODELS:
        return build_builtin(spec)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ModelSpecError(
            f"expected a built-in model ({', '.join(BUILTIN_MODELS)}) or 'package.module:callable', "
            f"got {spec!r}"
        )
    if os.getcwd() not in sys.path:
        # like `python -m`: a module next to the user's files is importable from the console script too
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ModelSpecError(f"cannot import {module_name!r}: {err}") from None
    factory: Optional[Callable[[], Any]] = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ModelSpecError(f"{module_name!r} has no callable {attr!r}")
    try:
        with stdout_to_stderr():
            network = factory()
    except Exception as err:  # a user factory can fail in any way; report it as bad input
        raise ModelSpecError(f"{spec} raised {type(err).__name__}: {err}") from None
    if not hasattr(network, "cells_and_names"):
        raise ModelSpecError(f"{spec} returned {type(network).__name__}, not a MindSpore nn.Cell")
    return network


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``mapping`` on its own: ``python -m mf_celldump.mapping.cli check FILE``."""
    parser = argparse.ArgumentParser(prog="mf-celldump")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    add_cli(sub)
    args = parser.parse_args(["mapping", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
