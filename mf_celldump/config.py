"""The dump configuration: one dataclass, built from keywords, a dict or a YAML file.

Every way in (a MindFormers ``callbacks:`` entry, ``attach(net, {...})``, a standalone
YAML file) goes through :meth:`DumpConfig.from_dict`, so validation and its error
messages are the same everywhere. Errors name the key, the bad value and what would
be valid; an unknown key is an error with the closest valid key suggested.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import reprlib
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional, Set, Tuple, Union

import yaml

from mf_celldump.errors import ConfigError, ReplicaSpecError
from mf_celldump.ranks.groups import ReplicaGroups
from mf_celldump.statistics import STATISTICS
from mf_celldump.watch import WatchRules

TASKS = ("tensor", "statistics")
DATA_MODES = ("forward", "backward", "all")
DEFAULT_STATISTICS = ("max", "min", "mean", "norm")
# Seconds on_train_end waits for the background processing of captured steps. Nothing is
# lost when it runs out: the steps stay raw for `mf-celldump process`.
DEFAULT_PROCESS_TIMEOUT = 1800.0
MAX_PROCESS_TIMEOUT = 365 * 24 * 3600.0  # a year: longer waits are not timeouts (threads refuse them)
BACKENDS = ("auto", "tensordump", "host", "device_stats", "kbk_statistics")
DEFAULT_DUMP_DIR_NAME = "celldump"
# Seconds rank 0 waits at train end for the other ranks' step summaries. Below MindSpore's
# node timeout (MS_NODE_TIMEOUT, 30 s by default): a rank that vanished gets the others
# stopped by MindSpore that long after, and the verdict should name it before then.
DEFAULT_RANK_VERDICT_TIMEOUT = 20.0
# A fixed port for the verdict's store must be one a user may open in a firewall (not privileged).
RANK_VERDICT_PORT_RANGE = (1024, 65535)


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
            raise ConfigError(_bad(key, value, "'all', an integer, a list, or a string like '0,5-7'"))
        if isinstance(value, int):
            items = [value]
        elif isinstance(value, str):
            items = value.split(",", MAX_SELECTION_ITEMS)
        elif isinstance(value, (list, tuple, set, frozenset)):
            items = list(value)
        else:
            raise ConfigError(_bad(key, value, "'all', an integer, a list, or a string like '0,5-7'"))
        if len(items) > MAX_SELECTION_ITEMS:
            raise ConfigError(f"{key}: more than {MAX_SELECTION_ITEMS} items; use ranges like '0-999'")
        spans = _merge(_parse_index_item(item, key) for item in items)
        if not spans:
            raise ConfigError(f"{key}: {short_repr(value)} selects nothing; use 'all' or list at least one number")
        return cls(spans)


@dataclass(frozen=True)
class AnomalySteps(IndexSelection):
    """``steps: "anomaly"``: no step is selected before training; a watch rule that fires selects the
    next step while training runs (``CellDump.select_step``)."""

    spans: Optional[Tuple[Tuple[int, int], ...]] = ()

    @property
    def on_anomaly(self) -> bool:
        return True

    def describe(self) -> str:
        return ANOMALY


ANOMALY = "anomaly"
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
        raise ConfigError(_bad(key, item, "non-negative integers or ranges like '5-7'"))
    if isinstance(item, int):
        if item < 0:
            raise ConfigError(_bad(key, item, "non-negative integers"))
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
    raise ConfigError(_bad(key, item, "non-negative integers or ranges like '5-7'"))


# Values in messages are shown through reprlib: a short text whatever the value's size or
# depth (a YAML alias bomb expands to billions of items when fully repr'd).
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = _SHORT.maxfrozenset = 4
_SHORT.maxlevel = 2
SHORT_REPR_MAX = 120


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to at most ``SHORT_REPR_MAX`` characters, in time independent of the value's size."""
    text = _SHORT.repr(value)
    return text if len(text) <= SHORT_REPR_MAX else text[: SHORT_REPR_MAX - 3] + "..."


def _bad(key: str, value: Any, valid: str) -> str:
    return f"{key}: invalid value {short_repr(value)}; valid: {valid}"


