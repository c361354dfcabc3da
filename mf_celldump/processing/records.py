"""Reading ``records.jsonl``: statistics and non-tensor values, one JSON object per line.

The file is append-only and may end in a torn line when the run was killed while writing;
that line is reported as a warning and skipped. A bad line elsewhere is a problem (the
raw step is then kept), but never stops the other lines from being used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import List, Optional

from mf_celldump import naming
from mf_celldump.processing.captures import Capture

_DIRS = set(naming.DIRECTIONS)


@dataclass
class RecordsRead:
    captures: List[Capture] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    size: int = 0


def _int(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _parse(obj, origin: str, order: int) -> Capture:
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    seq, cell = _int(obj.get("seq")), _int(obj.get("cell"))
    direction, slot, vkind = obj.get("dir"), obj.get("slot"), obj.get("kind")
    call, path = obj.get("call"), obj.get("path")
    if seq is None or cell is None:
        raise ValueError("'seq' and 'cell' must be integers")
    if direction not in _DIRS or slot not in naming.SLOTS or vkind not in naming.VKINDS:
        raise ValueError(f"invalid dir/slot/kind {direction!r}/{slot!r}/{vkind!r}")
    if call is not None and (_int(call) is None or call < 0):
        raise ValueError(f"invalid call {call!r}")
    if not isinstance(path, list) or not path or any(_int(p) is None or p < 0 for p in path):
        raise ValueError(f"invalid path {path!r}")
    key = naming.ProbeKey(cell, direction, slot, vkind, tuple(path), call)
    if vkind != naming.VKIND_TENSOR:
        return Capture(seq, order, key, origin, value=obj.get("value"))
    shape = obj.get("shape")
    stats = obj.get("stats") or {}
    if not isinstance(shape, list) or not isinstance(stats, dict) or not isinstance(obj.get("dtype"), str):
        raise ValueError("a tensor record needs 'dtype' (string), 'shape' (list) and 'stats' (object)")
    return Capture(seq, order, key, origin, dtype=obj["dtype"], shape=tuple(shape), stats=stats)


def read_records(path: str, first_order: int) -> RecordsRead:
    """All usable lines of ``path``; ``first_order`` numbers captures after the file-based ones."""
    out = RecordsRead()
    with open(path, "rb") as handle:
        data = handle.read()
    out.size = len(data)
    lines = data.split(b"\n")
    ends_clean = data.endswith(b"\n") or not data
    if ends_clean:
        lines.pop()  # the empty string after the final newline
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        origin = f"{path}:{number}"
        is_last = number == len(lines)
        try:
            obj = json.loads(raw)
            out.captures.append(_parse(obj, origin, first_order + number))
        except ValueError as err:
            if is_last and not ends_clean:
                out.warnings.append(f"{origin}: torn last line skipped (the run stopped while writing it)")
            else:
                out.problems.append(f"{origin}: unusable record ({err})")
    return out
