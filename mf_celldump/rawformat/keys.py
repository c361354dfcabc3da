"""What identifies one captured value: cell, direction, slot, value kind, index path, call.

A :class:`ProbeKey` is spelled three ways in the raw format: inside a raw file name
(``names``), as integer codes when it travels through a compiled graph as an int32
tensor (``to_codes``), and as fields of a ``records.jsonl`` line (``records``). The
value kinds of non-tensor arguments and their conversion from the scalar tensors they
travel as live here too, so capture and processing agree on them. A value read back from
any raw source is a :class:`Capture` under its key (with its ``file:line``, :class:`LineOrigin`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np

# Raw keys use msprobe's direction words (re-exported).
from mf_celldump.layout.naming import BACKWARD as BACKWARD
from mf_celldump.layout.naming import DIRECTIONS as DIRECTIONS
from mf_celldump.layout.naming import FORWARD as FORWARD

# Slots of a captured value, seen from the forward call.
SLOT_ARG = "a"  # positional input; path[0] is the argument index
SLOT_KWARG = "k"  # keyword-only input; path[0] is the parameter's index in the cell's signature
SLOT_OUTPUT = "o"  # output; path[0] is the output index (0 for a single tensor)
# The cell's own parameters (msprobe's ``parameters`` and ``parameters_grad``); path[0] is
# the index in the manifest cell's ``weights``. A weight (read when the step starts) has
# direction forward, its gradient direction backward; gradient calls count in order.
SLOT_WEIGHT = "w"
SLOT_WEIGHT_GRAD = "g"
SLOTS = (SLOT_ARG, SLOT_KWARG, SLOT_OUTPUT, SLOT_WEIGHT, SLOT_WEIGHT_GRAD)
WEIGHT_SLOTS = (SLOT_WEIGHT, SLOT_WEIGHT_GRAD)

# Kinds of captured value. Non-tensor Python values travel as scalar tensors.
KIND_TENSOR = "t"
KIND_INT = "i"
KIND_FLOAT = "f"
KIND_BOOL = "b"
KIND_NONE = "n"
KINDS = (KIND_TENSOR, KIND_INT, KIND_FLOAT, KIND_BOOL, KIND_NONE)
KIND_TYPE_NAMES = {KIND_INT: "int", KIND_FLOAT: "float", KIND_BOOL: "bool", KIND_NONE: "None"}

# Integer codes used when a probe key travels as an int32 tensor through a graph.
SLOT_CODES = {SLOT_ARG: 0, SLOT_KWARG: 1, SLOT_OUTPUT: 2, SLOT_WEIGHT: 3, SLOT_WEIGHT_GRAD: 4}
KIND_CODES = {KIND_TENSOR: 0, KIND_INT: 1, KIND_FLOAT: 2, KIND_BOOL: 3, KIND_NONE: 4}
CODE_SLOTS = {v: k for k, v in SLOT_CODES.items()}
CODE_KINDS = {v: k for k, v in KIND_CODES.items()}
UNKNOWN_CALL = -1
# Bounds that keep a reader's memory small whatever a raw file says: an index path is at
# most MAX_PATH_DEPTH deep and each index below MAX_INDEX (names.py spells them as digits).
MAX_INDEX = 1_000_000
MAX_PATH_DEPTH = 32


@dataclass(frozen=True)
class ProbeKey:
    """Identifies one captured value of one cell call.

    ``call`` is the cell's call index within the step when the capture side knows it
    (PyNative), or None when processing must infer it from the order of captures.
    """

    cell_id: int
    direction: str
    slot: str
    kind: str
    path: Tuple[int, ...]
    call: Optional[int] = None

    @property
    def msprobe_io(self) -> str:
        """``input`` or ``output`` as msprobe names the value in this direction.

        Backward names are seen from the gradient's flow: the gradient w.r.t. a forward
        output enters the cell (``backward.input``), the one w.r.t. a forward input
        leaves it (``backward.output``).
        """
        is_input = self.slot in (SLOT_ARG, SLOT_KWARG)
        if self.direction == BACKWARD:
            is_input = not is_input
        return "input" if is_input else "output"

    def with_kind(self, kind: str) -> ProbeKey:
        return ProbeKey(self.cell_id, self.direction, self.slot, kind, self.path, self.call)

    def with_path(self, path: Tuple[int, ...]) -> ProbeKey:
        return ProbeKey(self.cell_id, self.direction, self.slot, self.kind, tuple(path), self.call)

    def to_codes(self) -> Tuple[int, ...]:
        """The key as integers: (cell, slot, kind, call, *path); the direction is implied."""
        call = UNKNOWN_CALL if self.call is None else self.call
        return (self.cell_id, SLOT_CODES[self.slot], KIND_CODES[self.kind], call) + tuple(self.path)

    @classmethod
    def from_codes(cls, codes, direction: str) -> ProbeKey:
        codes = [int(c) for c in codes]
        if len(codes) < 5:
            raise ValueError(f"probe key {codes} is too short: expected cell, slot, kind, call, path...")
        call = None if codes[3] == UNKNOWN_CALL else codes[3]
        return cls(codes[0], direction, CODE_SLOTS[codes[1]], CODE_KINDS[codes[2]], tuple(codes[4:]), call)


def kind_of_value(value: Any) -> Optional[str]:
    """The kind of a non-tensor argument we record (None for values we pass by)."""
    if value is None:
        return KIND_NONE
    if isinstance(value, (bool, np.bool_)):
        return KIND_BOOL
    if isinstance(value, (int, np.integer)):
        return KIND_INT
    if isinstance(value, (float, np.floating)):
        return KIND_FLOAT
    return None


def plain_value(value: Any) -> Any:
    """A numpy scalar as the Python value it stands for (JSON-serialisable)."""
    return value.item() if isinstance(value, np.generic) else value


def scalar_of_kind(kind: str, raw: Any) -> Any:
    """The Python value of kind ``kind`` carried by ``raw`` (a number or a one-element array).

    Non-tensor arguments travel as scalar tensors (None as 0); this is the one place that
    turns them back, for every raw source (records, files, csv rows).
    """
    if kind == KIND_NONE:
        return None
    if raw is None:
        return None
    if isinstance(raw, np.ndarray):
        if raw.size != 1:
            raise ValueError(f"expected a single value for a non-tensor capture, got shape {raw.shape}")
        raw = raw.reshape(()).item()
    raw = plain_value(raw)
    if kind == KIND_BOOL:
        return bool(raw)
    if kind == KIND_INT:
        return int(raw)
    if kind == KIND_FLOAT:
        return float(raw)
    raise ValueError(f"{kind!r} is not a non-tensor value kind; valid: {', '.join(KIND_TYPE_NAMES)}")


# -- one captured value of one cell call, as read from any raw source -----------------------------

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
