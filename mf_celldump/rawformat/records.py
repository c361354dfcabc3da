"""``records.jsonl``: statistics and non-tensor values, one JSON object per line.

The capture side appends whole lines (``encode_record``); processing reads them back
(``read_records``). The file is append-only and may end in a torn line when the run was
killed while writing; that line is reported as a warning and skipped. A bad line
elsewhere is a problem (the raw step is then kept) but never stops the other lines.

Reading costs memory for the values a file holds, never for its repetitions or its
garbage: every captured value has its own ``seq``, so a line whose ``seq`` an earlier
line had is a repeat, named as a problem and not kept; and at most ``MAX_NAMED_PROBLEMS``
problem lines are named one by one, the rest counted in one more line. What a value
keeps is compact: its strings (direction, dtype, statistics names) and its key are
shared with the earlier values that had the same, and its origin is a path shared by the
file and a line number.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol

from mf_celldump.rawformat.keys import (
    DIRECTIONS,
    KIND_TENSOR,
    KINDS,
    MAX_INDEX,
    MAX_PATH_DEPTH,
    SLOTS,
    Capture,
    LineOrigin,
    ProbeKey,
)

# Record fields (docs/raw-format.md is checked against this table).
FIELDS = {
    "seq": "int: execution order inside the process",
    "cell": "int: manifest cell id",
    "dir": "'forward' or 'backward'",
    "slot": "'a', 'k', 'o', 'w' or 'g' (see the raw tensor file name)",
    "kind": "'t', 'i', 'f', 'b' or 'n' (see the raw tensor file name)",
    "call": "int or null: the call index, null when processing infers it",
    "path": "list of int: the index path",
    "dtype": "tensor records: MindSpore's dtype spelling (Float32, ...)",
    "shape": "tensor records: list of int",
    "stats": "tensor records: msprobe statistics keys (Max, Min, Mean, Norm, md5, nan_count, inf_count)",
    "value": "non-tensor records: the value (int, float, bool or null)",
}
MAX_LINE_BYTES = 1 << 20  # a record is a few hundred bytes; anything longer is not ours
MAX_NAMED_PROBLEMS = 20  # problem lines named per file; the others are counted
SHARED_LIMIT = 1 << 16  # distinct strings and keys shared per file; beyond, each value keeps its own


def encode_record(key: ProbeKey, seq: int, **payload: Any) -> str:
    """One line for ``key``: tensor records carry dtype/shape/stats, value records ``value``."""
    head: Dict[str, Any] = {"seq": seq, "cell": key.cell_id, "dir": key.direction, "slot": key.slot,
                            "kind": key.kind, "call": key.call, "path": list(key.path)}
    head.update(payload)
    return json.dumps(head, separators=(",", ":")) + "\n"


@dataclass
class RecordsRead:
    captures: List[Capture] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    size: int = 0
    unnamed: int = 0  # problem lines beyond MAX_NAMED_PROBLEMS
    first_unnamed: str = ""

    def problem(self, text: str, origin: str) -> None:
        if len(self.problems) < MAX_NAMED_PROBLEMS:
            self.problems.append(text)
            return
        self.unnamed += 1
        self.first_unnamed = self.first_unnamed or str(origin)

    def finish(self, path: str) -> RecordsRead:
        if self.unnamed:
            self.problems.append(f"{path}: {self.unnamed} more unusable or repeated line(s), not listed (the first at "
                                 f"{self.first_unnamed})")
        return self


class Interned:
    """One object per distinct string or key of a file, up to ``SHARED_LIMIT`` of each (a graph-mode
    key repeats once per call, a dtype or a statistics name on every line)."""

    def __init__(self):
        self._strings: Dict[str, str] = {}
        self._keys: Dict[tuple, ProbeKey] = {}

    def string(self, text: str) -> str:
        return _shared(self._strings, text, lambda: text)

    def key(self, fields: tuple) -> ProbeKey:
        return _shared(self._keys, fields, lambda: ProbeKey(*fields))


def _shared(table: dict, ident, make):
    """The object kept for ``ident`` in ``table``, made and kept (while the table has room) on first sight."""
    found = table.get(ident)
    if found is None:
        found = make()
        if len(table) < SHARED_LIMIT:
            table[ident] = found
    return found


def _int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _key(obj: dict, shared: Interned) -> ProbeKey:
    cell = _int(obj.get("cell"))
    direction, slot, kind = obj.get("dir"), obj.get("slot"), obj.get("kind")
    call, path = obj.get("call"), obj.get("path")
    if cell is None or cell < 0:
        raise ValueError("'cell' must be a non-negative integer")
    if direction not in DIRECTIONS or slot not in SLOTS or kind not in KINDS:
        raise ValueError("invalid dir/slot/kind")
    if call is not None and (_int(call) is None or not 0 <= call < MAX_INDEX):
        raise ValueError("invalid call")
    if not isinstance(path, list) or not 0 < len(path) <= MAX_PATH_DEPTH or any(
        _int(p) is None or not 0 <= p < MAX_INDEX for p in path
    ):
        raise ValueError(f"invalid path (1 to {MAX_PATH_DEPTH} integers in [0, {MAX_INDEX}))")
    return shared.key((cell, shared.string(direction), shared.string(slot), shared.string(kind), tuple(path), call))


def decode_record(obj: Any, origin, order: int, shared: Optional[Interned] = None) -> Capture:
    """A capture from one parsed line; ValueError says what is wrong with it. ``shared``: the strings and
    keys of the file's earlier lines."""
    shared = shared or Interned()
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    seq = _int(obj.get("seq"))
    if seq is None:
        raise ValueError("'seq' must be an integer")
    key = _key(obj, shared)
    if key.kind != KIND_TENSOR:
        value = obj.get("value")
        if not (value is None or isinstance(value, (bool, int, float))):
            raise ValueError("'value' must be a number, a bool or null")
        return Capture(seq, order, key, origin, value=value)
    shape, stats, dtype = obj.get("shape"), obj.get("stats") or {}, obj.get("dtype")
    if not isinstance(shape, list) or any(_int(d) is None or d < 0 for d in shape) or len(shape) > 64:
        raise ValueError("'shape' must be a list of at most 64 non-negative integers")
    if not isinstance(stats, dict) or not isinstance(dtype, str) or len(dtype) > 32:
        raise ValueError("a tensor record needs 'dtype' (string) and 'stats' (object)")
    if len(stats) > 16 or not all(isinstance(k, str) and _stat_value(v) for k, v in stats.items()):
        raise ValueError("'stats' must map at most 16 names to numbers, bools, short strings or null")
    stats = {shared.string(name): value for name, value in stats.items()}
    return Capture(seq, order, key, origin, dtype=shared.string(dtype), shape=tuple(shape), stats=stats)


