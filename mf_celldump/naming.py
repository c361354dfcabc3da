"""The one place that formats and parses names: entries, files, folders.

Two families of names live here:

* msprobe's names (the output contract): ``Cell.{cell}.{Class}.{forward|backward}.{n}``
  entries, ``{entry}.{input|output}.{index path}.npy`` tensor files, ``step{N}`` and
  ``rank``/``rank{R}`` folders.
* our raw names, written while training runs: a raw tensor file's stem encodes
  everything processing needs (cell id, direction, slot, value kind, call, index path),
  so processing never guesses from cell names. Cell names themselves never appear in
  raw file names: a cell is referred to by its integer id from the rank manifest, so
  no cell name can steer a file outside ``dump_path``.

No other module builds these strings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

FORWARD = "forward"
BACKWARD = "backward"
DIRECTIONS = (FORWARD, BACKWARD)

# Raw-tree layout: {dump_path}/{RAW_ROOT}/rank{R}/{MANIFEST}, .../step{N}/...
RAW_ROOT = "_raw"
MANIFEST_FILE = "manifest.json"
RECORDS_FILE = "records.jsonl"
STEP_DONE_FILE = "_step_done.json"

# Processed layout (msprobe contract).
DUMP_JSON = "dump.json"
CONSTRUCT_JSON = "construct.json"
STACK_JSON = "stack.json"
TENSOR_DIR = "dump_tensor_data"

# Slots of a captured value, seen from the forward call.
SLOT_ARG = "a"  # positional input; path[0] is the argument index
SLOT_KWARG = "k"  # keyword input; path[0] is the parameter's index in the cell's signature
SLOT_OUTPUT = "o"  # output; path[0] is the output index (0 for a single tensor)
SLOTS = (SLOT_ARG, SLOT_KWARG, SLOT_OUTPUT)

# Kinds of captured value. Non-tensor Python values travel as scalar tensors.
VKIND_TENSOR = "t"
VKIND_INT = "i"
VKIND_FLOAT = "f"
VKIND_BOOL = "b"
VKIND_NONE = "n"
VKINDS = (VKIND_TENSOR, VKIND_INT, VKIND_FLOAT, VKIND_BOOL, VKIND_NONE)
VKIND_TYPE_NAMES = {VKIND_INT: "int", VKIND_FLOAT: "float", VKIND_BOOL: "bool", VKIND_NONE: "None"}

# Integer codes used when a probe key travels as an int32 tensor through a graph.
SLOT_CODES = {SLOT_ARG: 0, SLOT_KWARG: 1, SLOT_OUTPUT: 2}
VKIND_CODES = {VKIND_TENSOR: 0, VKIND_INT: 1, VKIND_FLOAT: 2, VKIND_BOOL: 3, VKIND_NONE: 4}
CODE_SLOTS = {v: k for k, v in SLOT_CODES.items()}
CODE_VKINDS = {v: k for k, v in VKIND_CODES.items()}
UNKNOWN_CALL = -1


@dataclass(frozen=True)
class ProbeKey:
    """Identifies one captured value of one cell call.

    ``call`` is the cell's call index within the step when the capture side knows it
    (PyNative), or None when processing must infer it from the order of records.
    """

    cell_id: int
    direction: str
    slot: str
    vkind: str
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

    def to_codes(self) -> Tuple[int, ...]:
        """The key as integers: (cell, slot, vkind, call, *path); direction is implied."""
        call = UNKNOWN_CALL if self.call is None else self.call
        return (self.cell_id, SLOT_CODES[self.slot], VKIND_CODES[self.vkind], call) + tuple(self.path)

    @classmethod
    def from_codes(cls, codes, direction: str) -> ProbeKey:
        codes = [int(c) for c in codes]
        if len(codes) < 5:
            raise ValueError(f"probe key {codes} is too short: expected cell, slot, kind, call, path...")
        call = None if codes[3] == UNKNOWN_CALL else codes[3]
        return cls(codes[0], direction, CODE_SLOTS[codes[1]], CODE_VKINDS[codes[2]], tuple(codes[4:]), call)


# ---------------------------------------------------------------------------
# Raw names
# ---------------------------------------------------------------------------

_DIR_LETTER = {FORWARD: "f", BACKWARD: "b"}
_LETTER_DIR = {v: k for k, v in _DIR_LETTER.items()}

# c{cell}.{f|b}.{slot}.{vkind}.n{call|x}.p{i.j.k}  + TensorDump's [_in]_{dtype}_{id}.npy
_RAW_TENSOR_RE = re.compile(
    r"^c(?P<cell>\d+)\.(?P<dir>[fb])\.(?P<slot>[ako])\.(?P<vkind>[tifbn])\.n(?P<call>\d+|x)"
    r"\.p(?P<path>\d+(?:\.\d+)*)(?:_(?P<mode>in))?_(?P<dtype>[A-Za-z0-9]+)_(?P<seq>\d+)\.npy$"
)


def raw_stem(key: ProbeKey, sep: str = ".") -> str:
    """File stem for a raw tensor of ``key``; the writer appends ``_{dtype}_{seq}.npy``.

    ``sep="-"`` gives the form used inside kernel names of MindSpore's kernel-by-kernel
    statistics dump (``statistic.csv``), where dots are not kept.
    """
    call = "x" if key.call is None else str(key.call)
    path = sep.join(str(i) for i in key.path)
    letter = _DIR_LETTER[key.direction]
    return sep.join((f"c{key.cell_id}", letter, key.slot, key.vkind, f"n{call}", f"p{path}"))


_KBK_STEM_RE = re.compile(
    r"c(?P<cell>\d+)-(?P<dir>[fb])-(?P<slot>[ako])-(?P<vkind>[tifbn])-n(?P<call>\d+|x)-p(?P<path>\d+(?:-\d+)*)"
)


def find_kbk_stem(op_name: str) -> Optional[ProbeKey]:
    """Find our dash-separated stem inside a ``statistic.csv`` ``Op Name``; None if absent."""
    m = _KBK_STEM_RE.search(op_name)
    if m is None:
        return None
    return ProbeKey(
        cell_id=int(m["cell"]),
        direction=_LETTER_DIR[m["dir"]],
        slot=m["slot"],
        vkind=m["vkind"],
        path=tuple(int(p) for p in m["path"].split("-")),
        call=None if m["call"] == "x" else int(m["call"]),
    )


def raw_tensor_file_name(key: ProbeKey, dtype: str, seq: int) -> str:
    """Full raw file name as our own writers produce it (same shape as TensorDump's)."""
    return f"{raw_stem(key)}_{dtype}_{seq}.npy"


@dataclass(frozen=True)
class RawTensorName:
    key: ProbeKey
    numpy_dtype: str  # dtype as written in the name (bfloat16 data is stored as float32)
    seq: int  # execution order within the process (TensorDump id or our own counter)
    tensordump_in_mode: bool


def parse_raw_tensor_name(file_name: str) -> Optional[RawTensorName]:
    """Parse a raw tensor file name; None when the file is not one of ours."""
    m = _RAW_TENSOR_RE.match(file_name)
    if m is None:
        return None
    call = None if m["call"] == "x" else int(m["call"])
    key = ProbeKey(
        cell_id=int(m["cell"]),
        direction=_LETTER_DIR[m["dir"]],
        slot=m["slot"],
        vkind=m["vkind"],
        path=tuple(int(p) for p in m["path"].split(".")),
        call=call,
    )
    return RawTensorName(key, m["dtype"], int(m["seq"]), m["mode"] == "in")


def raw_rank_dir_name(rank: int) -> str:
    return f"rank{rank}"


_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^rank(\d*)$")


def step_dir_name(step: int) -> str:
    return f"step{step}"


def parse_step_dir_name(name: str) -> Optional[int]:
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def parse_rank_dir_name(name: str) -> Optional[int]:
    """``rank3`` -> 3, ``rank`` -> 0 (single card), anything else -> None."""
    m = _RANK_RE.match(name)
    if m is None:
        return None
    return int(m.group(1)) if m.group(1) else 0


# ---------------------------------------------------------------------------
# msprobe names
# ---------------------------------------------------------------------------


def output_rank_dir_name(rank: int, distributed: bool) -> str:
    """msprobe's folder: ``rank`` in a single-card run, ``rank{R}`` in a distributed one."""
    return f"rank{rank}" if distributed else "rank"


def cell_prefix(cell_name: str, class_name: str) -> str:
    return f"Cell.{cell_name}.{class_name}"


def entry_name(cell_name: str, class_name: str, direction: str, call: int) -> str:
    return f"{cell_prefix(cell_name, class_name)}.{direction}.{call}"


def arg_label(path: Tuple[int, ...], kwarg_name: Optional[str] = None) -> str:
    """Index path as msprobe writes it: ``1.0``; a keyword input uses its name first."""
    head = [kwarg_name] if kwarg_name is not None else [str(path[0])]
    return ".".join(head + [str(i) for i in path[1:]])


def data_name(entry: str, io: str, label: str) -> str:
    """``{entry}.{input|output}.{label}.npy`` (the file in dump_tensor_data/)."""
    return f"{entry}.{io}.{label}.npy"


def split_entry_name(entry: str) -> Tuple[str, str, str, int]:
    """``Cell.a.b.Class.forward.3`` -> (``a.b``, ``Class``, ``forward``, 3)."""
    parts = entry.split(".")
    if len(parts) < 5 or parts[0] != "Cell" or parts[-2] not in DIRECTIONS:
        raise ValueError(f"not a cell entry name: {entry!r}")
    return ".".join(parts[1:-3]), parts[-3], parts[-2], int(parts[-1])


# ---------------------------------------------------------------------------
# Processing's own bookkeeping names (temporary and marker files)
# ---------------------------------------------------------------------------

KBK_DIR = "kbk"  # _raw/rank{R}/kbk/**/{iteration}/statistic.csv (Ascend kernel-by-kernel statistics)
KBK_STATISTIC_CSV = "statistic.csv"
PROCESSED_DIR = "_processed"  # _raw/rank{R}/_processed/step{N}.json: what processing consumed
PROCESSING_LOCK = ".processing.lock"


def kbk_iteration_from_dir_name(name: str) -> Optional[int]:
    """MindSpore names the kernel-by-kernel dump's iteration folders by the bare number."""
    return int(name) if name.isdigit() else None


def processed_marker_name(step: int) -> str:
    return f"{step_dir_name(step)}.json"


def partial_output_dir_name(rank_dir: str) -> str:
    """Where an output rank folder is assembled before it is renamed into place."""
    return f".{rank_dir}.partial"


def retired_output_dir_name(rank_dir: str) -> str:
    """Where a replaced output rank folder waits for deletion."""
    return f".{rank_dir}.retired"


def removing_dir_name(name: str) -> str:
    """A raw folder renamed here is being deleted; a leftover one is finished on the next run."""
    return f".{name}.removing"


def is_removing_dir_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(".removing")