def resolve_jobs(jobs: Any, key: str = "jobs") -> int:
    """Worker processes for processing: a positive integer, or None for the CPU count."""
    if jobs is None:
        return os.cpu_count() or 1
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(_bad(key, jobs, "a positive integer (worker processes for processing)"))
    return jobs


def _choice(key: str, value: Any, choices: Tuple[str, ...]) -> str:
    if isinstance(value, str) and value in choices:
        return value
    hint = ""
    if isinstance(value, str):
        close = difflib.get_close_matches(value, choices, n=1)
        if close:
            hint = f" (did you mean {close[0]!r}?)"
    raise ConfigError(f"{key}: invalid value {short_repr(value)}{hint}; valid: {', '.join(choices)}")


def _str_list(key: str, value: Any) -> Tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(_bad(key, value, "a string or a list of non-empty strings"))
    return tuple(value)


def _verdict_port(value: Any) -> Optional[int]:
    """``auto``/null (a free port rank 0 picks outside HCCL's range) or a fixed TCP port a firewall can open."""
    if value is None or value == "auto":
        return None
    low, high = RANK_VERDICT_PORT_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(_bad("rank_verdict_port", value, f"'auto' or a TCP port from {low} to {high}"))
    return value


@dataclass(frozen=True)
class DumpConfig:
    """What to capture, where, and how. See README.md, 'Configuration reference'."""

    dump_path: Optional[str] = None
    task: str = "statistics"
    data_mode: str = "all"
    steps: IndexSelection = field(default_factory=IndexSelection)
    ranks: IndexSelection = field(default_factory=IndexSelection)
    include: Tuple[str, ...] = ("*",)
    exclude: Tuple[str, ...] = ()
    exclude_classes: Tuple[str, ...] = ()
    layer_mapping: Tuple[str, ...] = ("auto",)
    statistics: Tuple[str, ...] = DEFAULT_STATISTICS
    backend: str = "auto"
    parameters: bool = True
    process_on_train_end: bool = True
    process_timeout: float = DEFAULT_PROCESS_TIMEOUT
    jobs: Optional[int] = None
    rank_verdict: bool = False
    rank_verdict_timeout: float = DEFAULT_RANK_VERDICT_TIMEOUT
    rank_verdict_port: Optional[int] = None  # None ("auto"): a free port outside HCCL's range
    replica_groups: ReplicaGroups = field(default_factory=ReplicaGroups)
    watch: Optional[WatchRules] = None  # None: no watch; see mf_celldump/watch.py and docs/watch.md
    anomaly_captures: int = 1  # with steps "anomaly": at most this many steps captured per run
    anomaly_max_bytes: Optional[int] = None  # with steps "anomaly": no capture once dump_path holds this many

    # ------------------------------------------------------------------
    @property
    def captures_forward(self) -> bool:
        return self.data_mode in ("forward", "all")

    @property
    def captures_backward(self) -> bool:
        return self.data_mode in ("backward", "all")

    @property
    def captures_weights(self) -> bool:
        """Each forward entry gets ``parameters`` (the cell's own weights), as msprobe's L0 dump."""
        return self.parameters and self.captures_forward

    @property
    def captures_weight_gradients(self) -> bool:
        """``parameters_grad`` entries (gradients of each cell's own weights), as msprobe's L0 dump."""
        return self.parameters and self.captures_backward

    def resolved_dump_path(self, output_dir: Optional[str] = None) -> str:
        """``dump_path`` or, when unset, ``<output_dir>/celldump`` (MindFormers' convention).

        ``output_dir`` defaults to ``$LOCAL_DEFAULT_PATH`` or ``./output`` as in MindFormers.
        """
        if self.dump_path:
            return os.path.abspath(os.path.expanduser(self.dump_path))
        base = output_dir or os.environ.get("LOCAL_DEFAULT_PATH") or "./output"
        return os.path.abspath(os.path.join(base, DEFAULT_DUMP_DIR_NAME))

    def to_dict(self) -> dict:
        """Plain-data form (what the raw manifest records)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (IndexSelection, ReplicaGroups)):
                value = value.describe()
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, WatchRules):
                value = value.to_dict()
            out[f.name] = value
        return out

    # ------------------------------------------------------------------
    @classmethod
    def keys(cls) -> Tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(
        cls, values: Optional[Mapping[str, Any]] = None, source: str = "configuration"
    ) -> DumpConfig:
        """Validate ``values`` (keys as in the README) and build the config."""
        if values is None:
            values = {}
        if not isinstance(values, Mapping):
            raise ConfigError(
                f"{source}: expected a mapping of configuration keys, got {type(values).__name__}"
            )
        values = dict(values)
        known = cls.keys()
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(short_repr(key), known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{source}: unknown key {short_repr(key)}{hint}; valid keys: {', '.join(known)}")
        kwargs: dict = {}
        if "dump_path" in values and values["dump_path"] is not None:
            kwargs["dump_path"] = _dump_path(values["dump_path"])
        if "task" in values:
            kwargs["task"] = _choice("task", values["task"], TASKS)
        if "data_mode" in values:
            kwargs["data_mode"] = _choice("data_mode", values["data_mode"], DATA_MODES)
        for key in ("steps", "ranks"):
            if key == "steps" and isinstance(values.get(key), str) and values[key].strip().lower() == ANOMALY:
                kwargs[key] = AnomalySteps()
            elif key in values:
                kwargs[key] = IndexSelection.parse(values[key], key)
        for key in ("include", "exclude", "exclude_classes"):
            if key in values:
                kwargs[key] = _str_list(key, values[key])
        if "include" in kwargs and not kwargs["include"]:
            raise ConfigError("include: empty list selects no cell; use ['*'] for all cells")
        if "layer_mapping" in values:
            kwargs["layer_mapping"] = _parse_layer_mapping(values["layer_mapping"])
        if "statistics" in values:
            kwargs["statistics"] = _statistics(values["statistics"])
        if "backend" in values:
            kwargs["backend"] = _choice("backend", values["backend"], BACKENDS)
        for key in ("parameters", "process_on_train_end", "rank_verdict"):
            if key in values:
                flag = values[key]
                if not isinstance(flag, bool):
                    raise ConfigError(_bad(key, flag, "true or false"))
                kwargs[key] = flag
        for key in ("process_timeout", "rank_verdict_timeout"):
            if key in values:
                kwargs[key] = _timeout(values[key], key)
        if "rank_verdict_port" in values:
            kwargs["rank_verdict_port"] = _verdict_port(values["rank_verdict_port"])
        if "replica_groups" in values:
            try:
                kwargs["replica_groups"] = ReplicaGroups.parse(values["replica_groups"], "replica_groups")
            except ReplicaSpecError as err:
                raise ConfigError(str(err)) from None
        if "jobs" in values and values["jobs"] is not None:
            kwargs["jobs"] = resolve_jobs(values["jobs"])
        kwargs.update(_watch_keys(values, kwargs.get("steps")))
        if kwargs.get("backend") == "device_stats" and kwargs.get("task") == "tensor":
            raise ConfigError("backend: 'device_stats' reduces every tensor to statistics on the device and writes no "
                              "tensor file, so it cannot serve task 'tensor'; use backend 'auto' (or 'tensordump', "
                              "'host'), or task 'statistics'")
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls, path: str) -> DumpConfig:
        """Load a standalone YAML file whose top level holds the configuration keys.

        A file shaped like a MindFormers callback entry (with ``type: CellDumpCallback``)
        is accepted too; ``type`` and ``auto_register`` are then ignored. A key given twice
        is an error (YAML would keep the last one silently).
        """
        data = _load_yaml_file(path)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of configuration keys, got {type(data).__name__}")
        data = {k: v for k, v in data.items() if k not in ("type", "auto_register")}
        return cls.from_dict(data, source=path)

    @classmethod
    def coerce(cls, config: Union[DumpConfig, Mapping[str, Any], None]) -> DumpConfig:
        """Accept a DumpConfig, a plain dict of the same keys, or None (defaults)."""
        if isinstance(config, DumpConfig):
            return config
        if config is None or isinstance(config, Mapping):
            return cls.from_dict(config)
        raise ConfigError(f"configuration must be a DumpConfig or a dict, got {type(config).__name__}")


def _watch_keys(values: Mapping[str, Any], steps: Optional[IndexSelection]) -> dict:
    """``watch``, ``anomaly_captures`` and ``anomaly_max_bytes``, checked against ``steps``."""
    out: dict = {}
    if "watch" in values:
        out["watch"] = WatchRules.parse(values["watch"])
    anomaly = steps is not None and steps.on_anomaly
    if anomaly and out.get("watch") is None:
        raise ConfigError("steps: 'anomaly' captures the step after a watch rule fires, but watch is off; add "
                          "watch: true (or a mapping of rules, see docs/watch.md), or name the steps to capture")
    for key in ("anomaly_captures", "anomaly_max_bytes"):
        if key not in values or (key == "anomaly_max_bytes" and values[key] is None):
            continue
        number = values[key]
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            what = "captures per run" if key == "anomaly_captures" else "bytes on disk under dump_path"
            raise ConfigError(_bad(key, number, f"a positive integer ({what})"))
        if not anomaly and number != getattr(DumpConfig, key):
            raise ConfigError(f"{key}: {short_repr(number)} bounds the captures of steps: 'anomaly', but steps is "
                              f"{short_repr(values.get('steps', 'all'))}; set steps: anomaly (with watch), or "
                              f"remove {key}")
        out[key] = number
    return out


def _statistics(stats: Any) -> Tuple[str, ...]:
    if isinstance(stats, str):
        stats = [stats]
    if not isinstance(stats, (list, tuple)):
        raise ConfigError(_bad("statistics", stats, f"a list of: {', '.join(STATISTICS)}"))
    stats = tuple(_choice("statistics", item, STATISTICS) for item in stats)
    if not stats:
        raise ConfigError(f"statistics: empty list; choose from {', '.join(STATISTICS)}")
    return tuple(dict.fromkeys(stats))


def _dump_path(path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ConfigError(_bad("dump_path", path, "a non-empty directory path"))
    path = os.fspath(path)
    if not isinstance(path, str) or "\0" in path:
        raise ConfigError(_bad("dump_path", path, "a directory path (text without NUL bytes)"))
    return path


def _timeout(timeout: Any, key: str = "process_timeout") -> float:
    valid = f"a number of seconds > 0 (at most {MAX_PROCESS_TIMEOUT:.0f}, a year)"
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ConfigError(_bad(key, timeout, valid))
    try:
        seconds = float(timeout)
    except OverflowError:  # an int beyond any float, e.g. 10**400
        raise ConfigError(_bad(key, timeout, valid)) from None
    if not 0 < seconds <= MAX_PROCESS_TIMEOUT:
        raise ConfigError(_bad(key, timeout, valid))
    return seconds


# -- YAML files: bounded, UTF-8, not nested past what a configuration needs, no key twice, no alias loop ---

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


class _UniqueKeyLoader(yaml.SafeLoader):
    """``safe_load`` that refuses a key given twice in one mapping (YAML itself keeps the last)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    ident = (key_node.tag, key_node.value)
                    if ident in seen:
                        raise ConfigError(f"{self.name}:{key_node.start_mark.line + 1}: key {key_node.value!r} "
                                          f"given twice (first at line {seen[ident]}); YAML would keep only the "
                                          "last: keep one")
                    seen[ident] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _load_yaml_file(path: str) -> Any:
    text = read_yaml_text(path, "configuration file", ConfigError)
    try:
        line = yaml_depth_line(text, source=path)
        if line is not None:
            raise ConfigError(f"{path}:{line}: nested more than {MAX_YAML_DEPTH} levels deep; a configuration is "
                              "a mapping of keys to values")
        loader = _UniqueKeyLoader(text)
        loader.name = path
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: YAML syntax error: {err}") from None


def _parse_layer_mapping(value: Any) -> Tuple[str, ...]:
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() == "none"):
        return ()
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    elif isinstance(value, (list, tuple)):
        value = [os.fspath(v) if isinstance(v, os.PathLike) else v for v in value]
    items = _str_list("layer_mapping", value)
    return items