def _stat_value(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 64)


def read_records(data: bytes, path: str, first_order: int) -> RecordsRead:
    """All usable lines of a records file's content; ``first_order`` numbers them after others."""
    return read_records_stream(io.BytesIO(data), path, first_order)


class FirstLines(Protocol):
    """Which line first gave each ``seq`` (a dict, or an on-disk table for a file too large to hold)."""

    def setdefault(self, seq: int, line: int) -> int: ...


KeepCapture = Callable[[Capture, bytes], None]  # a usable value and its line's text


def read_records_stream(handle, path: str, first_order: int, keep: Optional[KeepCapture] = None,
                        first_lines: Optional[FirstLines] = None) -> RecordsRead:
    """Like ``read_records``, reading a binary file line by line: memory stays at one line, plus one small
    capture per value (see the module docstring).

    A line longer than ``MAX_LINE_BYTES`` is skipped unread (a problem); a last line
    without its newline that does not parse is a torn write (a warning). ``keep`` and
    ``first_lines`` put the values and the lines of their ``seq`` elsewhere than in memory
    (the result's ``captures`` then stays empty).
    """
    out = RecordsRead()
    shared = Interned()
    first_line = first_lines if first_lines is not None else {}  # seq -> the line that gave it
    if not isinstance(handle, io.BufferedIOBase):
        handle = io.BufferedReader(handle, 1 << 16)
    for number, raw, complete in _lines(handle, out):
        origin = LineOrigin(path, number)
        if raw is None:
            out.problem(f"{origin}: unusable record (line longer than {MAX_LINE_BYTES} bytes)", origin)
            continue
        if not raw.strip():
            continue
        try:
            capture = decode_record(json.loads(raw), origin, first_order + number, shared)
        except (ValueError, RecursionError) as err:
            if not complete:
                out.warnings.append(f"{origin}: torn last line skipped (the run stopped while writing it)")
            else:
                out.problem(f"{origin}: unusable record ({str(err)[:200]})", origin)
            continue
        earlier = first_line.setdefault(capture.seq, number)
        if earlier != number:
            out.problem(f"{origin}: repeats seq {capture.seq} of line {earlier} (every value has its own); not used",
                        origin)
            continue
        if keep is None:
            out.captures.append(capture)
        else:
            keep(capture, raw)
    return out.finish(path)


def _lines(handle, out: RecordsRead):
    """(line number, content or None when too long, ends with a newline) for each line."""
    number = 0
    while True:
        chunk = handle.readline(MAX_LINE_BYTES + 1)
        if not chunk:
            return
        number += 1
        out.size += len(chunk)
        if len(chunk) > MAX_LINE_BYTES:
            while chunk and not chunk.endswith(b"\n"):  # skip the rest of the line, a bounded piece at a time
                chunk = handle.readline(MAX_LINE_BYTES + 1)
                out.size += len(chunk)
            yield number, None, True
            continue
        complete = chunk.endswith(b"\n")
        yield number, chunk[:-1] if complete else chunk, complete
