"""The watch: rules over the signals a training step already computes, checked once per step.

A user cannot know in advance at which step a NaN or a loss spike will appear, so instead of
guessing ``steps`` they turn on ``watch`` and let a rule choose (``steps: "anomaly"`` then
captures the step after a firing, see ``integrations.watching``). This module holds only the
rules and their state: ``WatchRules`` (the configuration, validated when the configuration is
built) and ``Watch`` (one rank's window of recent values, fed ``StepSignals`` at each step end).
It imports nothing of MindSpore and nothing of the package but ``errors``, so the configuration
can validate with it and a test can drive it with plain numbers.

What a step costs: a few float comparisons and a sorted copy of the window (at most
``MAX_WINDOW`` values) per spike rule; reading the signals off the device is the caller's part.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Deque, Dict, List, Mapping, Optional

from mf_celldump.errors import ConfigError, short_repr

logger = logging.getLogger(__name__)

DEFAULT_LOSS_SPIKE = 3.0  # a loss three times the median of the window
DEFAULT_GRAD_NORM_SPIKE = 10.0  # gradient norms vary more from step to step than the loss
DEFAULT_SPIKE_WINDOW = 50
MAX_WINDOW = 10_000
MIN_HISTORY = 5  # a spike needs this many earlier finite values (or the whole window if smaller)
RULES = ("nan_inf_loss", "nan_inf_grad_norm", "overflow", "loss_spike", "grad_norm_spike")
_FLAGS = ("nan_inf_loss", "nan_inf_grad_norm", "overflow", "stop")
_FACTORS = {"loss_spike": DEFAULT_LOSS_SPIKE, "grad_norm_spike": DEFAULT_GRAD_NORM_SPIKE}


@dataclass(frozen=True)
class WatchRules:
    """Which rules fire and how; ``watch: true`` is this with every default.

    ``loss_spike``/``grad_norm_spike``: the factor over the median of the last ``spike_window``
    finite values that fires the rule, or None (``false`` in the configuration) for no spike rule.
    ``stop``: ask the trainer to stop after the firing step (after the captured step when
    ``steps: "anomaly"`` has one to capture).
    """

    nan_inf_loss: bool = True
    nan_inf_grad_norm: bool = True
    overflow: bool = True
    loss_spike: Optional[float] = DEFAULT_LOSS_SPIKE
    grad_norm_spike: Optional[float] = DEFAULT_GRAD_NORM_SPIKE
    spike_window: int = DEFAULT_SPIKE_WINDOW
    stop: bool = False

    @classmethod
    def names(cls) -> tuple:
        """The keys a ``watch`` mapping accepts."""
        return tuple(f.name for f in fields(cls))

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

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
            raise ConfigError(f"{key}: unknown rule {short_repr(unknown[0])}; valid keys: {', '.join(cls.names())}")
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
        rules = cls(**kwargs)
        if not rules.active_rules():
            raise ConfigError(f"{key}: every rule is off, so nothing would ever fire; leave one of "
                              f"{', '.join(RULES)} on, or set watch: false")
        return rules

    def active_rules(self) -> List[str]:
        return [name for name in RULES if getattr(self, name) not in (False, None)]


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

    def text(self) -> str:
        what = f"value {self.value}"
        if self.reference is not None:
            what += f", {self.value / self.reference:.3g} x the median {self.reference:.6g} of the window"
        return f"watch: step {self.step} rank {self.rank}: rule {self.rule} fired ({what})"


@dataclass
class Watch:
    """One rank's watch: ``check`` each step's signals; the windows hold earlier finite values only."""

    rules: WatchRules
    rank: int = 0
    fired: List[Firing] = field(default_factory=list)
    _losses: Deque[float] = field(init=False, repr=False)
    _norms: Deque[float] = field(init=False, repr=False)

    def __post_init__(self):
        self._losses = deque(maxlen=self.rules.spike_window)
        self._norms = deque(maxlen=self.rules.spike_window)

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
