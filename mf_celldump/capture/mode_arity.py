"""Layer-mapping entries that give more input modes than the cell's ``construct`` takes.

A mode list longer than the arguments is accepted by the file format, and the extra
modes are simply never used; that usually means the entry was written for another
cell (or a different model version), so capture says which modes are surplus.
"""

from __future__ import annotations

import inspect
from typing import Iterable, List, Mapping, Optional, Tuple

from mf_celldump.mapping import ArgModes


def positional_inputs(cell) -> Optional[Tuple[str, ...]]:
    """Names of the positional parameters of the cell class's ``construct``; None when unbounded (``*args``)."""
    try:
        signature = inspect.signature(type(cell).construct)
    except (TypeError, ValueError):
        return None
    names = []
    for name, param in signature.parameters.items():
        if param.kind == param.VAR_POSITIONAL:
            return None
        if name != "self" and param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            names.append(name)
    return tuple(names)


def surplus_mode_warnings(modes: Mapping[str, ArgModes], cells: Iterable[Tuple[str, object]]) -> List[str]:
    """One message per cell whose mapping entry lists more input modes than its ``construct`` takes.

    ``modes`` is cell name -> modes (``mapping.modes_for_network``); ``cells`` yields
    (cell name, cell) pairs, e.g. ``model.cells_and_names()``.
    """
    out = []
    for name, cell in cells:
        entry = modes.get(name)
        if entry is None:
            continue
        params = positional_inputs(cell)
        if params is None or len(entry.input_modes) <= len(params):
            continue
        surplus = entry.input_modes[len(params):]
        where = f"{entry.where}: " if entry.where else ""
        out.append(
            f"{where}{name} ({type(cell).__name__}) takes {len(params)} input(s) ({', '.join(params)}) but the "
            f"entry {entry.format()} gives {len(entry.input_modes)} input modes; surplus, ignored: "
            f"{', '.join(f'#{len(params) + i} {m}' for i, m in enumerate(surplus))}")
    return out
