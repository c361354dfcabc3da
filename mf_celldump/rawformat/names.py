"""Names of everything under ``{dump_path}/_raw``: folders, raw tensor files, marker files.

A raw tensor file's stem encodes everything processing needs (cell id, direction,
slot, value kind, call, index path), so processing never guesses from cell names.
Cell names never appear in raw file names: a cell is referred to by its integer id
from the rank manifest, so no cell name can steer a file outside ``dump_path``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from mf_celldump.rawformat.keys import BACKWARD, FORWARD, ProbeKey

# {dump_path}/{RAW_ROOT}/rank{R}/{MANIFEST_FILE}, .../step{N}/...
RAW_ROOT = "_raw"
MANIFEST_FILE = "manifest.json"
RECORDS_FILE = "records.jsonl"
STEP_DONE_FILE = "_step_done.json"
KBK_DIR = "kbk"  # rank{R}/kbk/**/{iteration}/statistic.csv (Ascend kernel-by-kernel statistics)
KBK_CONFIG_FILE = "kbk_dump_config.json"
KBK_STATISTIC_CSV = "statistic.csv"
PROCESSED_DIR = "_processed"  # rank{R}/_processed/step{N}.json: what processing consumed
PROCESSING_LOCK = ".processing.lock"

_DIR_LETTER = {FORWARD: "f", BACKWARD: "b"}

# Every number in a name we write is written by ``str(int)``: no sign, no leading zero. A
# name is ours only when it reads back to itself (``step01`` and ``rank00`` are not ours:
# taking them for step 1 and rank 0 would mix their data with the real step 1 and rank 0).
# Each number also has a bounded count of digits, so no name can make a reader build huge
# integers.


def _number(digits: int) -> str:
    return rf"(?:0|[1-9]\d{{0,{digits - 1}}})"


STEP_DIGITS = 12
MAX_STEP = 10**STEP_DIGITS - 1  # the largest global step a raw step folder can name
RANK_DIGITS = 9
MAX_RANK = 10**RANK_DIGITS - 1
_LETTER_DIR = {v: k for k, v in _DIR_LETTER.items()}

# c{cell}.{f|b}.{slot}.{kind}.n{call|x}.p{i.j.k}  + TensorDump's [_in]_{dtype}_{id}.npy
_N9, _N6 = _number(9), _number(6)
_RAW_TENSOR_RE = re.compile(
    rf"^c(?P<cell>{_N9})\.(?P<dir>[fb])\.(?P<slot>[akowg])\.(?P<kind>[tifbn])\.n(?P<call>{_N9}|x)"
    rf"\.p(?P<path>{_N6}(?:\.{_N6}){{0,31}})(?:_(?P<mode>in))?_(?P<dtype>[A-Za-z0-9]{{1,32}})"
    rf"_(?P<seq>{_number(18)})\.npy$"
)
_KBK_STEM_RE = re.compile(
    rf"c(?P<cell>{_N9})-(?P<dir>[fb])-(?P<slot>[akowg])-(?P<kind>[tifbn])-n(?P<call>{_N9}|x)"
    rf"-p(?P<path>{_N6}(?:-{_N6}){{0,31}})(?:-w(?P<wide>bfloat16|float16))?(?![0-9])"
)
# A kernel-by-kernel stem ends with -w{dtype} when the capture widened a bfloat16/float16 value
# to float32 before its TensorDump, so that MindSpore's device statistics kernels, which
# allocate their result in the input's dtype (statistic_kernel.cc), compute in float32;
# {dtype} is the value's own dtype, which dump.json reports.
WIDENED_DTYPES = ("bfloat16", "float16")
# The file part of a kernel-by-kernel Op Name ends with our stem: TensorDump's file input as
# the graph holds it, after MindSpore's parallel pass may have appended "_in.npy"
# (parallel_tensordump.cc GetInModeSuffixedDumpPath), and with "/", "\", "." and " " turned
# into "_" up to MindSpore 2.7.0 (dump_utils.cc GetFileKernelName).
_KBK_FILE_END_RE = re.compile(_KBK_STEM_RE.pattern + r"(?P<in_mode>_in[._]npy)?$")
# MindSpore names a graph-mode TensorDump file {file}_{dtype}_{id}.npy; our step-done
# marker's {file} is _td_done_g{global step}.
TD_DONE_PREFIX = "_td_done_g"
_TD_DONE_RE = re.compile(rf"^_td_done_g(?P<step>{_number(STEP_DIGITS)})_[A-Za-z0-9]{{1,32}}_{_number(18)}\.npy$")
# The same marker for a step that was not selected but written anyway (another TensorDump user
# keeps MindSpore's process-wide step filter open): the folder is deleted once it holds it.
TD_SKIP_PREFIX = "_td_skip_g"
_TD_SKIP_RE = re.compile(rf"^_td_skip_g(?P<step>{_number(STEP_DIGITS)})_[A-Za-z0-9]{{1,32}}_{_number(18)}\.npy$")
_STEP_RE = re.compile(rf"^step({_number(STEP_DIGITS)})$")
_RANK_RE = re.compile(rf"^rank({_number(RANK_DIGITS)})$")
# What a step or rank folder name looks like with any number: told apart from ours to warn about it.
_LOOKS_NUMBERED = re.compile(r"^(?:step|rank)\d+$")


def raw_stem(key: ProbeKey, sep: str = ".", widened_from: Optional[str] = None) -> str:
    """File stem for a raw tensor of ``key``; writers append ``_{dtype}_{seq}.npy``.

    ``sep="-"`` gives the form used inside kernel names of MindSpore's kernel-by-kernel
    statistics dump (``statistic.csv``), where dots are not kept; there ``widened_from``
    (one of ``WIDENED_DTYPES``) says the value was cast to float32 for the dump.
    """
    call = "x" if key.call is None else str(key.call)
    path = sep.join(str(i) for i in key.path)
    letter = _DIR_LETTER[key.direction]
    stem = sep.join((f"c{key.cell_id}", letter, key.slot, key.kind, f"n{call}", f"p{path}"))
    if widened_from:
        if sep != "-" or widened_from not in WIDENED_DTYPES:
            raise ValueError(f"only kernel-by-kernel stems name a widened dtype ({', '.join(WIDENED_DTYPES)}), "
                             f"not {widened_from!r} with separator {sep!r}")
        stem += f"-w{widened_from}"
    return stem


def raw_tensor_file_name(key: ProbeKey, dtype: str, seq: int) -> str:
    """Full raw file name as our own writers produce it (same shape as TensorDump's)."""
    return f"{raw_stem(key)}_{dtype}_{seq}.npy"


def _key(match: re.Match, sep: str) -> ProbeKey:
    return ProbeKey(
        cell_id=int(match["cell"]),
        direction=_LETTER_DIR[match["dir"]],
        slot=match["slot"],
        kind=match["kind"],
        path=tuple(int(p) for p in match["path"].split(sep)),
        call=None if match["call"] == "x" else int(match["call"]),
    )


@dataclass(frozen=True)
class RawTensorName:
    key: ProbeKey
    numpy_dtype: str  # dtype as written in the name (bfloat16 data is stored as float32)
    seq: int  # execution order within the process (TensorDump id or our own counter)
    tensordump_in_mode: bool


def parse_raw_tensor_name(file_name: str) -> Optional[RawTensorName]:
    """Parse a raw tensor file name; None when the file is not one of ours.

    Every number has a bounded number of digits, so no name can make a reader build
    huge integers or deep index paths.
    """
    m = _RAW_TENSOR_RE.match(file_name)
    if m is None:
        return None
    return RawTensorName(_key(m, "."), m["dtype"], int(m["seq"]), m["mode"] == "in")


@dataclass(frozen=True)
class KbkName:
    """What the ``Op Name`` of a ``statistic.csv`` row says about the value."""

    key: ProbeKey
    widened_from: Optional[str]  # numpy-style dtype the value had before the capture's cast, else None
    tensordump_in_mode: bool  # the file input carries MindSpore's "_in.npy" ('in' mode, parallel pass)


def parse_kbk_op_name(op_name: str) -> Optional[KbkName]:
    """Our dash-separated stem in a ``statistic.csv`` ``Op Name``; None if absent.

    MindSpore names a TensorDump kernel that carries ``td_flag`` ``{file input}|{scope}``
    (debug_actor.cc ``AscendKbkDump``); the stem ends the file part. A name without that
    form is searched whole (the last match), as earlier readers did.
    """
    file_part, sep, _ = op_name.partition("|")
    if sep:
        m = _KBK_FILE_END_RE.search(file_part)
        if m is not None:
            return KbkName(_key(m, "-"), m["wide"], m["in_mode"] is not None)
    matches = list(_KBK_STEM_RE.finditer(op_name[:4096]))
    if not matches:
        return None
    return KbkName(_key(matches[-1], "-"), matches[-1]["wide"], False)


def find_kbk_stem(op_name: str) -> Optional[ProbeKey]:
    """The probe key in a ``statistic.csv`` ``Op Name`` (``parse_kbk_op_name``); None if absent."""
    parsed = parse_kbk_op_name(op_name)
    return parsed.key if parsed is not None else None


def td_done_stem(step: int) -> str:
    """The file name our step-done marker is sent with (MindSpore appends ``_{dtype}_{id}.npy``)."""
    return f"{TD_DONE_PREFIX}{step}"


def parse_td_done_name(name: str) -> Optional[int]:
    """The global step a graph-mode TensorDump step-done marker file names; None if it is not one."""
    m = _TD_DONE_RE.match(name)
    return int(m["step"]) if m else None


def td_skip_stem(step: int) -> str:
    """The file name the marker of a written but not selected step is sent with."""
    return f"{TD_SKIP_PREFIX}{step}"


def parse_td_skip_name(name: str) -> Optional[int]:
    """The global step a not-selected-step marker file names; None if it is not one."""
    m = _TD_SKIP_RE.match(name)
    return int(m["step"]) if m else None


def is_step_marker(name: str) -> bool:
    """A file that marks a raw step folder complete (ours, or the one MindSpore writes for us)."""
    return name == STEP_DONE_FILE or name.startswith((TD_DONE_PREFIX, TD_SKIP_PREFIX))


def rank_dir_name(rank: int) -> str:
    """Raw rank folders are always numbered, also on a single card."""
    return f"rank{rank}"


def parse_rank_dir_name(name: str) -> Optional[int]:
    m = _RANK_RE.match(name)
    return int(m.group(1)) if m else None


def step_dir_name(step: int) -> str:
    return f"step{step}"


def parse_step_dir_name(name: str) -> Optional[int]:
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def looks_numbered(name: str) -> bool:
    """``step{digits}`` or ``rank{digits}``: a name like ours, which is ours only if it parses."""
    return _LOOKS_NUMBERED.match(name) is not None


_ITERATION_RE = re.compile(rf"^{_number(STEP_DIGITS)}$")


def kbk_iteration_from_dir_name(name: str) -> Optional[int]:
    """MindSpore names the kernel-by-kernel dump's iteration folders by the bare number (``str(int)``)."""
    return int(name) if _ITERATION_RE.match(name) else None


def processed_marker_name(step: int) -> str:
    return f"{step_dir_name(step)}.json"


def parse_processed_marker_name(name: str) -> Optional[int]:
    return parse_step_dir_name(name[: -len(".json")]) if name.endswith(".json") else None


def set_aside_dir_name(step_dir: str, stamp: str) -> str:
    """Where a step folder of an earlier, unprocessed run is moved when the step is captured again."""
    return f"{step_dir}.earlier-{stamp}"


def removing_dir_name(name: str) -> str:
    """A raw folder renamed here is being deleted; a leftover one is finished on the next run."""
    return f".{name}.removing"


def is_removing_dir_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(".removing")


# TensorDump replaces this path component with ``step{N}`` (N = the graph's step counter),
# which is the form ``step_dir_name`` gives; graph-mode TensorDump paths use it in place of
# a numbered step folder.
TENSORDUMP_STEP_PLACEHOLDER = "{step}"
