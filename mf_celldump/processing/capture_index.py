"""An SQLite file holding one step's records and entries, for a records file too large to hold.

Held in memory, a value of ``records.jsonl`` costs about 1.3 KB (its capture, its entry,
the output's structures). Here the lines are kept on disk, grouped by cell: a cell's lines
are read back when its entries are built, and the entries go back with their
``dump.json`` body, to be streamed in execution order (``indexed_step``). Memory then
holds one cell's values and SQLite's page cache, whatever the file's size.

The file is a temporary file of ours in ``_processed/`` (``fsutil.TEMP_PREFIX``: a run
killed while it exists leaves a name the next run recognises and deletes), without a
journal: it is rebuilt from the raw data whenever it is needed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import tempfile
from typing import Iterable, Iterator, List, Optional, Tuple

from mf_celldump import fsutil
from mf_celldump.errors import CellDumpError

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
    "CREATE INDEX entries_by_cell ON entries(cell)",
)

# An entry as the index gives it back: (row id, name, direction, call, first seq, first order, parameters_grad)
EntryRow = Tuple[int, str, str, int, int, int, bool]


class IndexFileError(CellDumpError, OSError):
    """The index could not be written or read (a full disk, most often); the step's raw data is kept."""


def _os_error(err: sqlite3.Error, path: str) -> OSError:
    full = "full" in str(err).lower()
    code = errno.ENOSPC if full else errno.EIO
    return IndexFileError(code, f"{os.strerror(code)} (the on-disk index of a large records file: {err})", path)


class CaptureIndex:
    """One step's records lines by cell, then its entries; ``close`` deletes the file."""

    def __init__(self, folder: str, source: str):
        self.source = source  # the records file indexed, as its values' origins name it
        self._pending: List[Tuple[int, int, int, bytes]] = []  # lines kept, inserted in batches
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

    # records: ``records.read_records_stream``'s ``first_lines`` and ``keep``
    def setdefault(self, seq: int, line: int) -> int:
        """The line that first gave ``seq``: ``line`` when none did."""
        if self._run("INSERT OR IGNORE INTO seqs VALUES (?, ?)", (seq, line)).rowcount:
            return line
        return self._run("SELECT line FROM seqs WHERE seq = ?", (seq,)).fetchone()[0]

    def keep(self, cell: int, line: int, order: int, raw: bytes) -> None:
        self._pending.append((cell, line, order, raw))
        if len(self._pending) >= INSERT_BATCH:
            self._insert_pending()

    def _insert_pending(self) -> None:
        with self._translated():
            self._db.executemany("INSERT INTO captures VALUES (?, ?, ?, ?)", self._pending)
        self._pending.clear()

    def cells(self) -> List[int]:
        self._insert_pending()
        return [row[0] for row in self._run("SELECT DISTINCT cell FROM captures ORDER BY cell")]

    def lines_of(self, cell: int) -> List[Tuple[int, int, bytes]]:
        """(line number, order, line) of one cell's values, in file order."""
        self._insert_pending()
        return self._run("SELECT line, ord, raw FROM captures WHERE cell = ? ORDER BY line", (cell,)).fetchall()

    def count(self) -> int:
        self._insert_pending()
        return self._run("SELECT COUNT(*) FROM captures").fetchone()[0]

    # entries
    def add_entry(self, first: Tuple[int, int], name: str, cell: int, direction: str, call: int, pgrad: bool,
                  body: Optional[str]) -> None:
        """One entry; ``body`` is its encoded ``dump.json`` body, None for an entry not written."""
        self._run("INSERT INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                  (first[0], first[1], name, cell, direction, call, int(pgrad), int(body is not None), body))

    def entries_of(self, cell: int) -> List[EntryRow]:
        """One cell's entries in execution order."""
        rows = self._run("SELECT rowid, name, direction, call, seq, ord, pgrad FROM entries WHERE cell = ? "
                         "ORDER BY seq, ord, name", (cell,)).fetchall()
        return [(rowid, name, direction, call, seq, order, bool(pgrad))
                for rowid, name, direction, call, seq, order, pgrad in rows]

    def entry_cells(self) -> List[Tuple[int, str]]:
        """(cell, direction) of every cell and direction holding an entry that is not ``parameters_grad``."""
        return self._run("SELECT DISTINCT cell, direction FROM entries WHERE pgrad = 0").fetchall()

    def set_parents(self, parents: Iterable[Tuple[Optional[str], int]]) -> None:
        """(parent name, entry row id) pairs."""
        with self._translated():
            self._db.executemany("UPDATE entries SET parent = ? WHERE rowid = ?", parents)

    def written(self) -> Iterator[Tuple[str, str, int, bool, Optional[str]]]:
        """(name, body, cell, parameters_grad, parent) of the written entries, in execution order."""
        for name, body, cell, pgrad, parent in self._run(
                "SELECT name, body, cell, pgrad, parent FROM entries WHERE kept = 1 ORDER BY seq, ord, name"):
            yield name, body, cell, bool(pgrad), parent

    def written_counts(self) -> Tuple[int, int]:
        """(written entries, of which parameters_grad)."""
        row = self._run("SELECT COUNT(*), COALESCE(SUM(pgrad), 0) FROM entries WHERE kept = 1").fetchone()
        return row[0], row[1]

    def commit(self) -> None:
        self._insert_pending()
        with self._translated():
            self._db.commit()
