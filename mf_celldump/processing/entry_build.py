"""From one step's captures to the entries its output holds: grouped, linked, checked and named, over a store.

Every step takes this one path, one cell at a time: numbering calls, grouping entries and
checking them only ever look at the captures of one cell, and a cell's parents at its
entries and those of its nearest captured ancestors. An :class:`EntryStore` holds the
captures and the entries between those stages: :class:`HeldStore` in memory (the usual
case, where the captures' files are then read), ``capture_index.CaptureIndex`` in an SQLite
file (a records file too large to hold), so memory holds one cell's values whatever the
step's size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Protocol, Set, Tuple

from mf_celldump import fsutil
from mf_celldump.errors import UnsafePathError
from mf_celldump.layout import naming
from mf_celldump.processing import msprobe_json
from mf_celldump.processing.consumer_parts import ContentOf, merge_consumer_parts
from mf_celldump.processing.entries import (
    Entry,
    ShapeOf,
    ancestor_names,
    assign_calls,
    group_entries,
    implausible_calls,
    link_parents,
)
from mf_celldump.rawformat.keys import Capture
from mf_celldump.rawformat.manifest import CellRecord, Manifest

BodyOf = Callable[[Entry], dict]  # an entry's dump.json body (msprobe_json.entry_json with the step's files)


class EntryStore(Protocol):
    """Where one step's captures and entries are while ``build_step`` links them and the output is written.

    A store lets an entry's captures go when it has its body: ``add`` may call ``body_of``
    then (a store on disk keeps no captures), or ``bodies`` later (a store in memory, whose
    captures' files are read in between and fill ``body_of``'s failures).
    """

    def cells(self) -> List[int]: ...  # the cell ids holding captures, ascending

    def captures_of(self, cell: int) -> List[Capture]: ...  # one cell's captures, in file order

    def add(self, entries: List[Entry], written: List[Entry], body_of: BodyOf) -> None:
        """One cell's entries, all (they place parents) and those written (a subset)."""

    def entry_cells(self) -> List[Tuple[int, str]]: ...  # (cell, direction) of every entry not parameters_grad

    def entries_of(self, cell: CellRecord) -> List[Entry]: ...  # one cell's entries (captures not needed)

    def set_parents(self, cell: CellRecord, entries: List[Entry]) -> None:
        """Keep the parents ``link_step`` set on ``entries`` (from ``entries_of(cell)``)."""

    def finish(self) -> None: ...  # every entry added and linked

    def held(self) -> List[Entry]: ...  # the written entries whose captures are held: their files are read

    def bodies(self, body_of: BodyOf) -> Iterator[Tuple[str, str]]: ...  # (name, encoded body), execution order

    def nodes(self) -> Iterator[Tuple[str, int, Optional[str]]]: ...  # (name, cell, parent) not parameters_grad

    def counts(self) -> Tuple[int, int]: ...  # (written entries, of which parameters_grad)

    def values(self) -> int: ...  # captures that came from records or csv rows, not from a file


MAX_NAMED_REPEATS = 20  # "a second capture" problems named one by one per step; the rest are counted


@dataclass
class SecondCaptures:
    """The step's values captured twice under one name: the first few named, then counted."""

    named: List[str] = field(default_factory=list)
    unnamed: int = 0
    first_unnamed: str = ""

    def add(self, capture: Capture, first: Capture, where: str) -> None:
        if len(self.named) < MAX_NAMED_REPEATS:
            self.named.append(f"{capture.origin}: a second capture of {where} (first: {first.origin}); not used, "
                              "raw data kept")
            return
        self.unnamed += 1
        self.first_unnamed = self.first_unnamed or str(capture.origin)

    def finish(self, problems: List[str]) -> None:
        problems.extend(self.named)
        if self.unnamed:
            problems.append(f"{self.unnamed} more second captures not used, not listed (the first at "
                            f"{self.first_unnamed}); raw data kept")


def build_step(manifest: Manifest, store: EntryStore, shape_of: ShapeOf, problems: List[str],
               warnings: List[str], body_of: BodyOf, content_of: Optional[ContentOf] = None) -> None:
    """The step's entries into ``store``, cell by cell, then linked; duplicates and bad names become problems."""
    seconds = SecondCaptures()
    for cell in store.cells():
        entries = _grouped_entries(manifest, store.captures_of(cell), problems, shape_of, warnings, content_of)
        written = _usable_entries(manifest, entries, problems, seconds)
        warnings.extend(implausible_calls(written))
        store.add(entries, written, body_of)
    seconds.finish(problems)
    link_step(manifest, store)
    store.finish()


def _grouped_entries(manifest: Manifest, captures: List[Capture], problems: List[str], shape_of: ShapeOf,
                     warnings: List[str], content_of: Optional[ContentOf] = None) -> List[Entry]:
    """Entries in execution order, calls numbered, parents not yet linked."""
    captures = merge_consumer_parts(captures, shape_of, problems, warnings, content_of)
    assign_calls(captures, shape_of, manifest.micro_batches)
    return group_entries(captures, manifest.cells, problems)


