"""The cells and classes found in a dump (ours or a baseline), read through ``layout``.

``mapping check --target/--baseline`` matches a mapping against them without a network.
"""

from __future__ import annotations

from typing import Dict, List, Set, Tuple

from mf_celldump.layout.naming import parse_entry_name
from mf_celldump.layout.reader import DumpError, DumpJson, find_rank_dumps
from mf_celldump.mapping.baseline_names import NOT_DUMPED


def cells_with_classes(path: str) -> List[Tuple[str, str]]:
    """(cell, class) of every cell with entries in a dump, in first-seen order."""
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
