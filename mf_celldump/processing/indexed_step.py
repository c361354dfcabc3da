"""A step whose records file is too large to hold, processed one cell at a time through a ``CaptureIndex``.

The output is the one ``entry_build.build_entries`` gives for the same captures: numbering
calls, grouping entries and checking them only look at one cell's captures, so they run
per cell; parents look at a cell and its nearest captured ancestors, so they are linked
per cell from the entries already in the index; the three JSON files are streamed from
the index in execution order. Problems are the same, in cell order.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from mf_celldump import fsutil
from mf_celldump.layout import naming
from mf_celldump.processing import msprobe_json
from mf_celldump.processing.capture_index import CaptureIndex, EntryRow, IndexFileError
from mf_celldump.processing.entries import Entry, ShapeOf, ancestor_names, implausible_calls, link_parents
from mf_celldump.processing.entry_build import SecondCaptures, grouped_entries, usable_entries
from mf_celldump.processing.space import human
from mf_celldump.rawformat.captured import Capture, LineOrigin
from mf_celldump.rawformat.manifest import Manifest
from mf_celldump.rawformat.records import Interned, RecordsRead, decode_record, read_records_stream

logger = logging.getLogger(__name__)


def record_keeper(index: CaptureIndex):
    """``records.read_records_stream``'s ``keep``: a value's line goes to the index under its cell."""
    def keep(capture: Capture, raw: bytes) -> None:
        index.keep(capture.key.cell_id, capture.origin.line, capture.order, raw)
    return keep


@dataclass
class IndexedStep:
    """The entries of a step, in the index: what ``_assemble`` needs of them."""

    index: CaptureIndex
    manifest: Manifest
    values: int  # values read from the records file

    def counts(self) -> Tuple[int, int]:
        return self.index.written_counts()

    def held(self) -> List[Entry]:
        return []  # none: RecordsIndexer indexes only a step without tensor files, so no file is read

    def texts(self, data_dir: Optional[str], failed: Dict[int, int]) -> Iterator[Tuple[str, Iterable[str]]]:
        """(file name, text chunks) of the three files, as ``msprobe_json.output_texts`` gives them
        (``failed`` is always empty: no file is read)."""
        cells = self.manifest.cells
        yield naming.DUMP_JSON, msprobe_json.dump_json_encoded(
            self.manifest.task, data_dir, ((name, body) for name, body, _, _, _ in self.index.written()),
            self.manifest.run_id, self.manifest.details.get(naming.PARAMETERS_GRAD_KEY))
        yield naming.CONSTRUCT_JSON, msprobe_json.one_per_line(
            (name, parent) for name, _, _, pgrad, parent in self.index.written() if not pgrad)
        yield naming.STACK_JSON, msprobe_json.one_per_line(
            (name, msprobe_json.stack_lines(cells[cell])) for name, _, cell, pgrad, _ in self.index.written()
            if not pgrad)


def build_indexed(manifest: Manifest, index: CaptureIndex, shape_of: ShapeOf, problems: List[str],
                  warnings: List[str], body_of: Callable[[Entry], dict]) -> IndexedStep:
    """Entries of every cell into the index, then their parents; ``body_of(entry)``: its ``dump.json`` body."""
    seconds = SecondCaptures()
    shared = Interned()
    for cell in index.cells():
        captures = [decode_record(json.loads(raw), LineOrigin(index.source, line), order, shared)
                    for line, order, raw in index.lines_of(cell)]
        entries = grouped_entries(manifest, captures, problems, shape_of, warnings)
        usable = usable_entries(manifest, entries, problems, seconds)
        warnings.extend(implausible_calls(usable))
        written = {id(entry) for entry in usable}
        for entry in entries:
            body = body_of(entry) if id(entry) in written else None
            index.add_entry(entry.first, entry.name, entry.cell.cell_id, entry.direction, entry.call,
                            entry.is_parameters_grad, None if body is None else json.dumps(body))
    seconds.finish(problems)
    _link_parents(manifest, index)
    index.commit()
    return IndexedStep(index, manifest, index.count())


# (direction in which an ancestor is the nearest captured one, which of its entries its children's parents use)
_ANCESTOR_ENTRIES = ((naming.FORWARD, (naming.FORWARD, naming.BACKWARD)), (naming.BACKWARD, (naming.BACKWARD,)))


def _link_parents(manifest: Manifest, index: CaptureIndex) -> None:
    """``entries.link_parents`` for each cell, given the cell's entries and those of its nearest captured
    ancestor in each direction (all that the parents of its entries depend on)."""
    by_name: Dict[str, List[int]] = {}
    for cell in manifest.cells.values():
        by_name.setdefault(cell.name, []).append(cell.cell_id)
    entry_cells = index.entry_cells()
    captured: Dict[str, Set[str]] = {}  # direction -> names of cells with entries in it
    for cell_id, direction in entry_cells:
        captured.setdefault(direction, set()).add(manifest.cells[cell_id].name)
    for cell_id in sorted({cell_id for cell_id, _ in entry_cells}):
        cell = manifest.cells[cell_id]
        own = _entries(manifest, index, [cell_id])
        subset = dict(own)
        # forward parents come from the forward ancestor's calls, and backward ones mirror them onto its
        # backward calls; a backward entry without a mirror takes the backward ancestor's calls by order
        for direction, kept in _ANCESTOR_ENTRIES:
            ancestor = next((name for name in ancestor_names(cell.name) if name in captured.get(direction, ())),
                            None) if cell.name else None
            if ancestor is not None:
                subset.update((rowid, entry) for rowid, entry in _entries(manifest, index, by_name[ancestor])
                              if entry.direction in kept)
        link_parents(sorted(subset.values(), key=lambda entry: (entry.first, entry.name)))
        index.set_parents((entry.parent, rowid) for rowid, entry in own if not entry.is_parameters_grad)


def _entries(manifest: Manifest, index: CaptureIndex, cell_ids: List[int]) -> List[Tuple[int, Entry]]:
    out = []
    for cell_id in cell_ids:
        for row in index.entries_of(cell_id):
            out.append((row[0], _entry(manifest, cell_id, row)))
    return out


def _entry(manifest: Manifest, cell_id: int, row: EntryRow) -> Entry:
    _, name, direction, call, seq, order, _ = row
    return Entry(manifest.cells[cell_id], direction, call, name, (seq, order))


INDEX_RECORDS_BYTES = 32 << 20  # a records file this large (~140k values, ~180 MB held) is read into an index


class RecordsIndexer:
    """``scan.list_step_files``'s records reader: a large records file of a step holding nothing else goes
    into a ``CaptureIndex`` (``index`` once it has), any other into memory."""

    def __init__(self, folder: str, limit: Optional[int] = None):
        self.folder = folder
        self.limit = INDEX_RECORDS_BYTES if limit is None else limit
        self.index: Optional[CaptureIndex] = None
        self.failed: Optional[str] = None  # why the records could not be indexed (the step then stops)

    def __call__(self, handle, path: str, first_order: int, size: int) -> RecordsRead:
        if size < self.limit or first_order or not _usable(self.folder):  # small, or beside tensor files
            return read_records_stream(handle, path, first_order)
        self.index = CaptureIndex(self.folder, path)
        logger.info("%s: %d bytes of records, read into an on-disk index (%s)", path, size, self.index.path)
        try:
            read = read_records_stream(handle, path, first_order, keep=record_keeper(self.index),
                                       first_lines=self.index)
            self.index.commit()
        except BaseException as err:
            self.index.close()
            self.index = None
            if not isinstance(err, IndexFileError):
                raise  # the step reports it, its records unread, as for a file held in memory
            self.failed = (f"{path}: its {size} bytes of records did not fit in an on-disk index in {self.folder} "
                           f"({err.strerror}); the step needs about {human(size * 3 // 2)} free there; the raw data "
                           "is kept: free space and run `mf-celldump process` again")
            return RecordsRead()
        return read


def _usable(folder: str) -> bool:
    """Whether the index can go in ``folder`` (else the step says why it cannot record what it consumed there)."""
    try:
        fsutil.make_dir(folder)
    except fsutil.UnsafePathError:
        return False
    return True
