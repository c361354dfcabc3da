"""Which of our cells find a partner in a baseline dump under ``msprobe compare -lm``, and why not.

Input: the resolutions of :mod:`mf_celldump.mapping.baseline_names` and the cells a
baseline dump has entries for. A cell finds a partner when the baseline has entries at
exactly the path msprobe looks up; otherwise the reason names the deepest part of that
path the baseline has and its nearest children.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set

from mf_celldump.mapping.baseline_names import Resolution


@dataclass(frozen=True)
class Partner:
    cell: str
    cls: str
    baseline: str
    via: str  # the mapping entry (file:line) that renamed the last part, or "" when the name was kept
    found: Optional[bool] = None  # None: no baseline given
    reason: str = ""


def find_partners(
    resolutions: Iterable[Resolution], classes: Dict[str, str], baseline: Optional[Dict[str, Set[str]]]
) -> List[Partner]:
    """``baseline``: baseline cell -> directions it has entries for (None: only resolve)."""
    nodes: Dict[str, Set[str]] = {}
    for cell in baseline or {}:
        parts = cell.split(".")
        nodes.setdefault(cell, set())
        for size in range(len(parts)):
            nodes.setdefault(".".join(parts[:size]), set()).add(parts[size])
    out = []
    for item in resolutions:
        via = item.entry.where if item.entry is not None else ""
        if baseline is None:
            out.append(Partner(item.cell, classes.get(item.cell, ""), item.baseline, via))
        elif item.baseline in baseline:
            out.append(Partner(item.cell, classes.get(item.cell, ""), item.baseline, via, True))
        else:
            reason = _why_not(item.baseline, nodes)
            out.append(Partner(item.cell, classes.get(item.cell, ""), item.baseline, via, False, reason))
    return out


def _why_not(path: str, nodes: Dict[str, Set[str]]) -> str:
    parts = path.split(".")
    for size in range(len(parts) - 1, -1, -1):
        prefix = ".".join(parts[:size])
        children = nodes.get(prefix)
        if children is None:
            continue
        missing = parts[size]
        near = difflib.get_close_matches(missing, sorted(children), n=3, cutoff=0.4)
        where = f"under {prefix!r}" if prefix else "at the top"
        if near:
            hint = f"nearest: {', '.join(near)}"
        else:
            hint = f"it has: {', '.join(sorted(children)[:6])}" if children else "it has no children"
        return f"the baseline has no {missing!r} {where} ({hint})"
    return "the baseline dump has no cells"


def format_partners(partners: List[Partner], baseline_label: Optional[str]) -> str:
    lines = ["baseline names (as msprobe compare -lm resolves them):"]
    for item in partners:
        via = f"  [{item.via}]" if item.via else "  [name kept]"
        state = "" if item.found is None else ("  found" if item.found else f"  NO PARTNER: {item.reason}")
        lines.append(f"  {item.cell} ({item.cls}) -> {item.baseline}{via}{state}")
    if baseline_label is not None:
        found = sum(1 for item in partners if item.found)
        lines.append(f"partners in {baseline_label}: {found} of {len(partners)} cells")
    return "\n".join(lines)
