"""Which baseline name each of our cells gets under ``msprobe compare -lm``, resolved as msprobe does.

Facts from msprobe 26.2 (msprobe/core/compare/layer_mapping/layer_mapping.py, read, not copied):

* A dump becomes a tree rooted at a node of type ``TopLayer``; each entry ``Cell.a.b.C.forward.0``
  adds the path ``a`` -> ``b``. A node's type is the class of the last entry inserted at it; a
  node that has no entry of its own (a ``CellList`` is never called) keeps its own name as type.
  The model root is not in a dump, so a section keyed by the root's class never applies.
* The mapping file is read with ``yaml.safe_load``; a section named ``Cell`` replaces
  ``TopLayer``. In each section a key is grouped by its first dotted part; each value is cut
  at the first ``(`` (the rest, our modes and rules, is ignored). Keys of one group are tried
  longest first (number of dotted parts), file order among equals.
* Renaming walks down from the root: at a node of type T with next name part c, the first key
  of group c in section T that equals the next parts of the path replaces them by its value;
  otherwise c stays. The walk then continues below the node the key reached.
* The baseline entry is the one at the renamed path with the same direction (forward,
  backward, parameters_grad) and the same position among that node's entries of that
  direction (in dump order), i.e. the same call number when every call is dumped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

from mf_celldump.mapping.modes import TOP_LAYER, ArgModes, LayerMapping

# msprobe renames a section called "Cell" to TopLayer (its older name for the root).
OLD_TOP_LAYER = "Cell"
# Cells that are never called, so never get an entry of their own (their node type is their name).
CONTAINER_CLASSES = frozenset({"CellList", "CellDict", "ModuleList", "ModuleDict"})
# Class given to a path that has no entries of its own in a dump (an ancestor of dumped cells).
NOT_DUMPED = "(not dumped)"
_NAMELESS = CONTAINER_CLASSES | {NOT_DUMPED}

_Candidate = Tuple[str, str, int, ArgModes]  # key, baseline value, number of parts, entry


@dataclass(frozen=True)
class Resolution:
    """Our cell, the baseline path msprobe looks up for it, and the entries used on the way."""

    cell: str
    baseline: str
    entry: Optional[ArgModes]  # the entry whose key ended at this cell (None: name kept)
    renamed_by: Tuple[ArgModes, ...]  # every entry used on the walk, root first


class MsprobeView:
    """A layer mapping as msprobe's compare reads it: section -> first part -> candidates, longest first."""

    def __init__(self, mapping: LayerMapping):
        sections: Dict[str, Dict[str, ArgModes]] = dict(mapping.classes)
        top = sections.pop(OLD_TOP_LAYER, None)
        sections[TOP_LAYER] = top if top is not None else dict(mapping.top_layer)
        self.sections: Dict[str, Dict[str, List[_Candidate]]] = {}
        self.self_entries: Dict[str, ArgModes] = {}
        for section, entries in sections.items():
            groups: Dict[str, List[_Candidate]] = {}
            for key, entry in entries.items():
                if key == "":
                    self.self_entries[section] = entry
                    continue
                parts = key.split(".")
                groups.setdefault(parts[0], []).append((key, entry.bench_name, len(parts), entry))
            for candidates in groups.values():
                candidates.sort(key=lambda item: -item[2])
            self.sections[section] = groups

    def resolve(self, cell: str, type_of) -> Resolution:
        """Walk ``cell`` (dotted name) from the root; ``type_of(prefix)`` is msprobe's node type."""
        parts = cell.split(".")
        out: List[str] = []
        used: List[ArgModes] = []
        node_type = TOP_LAYER
        index = 0
        last: Optional[ArgModes] = None
        while index < len(parts):
            step, target, last = 1, parts[index], None
            for key, value, level, entry in self.sections.get(node_type, {}).get(parts[index], ()):
                if ".".join(parts[index : index + level]) == key:
                    step, target, last = level, value, entry
                    used.append(entry)
                    break
            out.append(target)
            index += step
            node_type = type_of(".".join(parts[:index]))
        return Resolution(cell, ".".join(out), last, tuple(used))


def type_lookup(classes: Dict[str, str]):
    """msprobe's node type for a path: the class of a cell that has entries, else the path's last part."""

    def type_of(path: str) -> str:
        cls = classes.get(path)
        if cls is None or cls in _NAMELESS:
            return path.rpartition(".")[2]
        return cls

    return type_of


def resolve_cells(mapping: LayerMapping, named: Iterable[Tuple[str, str]]) -> List[Resolution]:
    """Baseline path of every (cell name, class) pair that msprobe would see (root and containers skipped)."""
    named = list(named)
    pairs = [(name, cls) for name, cls in named if name and cls not in _NAMELESS]
    view = MsprobeView(mapping)
    type_of = type_lookup(dict(named))
    return [view.resolve(name, type_of) for name, _ in pairs]
