"""What the example prints: MindFormers' own output goes to a log file, the terminal gets progress.

MindFormers and MindSpore print hundreds of lines (configuration dumps, deprecation
warnings) from Python and from C++; both write to file descriptors 1 and 2, so those are
pointed at the log file and the terminal keeps a duplicate of the original stdout for
the lines a user needs: one per training step (a tqdm bar on a terminal), then where
the dump is and what it holds.
"""

from __future__ import annotations

import os
import sys
import time
from typing import List, Optional, TextIO

from tqdm import tqdm


class Console:
    """The user's terminal, while fds 1 and 2 may be redirected to a log file."""

    def __init__(self, out: TextIO, log_path: Optional[str] = None, saved_fds: Optional[List[int]] = None):
        self.out = out
        self.log_path = log_path
        self._saved = saved_fds or []

    @classmethod
    def plain(cls) -> Console:
        return cls(sys.stdout)

    @classmethod
    def to_log(cls, log_path: str) -> Console:
        """Send fds 1 and 2 (Python and C++ output alike) to ``log_path``; keep the terminal for us."""
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        out = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding="utf-8", errors="replace")
        # appended to, never truncated: the log of an earlier run in the same folder stays
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        os.write(log_fd, f"\n===== run_tiny_llama.py started {time.strftime('%Y-%m-%d %H:%M:%S')} "
                         f"(pid {os.getpid()}) =====\n".encode())
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        return cls(out, log_path, saved)

    def say(self, text: str) -> None:
        tqdm.write(text, file=self.out)

    def restore(self) -> None:
        """Point fds 1 and 2 back at the terminal."""
        if not self._saved:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._saved = []


def step_progress_callback(console: Console, total_steps: int, dump_path: str, selected_steps=None,
                           processed: bool = True):
    """A MindSpore callback printing one line (or advancing a tqdm bar) per training step.

    ``selected_steps`` (an ``IndexSelection``, None = every step; ``steps: anomaly``: the watch
    picks them while training runs) says which steps are captured; their processed output
    appears under ``dump_path`` when the background worker has finished them, so the line says
    "captured", not where the output is. With ``processed`` False (``process_on_train_end:
    false``) no step folder is made during the run: the line says the step is raw under ``_raw/``.
    """
    from mindspore.train import Callback

    class StepProgress(Callback):
        def __init__(self):
            super().__init__()
            self.start = time.monotonic()
            self.bar = None
            if console.out.isatty():
                self.bar = tqdm(total=total_steps, unit="step", desc="training", file=console.out, leave=False)
            self.losses: List[float] = []
            self.last_step = -1  # the last step the run reached (-1: none)

        def on_train_step_end(self, run_context):
            params = run_context.original_args()
            step = int(params.cur_step_num) + int(getattr(params, "initial_step", 0) or 0) - 1
            loss = _loss_of(getattr(params, "net_outputs", None))
            if loss is not None:
                self.losses.append(loss)
            seconds = time.monotonic() - self.start
            self.start = time.monotonic()
            self.last_step = max(self.last_step, step)
            captured = selected_steps is None or step in selected_steps
            where = f"step{step}/" if processed else "_raw/ (raw; `mf-celldump process` makes its step folder)"
            dumped = f"captured into {os.path.basename(dump_path)}/{where}" if captured else "not captured"
            if selected_steps is not None and selected_steps.on_anomaly:
                dumped = "watched (a step is captured when a watch rule fires)"
            loss_text = "-" if loss is None else f"{loss:.4f}"
            console.say(f"step {step}: loss {loss_text}, {seconds:.1f} s, {dumped}")
            if self.bar is not None:
                self.bar.update()

        def on_train_end(self, run_context):
            if self.bar is not None:
                self.bar.close()

    return StepProgress()


def _loss_of(outputs) -> Optional[float]:
    """The loss from a train step's outputs (MindFormers returns loss, overflow, scale, ...)."""
    try:
        import numpy as np

        first = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        return float(np.asarray(first.asnumpy() if hasattr(first, "asnumpy") else first).mean())
    except (TypeError, ValueError, IndexError, AttributeError):
        return None
