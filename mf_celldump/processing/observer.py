"""Who watches a processing run: the progress bar, a log line now and then, or a parent process.

``process_dump`` reports what it does to a :class:`ProcessingObserver`: how many files
there are, each file done, each stage of a step's transaction (``output`` in place,
``marker`` written, raw ``removed``), and the entries of each output it puts in place (the
worker makes the step's rank summary of them). The default observer shows progress.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Dict, Iterable, Optional, Tuple

from tqdm import tqdm

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0
STAGES = ("output", "marker", "removed")


class ProcessingObserver:
    """Hooks called by ``process_dump``; every default does nothing."""

    def on_start(self, total_files: int) -> None:
        """Processing is about to read ``total_files`` raw files."""

    def on_file(self) -> None:
        """One raw file was processed (or reported as a problem)."""

    def on_stage(self, rank: int, step: int, stage: str) -> None:
        """A step's transaction reached ``stage`` (one of STAGES)."""

    def on_output(self, rank: int, step: int, entries: Iterable[Tuple[str, Dict[str, Any]]]) -> None:
        """A step's output is in place: ``entries`` streams its dump.json entries (name, body) in order, from
        the entries processing holds (not from the file). Lazy: untouched, it costs nothing; iterated once,
        during this call, memory holds one entry at a time."""

    def on_finish(self) -> None:
        """The run is over (also after an error)."""


class ProgressObserver(ProcessingObserver):
    """A tqdm bar on a terminal, and a log line every ``LOG_INTERVAL_S`` seconds in any case."""

    def __init__(self, show_bar: bool = False, unit: str = "file"):
        self.show_bar = show_bar
        self.unit = unit
        self.done = 0
        self.total = 0
        self._bar: Optional[tqdm] = None
        self._start = self._last_log = time.monotonic()

    def on_start(self, total_files: int) -> None:
        self.total = total_files
        if self.show_bar and total_files:
            self._bar = tqdm(total=total_files, unit=self.unit, desc="processing", leave=False)

    def on_file(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update()
        now = time.monotonic()
        if now - self._last_log >= LOG_INTERVAL_S:
            self._last_log = now
            rate = self.done / max(now - self._start, 1e-9)
            logger.info("processed %d of %d files (%.0f files/s)", self.done, self.total, rate)

    def on_finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
