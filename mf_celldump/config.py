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
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Tuple, Union

import yaml

from mf_celldump.errors import ConfigError, ReplicaSpecError, short_repr
from mf_celldump.ranks.groups import ReplicaGroups
from mf_celldump.statistics import DEFAULT_STATISTICS, STATISTICS, TASKS
from mf_celldump.userinput import (
    MAX_YAML_DEPTH,
    IndexSelection,
    bad_value,
    read_yaml_text,
    resolve_jobs,
    yaml_depth_line,
)
from mf_celldump.watch import WatchRules

DATA_MODES = ("forward", "backward", "all")
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
        raise ConfigError(bad_value(key, value, "a string or a list of non-empty strings"))
    return tuple(value)


def _verdict_port(value: Any) -> Optional[int]:
    """``auto``/null (a free port rank 0 picks outside HCCL's range) or a fixed TCP port a firewall can open."""
    if value is None or value == "auto":
        return None
    low, high = RANK_VERDICT_PORT_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(bad_value("rank_verdict_port", value, f"'auto' or a TCP port from {low} to {high}"))
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
                    raise ConfigError(bad_value(key, flag, "true or false"))
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
            raise ConfigError(bad_value(key, number, f"a positive integer ({what})"))
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
        raise ConfigError(bad_value("statistics", stats, f"a list of: {', '.join(STATISTICS)}"))
    stats = tuple(_choice("statistics", item, STATISTICS) for item in stats)
    if not stats:
        raise ConfigError(f"statistics: empty list; choose from {', '.join(STATISTICS)}")
    return tuple(dict.fromkeys(stats))


def _dump_path(path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ConfigError(bad_value("dump_path", path, "a non-empty directory path"))
    path = os.fspath(path)
    if not isinstance(path, str) or "\0" in path:
        raise ConfigError(bad_value("dump_path", path, "a directory path (text without NUL bytes)"))
    return path


def _timeout(timeout: Any, key: str = "process_timeout") -> float:
    valid = f"a number of seconds > 0 (at most {MAX_PROCESS_TIMEOUT:.0f}, a year)"
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise ConfigError(bad_value(key, timeout, valid))
    try:
        seconds = float(timeout)
    except OverflowError:  # an int beyond any float, e.g. 10**400
        raise ConfigError(bad_value(key, timeout, valid)) from None
    if not 0 < seconds <= MAX_PROCESS_TIMEOUT:
        raise ConfigError(bad_value(key, timeout, valid))
    return seconds


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
