"""The on-disk ``EntryStore``: an SQLite file holding one step's records and entries, for a records file too
large to hold.

Held in memory, a value of ``records.jsonl`` costs about 1.3 KB (its capture, its entry,
the output's structures). Here the lines are kept on disk, grouped by cell: a cell's lines
are read back when ``entry_build.build_step`` builds its entries, and the entries go back
with their ``dump.json`` body, to be streamed in execution order. Memory then holds one
cell's values and SQLite's page cache, whatever the file's size. ``RecordsIndexer`` decides
which records file goes here.

The file is a temporary file of ours in ``_processed/`` (``fsutil.TEMP_PREFIX``: a run
killed while it exists leaves a name the next run recognises and deletes), without a
journal: it is rebuilt from the raw data whenever it is needed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import sqlite3
import tempfile
from typing import Iterable, Iterator, List, Optional, Tuple

from mf_celldump import fsutil
from mf_celldump.errors import IndexFileError, UnsafePathError
from mf_celldump.processing import msprobe_json
from mf_celldump.processing.entries import Entry
from mf_celldump.processing.entry_build import BodyOf
from mf_celldump.processing.space import human
from mf_celldump.rawformat.keys import Capture, LineOrigin
from mf_celldump.rawformat.manifest import CellRecord
from mf_celldump.rawformat.records import Interned, RecordsRead, decode_record, read_records_stream

logger = logging.getLogger(__name__)

CACHE_KIB = 16 * 1024  # SQLite's page cache: the memory the index costs
# The index of the largest records file scan accepts (1 GiB) takes about 1.5 GiB; beyond this
# bound SQLite reports the index full, as a full disk would be reported.
MAX_INDEX_BYTES = 4 << 30
INSERT_BATCH = 4096  # lines kept before they are inserted (one statement for many)

_SCHEMA = (
    "CREATE TABLE seqs(seq INTEGER PRIMARY KEY, line INTEGER NOT NULL)",
    "CREATE TABLE captures(cell INTEGER NOT NULL, line INTEGER NOT NULL, ord INTEGER NOT NULL, raw BLOB NOT NULL)",
    "CREATE INDEX captures_by_cell ON captures(cell, line)",
    "CREATE TABLE entries(seq INTEGER NOT NULL, ord INTEGER NOT NULL, name TEXT NOT NULL, cell INTEGER NOT NULL,"
    " direction TEXT NOT NULL, call INTEGER NOT NULL, pgrad INTEGER NOT NULL, kept INTEGER NOT NULL,"
    " body TEXT, parent TEXT)",
    "CREATE INDEX entries_in_order ON entries(seq, ord, name)",
    "CREATE INDEX entries_by_cell ON entries(cell, name)",
)

def _os_error(err: sqlite3.Error, path: str) -> OSError:
    full = "full" in str(err).lower()
    code = errno.ENOSPC if full else errno.EIO
    return IndexFileError(code, f"{os.strerror(code)} (the on-disk index of a large records file: {err})", path)


class CaptureIndex:
    """One step's records lines by cell, then its entries (an ``entry_build.EntryStore``); ``close`` deletes
    the file."""

    def __init__(self, folder: str, source: str):
        self.source = source  # the records file indexed, as its values' origins name it
        self._pending: List[Tuple[int, int, int, bytes]] = []  # lines kept, inserted in batches
        self._shared = Interned()  # the strings every decoded value of the step shares
        fd, self.path = tempfile.mkstemp(prefix=fsutil.TEMP_PREFIX, dir=folder)
        os.close(fd)
        try:
            with self._translated():
                self._db = sqlite3.connect(self.path)
                for pragma in ("journal_mode=OFF", "synchronous=OFF", f"cache_size=-{CACHE_KIB}"):
                    self._db.execute(f"PRAGMA {pragma}")
                page = self._db.execute("PRAGMA page_size").fetchone()[0]
                self._db.execute(f"PRAGMA max_page_count={max(1, MAX_INDEX_BYTES // page)}")
                for statement in _SCHEMA:
                    self._db.execute(statement)
        except IndexFileError:
            self.close()
            raise

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error, AttributeError):
            self._db.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    @contextlib.contextmanager
    def _translated(self):
        """SQLite's errors as an ``IndexFileError`` (an ``OSError``: the step's usual file-system path)."""
        try:
            yield
        except sqlite3.Error as err:
            raise _os_error(err, self.path) from None

    def _run(self, sql: str, args: Iterable = ()) -> sqlite3.Cursor:
        with self._translated():
            return self._db.execute(sql, tuple(args))

    def _rows(self, sql: str) -> Iterator[tuple]:
        """The rows of ``sql``, fetched as they are used (errors translated while they are)."""
        with self._translated():
            yield from self._db.execute(sql)

    # records: ``records.read_records_stream``'s ``first_lines`` and ``keep``
    def setdefault(self, seq: int, line: int) -> int:
        """The line that first gave ``seq``: ``line`` when none did."""
        if self._run("INSERT OR IGNORE INTO seqs VALUES (?, ?)", (seq, line)).rowcount:
            return line
        return self._run("SELECT line FROM seqs WHERE seq = ?", (seq,)).fetchone()[0]

    def keep(self, capture: Capture, raw: bytes) -> None:
        """``records.read_records_stream``'s ``keep``: a value's line goes to the index under its cell."""
        self._pending.append((capture.key.cell_id, capture.origin.line, capture.order, raw))
        if len(self._pending) >= INSERT_BATCH:
            self._insert_pending()

    def _insert_pending(self) -> None:
        with self._translated():
            self._db.executemany("INSERT INTO captures VALUES (?, ?, ?, ?)", self._pending)
        self._pending.clear()

    # the EntryStore
    def cells(self) -> List[int]:
        self._insert_pending()
        return [row[0] for row in self._run("SELECT DISTINCT cell FROM captures ORDER BY cell")]

    def captures_of(self, cell: int) -> List[Capture]:
        rows = self._run("SELECT line, ord, raw FROM captures WHERE cell = ? ORDER BY line", (cell,)).fetchall()
        return [decode_record(json.loads(raw), LineOrigin(self.source, line), order, self._shared)
                for line, order, raw in rows]

    def values(self) -> int:
        return self._run("SELECT COUNT(*) FROM captures").fetchone()[0]

    def add(self, entries: List[Entry], written: List[Entry], body_of: BodyOf) -> None:
        """A cell's entries; those written with their encoded body (the captures are not kept)."""
        kept = {id(entry) for entry in written}
        with self._translated():
            self._db.executemany("INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)", (
                (entry.first[0], entry.first[1], entry.name, entry.cell.cell_id, entry.direction, entry.call,
                 int(entry.is_parameters_grad), int(id(entry) in kept),
                 msprobe_json.encoded(body_of(entry)) if id(entry) in kept else None) for entry in entries))

    def entry_cells(self) -> List[Tuple[int, str]]:
        return self._run("SELECT DISTINCT cell, direction FROM entries WHERE pgrad = 0").fetchall()

    def entries_of(self, cell: CellRecord) -> List[Entry]:
        rows = self._run("SELECT name, direction, call, seq, ord FROM entries WHERE cell = ? ORDER BY seq, ord, name",
                         (cell.cell_id,)).fetchall()
        return [Entry(cell, direction, call, name, (seq, order)) for name, direction, call, seq, order in rows]

    def set_parents(self, cell: CellRecord, entries: List[Entry]) -> None:
        with self._translated():
            self._db.executemany("UPDATE entries SET parent = ? WHERE cell = ? AND name = ?",
                                 ((entry.parent, cell.cell_id, entry.name) for entry in entries
                                  if not entry.is_parameters_grad))

    def finish(self) -> None:
        self.commit()

    def held(self) -> List[Entry]:
        return []  # none: RecordsIndexer indexes only a step without tensor files, so no file is read

    def bodies(self, body_of: BodyOf) -> Iterator[Tuple[str, str]]:
        """The bodies ``add`` encoded (``body_of`` is not called again: there are no captures)."""
        return self._rows("SELECT name, body FROM entries WHERE kept = 1 ORDER BY seq, ord, name")

    def nodes(self) -> Iterator[Tuple[str, int, Optional[str]]]:
        return self._rows("SELECT name, cell, parent FROM entries WHERE kept = 1 AND pgrad = 0 ORDER BY seq, ord, name")

    def counts(self) -> Tuple[int, int]:
        row = self._run("SELECT COUNT(*), COALESCE(SUM(pgrad), 0) FROM entries WHERE kept = 1").fetchone()
        return row[0], row[1]

    def commit(self) -> None:
        self._insert_pending()
        with self._translated():
            self._db.commit()


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
            read = read_records_stream(handle, path, first_order, keep=self.index.keep, first_lines=self.index)
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
    except UnsafePathError:
        return False
    return True
