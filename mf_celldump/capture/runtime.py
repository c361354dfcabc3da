"""Per-attach mutable capture state: which step runs, whether it is captured, counters.

One ``CaptureRuntime`` belongs to one attached dump. Capture ops consult it when they
execute (graph mode) or when the wrapped ``construct`` runs (PyNative), so nothing
about steps is baked into a compiled graph and nothing is shared between dumps.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Dict, Optional


@dataclass
class CaptureRuntime:
    rank_selected: bool
    step: Optional[int] = None
    active: bool = False  # True while a selected step runs on a selected rank
    closed: bool = False  # set at detach: capture ops compiled into a graph become no-ops
    _calls: Dict[int, int] = field(default_factory=dict)
    _seq: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start_step(self, step: int, selected: bool) -> None:
        with self.lock:
            self.step = step
            self.active = selected and self.rank_selected and not self.closed
            self._calls.clear()

    def stop_step(self) -> None:
        with self.lock:
            self.active = False

    def next_call(self, cell_id: int) -> int:
        """Call index of ``cell_id`` within the step (PyNative, where Python sees each call)."""
        with self.lock:
            n = self._calls.get(cell_id, 0)
            self._calls[cell_id] = n + 1
            return n

    def next_seq(self) -> int:
        """Process-wide execution order for records our own writers produce."""
        with self.lock:
            seq = self._seq
            self._seq += 1
            return seq