def _usable_entries(manifest: Manifest, entries: List[Entry], problems: List[str],
                    seconds: SecondCaptures) -> List[Entry]:
    """The entries whose names and index paths can be written, each capture given its data name;
    a second value under one name is not used (``seconds``)."""
    safe = []
    for entry in entries:
        try:
            fsutil.check_component(entry.name)
        except UnsafePathError as err:
            problems.append(f"{manifest.path}: cell {entry.cell.cell_id}: {err}; its captures are skipped")
            continue
        gaps = msprobe_json.index_gap_problem(entry.captures)
        if gaps is not None:
            problems.append(f"{entry.name}: {gaps}; its captures are skipped")
            continue
        safe.append(entry)
        _name_captures(entry, problems, seconds)
    return safe


def _name_captures(entry: Entry, problems: List[str], seconds: SecondCaptures) -> None:
    seen: Dict[Tuple[str, str], Capture] = {}
    for capture in entry.captures:
        io, label = msprobe_json.io_label_of(capture, entry.cell)
        first = seen.get((io, label))
        if first is not None:
            seconds.add(capture, first, f"{entry.name}.{io}.{label}")
            continue
        try:
            capture.data_name = fsutil.check_component(msprobe_json.data_name_of(entry.name, io, label))
        except UnsafePathError as err:
            problems.append(f"{capture.origin}: {err}; not used")
            continue
        seen[(io, label)] = capture


# (direction in which an ancestor is the nearest captured one, which of its entries its children's parents use)
_ANCESTOR_ENTRIES = ((naming.FORWARD, (naming.FORWARD, naming.BACKWARD)), (naming.BACKWARD, (naming.BACKWARD,)))


def link_step(manifest: Manifest, store: EntryStore) -> None:
    """``entries.link_parents`` for each cell, given the cell's entries and those of its nearest captured
    ancestor in each direction: all that its entries' parents depend on, so a store on disk is read a
    few cells at a time."""
    by_name: Dict[str, List[CellRecord]] = {}
    for cell in manifest.cells.values():
        by_name.setdefault(cell.name, []).append(cell)
    entry_cells = store.entry_cells()
    captured: Dict[str, Set[str]] = {}  # direction -> names of cells with entries in it
    for cell_id, direction in entry_cells:
        captured.setdefault(direction, set()).add(manifest.cells[cell_id].name)
    for cell_id in sorted({cell_id for cell_id, _ in entry_cells}):
        cell = manifest.cells[cell_id]
        own = store.entries_of(cell)
        subset = list(own)
        # forward parents come from the forward ancestor's calls, and backward ones mirror them onto its
        # backward calls; a backward entry without a mirror takes the backward ancestor's calls by order
        for direction, kept in _ANCESTOR_ENTRIES:
            ancestor = next((name for name in ancestor_names(cell.name) if name in captured.get(direction, ())),
                            None) if cell.name else None
            if ancestor is not None:
                subset.extend(entry for other in by_name[ancestor] for entry in store.entries_of(other)
                              if entry.direction in kept)
        link_parents(sorted(subset, key=lambda entry: (entry.first, entry.name)), of=own)
        store.set_parents(cell, own)


class HeldStore:
    """An :class:`EntryStore` in memory: the step's captures, then its entries with theirs."""

    def __init__(self, captures: List[Capture]):
        self._captures: Dict[int, List[Capture]] = {}
        for capture in captures:
            self._captures.setdefault(capture.key.cell_id, []).append(capture)
        self._values = sum(1 for capture in captures if capture.file is None)
        self._entries: Dict[int, List[Entry]] = {}  # cell -> its entries, all
        self._written: List[Entry] = []

    def cells(self) -> List[int]:
        return sorted(self._captures)

    def captures_of(self, cell: int) -> List[Capture]:
        return self._captures.pop(cell)  # held from now on by the cell's entries

    def add(self, entries: List[Entry], written: List[Entry], body_of: BodyOf) -> None:
        for entry in entries:
            self._entries.setdefault(entry.cell.cell_id, []).append(entry)
        self._written.extend(written)

    def entry_cells(self) -> List[Tuple[int, str]]:
        return list({(entry.cell.cell_id, entry.direction) for entries in self._entries.values()
                     for entry in entries if not entry.is_parameters_grad})

    def entries_of(self, cell: CellRecord) -> List[Entry]:
        return self._entries.get(cell.cell_id, [])

    def set_parents(self, cell: CellRecord, entries: List[Entry]) -> None:
        """Nothing to keep: ``entries`` are the held ones."""

    def finish(self) -> None:
        self._entries.clear()
        self._written.sort(key=lambda entry: (entry.first, entry.name))

    def held(self) -> List[Entry]:
        return self._written

    def bodies(self, body_of: BodyOf) -> Iterator[Tuple[str, str]]:
        return ((entry.name, msprobe_json.encoded(body_of(entry))) for entry in self._written)

    def nodes(self) -> Iterator[Tuple[str, int, Optional[str]]]:
        return ((entry.name, entry.cell.cell_id, entry.parent) for entry in self._written
                if not entry.is_parameters_grad)

    def counts(self) -> Tuple[int, int]:
        return len(self._written), sum(1 for entry in self._written if entry.is_parameters_grad)

    def values(self) -> int:
        return self._values
