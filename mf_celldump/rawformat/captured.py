"""One captured value of one cell call, as read from any raw source."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from mf_celldump.rawformat.keys import ProbeKey


class LineOrigin:
    """``file:line`` of a value read from a text file, as it is printed; the file's path is one string
    shared by all its lines (a value costs a line number, not a copy of the path)."""

    __slots__ = ("path", "line")

    def __init__(self, path: str, line: int):
        self.path = path
        self.line = line

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __eq__(self, other) -> bool:
        return str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))


class Capture:
    """A value captured at ``seq``: from a raw file (``file``: its name in the step folder),
    a records.jsonl line or a csv row.

    ``dtype``/``shape``/``stats``/``value`` are known up front for records and csv rows and
    filled in by processing from the file otherwise; ``call`` and ``data_name`` are set
    by processing. Slots keep the per-capture cost to metadata size.
    """

    __slots__ = ("seq", "order", "key", "origin", "file", "file_dtype", "dtype", "shape", "stats", "value",
                 "in_mode", "parts", "call", "data_name")

    def __init__(self, seq: int, order: int, key: ProbeKey, origin: str, file: Optional[str] = None,
                 file_dtype: Optional[str] = None, dtype: Optional[str] = None,
                 shape: Optional[Tuple[int, ...]] = None, stats: Optional[Dict[str, object]] = None,
                 value: object = None, in_mode: bool = False):
        self.seq = seq
        self.order = order
        self.key = key
        self.origin = origin
        self.file = file
        self.file_dtype = file_dtype
        self.dtype = dtype
        self.shape = shape
        self.stats = stats
        self.value = value
        self.in_mode = in_mode  # MindSpore's parallel pass named it "_in" (TensorDump 'in' / DumpGradient 'in')
        # more raw files (same step folder) whose arrays are summed with ``file``'s: a gradient MindSpore
        # dumped once per redistributing consumer (processing/consumer_parts.py)
        self.parts: Tuple[str, ...] = ()
        self.call: Optional[int] = key.call
        self.data_name: Optional[str] = None  # set when the capture is kept for the output

    def copy(self) -> Capture:
        """The same value once more (processing names it under a second entry)."""
        twin = Capture(self.seq, self.order, self.key, self.origin, self.file, self.file_dtype, self.dtype,
                       self.shape, dict(self.stats) if self.stats is not None else None, self.value, self.in_mode)
        twin.call = self.call
        twin.parts = self.parts
        return twin

    @property
    def probe(self) -> Tuple[int, str, str, Tuple[int, ...]]:
        """What repeats once per call of the cell: (cell, direction, slot, index path)."""
        return (self.key.cell_id, self.key.direction, self.key.slot, self.key.path)

    @property
    def sort_key(self) -> Tuple[int, int]:
        return (self.seq, self.order)
