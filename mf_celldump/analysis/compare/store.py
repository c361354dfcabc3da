"""The working store of a comparison: an SQLite file, so memory stays flat whatever the dump size.

Entries of both sides are written as they stream in (baseline looked up by name, target
read back in order), and every compared pair becomes a row of ``pairs``, which the
report reads back with SQL (first divergence, per-layer aggregates, the CSV streamed row by row).

Worker processes pairing ranges of a unit read the entries through their own read-only
connections (:meth:`Store.reader`) while this one writes pair rows: the file is in WAL mode,
where readers and the one writer do not wait for each other.
"""

from __future__ import annotations

import json
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
_TEXT = {
    "folder", "kind", "direction", "entry", "cell", "cell_class", "layer", "slot", "baseline_entry",
    "baseline_slot", "dtype", "baseline_dtype", "shape", "baseline_shape", "baseline_transform", "status",
    "basis", "skip_class", "reason", "crc_match", "msprobe_result", "msprobe_message",
}


class Store:
    def __init__(self, path: str, read_only: bool = False):
        self.path = path
        if read_only:
            self.db = sqlite3.connect(f"file:{pathname2url(path)}?mode=ro", uri=True)
            return
        self.db = sqlite3.connect(path)
        self.db.execute("pragma journal_mode=wal")
        self.db.execute("pragma synchronous=off")
        columns = ", ".join(
            f"{c} {'integer' if c in _INT else 'text' if c in _TEXT else 'real'}" for c in PAIR_COLUMNS
        )
        self.db.executescript(
            f"""
            create table pairs ({columns});
            create table base (cell text, direction text, ordinal integer, name text, body text);
            create index base_key on base (cell, direction, ordinal);
            create table target (pos integer primary key, name text, cell text, cls text, direction text,
                                 ordinal integer, depth integer, body text);
            create table base_totals (step integer, rank integer, kind text, direction text, tensors integer);
            """
        )

    @classmethod
    def reader(cls, path: str) -> Store:
        """A read-only connection to a store another connection created (a worker process's)."""
        return cls(path, read_only=True)

    def close(self) -> None:
        self.db.close()

    def commit(self) -> None:
        """Make what was written visible to readers (the entries of a unit, before workers pair them)."""
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

    def target_count(self) -> int:
        return self.db.execute("select count(*) from target").fetchone()[0]

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
