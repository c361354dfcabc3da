"""The working store of a comparison: an SQLite file, so memory stays flat whatever the dump size.

Entries of both sides are written as they stream in (baseline looked up by name, target
read back in order), and every compared pair becomes a row of ``pairs``, which the
report reads back with SQL (first divergence, per-layer aggregates, the CSV streamed row by row).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

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
    def __init__(self, path: str):
        self.db = sqlite3.connect(path)
        self.db.execute("pragma journal_mode=off")
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
                                 ordinal integer, body text);
            create table base_totals (step integer, rank integer, kind text, direction text, tensors integer);
            """
        )

    def close(self) -> None:
        self.db.close()

    # --- one unit (step/rank pair) at a time -------------------------------------------------
    def reset_unit(self) -> None:
        self.db.execute("delete from base")
        self.db.execute("delete from target")

    def add_base(self, rows: Iterable[Tuple[str, str, int, str, Dict[str, Any]]]) -> None:
        self.db.executemany(
            "insert into base values (?, ?, ?, ?, ?)",
            ((cell, d, o, name, json.dumps(body)) for cell, d, o, name, body in rows),
        )

    def add_target(self, rows: Iterable[Tuple[int, str, str, str, str, int, Dict[str, Any]]]) -> None:
        self.db.executemany(
            "insert into target values (?, ?, ?, ?, ?, ?, ?)",
            ((pos, name, cell, cls, d, o, json.dumps(body)) for pos, name, cell, cls, d, o, body in rows),
        )

    def base_entry(self, cell: str, direction: str, ordinal: int) -> Optional[Tuple[str, Dict[str, Any]]]:
        row = self.db.execute(
            "select name, body from base where cell = ? and direction = ? and ordinal = ?",
            (cell, direction, ordinal),
        ).fetchone()
        return (row[0], json.loads(row[1])) if row else None

    def base_has_cell(self, cell: str) -> bool:
        return self.db.execute("select 1 from base where cell = ? limit 1", (cell,)).fetchone() is not None

    def targets(self) -> Iterator[Tuple[int, str, str, str, str, int, Dict[str, Any]]]:
        cursor = self.db.execute(
            "select pos, name, cell, cls, direction, ordinal, body from target order by pos"
        )
        for pos, name, cell, cls, direction, ordinal, body in cursor:
            yield pos, name, cell, cls, direction, ordinal, json.loads(body)

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
        placeholders = ", ".join("?" for _ in PAIR_COLUMNS)
        self.db.executemany(
            f"insert into pairs values ({placeholders})", ([row.get(c) for c in PAIR_COLUMNS] for row in rows)
        )

    def query(self, sql: str, params: tuple = ()) -> List[tuple]:
        return self.db.execute(sql, params).fetchall()
