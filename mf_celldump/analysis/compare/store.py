"""The working store of a comparison: an SQLite file, so memory stays flat whatever the dump size.

Entries of both sides are written as they stream in (baseline looked up by name, target
read back in order), and every compared pair becomes a row of ``pairs``, which the
report reads back with SQL (first divergence, per-layer aggregates, the CSV streamed row by row).

The entries live in a second file, attached as ``entries``: worker processes pairing ranges of a
unit read them through their own read-only connections to that file alone (:meth:`Store.reader`)
while this connection writes pair rows into the first, so no file is read by one process while
another writes it (no WAL, which needs shared memory a network file system may not give).
"""

from __future__ import annotations

import json
import os
import sqlite3
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple
from urllib.request import pathname2url

PAIR_COLUMNS = (
    "step",
    "rank",
    "folder",
    "pos",
    "kind",
    "direction",
    "entry",
    "cell",
    "cell_class",
    "layer",
    "slot",
    "baseline_entry",
    "baseline_slot",
    "dtype",
    "baseline_dtype",
    "shape",
    "baseline_shape",
    "baseline_transform",
    "status",
    "basis",
    "skip_class",
    "reason",
    "cosine",
    "euc_dist",
    "max_abs_err",
    "max_rel_err",
    "rel_err",
    "one_thousandth_ratio",
    "five_thousandths_ratio",
    "stat_rel",
    "score",
    "factor",
    "factor_rel",
    "factor_tol",
    "noise_bound",
    "target_max",
    "target_min",
    "target_mean",
    "target_norm",
    "baseline_max",
    "baseline_min",
    "baseline_mean",
    "baseline_norm",
    "max_diff",
    "min_diff",
    "mean_diff",
    "norm_diff",
    "crc_match",
    "msprobe_result",
    "msprobe_message",
)
_INT = {"step", "rank", "pos"}
ENTRIES, PAIRS = "entries", "pairs"  # the two files of a store
_TEXT = {
    "folder", "kind", "direction", "entry", "cell", "cell_class", "layer", "slot", "baseline_entry",
    "baseline_slot", "dtype", "baseline_dtype", "shape", "baseline_shape", "baseline_transform", "status",
    "basis", "skip_class", "reason", "crc_match", "msprobe_result", "msprobe_message",
}


