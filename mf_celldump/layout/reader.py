"""Read msprobe-layout dumps (ours or msprobe's, MindSpore or PyTorch) without loading them whole.

``dump.json`` is parsed incrementally: the top-level keys before ``data`` are read as
they come, then each entry of ``data`` is decoded and handed out on its own, so memory
is bounded by the largest single entry whatever the file size (msprobe writes indented
JSON, we write one entry per line; both put ``data`` last, and keys after it are read
when the entries are exhausted).
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from mf_celldump.errors import DumpError
from mf_celldump.layout import naming

CHUNK = 1 << 20
MAX_ENTRY_CHARS = 256 << 20  # one entry bigger than this is not a dump entry
_WS = " \t\r\n"
_DECODER = json.JSONDecoder()


class _Cursor:
    """A sliding text window over a file, refilled as values are decoded."""

    def __init__(self, handle, path: str):
        self.handle = handle
        self.path = path
        self.buf = ""
        self.pos = 0
        self.consumed = 0  # characters dropped from the front of the window
        self.eof = False

    def fill(self) -> bool:
        try:
            data = self.handle.read(CHUNK)
        except UnicodeDecodeError as err:
            raise DumpError(f"{self.path}: not UTF-8 text ({err.reason}); "
                            "a dump.json is JSON text") from None
        except OSError as err:
            raise DumpError(f"{self.path}: cannot read: {err.strerror or err}") from None
        self.consumed += self.pos
        self.buf = self.buf[self.pos :] + data
        self.pos = 0
        if not data:
            self.eof = True
        return bool(data)

    def peek(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf) or not self.fill():
                return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def expect(self, char: str) -> None:
        found = self.peek()
        if found != char:
            raise self.error(f"expected {char!r}, found {found or 'end of file'!r}")
        self.pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except RecursionError:
                raise self.error("JSON nested too deeply to be a dump entry") from None
            except json.JSONDecodeError as err:
                if self.eof:
                    raise self.error(f"invalid JSON: {err.msg}") from None
                if len(self.buf) - self.pos > MAX_ENTRY_CHARS:
                    raise self.error(
                        "a single value is larger than 256 MiB; not an msprobe dump entry"
                    ) from None
                self.fill()
                continue
            if end == len(self.buf) and not self.eof:  # a number may go on in the next chunk
                self.fill()
                continue
            self.pos = end
            return obj

    def error(self, message: str) -> DumpError:
        return DumpError(f"{self.path}: at character {self.consumed + self.pos}: {message}")


def _read_head(cursor: _Cursor, header: Dict[str, Any]) -> bool:
    """Read the keys before ``data`` into ``header``; True when ``data`` follows (the cursor is at its first entry)."""
    cursor.expect("{")
    while True:
        char = cursor.peek()
        if char == "}":
            return False
        key = cursor.value()
        if not isinstance(key, str):
            raise cursor.error("expected a key")
        cursor.expect(":")
        if key == "data":
            cursor.expect("{")
            return True
        header[key] = cursor.value()
        if cursor.peek() == ",":
            cursor.pos += 1


HEAD_BYTES = 16 << 10  # the keys before "data" in a dump.json we wrote (dump_data_dir is a path: < 4 KiB)


def output_run_id(dump_json: str) -> Optional[str]:
    """The run id (``naming.RUN_ID_KEY``) in the head of a dump.json we wrote; None when absent or unreadable.

    Only the head is read (at most ``HEAD_BYTES``), and never through a link.
    """
    try:
        fd = os.open(dump_json, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = handle.read(HEAD_BYTES).decode("utf-8", "replace")
    header: Dict[str, Any] = {}
    try:
        _read_head(_Cursor(io.StringIO(text), dump_json), header)
    except (DumpError, RecursionError):
        pass  # a head cut at HEAD_BYTES or not ours: what was read before still counts
    value = header.get(naming.RUN_ID_KEY)
    return value if isinstance(value, str) and value else None


class DumpJson:
    """One ``dump.json``: ``header`` (task, level, framework, dump_data_dir) and streamed ``entries()``."""

    def __init__(self, path: str):
        self.path = path
        self.header: Dict[str, Any] = {}
        try:
            handle = open(path, encoding="utf-8")  # noqa: SIM115  (closed by the with below)
        except OSError as err:
            raise DumpError(f"{path}: cannot read: {err.strerror or err}") from None
        with handle:  # read the header once, up to "data"
            self.has_data = self._to_data(_Cursor(handle, path))  # False: no "data" key, so no entries

    def _to_data(self, cursor: _Cursor) -> bool:
        """Advance to the first entry of ``data``; header keys go to ``self.header``."""
        return _read_head(cursor, self.header)

    def entries(self) -> Iterator[Tuple[str, Dict[str, Any]]]:
        """(entry name, entry body) in file order, i.e. the dumper's execution order."""
        try:
            handle = open(self.path, encoding="utf-8")  # noqa: SIM115  (closed by the with below)
        except OSError as err:
            raise DumpError(f"{self.path}: cannot read: {err.strerror}") from None
        with handle:
            cursor = _Cursor(handle, self.path)
            if not self._to_data(cursor):
                return
            while cursor.peek() != "}":
                name = cursor.value()
                cursor.expect(":")
                body = cursor.value()
                if not isinstance(name, str):
                    raise cursor.error("an entry name must be a string")
                yield name, body if isinstance(body, dict) else {}
                if cursor.peek() == ",":
                    cursor.pos += 1
            cursor.pos += 1
            if cursor.peek() == ",":  # keys after "data"
                cursor.pos += 1
                self._rest(cursor)

    def _rest(self, cursor: _Cursor) -> None:
        while cursor.peek() not in ("}", ""):
            key = cursor.value()
            cursor.expect(":")
            self.header[key] = cursor.value()
            if cursor.peek() == ",":
                cursor.pos += 1

    @property
    def framework(self) -> str:
        return str(self.header.get("framework") or "mindspore")

    @property
    def task(self) -> str:
        return str(self.header.get("task") or "statistics")


