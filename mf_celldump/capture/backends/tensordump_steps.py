"""Graph-mode TensorDump: which step folder a global step lands in, and the step filter.

In a compiled graph, TensorDump replaces ``{step}`` in its file path with ``step{K}``,
K being MindSpore's graph step counter: it starts at 0 in every process and moves only
when a TensorDump with the file name ``<tensordump-update-step>`` runs
(TDC ``TensorNameToArrayName`` / ``UpdateStep``). The backend sends that marker at the
end of every step, so while global step G runs, K = G - ``base``. MindSpore writes an
item only if K is in the process-wide filter set by ``_tensordump_set_step`` (an empty
list means every step; TDC ``NeedDump``), checked on its writer thread when the item is
written, so values for steps whose data may still be queued are never dropped from it
(``captured_counters``; at detach the backend reopens the filter around them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from mf_celldump.capture.backends.ascend_primitives import UNREACHABLE_STEP
from mf_celldump.errors import BackendSetupError
from mf_celldump.userinput import IndexSelection

# _tensordump_set_step takes an explicit list: a selection like "0-100000000" cannot be passed.
MAX_FILTER_STEPS = 100_000


@dataclass
class GraphStepMap:
    """Global step G runs while the graph counter is ``G - base``; ``counters`` is the filter (None: all)."""

    selection: IndexSelection
    base: int
    counters: Optional[List[int]]
    captured_counters: List[int] = field(default_factory=list)

    @classmethod
    def start(cls, selection: IndexSelection, first_step: int, counter: int) -> GraphStepMap:
        """The map at attach: ``first_step`` will run at graph counter ``counter``."""
        base = first_step - counter
        if selection.selects_all:
            return cls(selection, base, None)
        return cls(selection, base, _counters(selection, first_step, base))

    def counter_of(self, step: int) -> int:
        return step - self.base

    def mindspore_filter(self) -> List[int]:
        """The list for ``_tensordump_set_step``: never the empty list unless every step is wanted."""
        if self.counters is None:
            return []
        return list(self.counters) or [UNREACHABLE_STEP]

    def realign(self, step: int, counter: int) -> bool:
        """``step`` begins at graph counter ``counter``; re-map if that is not where the map expects it.

        Happens when steps skip or restart (a trainer that attached at compile time with
        another first step). Filter values below ``counter`` are kept: their data may
        still be queued.
        """
        if self.counter_of(step) == counter:
            return False
        self.base = step - counter
        if self.counters is not None:
            kept = [k for k in self.counters if k < counter]
            self.counters = kept + _counters(self.selection, step, self.base)
        return True

    def note_captured(self, step: int) -> None:
        self.captured_counters.append(self.counter_of(step))


def _counters(selection: IndexSelection, first_step: int, base: int) -> List[int]:
    steps = selection.from_value(first_step, MAX_FILTER_STEPS + 1)
    if len(steps) > MAX_FILTER_STEPS:
        raise BackendSetupError(
            f"steps={selection.describe()} selects more than {MAX_FILTER_STEPS} steps from step {first_step}; "
            "graph-mode TensorDump takes an explicit list of steps (_tensordump_set_step): select fewer "
            "steps, or 'all'")
    return [step - base for step in steps]
