"""Progress of a processing run: a log line every few seconds, and an optional bar on stderr."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, TextIO

logger = logging.getLogger(__name__)

LOG_INTERVAL_S = 10.0
BAR_INTERVAL_S = 0.2
BAR_WIDTH = 30


@dataclass
class Progress:
    """Counts processed files against a total; cheap enough to call once per file."""

    total: int
    show_bar: bool = False
    stream: Optional[TextIO] = None
    done: int = 0
    _start: float = field(default_factory=time.monotonic)
    _last_log: float = field(default_factory=time.monotonic)
    _last_bar: float = 0.0
    _drawn: int = -1

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if now - self._last_log >= LOG_INTERVAL_S:
            self._last_log = now
            rate = self.done / max(now - self._start, 1e-9)
            logger.info("processed %d of %d files (%.0f files/s)", self.done, self.total, rate)
        if self.show_bar and (now - self._last_bar >= BAR_INTERVAL_S or self.done >= self.total):
            self._last_bar = now
            self._draw()

    def _draw(self) -> None:
        self._drawn = self.done
        stream = self.stream or sys.stderr
        filled = int(BAR_WIDTH * self.done / self.total) if self.total else BAR_WIDTH
        stream.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} files")
        stream.flush()

    def finish(self) -> None:
        if self.show_bar and self.total:
            if self._drawn != self.done:
                self._draw()
            (self.stream or sys.stderr).write("\n")