# --- locating dumps -----------------------------------------------------------------
_STEP_RE = re.compile(r"step(\d+)$")
_RANK_RE = re.compile(r"rank(\d*)$")


@dataclass(frozen=True)
class RankDump:
    """One ``step{N}/rank{R}`` folder holding dump.json (``rank`` None: single-card ``rank``)."""

    path: str
    step: Optional[int]
    rank: Optional[int]
    label: str = field(default="")

    @property
    def dump_json(self) -> str:
        return os.path.join(self.path, "dump.json")

    @property
    def data_dir(self) -> str:
        """msprobe reads tensors from dirname(dump.json)/dump_tensor_data whatever dump_data_dir says."""
        return os.path.join(self.path, "dump_tensor_data")


def find_rank_dumps(path: str) -> List[RankDump]:
    """Every rank folder of a dump root (``step*/rank*``), a step folder, or a rank folder."""
    if not os.path.exists(path):
        raise DumpError(f"{path}: no such file or folder")
    if os.path.isfile(path):
        if os.path.basename(path) != "dump.json":
            raise DumpError(f"{path}: give a dump folder or a dump.json")
        path = os.path.dirname(os.path.abspath(path))
    if os.path.isfile(os.path.join(path, "dump.json")):
        return [_rank_dump(path)]
    found = _rank_folders(path)
    if not found:
        for step in sorted(os.listdir(path)):
            if _STEP_RE.match(step) and os.path.isdir(os.path.join(path, step)):
                found.extend(_rank_folders(os.path.join(path, step)))
    if not found:
        raise DumpError(
            f"{path}: no dump.json found; give a dump root (step*/rank*/dump.json), "
            "a step folder or a rank folder"
        )
    return sorted(
        found, key=lambda d: (d.step if d.step is not None else -1, d.rank if d.rank is not None else -1)
    )


def _rank_folders(step_dir: str) -> List[RankDump]:
    out = []
    for name in sorted(os.listdir(step_dir)):
        folder = os.path.join(step_dir, name)
        if os.path.isfile(os.path.join(folder, "dump.json")) and not os.path.islink(folder):
            out.append(_rank_dump(folder))
    return out


def _rank_dump(folder: str) -> RankDump:
    folder = os.path.abspath(folder)
    name = os.path.basename(folder)
    step_match = _STEP_RE.match(os.path.basename(os.path.dirname(folder)))
    rank_match = _RANK_RE.match(name)
    rank = int(rank_match.group(1)) if rank_match and rank_match.group(1) else None
    step = int(step_match.group(1)) if step_match else None
    label = f"step{step}/{name}" if step is not None else name
    return RankDump(folder, step, rank, label)
