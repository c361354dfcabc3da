"""Compare a layer mapping with a real network: what matches nothing, what is left uncovered.

A mapping key that names no cell is silently ignored at dump time, so a typo would
quietly dump with default modes; this report makes such keys visible, with the
nearest real names, at attach time and from ``mf-celldump mapping check``. Without a
network, ``mapping check --target/--baseline`` matches a mapping against the cells and
classes found in a dump (ours or a baseline), read through ``layout``.
"""

from __future__ import annotations

import bisect
import difflib
import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Sequence, Set, Tuple

from mf_celldump.errors import DumpError
from mf_celldump.layout.naming import parse_entry_name
from mf_celldump.layout.reader import DumpJson, find_rank_dumps
from mf_celldump.mapping.baseline_names import NOT_DUMPED
from mf_celldump.mapping.modes import MODE_OUT, TOP_LAYER, ArgModes, LayerMapping
from mf_celldump.mapping.resolve import child_name, modes_for_network, named_classes

# Containers are never called themselves and their items are numbered, which the
# format cannot address generically; their items are covered by their own classes.
CONTAINER_CLASSES = frozenset({"CellList", "SequentialCell", "CellDict"})


@dataclass(frozen=True)
class UnmatchedEntry:
    """A child key (or TopLayer name) that names no cell of the network.

    ``candidates`` are the names it could have meant (shared between entries); the nearest
    are found only when the entry is described, so checking a mapping of many thousand
    entries costs no similarity search for the entries nobody reads.
    """

    section: str
    key: str
    entry: ArgModes
    candidates: Sequence[str] = field(default=(), compare=False, repr=False)

    @property
    def suggestions(self) -> Tuple[str, ...]:
        return _nearest(self.key, list(self.candidates))

    def describe(self) -> str:
        what = f"cell {self.key!r}" if self.section == TOP_LAYER else f"child {self.key!r}"
        near = f" (nearest: {', '.join(self.suggestions)})" if self.suggestions else " (no similar name)"
        return f"{self.entry.where}: {self.section}: {what} matches no cell{near}"


@dataclass(frozen=True)
class AbsentClass:
    """A class section whose class no cell has: fine in a bundled file (it names the classes of a
    whole family), a likely typo in a user's file, when the cells checked are the whole network's.

    ``candidates`` are the classes present, for the did-you-mean, found only when described."""

    class_name: str
    entries: int
    sources: Tuple[str, ...]
    bundled: bool = True
    candidates: Sequence[str] = field(default=(), compare=False, repr=False)

    def describe(self) -> str:
        near = difflib.get_close_matches(self.class_name, list(self.candidates), n=1, cutoff=0.6)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        return f"{self.class_name} ({self.entries} entries, from {', '.join(self.sources)}){hint}"


@dataclass(frozen=True)
class UncoveredChild:
    """A direct child of a cell of a mapped class that gets no entry (dumped with ``out``)."""

    class_name: str
    child: str
    child_class: str
    example: str

    def describe(self) -> str:
        return f"{self.class_name}: {self.child} ({self.child_class}), e.g. {self.example!r}"


@dataclass
class MappingReport:
    """Result of :func:`check_mapping`; problems are unmatched entries from user files."""

    sources: Tuple[str, ...] = ()
    unmatched: List[UnmatchedEntry] = field(default_factory=list)
    absent_classes: List[AbsentClass] = field(default_factory=list)
    uncovered: List[UncoveredChild] = field(default_factory=list)
    cells_with_modes: int = 0
    cells_total: int = 0
    classes_checked: bool = True  # the cells are a whole network's (not a dump's, which lacks excluded cells)

    @property
    def problems(self) -> List[UnmatchedEntry]:
        """Unmatched entries from user files: most likely typos or a different model."""
        return [item for item in self.unmatched if not item.entry.bundled]

    @property
    def absent_user_classes(self) -> List[AbsentClass]:
        """Class sections of a user's file whose class no cell of the network has: most likely typos."""
        return [item for item in self.absent_classes if not item.bundled] if self.classes_checked else []

    @property
    def problem_count(self) -> int:
        return len(self.problems) + len(self.absent_user_classes)

    @property
    def bundled_unmatched(self) -> List[UnmatchedEntry]:
        """Unmatched bundled entries: they cover model variants (e.g. fused projections)."""
        return [item for item in self.unmatched if item.entry.bundled]

    @property
    def has_problems(self) -> bool:
        return self.problem_count > 0

    def format(self) -> str:
        lines = [f"layer mapping from: {', '.join(self.sources) if self.sources else '(none)'}"]
        if self.problems:
            lines.append(f"PROBLEMS, entries that match no cell ({len(self.problems)}):")
            lines.extend(f"  {item.describe()}" for item in self.problems)
        if self.bundled_unmatched:
            lines.append("bundled entries for model variants not present here (fine):")
            lines.extend(f"  {item.describe()}" for item in self.bundled_unmatched)
        if self.absent_user_classes:
            lines.append(f"PROBLEMS, class sections of your files whose class no cell has "
                         f"({len(self.absent_user_classes)}):")
            lines.extend(f"  {item.describe()}" for item in self.absent_user_classes)
        ignored = [item for item in self.absent_classes if item not in self.absent_user_classes]
        if ignored:
            why = "(fine: bundled files name a whole family's classes)" if self.classes_checked else \
                "(ignored: a dump lacks the cells it excluded)"
            lines.append(f"class sections whose class does not occur here {why}:")
            lines.extend(f"  {item.describe()}" for item in ignored)
        if self.uncovered:
            lines.append(f"children of mapped classes without an entry (dumped with mode '{MODE_OUT}'):")
            lines.extend(f"  {item.describe()}" for item in self.uncovered)
        lines.append(
            f"summary: {self.cells_with_modes} of {self.cells_total} cells get modes from the mapping; "
            f"{_count(self.problem_count, 'problem')}"
        )
        return "\n".join(lines)


