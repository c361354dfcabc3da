"""The tests' own statement of the file formats: literal names, written here, not imported.

Raw format (docs/raw-format.md) and msprobe's output layout, spelled out independently
of ``mf_celldump.rawformat`` and ``mf_celldump.layout.naming``, so a wrong name format in the
package fails the tests instead of passing on both sides.
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional, Tuple

# -- raw tree ---------------------------------------------------------------------------
RAW_ROOT = "_raw"
MANIFEST_FILE = "manifest.json"
RECORDS_FILE = "records.jsonl"
STEP_DONE_FILE = "_step_done.json"
KBK_DIR = "kbk"
PROCESSED_DIR = "_processed"
PROCESSING_LOCK = ".processing.lock"
RAW_FORMAT = "mf_celldump-raw/3"

FORWARD, BACKWARD = "forward", "backward"
SLOT_ARG, SLOT_KWARG, SLOT_OUTPUT = "a", "k", "o"
KIND_TENSOR, KIND_INT, KIND_FLOAT, KIND_BOOL, KIND_NONE = "t", "i", "f", "b", "n"

RAW_FILE_RE = re.compile(
    r"^c(?P<cell>\d+)\.(?P<dir>[fb])\.(?P<slot>[akowg])\.(?P<kind>[tifbn])\.n(?P<call>\d+|x)"
    r"\.p(?P<path>\d+(?:\.\d+)*)(?P<in>_in)?_(?P<dtype>[A-Za-z0-9]+)_(?P<seq>\d+)\.npy$"
)


class Key(NamedTuple):
    cell_id: int
    direction: str
    slot: str
    kind: str
    path: Tuple[int, ...]
    call: Optional[int] = None


class RawFile(NamedTuple):
    key: Key
    dtype: str
    seq: int
    in_mode: bool


def raw_stem(key: Key, sep: str = ".") -> str:
    letter = "f" if key.direction == FORWARD else "b"
    call = "x" if key.call is None else str(key.call)
    return sep.join([f"c{key.cell_id}", letter, key.slot, key.kind, f"n{call}", "p" + sep.join(map(str, key.path))])


def raw_tensor_file_name(key: Key, dtype: str, seq: int) -> str:
    return f"{raw_stem(key)}_{dtype}_{seq}.npy"


def parse_raw_tensor_name(name: str) -> Optional[RawFile]:
    m = RAW_FILE_RE.match(name)
    if m is None:
        return None
    key = Key(int(m["cell"]), FORWARD if m["dir"] == "f" else BACKWARD, m["slot"], m["kind"],
              tuple(int(p) for p in m["path"].split(".")), None if m["call"] == "x" else int(m["call"]))
    return RawFile(key, m["dtype"], int(m["seq"]), bool(m["in"]))


def raw_rank_dir_name(rank: int) -> str:
    return f"rank{rank}"


def step_dir_name(step: int) -> str:
    return f"step{step}"


def parse_step_dir_name(name: str) -> Optional[int]:
    m = re.match(r"^step(\d+)$", name)
    return int(m.group(1)) if m else None


def removing_dir_name(name: str) -> str:
    return f".{name}.removing"


# -- msprobe output -------------------------------------------------------------------------
DUMP_JSON = "dump.json"
CONSTRUCT_JSON = "construct.json"
STACK_JSON = "stack.json"
TENSOR_DIR = "dump_tensor_data"


def split_entry_name(entry: str) -> Tuple[str, str, str, int]:
    """``Cell.a.b.Class.forward.3`` -> (``a.b``, ``Class``, ``forward``, 3)."""
    m = re.match(r"^Cell\.(?P<cell>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward)\.(?P<n>\d+)$", entry)
    assert m is not None, entry
    return m["cell"], m["cls"], m["dir"], int(m["n"])
