"""The watch: rules over the signals a training step already computes, checked once per step.

A user cannot know in advance at which step a NaN or a loss spike will appear, so instead of
guessing ``steps`` they turn on ``watch`` and let a rule choose (``steps: "anomaly"`` then
captures the step after a firing, see ``integrations.watching``). This module holds only the
rules and their state: ``WatchRules`` (the configuration, validated when the configuration is
built) and ``Watch`` (one rank's window of recent values, fed ``StepSignals`` at each step end).
It imports nothing of MindSpore and nothing of the package but ``errors``, so the configuration
can validate with it and a test can drive it with plain numbers.

Cell health (``watch: {cells: true}``) adds two rules over what ``capture.health`` read inside the
step: ``nan_inf_cell`` names the first cell in execution order (forward, then backward) whose value
holds a NaN or an Inf, ``cell_spike`` the first whose largest finite |x| passes a factor over the
median of its own window. ``first_in_order`` is THE reading of "first bad cell": the analysis tools
(``mf-celldump anomalies`` over dumps, ``mf-celldump health`` over health files) use it too.

What a step costs: a few float comparisons and a sorted copy of the window (at most
``MAX_WINDOW`` values) per spike rule; reading the signals off the device is the caller's part.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional, Tuple, TypeVar

from mf_celldump.errors import ConfigError, short_repr

logger = logging.getLogger(__name__)

DEFAULT_LOSS_SPIKE = 3.0  # a loss three times the median of the window
DEFAULT_GRAD_NORM_SPIKE = 10.0  # gradient norms vary more from step to step than the loss
DEFAULT_SPIKE_WINDOW = 50
MAX_WINDOW = 10_000
MIN_HISTORY = 5  # a spike needs this many earlier finite values (or the whole window if smaller)
DEFAULT_CELL_SPIKE = 10.0  # a cell's largest |x| ten times the median of its own window
DEFAULT_HEALTH_MAX_BYTES = 1 << 30  # per rank: health/rank{R}.csv stops growing here (docs/watch.md)
MAX_CELLS_EVERY = 1_000_000
# Bit order of watch_ranks' gathered table: new rules go at the end.
RULES = ("nan_inf_loss", "nan_inf_grad_norm", "overflow", "loss_spike", "grad_norm_spike", "nan_inf_cell",
         "cell_spike")
CELL_RULES = ("nan_inf_cell", "cell_spike")
CELL_KEYS = ("cells", "cells_every", "cell_norm", "nan_inf_cell", "cell_spike", "health_max_bytes")
_FLAGS = ("nan_inf_loss", "nan_inf_grad_norm", "overflow", "stop", "cells", "cell_norm", "nan_inf_cell")
_FACTORS = {"loss_spike": DEFAULT_LOSS_SPIKE, "grad_norm_spike": DEFAULT_GRAD_NORM_SPIKE,
            "cell_spike": DEFAULT_CELL_SPIKE}


@dataclass(frozen=True)
class WatchRules:
    """Which rules fire and how; ``watch: true`` is this with every default.

    ``loss_spike``/``grad_norm_spike``: the factor over the median of the last ``spike_window``
    finite values that fires the rule, or None (``false`` in the configuration) for no spike rule.
    ``stop``: ask the trainer to stop after the firing step (after the captured step when
    ``steps: "anomaly"`` has one to capture).
    ``cells``: cell health (``capture.health``) every ``cells_every`` steps, with the L2 norm when
    ``cell_norm``; its rules ``nan_inf_cell`` and ``cell_spike`` (a factor, or None); its record
    ``health/rank{R}.csv`` under ``dump_path`` stops growing at ``health_max_bytes`` (0: no file).
    """

    nan_inf_loss: bool = True
    nan_inf_grad_norm: bool = True
    overflow: bool = True
    loss_spike: Optional[float] = DEFAULT_LOSS_SPIKE
    grad_norm_spike: Optional[float] = DEFAULT_GRAD_NORM_SPIKE
    spike_window: int = DEFAULT_SPIKE_WINDOW
    stop: bool = False
    cells: bool = False
    cells_every: int = 1
    cell_norm: bool = False
    nan_inf_cell: bool = True
    cell_spike: Optional[float] = DEFAULT_CELL_SPIKE
    health_max_bytes: int = DEFAULT_HEALTH_MAX_BYTES

    @classmethod
    def names(cls) -> tuple:
        """The keys a ``watch`` mapping accepts."""
        return tuple(f.name for f in fields(cls))

    def to_dict(self) -> Dict[str, Any]:
        """The rules as ``parse`` reads them back (the cell keys only with cell health on)."""
        values = asdict(self)
        if not self.cells:
            for name in CELL_KEYS:
                values.pop(name)
        return values

    @classmethod
    def parse(cls, value: Any, key: str = "watch") -> Optional[WatchRules]:
        """``watch``'s value: false/None (no watch), true (every default) or a mapping of rules."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: invalid value {short_repr(value)}; valid: true, false, or a mapping of rules "
                              f"with keys {', '.join(cls.names())}")
        unknown = [k for k in value if k not in cls.names()]
        if unknown:
            close = difflib.get_close_matches(short_repr(unknown[0]), cls.names(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{key}: unknown rule {short_repr(unknown[0])}{hint}; "
                              f"valid keys: {', '.join(cls.names())}")
        kwargs: Dict[str, Any] = {}
        for name in _FLAGS:
            if name in value:
                if not isinstance(value[name], bool):
                    raise ConfigError(f"{key}.{name}: invalid value {short_repr(value[name])}; valid: true or false")
                kwargs[name] = value[name]
        for name, default in _FACTORS.items():
            if name in value:
                kwargs[name] = _factor(f"{key}.{name}", value[name], default)
        if "spike_window" in value:
            window = value["spike_window"]
            if isinstance(window, bool) or not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
                raise ConfigError(f"{key}.spike_window: invalid value {short_repr(window)}; valid: an integer from 1 "
                                  f"to {MAX_WINDOW} (the earlier steps a spike is measured against)")
            kwargs["spike_window"] = window
        kwargs.update(_cell_numbers(key, value))
        rules = cls(**kwargs)
        if not rules.active_rules():
            raise ConfigError(f"{key}: every rule is off, so nothing would ever fire; leave one of "
                              f"{', '.join(RULES)} on, or set watch: false")
        return rules

    def active_rules(self) -> List[str]:
        return [name for name in RULES if getattr(self, name) not in (False, None)
                and (self.cells or name not in CELL_RULES)]

    def health_step(self, step: int) -> bool:
        """Whether cell health is read in ``step`` (every ``cells_every`` steps, from step 0)."""
        return self.cells and step % self.cells_every == 0


def _cell_numbers(key: str, value: Mapping[str, Any]) -> Dict[str, Any]:
    """``cells_every`` and ``health_max_bytes``, and no cell key without ``cells: true``."""
    out: Dict[str, Any] = {}
    given = [name for name in CELL_KEYS if name != "cells" and name in value]
    if given and value.get("cells") is not True:
        raise ConfigError(f"{key}.{given[0]}: only means something with cell health on; add {key}.cells: true "
                          "(docs/watch.md, \"Cell health\"), or remove it")
    for name, low, high, what in (("cells_every", 1, MAX_CELLS_EVERY, "read cell health every N steps"),
                                  ("health_max_bytes", 0, None, "bytes of health/rank{R}.csv per rank, 0: no file")):
        if name not in value:
            continue
        number = value[name]
        if isinstance(number, bool) or not isinstance(number, int) or number < low or \
                (high is not None and number > high):
            bound = f"from {low} to {high}" if high is not None else f">= {low}"
            raise ConfigError(f"{key}.{name}: invalid value {short_repr(number)}; valid: an integer {bound} ({what})")
        out[name] = number
    return out


def _factor(key: str, value: Any, default: float) -> Optional[float]:
    if value is False or value is None:
        return None
    if value is True:
        return default
    if isinstance(value, (int, float)) and math.isfinite(value) and value > 1:
        return float(value)
    raise ConfigError(f"{key}: invalid value {short_repr(value)}; valid: a factor > 1 over the median of the window "
                      f"(true for {default:g}), or false for no spike rule")


@dataclass(frozen=True)
class StepSignals:
    """What a step already computed, read by the caller: the loss (a mean where it is a tensor), the
    global gradient norm and the loss-scale wrapper's overflow flag; None where the step gave none."""

    loss: Optional[float] = None
    grad_norm: Optional[float] = None
    overflow: Optional[bool] = None
    loss_scale: Optional[float] = None


@dataclass(frozen=True)
class Firing:
    """One rule that fired: the step, the rank, the rule and the value (with the reference of a spike)."""

    step: int
    rank: int
    rule: str
    value: Any
    reference: Optional[float] = None
    cell: Optional[str] = None  # a cell rule: the cell, its direction and which of its values
    direction: Optional[str] = None
    what: str = ""

    def text(self) -> str:
        what = f"value {self.value}"
        if self.reference is not None:
            what += f", {self.value / self.reference:.3g} x the median {self.reference:.6g} of the window"
        if self.cell is not None:
            what = f"cell {self.cell}, {self.direction} {self.what}, {what}"
        return f"watch: step {self.step} rank {self.rank}: rule {self.rule} fired ({what})"


@dataclass(frozen=True)
class CellReading:
    """One floating value of a cell in one step, as cell health reads it: ``kind`` is ``output`` (a forward
    output), ``output_grad`` (its gradient), ``weight`` or ``weight_grad``; ``index`` the output's position
    among the call's floating outputs (a weight's: among the cell's own parameters); ``call`` the call's
    number in the step (micro-batches are calls); ``order`` the position in the step's execution order."""

    order: int
    direction: str
    cell: str
    kind: str
    index: int
    call: int
    nan: int
    inf: int
    max_abs: float
    norm: Optional[float] = None

    @property
    def bad(self) -> bool:
        return self.nan > 0 or self.inf > 0

    def where(self) -> str:
        return f"{self.kind} {self.index} (call {self.call})"


T = TypeVar("T")


def first_in_order(found: Iterable[Tuple[str, str, T]]) -> Optional[T]:
    """The first bad item of a step: ``found`` gives ``(direction, cell, item)`` for the bad ones in execution
    order. The first forward one wins (else the first backward one), replaced by a later bad one of a
    descendant cell (``cell.`` prefix), so a record listing parents before children still names the innermost
    cell. THE reading of "first bad cell": the watch, ``mf-celldump anomalies`` and ``mf-celldump health``."""
    current: Dict[str, Tuple[str, T]] = {}
    for direction, cell, item in found:
        mine = current.get(direction)
        if mine is None or cell.startswith(mine[0] + "."):
            current[direction] = (cell, item)
    first = current.get("forward") or current.get("backward")
    return None if first is None else first[1]


@dataclass
class Watch:
    """One rank's watch: ``check`` each step's signals; the windows hold earlier finite values only."""

    rules: WatchRules
    rank: int = 0
    fired: List[Firing] = field(default_factory=list)
    _losses: Deque[float] = field(init=False, repr=False)
    _norms: Deque[float] = field(init=False, repr=False)

    _cells: Dict[tuple, Deque[float]] = field(init=False, repr=False)  # (cell, kind, index) -> |x| maxima

    def __post_init__(self):
        self._losses = deque(maxlen=self.rules.spike_window)
        self._norms = deque(maxlen=self.rules.spike_window)
        self._cells = {}

    def check_cells(self, step: int, readings: Iterable[CellReading]) -> List[Firing]:
        """The cell rules over one step's health: at most one firing per rule (the first cell in execution
        order), each logged on one line. A cell's window holds the largest finite |x| of its earlier steps."""
        readings = sorted(readings, key=lambda r: r.order)
        found: List[Firing] = []
        if self.rules.nan_inf_cell:
            first = first_in_order((r.direction, r.cell, r) for r in readings if r.bad)
            if first is not None:
                value = math.nan if first.nan else math.inf
                found.append(Firing(step, self.rank, "nan_inf_cell", value, None, first.cell, first.direction,
                                    f"{first.where()}: {first.nan} NaN, {first.inf} Inf"))
        spikes = self._cell_spikes(readings)
        first = first_in_order((r.direction, r.cell, (r, ref)) for r, ref in spikes)
        if first is not None:
            reading, reference = first
            found.append(Firing(step, self.rank, "cell_spike", reading.max_abs, reference, reading.cell,
                                reading.direction, f"{reading.where()} largest |x|"))
        for firing in found:
            logger.warning("mf_celldump %s", firing.text())
        self.fired.extend(found)
        return found

    def _cell_spikes(self, readings: List[CellReading]) -> List[Tuple[CellReading, float]]:
        """The readings whose largest |x| passes ``cell_spike`` x the median of their cell's window (every
        call of a step is measured against the earlier steps only; the step's largest enters the window)."""
        factor, out = self.rules.cell_spike, []
        largest: Dict[tuple, float] = {}
        for reading in readings:
            if reading.kind == "weight" or not math.isfinite(reading.max_abs):
                continue  # a weight moves by its update: its gradient's spike is the one to see
            key = (reading.cell, reading.kind, reading.index)
            window = self._cells.get(key)
            if factor is not None and window is not None and len(window) >= min(MIN_HISTORY, window.maxlen):
                reference = sorted(window)[len(window) // 2]
                if reference > 0 and reading.max_abs > factor * reference:
                    out.append((reading, reference))
            largest[key] = max(largest.get(key, 0.0), reading.max_abs)
        for key, value in largest.items():
            self._cells.setdefault(key, deque(maxlen=self.rules.spike_window)).append(value)
        return out

    def check(self, step: int, signals: StepSignals) -> List[Firing]:
        """The rules ``signals`` of ``step`` fire (in the order of ``RULES``), each logged on one line."""
        rules = self.rules
        found: List[Firing] = []
        if rules.nan_inf_loss and signals.loss is not None and not math.isfinite(signals.loss):
            found.append(Firing(step, self.rank, "nan_inf_loss", signals.loss))
        if rules.nan_inf_grad_norm and signals.grad_norm is not None and not math.isfinite(signals.grad_norm):
            found.append(Firing(step, self.rank, "nan_inf_grad_norm", signals.grad_norm))
        if rules.overflow and signals.overflow:
            found.append(Firing(step, self.rank, "overflow", True))
        found.extend(self._spike(step, "loss_spike", rules.loss_spike, signals.loss, self._losses))
        found.extend(self._spike(step, "grad_norm_spike", rules.grad_norm_spike, signals.grad_norm, self._norms))
        for firing in found:
            logger.warning("mf_celldump %s", firing.text())
        self.fired.extend(found)
        return found

    def _spike(self, step: int, rule: str, factor: Optional[float], value: Optional[float],
               window: Deque[float]) -> List[Firing]:
        if value is None or not math.isfinite(value):
            return []  # a non-finite value is the NaN/Inf rules' to report, and never enters the window
        fired = []
        if factor is not None and len(window) >= min(MIN_HISTORY, window.maxlen):
            reference = sorted(window)[len(window) // 2]
            if reference > 0 and value > factor * reference:
                fired.append(Firing(step, self.rank, rule, value, reference))
        window.append(value)
        return fired