def check_mapping(mapping: LayerMapping, named_cells: Iterable[Tuple[str, Any]],
                  whole_network: bool = True) -> MappingReport:
    """Check ``mapping`` against a network given as (name, class name) or (name, cell) pairs.

    ``whole_network`` False: the cells are a dump's (``--target``), which lacks the cells the dump
    excluded, so a class none of them has is no problem."""
    pairs = named_classes(named_cells)
    names = sorted({name for name, _ in pairs})
    present = set(names)
    instances: Dict[str, List[str]] = {}
    for name, cls in pairs:
        instances.setdefault(cls, []).append(name)
    report = MappingReport(sources=mapping.sources, cells_total=len(present), classes_checked=whole_network)
    present_classes = sorted(instances)

    for cls, children in mapping.classes.items():
        if cls not in instances:
            if children:
                sources = tuple(dict.fromkeys(m.source for m in children.values()))
                bundled = all(m.bundled for m in children.values())
                report.absent_classes.append(AbsentClass(cls, len(children), sources, bundled, present_classes))
            continue
        relative: List[str] = []
        for key, entry in children.items():
            if any(child_name(parent, key) in present for parent in instances[cls]):
                continue
            relative = relative or _descendants(names, instances[cls][0])
            report.unmatched.append(UnmatchedEntry(cls, key, entry, relative))

    for name, entry in mapping.top_layer.items():
        if name not in present:
            report.unmatched.append(UnmatchedEntry(TOP_LAYER, name, entry, names))

    with_modes = modes_for_network(mapping, pairs)
    report.cells_with_modes = len(with_modes)
    report.uncovered = _uncovered(mapping, pairs, instances, with_modes)
    return report


MAX_LOGGED = 10  # lines of each kind at attach; the rest are summed up in one line


def log_mapping_warnings(report: MappingReport, log: logging.Logger) -> None:
    """Log a report at attach time: problems as warnings, the rest at debug level.

    At most ``MAX_LOGGED`` lines of each kind, then one line saying how many more there are
    (``mf-celldump mapping check`` lists them all): a mapping of many thousand entries for
    another model gives a summary, not a line per entry.
    """
    problems = report.problems
    for item in report.absent_user_classes[:MAX_LOGGED]:
        log.warning("layer mapping: class section %s: no cell of the network has this class", item.describe())
    for item in problems[:MAX_LOGGED]:
        log.warning("layer mapping: %s", item.describe())
    if len(problems) > MAX_LOGGED:
        log.warning("layer mapping: ... and %d more entries that match no cell (%d in all); "
                    "`mf-celldump mapping check FILE --model ...` lists them all", len(problems) - MAX_LOGGED,
                    len(problems))
    if log.isEnabledFor(logging.DEBUG):
        for what, items in (("(bundled variant, not present)", report.bundled_unmatched),
                            ("class not in network", [c for c in report.absent_classes if c.bundled]),
                            ("no entry for", report.uncovered)):
            for item in items[:MAX_LOGGED]:
                log.debug("layer mapping: %s %s", what, item.describe())
            if len(items) > MAX_LOGGED:
                log.debug("layer mapping: %s: ... and %d more", what, len(items) - MAX_LOGGED)
    log.info(
        "layer mapping: %d of %d cells get modes from %s; %s",
        report.cells_with_modes,
        report.cells_total,
        ", ".join(report.sources) if report.sources else "no mapping",
        _count(report.problem_count, "problem"),
    )


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _descendants(sorted_names: List[str], parent: str) -> List[str]:
    if not parent:
        return [name for name in sorted_names if name]
    prefix = parent + "."
    start = bisect.bisect_left(sorted_names, prefix)
    out = []
    for name in sorted_names[start:]:
        if not name.startswith(prefix):
            break
        out.append(name[len(prefix) :])
    return out


def _nearest(key: str, candidates: List[str]) -> Tuple[str, ...]:
    return tuple(difflib.get_close_matches(key, candidates, n=3, cutoff=0.5))


def _uncovered(
    mapping: LayerMapping,
    pairs: List[Tuple[str, str]],
    instances: Dict[str, List[str]],
    with_modes: Dict[str, ArgModes],
) -> List[UncoveredChild]:
    class_of = dict(pairs)
    children_of: Dict[str, List[str]] = {}
    for name, _ in pairs:
        if name:
            children_of.setdefault(name.rpartition(".")[0], []).append(name)
    seen = set()
    out = []
    for cls, entries in mapping.classes.items():
        if not entries:
            continue
        for parent in instances.get(cls, ()):
            for child in children_of.get(parent, ()):
                if class_of[child] in CONTAINER_CLASSES or child in with_modes:
                    continue
                relative = child[len(parent) + 1 :] if parent else child
                if (cls, relative) in seen:
                    continue
                seen.add((cls, relative))
                out.append(UncoveredChild(cls, relative, class_of[child], child))
    return out


# -- the cells of a dump ---------------------------------------------------------------------------------

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
