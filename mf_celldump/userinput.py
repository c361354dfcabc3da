"""What users write, read the same way wherever they write it (the configuration, layer-mapping files,
the command line): YAML text, steps and ranks as index selections, the worker count.

A value shown in a message goes through ``errors.short_repr`` (bounded whatever its size). YAML
texts are read bounded (size, UTF-8, no NUL byte) and walked as parser events before anything is
composed, so nesting and alias loops are refused with the file and line before any recursion runs.
Ground floor: imports only ``errors`` of the package, so the configuration, the mapping parser,
capture, processing, the analysis tools and the command line all take these from here.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Optional, Set, Tuple

import yaml

from mf_celldump.errors import ConfigError, short_repr


def bad_value(key: str, value: Any, valid: str) -> str:
    """The message for an invalid value of ``key``: the value, bounded, and what is valid."""
    return f"{key}: invalid value {short_repr(value)}; valid: {valid}"


@dataclass(frozen=True)
class IndexSelection:
    """A set of non-negative integers (steps or ranks) kept as sorted, merged inclusive spans.

    ``spans=None`` means all. Spans keep a selection like ``"0-100000000"`` small.
    """

    spans: Optional[Tuple[Tuple[int, int], ...]] = None

    @property
    def selects_all(self) -> bool:
        return self.spans is None

    @property
    def values(self) -> Optional[FrozenSet[int]]:
        """Every selected number (None for all); for small selections such as tests and messages."""
        if self.spans is None:
            return None
        return frozenset(v for lo, hi in self.spans for v in range(lo, hi + 1))

    def __contains__(self, item: int) -> bool:
        return self.spans is None or any(lo <= item <= hi for lo, hi in self.spans)

    def from_value(self, start: int, limit: int) -> List[int]:
        """Up to ``limit`` selected numbers >= ``start``, ascending (all: ``start``, ``start+1``...)."""
        spans = self.spans if self.spans is not None else ((start, start + limit - 1),)
        out: List[int] = []
        for lo, hi in spans:
            lo = max(lo, start)
            if lo <= hi:
                out.extend(range(lo, min(hi, lo + limit - len(out) - 1) + 1))
            if len(out) >= limit:
                break
        return out

    @property
    def on_anomaly(self) -> bool:
        """True for ``steps: "anomaly"``: no step is named, the watch chooses them (``AnomalySteps``)."""
        return False

    def describe(self) -> str:
        if self.spans is None:
            return "all"
        return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.spans)

    @classmethod
    def of(cls, values: Iterable[int]) -> IndexSelection:
        return cls(_merge((v, v) for v in values))

    @classmethod
    def parse(cls, value: Any, key: str) -> IndexSelection:
        """Accept ``all``/None, an int, ``"0,5-7"``, or a list of ints and such strings."""
        if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
            return cls(None)
        items: List[Any]
        if isinstance(value, bool):
            raise ConfigError(bad_value(key, value, "'all', an integer, a list, or a string like '0,5-7'"))
        if isinstance(value, int):
            items = [value]
        elif isinstance(value, str):
            items = value.split(",", MAX_SELECTION_ITEMS)
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = list(value)
        else:
            raise ConfigError(bad_value(key, value, "'all', an integer, a list, or a string like '0,5-7'"))
        if len(items) > MAX_SELECTION_ITEMS:
            raise ConfigError(f"{key}: more than {MAX_SELECTION_ITEMS} items; use ranges like '0-999'")
        spans = _merge(_parse_index_item(item, key) for item in items)
        if not spans:
            raise ConfigError(f"{key}: {short_repr(value)} selects nothing; use 'all' or list at least one number")
        return cls(spans)


MAX_SELECTION_ITEMS = 10_000
_RANGE_RE = re.compile(r"^\s*([0-9]{1,15})\s*-\s*([0-9]{1,15})\s*$")
_NUMBER_RE = re.compile(r"^[0-9]{1,15}$")


def _merge(spans: Iterable[Tuple[int, int]]) -> Tuple[Tuple[int, int], ...]:
    merged: List[List[int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return tuple((lo, hi) for lo, hi in merged)


def _parse_index_item(item: Any, key: str) -> Tuple[int, int]:
    if isinstance(item, bool):
        raise ConfigError(bad_value(key, item, "non-negative integers or ranges like '5-7'"))
    if isinstance(item, int):
        if item < 0:
            raise ConfigError(bad_value(key, item, "non-negative integers"))
        return (item, item)
    if isinstance(item, str):
        text = item.strip()
        if _NUMBER_RE.match(text):
            return (int(text), int(text))
        m = _RANGE_RE.match(text)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise ConfigError(f"{key}: range {short_repr(text)} is reversed; write it as '{hi}-{lo}'")
            return (lo, hi)
    raise ConfigError(bad_value(key, item, "non-negative integers or ranges like '5-7'"))


def resolve_jobs(jobs: Any, key: str = "jobs") -> int:
    """Worker processes for processing: a positive integer, or None for the CPU count."""
    if jobs is None:
        return os.cpu_count() or 1
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(bad_value(key, jobs, "a positive integer (worker processes for processing)"))
    return jobs


# -- YAML files: bounded, UTF-8, not nested past what a configuration needs, no alias loop -----------------

MAX_YAML_BYTES = 4 << 20  # a configuration is a few lines; a MindFormers run config a few KB
MAX_YAML_DEPTH = 64


def yaml_events(text: str, source: str, error: type) -> Iterator[yaml.Event]:
    """The parser events of ``text`` (libyaml's when available): the pass every YAML text the package reads
    (configuration and layer-mapping files) makes before anything is composed or built.

    It refuses, with ``error`` naming ``source`` and the line, an alias inside the collection its anchor
    names (``Net: &a {fc1: x, loop: *a}``): ``safe_load`` would build a value that contains itself, and
    every walk over it (validation, messages, the mapping parser) would recurse until RecursionError.
    Reusing a finished collection (``x: &a [1]`` then ``y: *a``) is fine. Syntax errors raise
    ``yaml.YAMLError`` as ``yaml.compose`` would.
    """
    open_collections: List[int] = []  # the event number of each collection started and not yet ended
    still_open: Set[int] = set()
    anchors: Dict[str, Tuple[int, int]] = {}  # anchor -> (event number, line) of its latest definition
    for number, event in enumerate(yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))):
        if isinstance(event, yaml.AliasEvent):
            defined = anchors.get(event.anchor)
            if defined is not None and defined[0] in still_open:
                raise error(f"{source}:{event.start_mark.line + 1}: alias *{event.anchor[:60]} refers to the "
                            f"collection anchored at line {defined[1]}, which holds it: the value would contain "
                            "itself without end; write the values out instead of the alias")
        elif isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            anchors[event.anchor] = (number, event.start_mark.line + 1)
        if isinstance(event, yaml.CollectionStartEvent):
            open_collections.append(number)
            still_open.add(number)
        elif isinstance(event, yaml.CollectionEndEvent):
            still_open.discard(open_collections.pop())
        yield event


def yaml_depth_line(text: str, limit: int = MAX_YAML_DEPTH, source: str = "<string>",
                    error: type = ConfigError) -> Optional[int]:
    """The line where ``text`` nests YAML collections more than ``limit`` deep; None when it does not.

    Walks the parser's events (:func:`yaml_events`, which refuses alias loops with ``error``), which
    keeps its own stack: a document nested 100,000 deep is measured here before any recursive composer
    sees it. Syntax errors raise ``yaml.YAMLError`` as ``yaml.compose`` would.
    """
    depth = 0
    for event in yaml_events(text, source, error):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > limit:
                return event.start_mark.line + 1
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
    return None


def read_yaml_text(path: str, what: str, error: type, max_bytes: int = MAX_YAML_BYTES) -> str:
    """The text of a YAML file, or ``error`` naming it: missing, unreadable, too big, not UTF-8, NUL bytes."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{what} not found: {path}") from None
    except OSError as err:
        raise error(f"cannot read {what} {path}: {err.strerror or err}") from None
    if len(data) > max_bytes:
        raise error(f"{path}: more than {max_bytes >> 20} MiB; not a {what}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); a {what} is "
                    "YAML text") from None
    if "\0" in text:
        raise error(f"{path}: holds NUL bytes (offset {text.index(chr(0))}); a {what} is YAML text")
    return text
