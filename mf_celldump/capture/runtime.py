"""Per-attach capture state, and the sink backends hand what they capture to.

One ``CaptureRuntime`` belongs to one attached dump: which step runs, whether it is
captured, counters. Capture ops consult it when they execute (graph mode) or when the
wrapped ``construct`` runs (PyNative), so nothing about steps is baked into a compiled
graph and nothing is shared between dumps.

A backend hands values over to the ``RawSink`` and never builds paths or record lines
itself; the sink adds the running step and the execution-order number (``seq``) from the
runtime and calls the raw-format writer, which writes on its own thread. Capture ops
call it from whatever thread MindSpore runs them on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import numpy as np

from mf_celldump.rawformat.keys import ProbeKey, plain_value
from mf_celldump.rawformat.writer import RawWriter


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


@dataclass
class RawSink:
    runtime: CaptureRuntime
    writer: RawWriter

    def value(self, key: ProbeKey, value: Any) -> None:
        """A non-tensor argument (int, float, bool, None) of the running step."""
        self.writer.append_record(self.runtime.step, key, self.runtime.next_seq(), value=plain_value(value))

    def statistics(self, key: ProbeKey, dtype: str, shape: Tuple[int, ...], stats: Dict[str, Any],
                   seq: int) -> None:
        """Statistics of a tensor (``dtype`` in MindSpore's spelling); ``seq`` taken when it was captured."""
        self.writer.append_record(self.runtime.step, key, seq, dtype=dtype, shape=list(shape), stats=stats)

    def tensor(self, key: ProbeKey, array: np.ndarray, dtype_name: str) -> None:
        """A whole tensor as a raw ``.npy`` file (``dtype_name`` numpy-style, ``bfloat16`` allowed)."""
        self.writer.write_tensor(self.runtime.step, key, array, dtype_name, self.runtime.next_seq())