class Store:
    def __init__(self, path: str, read_only: Optional[str] = None):
        """``path``: the pairs' file; the entries' file is beside it (:func:`entries_path`). ``read_only``:
        None, both files for reading and writing; else the one file to read, ``pairs`` or ``entries``
        (a reader never opens the other: it would wait on the writer's lock of that file)."""
        self.path = path
        if read_only is not None:
            one = entries_path(path) if read_only == ENTRIES else path
            self.db = sqlite3.connect(f"file:{pathname2url(one)}?mode=ro", uri=True)
            return
        self.db = sqlite3.connect(path)
        self.db.execute("attach database ? as entries", (entries_path(path),))
        for schema in ("main", "entries"):
            self.db.execute(f"pragma {schema}.journal_mode=off")
            self.db.execute(f"pragma {schema}.synchronous=off")
        columns = ", ".join(
            f"{c} {'integer' if c in _INT else 'text' if c in _TEXT else 'real'}" for c in PAIR_COLUMNS
        )
        self.db.executescript(
            f"""
            create table pairs ({columns});
            create table entries.base (cell text, direction text, ordinal integer, name text, body text);
            create index entries.base_key on base (cell, direction, ordinal);
            create table entries.target (pos integer primary key, name text, cell text, cls text, direction text,
                                 ordinal integer, depth integer, body text);
            create table base_totals (step integer, rank integer, kind text, direction text, tensors integer);
            """
        )

    @classmethod
    def reader(cls, path: str, part: str) -> Store:
        """A read-only connection (a worker process's) to one file of a store another connection writes:
        ``entries`` (the unit being paired, committed) or ``pairs`` (once they are all committed)."""
        if part not in (ENTRIES, PAIRS):
            raise ValueError(f"part {part!r}: {ENTRIES} or {PAIRS}")
        return cls(path, read_only=part)

    def close(self) -> None:
        self.db.close()

    def commit(self) -> None:
        """Make what was written visible to readers (a unit's entries, before workers pair them; the pairs,
        before a worker draws the plot)."""
        self.db.commit()

    # --- one unit (step/rank pair) at a time -------------------------------------------------
    def reset_unit(self) -> None:
        self.db.execute("delete from base")
        self.db.execute("delete from target")

    def add_base(self, rows: Iterable[Tuple[str, str, int, str, Dict[str, Any]]]) -> None:
        self.db.executemany(
            "insert into base values (?, ?, ?, ?, ?)",
            ((cell, d, o, name, json.dumps(body)) for cell, d, o, name, body in rows),
        )

    def add_target(self, rows: Iterable[Tuple[int, str, str, str, str, int, int, Dict[str, Any]]]) -> None:
        """(pos, name, cell, class, direction, ordinal, depth, body) of each target entry, in execution order."""
        self.db.executemany(
            "insert into target values (?, ?, ?, ?, ?, ?, ?, ?)",
            ((pos, name, cell, cls, d, o, depth, json.dumps(body))
             for pos, name, cell, cls, d, o, depth, body in rows),
        )

    def base_entry(self, cell: str, direction: str, ordinal: int) -> Optional[Tuple[str, Dict[str, Any]]]:
        row = self.db.execute(
            "select name, body from base where cell = ? and direction = ? and ordinal = ?",
            (cell, direction, ordinal),
        ).fetchone()
        return (row[0], json.loads(row[1])) if row else None

    def base_has_cell(self, cell: str) -> bool:
        return self.db.execute("select 1 from base where cell = ? limit 1", (cell,)).fetchone() is not None

    def targets(self, start: int = 0, stop: Optional[int] = None
                ) -> Iterator[Tuple[int, str, str, str, str, int, int, Dict[str, Any]]]:
        """Target entries at positions ``start`` to ``stop`` (excluded; None: to the end), in order."""
        cursor = self.db.execute(
            "select pos, name, cell, cls, direction, ordinal, depth, body from target where pos >= ? and pos < ? "
            "order by pos",
            (start, stop if stop is not None else 1 << 62),
        )
        for pos, name, cell, cls, direction, ordinal, depth, body in cursor:
            yield pos, name, cell, cls, direction, ordinal, depth, json.loads(body)

    def add_base_totals(self, step, rank, totals: Dict[Tuple[str, str], int]) -> None:
        """How many tensors the baseline side of a unit holds, per (kind, direction)."""
        self.db.executemany(
            "insert into base_totals values (?, ?, ?, ?, ?)",
            ((step, rank, kind, direction, n) for (kind, direction), n in totals.items()),
        )

    # --- results ----------------------------------------------------------------------------
    def add_pairs(self, rows: List[Dict[str, Any]]) -> None:
        self.add_pair_values(pair_values(row) for row in rows)

    def add_pair_values(self, rows: Iterable[Sequence[Any]]) -> None:
        """Rows as :func:`pair_values` gives them (a worker process sends them so: small to pickle)."""
        placeholders = ", ".join("?" for _ in PAIR_COLUMNS)
        self.db.executemany(f"insert into pairs values ({placeholders})", rows)

    def query(self, sql: str, params: tuple = ()) -> List[tuple]:
        return self.db.execute(sql, params).fetchall()


def pair_values(row: Dict[str, Any]) -> Tuple[Any, ...]:
    """A pair row's values in the order of ``PAIR_COLUMNS`` (None for a column it lacks)."""
    return tuple(map(row.get, PAIR_COLUMNS))


def entries_path(path: str) -> str:
    """The file of the entries of the store whose pairs are in ``path``."""
    return f"{os.path.splitext(path)[0]}-entries.sqlite"
