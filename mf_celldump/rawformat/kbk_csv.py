"""Ascend kernel-by-kernel statistics: captures from MindSpore's ``statistic.csv`` files.

Format from MindSpore's source (``mindspore/ccsrc/debug/utils.h`` csvHeaderComm and
header_map, ``debugger_utils.cc`` Write2File, ``csv_writer.h`` WriteToCsv) and checked
against the emulation in ``tests/support/ascend_emulation.py``, never against an NPU: a header
``Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape`` plus
one column per configured statistic (``Max Value``, ``Min Value``, ``Avg Value``,
``L2Norm Value``, ...), every row ending with a comma, a timestamp per row. The capture
side gives each TensorDump kernel ``td_flag``, so its ``Op Name`` is
``{file input}|{scope}`` (``debug_actor.cc`` AscendKbkDump) and the file input ends with
our dash-separated stem (``names.find_kbk_stem``). The dumped tensor is input slot 1
(slot 0 is the file name), which is also the row msprobe 26.2 keeps. A row for input
slot 1 that names no captured value is never dropped silently: a kernel whose file lies in
our raw folder is a problem; another TensorDump user's row (no ``td_flag``, or a file of
theirs) is left out with a warning, and a step where no row is ours is a problem. MindSpore's
``MD5`` column is a real MD5, not msprobe's CRC-32 ``md5``, so it is not used.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mf_celldump.dtypes import mindspore_dtype_name, numpy_dtype_name
from mf_celldump.errors import short_repr
from mf_celldump.fsutil import open_own_file
from mf_celldump.rawformat.keys import BACKWARD, FORWARD, KIND_TENSOR, Capture, scalar_of_kind
from mf_celldump.rawformat.manifest import Manifest
from mf_celldump.rawformat.names import RAW_ROOT, find_kbk_stem, parse_kbk_op_name
from mf_celldump.statistics import StatValues, statistics_record

REQUIRED_COLUMNS = ("Op Name", "IO", "Slot", "Data Type", "Shape")
_INT_RE = re.compile(r"\d+")
# Our raw rank folder in a kernel's file input, with "/" possibly turned into "_" (up to MindSpore 2.7.0).
_OUR_RAW_FOLDER_RE = re.compile(r"[/_]" + re.escape(RAW_ROOT) + r"[/_]rank\d+[/_]")


@dataclass
class KbkRead:
    captures: List[Capture] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    foreign: List[str] = field(default_factory=list)  # "file:line: op name" of other TensorDump users' rows


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


def _stat_values(row: Dict[str, str]) -> StatValues:
    negative, positive = row.get("Negative Inf Count"), row.get("Positive Inf Count")
    return StatValues(
        max=_number(row.get("Max Value")),
        min=_number(row.get("Min Value")),
        mean=_number(row.get("Avg Value")),
        norm=_number(row.get("L2Norm Value")),
        nan_count=_int(row["NaN Count"]) if "NaN Count" in row else None,
        inf_count=_int(negative) + _int(positive) if negative is not None or positive is not None else None,
    )


def _kind_of(dtype_text: str) -> str:
    name = numpy_dtype_name(dtype_text)
    if name == "bool":
        return "b"
    if name.startswith(("int", "uint")):
        return "i"
    return "f"


TENSOR_SLOT = 1  # TensorDump(file, x): x is input 1


def _read_rows(path: str, file_index: int, out: KbkRead) -> List[tuple]:
    """(timestamp, (file, line), row, origin) of every input-slot-1 row of one csv; a file we cannot
    read safely (a link, not a plain file, bad encoding) is a problem and its rows are not used."""
    try:
        with open_own_file(path, None) as raw:
            handle = io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors="replace", newline="")
            return _rows_of(csv.DictReader(handle), path, file_index, out)
    except (OSError, ValueError, csv.Error) as err:  # UnsafePathError is a ValueError
        out.problems.append(f"{path}: unreadable statistic.csv ({str(err)[:300]}); its rows are not used")
        return []


def _rows_of(reader: csv.DictReader, path: str, file_index: int, out: KbkRead) -> List[tuple]:
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        out.problems.append(f"{path}: not a MindSpore statistic.csv (missing columns {', '.join(missing)})")
        return []
    reader.fieldnames = header
    rows = []
    for line, row in enumerate(reader, start=2):
        if (row.get("IO") or "").strip().lower() != "input" or _int(row.get("Slot"), -1) != TENSOR_SLOT:
            continue  # output rows, and the file-name input (slot 0)
        op_name = row.get("Op Name") or ""
        if find_kbk_stem(op_name) is None:
            if _names_our_file(op_name):
                out.problems.append(f"{path}:{line}: the row of kernel {op_name[:200]!r} names a file of "
                                    "mf_celldump's raw folder but no value it captured; not attributed")
            else:
                out.foreign.append(f"{path}:{line}: {op_name[:200]!r}")
            continue
        rows.append((_int(row.get("Timestamp")), (file_index, line), row, f"{path}:{line}"))
    return rows


def captured_directions(manifest: Manifest) -> Tuple[str, ...]:
    """The directions a capture recorded (the manifest's informative data_mode; both when absent)."""
    mode = manifest.details.get("data_mode", "all")
    return tuple(d for d, modes in ((FORWARD, ("forward", "all")), (BACKWARD, ("backward", "all"))) if mode in modes)


def _names_our_file(op_name: str) -> bool:
    """A ``td_flag`` kernel whose file input lies in a raw rank folder of ours (``_raw/rank{R}/``)."""
    file_part, sep, _ = op_name.partition("|")
    return bool(sep) and _OUR_RAW_FOLDER_RE.search(file_part) is not None


def _report_foreign(out: KbkRead, ours: List[tuple], directions: Tuple[str, ...]) -> None:
    """Rows of other TensorDump users (MindFormers' monitor, a TensorDump in the model) are theirs, not
    problems. But when forward values were captured and no forward row is ours beside them, mf_celldump's
    forward kernels lost ``td_flag`` (which the capture sets; MindSpore then names none by file): a problem.
    Backward rows cannot lose it: MindSpore sets it on the TensorDump inside DumpGradient itself."""
    if not out.foreign:
        return
    shown = "; ".join(out.foreign[:3]) + ("; ..." if len(out.foreign) > 3 else "")
    found = {find_kbk_stem(row["Op Name"]).direction for _, _, row, _ in ours}
    if FORWARD in directions and FORWARD not in found:
        out.problems.append(f"no statistics row names a forward value captured by mf_celldump, but "
                            f"{len(out.foreign)} TensorDump rows name no file of ours (mf_celldump's kernels carry "
                            f"td_flag, so MindSpore names them by file; did they lose it?): {shown}")
        return
    out.warnings.append(f"{len(out.foreign)} statistics rows of TensorDump kernels that are not mf_celldump's "
                        f"(another TensorDump user of the process, such as MindFormers' training monitor or a "
                        f"TensorDump in the model) were left out: {shown}")


def read_statistic_csvs(paths: List[str], wanted: Tuple[str, ...], first_order: int,
                        directions: Tuple[str, ...] = ()) -> KbkRead:
    """Captures from all csv files of one iteration, in kernel execution order (Timestamp, then file order).

    A row whose values cannot be what MindSpore writes is a problem naming file and line;
    the other rows are used. ``directions``: the directions the capture recorded (forward,
    backward), each of which must have a row of ours when other TensorDump users' rows are there.
    """
    out = KbkRead()
    rows: List[tuple] = []
    for file_index, path in enumerate(paths):
        rows.extend(_read_rows(path, file_index, out))
    _report_foreign(out, rows, directions)
    rows.sort(key=lambda item: (item[0], item[1]))
    for seq, (_, _, row, origin) in enumerate(rows):
        try:
            out.captures.append(_capture(row, origin, seq, first_order + seq, wanted))
        except (ValueError, OverflowError) as err:
            out.problems.append(f"{origin}: unusable statistics row ({str(err)[:200]})")
    return out


def _capture(row: Dict[str, str], origin: str, seq: int, order: int, wanted: Tuple[str, ...]) -> Capture:
    parsed = parse_kbk_op_name(row["Op Name"])
    key = parsed.key
    if key.kind != KIND_TENSOR:
        return Capture(seq, order, key, origin, value=scalar_of_kind(key.kind, _number(row.get("Max Value"))))
    dtype_text = (row.get("Data Type") or "").strip()[:64] or "unknown"
    dims = _INT_RE.findall(row.get("Shape") or "")
    if len(dims) > 64 or any(len(d) > 18 for d in dims):
        raise ValueError(f"'Shape' {short_repr(row.get('Shape'))} is not a tensor shape")
    shape = tuple(int(d) for d in dims)
    stats = statistics_record(_stat_values(row), wanted, _kind_of(dtype_text))
    # A widened value's row is of its float32 copy (statistics computed in float32); dump.json names its own dtype.
    dtype = mindspore_dtype_name(parsed.widened_from or dtype_text)
    return Capture(seq, order, key, origin, dtype=dtype, shape=shape, stats=stats, in_mode=parsed.tensordump_in_mode)
