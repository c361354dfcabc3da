"""Ascend kernel-by-kernel statistics: captures from MindSpore's ``statistic.csv`` files.

WRITTEN FROM MINDSPORE'S DOCUMENTATION, NOT VERIFIED ON ASCEND: the column names are
those MindSpore documents for its statistics dump (``Op Type, Op Name, Task ID,
Stream ID, Timestamp, IO, Slot, Data Size, Data Type, Shape, Max Value, Min Value,
Avg Value, Count, ... NaN Count, Negative Inf Count, Positive Inf Count, ...,
L2Norm Value, MD5``; which statistic columns appear depends on ``statistic_category``).
The capture side names each TensorDump kernel with our dash-separated stem, which
``naming.find_kbk_stem`` finds inside ``Op Name``. The dumped tensor is the kernel's
last input slot (the file-name argument, when it is an input, comes first).
MindSpore's ``MD5`` column is a real MD5, not msprobe's CRC-32 ``md5``, so it is not used.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mf_celldump import naming
from mf_celldump.dtypes import mindspore_dtype_name
from mf_celldump.processing.captures import Capture

_STAT_COLUMNS = (
    ("max", "Max Value", "Max"),
    ("min", "Min Value", "Min"),
    ("mean", "Avg Value", "Mean"),
    ("norm", "L2Norm Value", "Norm"),
)
_REQUIRED = ("Op Name", "IO", "Slot", "Data Type", "Shape")
_INT_RE = re.compile(r"\d+")


@dataclass
class KbkRead:
    captures: List[Capture] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)


def _number(text: Optional[str]):
    if text is None:
        return None
    text = text.strip()
    if not text or text.lower() in ("none", "null", "n/a"):
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        value = float(text)
    except ValueError:
        return None
    if math.isfinite(value) and value.is_integer() and "." not in text and "e" not in text.lower():
        return int(value)
    return value


def _int(text: Optional[str], default: int = 0) -> int:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return default


def _stats(row: Dict[str, str], wanted: Tuple[str, ...]) -> Dict[str, object]:
    stats: Dict[str, object] = {}
    for name, column, key in _STAT_COLUMNS:
        if name in wanted and column in row:
            stats[key] = _number(row[column])
    if "nan_count" in wanted and "NaN Count" in row:
        stats["nan_count"] = _int(row["NaN Count"])
    if "inf_count" in wanted and ("Negative Inf Count" in row or "Positive Inf Count" in row):
        stats["inf_count"] = _int(row.get("Negative Inf Count")) + _int(row.get("Positive Inf Count"))
    return stats


def _scalar_value(vkind: str, row: Dict[str, str]):
    """A non-tensor value travelled as a one-element tensor: its maximum is the value."""
    value = _number(row.get("Max Value"))
    if value is None or vkind == naming.VKIND_NONE:
        return None
    if vkind == naming.VKIND_INT:
        return int(value)
    if vkind == naming.VKIND_BOOL:
        return bool(value)
    return float(value)


def read_statistic_csvs(paths: List[str], wanted: Tuple[str, ...], first_order: int) -> KbkRead:
    """Captures from all csv files of one iteration, in kernel execution order (Timestamp)."""
    out = KbkRead()
    # (op name, task, stream, timestamp) -> row with the highest input slot
    invocations: Dict[Tuple[str, str, str, str], Tuple[int, int, Dict[str, str], str]] = {}
    position = 0
    for path in paths:
        with open(path, newline="", encoding="utf-8", errors="replace") as handle:
            reader = csv.DictReader(handle)
            header = [h.strip() for h in (reader.fieldnames or [])]
            missing = [c for c in _REQUIRED if c not in header]
            if missing:
                out.problems.append(
                    f"{path}: not a MindSpore statistic.csv (missing columns {', '.join(missing)})"
                )
                continue
            reader.fieldnames = header
            for line, row in enumerate(reader, start=2):
                position += 1
                if (row.get("IO") or "").strip().lower() != "input":
                    continue
                op_name = row.get("Op Name") or ""
                if naming.find_kbk_stem(op_name) is None:
                    continue
                ident = (op_name, row.get("Task ID", ""), row.get("Stream ID", ""), row.get("Timestamp", ""))
                slot = _int(row.get("Slot"))
                known = invocations.get(ident)
                if known is None or slot > known[0]:
                    first = known[1] if known else position
                    invocations[ident] = (slot, first, row, f"{path}:{line}")
    ordered = sorted(invocations.values(), key=lambda item: (_int(item[2].get("Timestamp")), item[1]))
    for seq, (_, _, row, origin) in enumerate(ordered):
        key = naming.find_kbk_stem(row["Op Name"])
        shape = tuple(int(n) for n in _INT_RE.findall(row.get("Shape") or ""))
        dtype = mindspore_dtype_name((row.get("Data Type") or "").strip() or "unknown")
        if key.vkind != naming.VKIND_TENSOR:
            value = _scalar_value(key.vkind, row)
            out.captures.append(Capture(seq, first_order + seq, key, origin, value=value))
            continue
        out.captures.append(
            Capture(seq, first_order + seq, key, origin, dtype=dtype, shape=shape, stats=_stats(row, wanted))
        )
    return out
