"""Where capture backends put what they captured: the raw writer, at the running step.

A backend hands values over here and never builds paths or record lines itself; the
sink adds the step and the execution-order number (``seq``) and calls the raw-format
writer, which writes on its own thread. Capture ops call it from whatever thread
MindSpore runs them on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import numpy as np

from mf_celldump.capture.runtime import CaptureRuntime
from mf_celldump.rawformat.keys import ProbeKey, plain_value
from mf_celldump.rawformat.writer import RawWriter


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
