"""Waiting for raw steps whose files are written after the step has ended.

MindSpore's TensorDump (graph mode) writes files from one host thread, in place, after
the step has run (``mbuf_receive_manager.cc`` ``MbufDataHandler``, ``tensordump_utils.cc``
``SaveTensor2NPY``); our own raw writer writes from its thread beside training. A step
folder is complete once its step marker is in it (``rawformat.markers``): until then a
file there may be missing or half written, so nothing reads it. ``wait_for_steps`` polls folder listings only, with
a deadline, and says what is still missing; it needs nothing from the training
process, so it can run in any process.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional

from tqdm import tqdm

from mf_celldump.errors import ManifestError
from mf_celldump.rawformat import markers, names
from mf_celldump.rawformat.manifest import Manifest, load_manifest

logger = logging.getLogger(__name__)

# How long to wait for a step's files by default: msprobe 26.2 waits as long for its own
# marker (graph_mode_cell_dump.py, TIMEOUT = 600).
DEFAULT_TIMEOUT_S = 600.0
FIRST_POLL_S = 0.05
MAX_POLL_S = 1.0
LOG_INTERVAL_S = 10.0

Progress = Callable[[int, int, float], None]  # (steps ready, steps wanted, seconds waited)


@dataclass
class StepsWait:
    """The outcome of a wait: steps whose files are all written, and what is missing for the others."""

    ready: List[int]
    missing: Dict[int, str] = field(default_factory=dict)
    waited_s: float = 0.0

    def problems(self, rank: int) -> List[str]:
        return [f"rank {rank} step {step}: {why}" for step, why in sorted(self.missing.items())]


def _count_files(folder: str) -> int:
    try:
        with os.scandir(folder) as entries:
            return sum(1 for e in entries if e.name.endswith(".npy"))
    except OSError:
        return -1


def _missing(rank_dir: str, manifest: Manifest, step: int, waited: float) -> str:
    folder = os.path.join(rank_dir, names.step_dir_name(manifest.folder_step(step)))
    count = _count_files(folder)
    there = f"{count} tensor files there so far" if count >= 0 else "the folder does not exist"
    if not manifest.written_later:
        return (f"not marked complete after {waited:.0f} s: no {names.STEP_DONE_FILE} in {folder} ({there}); a write "
                "of the step failed (the training log says which) or the run stopped before it was written; the raw "
                "data stays for `mf-celldump process`")
    return (f"MindSpore had not finished writing its TensorDump files after {waited:.0f} s: no step-done marker "
            f"{names.td_done_stem(step)}_*.npy in {folder} ({there}); the raw data stays for "
            f"`mf-celldump process` (a selected step MindSpore never reached, or another sender of TensorDump's "
            f"<tensordump-update-step>, also leaves it out)")


def wait_for_steps(dump_path: str, rank: int, steps: Iterable[int], timeout: Optional[float] = None,
                   progress: Optional[Progress] = None, show_bar: Optional[bool] = None,
                   include_unselected: bool = False) -> StepsWait:
    """Wait up to ``timeout`` seconds until each of ``steps`` (not yet processed) of ``rank`` is complete on disk.

    ``progress`` is called after each poll; ``show_bar`` None shows a tqdm bar on a terminal
    once the wait has lasted 2 s. Never raises for a missing step: it is named in the result.
    ``include_unselected``: the marker of a step written but not selected counts too.
    """
    timeout = DEFAULT_TIMEOUT_S if timeout is None else max(float(timeout), 0.0)
    rank_dir = os.path.join(dump_path, names.RAW_ROOT, names.rank_dir_name(rank))
    wanted = sorted(set(steps))
    try:
        root_real = os.path.realpath(dump_path)
        manifest = load_manifest(os.path.join(rank_dir, names.MANIFEST_FILE), root_real)
    except ManifestError as err:
        return StepsWait([], {step: f"cannot wait for its files: {err}" for step in wanted})
    start = last_log = time.monotonic()
    interval, ready = FIRST_POLL_S, set()
    writer = "MindSpore's TensorDump files" if manifest.written_later else "captured files"
    bar = tqdm(total=len(wanted), unit="step", desc=f"rank {rank}: waiting for {writer}",
               delay=2, leave=False, disable=True if show_bar is False else None)
    try:
        while True:
            written = markers.written_steps(rank_dir, manifest, root_real, include_unselected)
            now_ready = {s for s in wanted if s in written}
            bar.update(len(now_ready - ready))
            ready = now_ready
            waited = time.monotonic() - start
            if progress is not None:
                progress(len(ready), len(wanted), waited)
            if len(ready) == len(wanted) or waited >= timeout:
                break
            if time.monotonic() - last_log >= LOG_INTERVAL_S:
                last_log = time.monotonic()
                logger.info("rank %d: waiting for %s: %d of %d steps written after %.0f s",
                            rank, writer, len(ready), len(wanted), waited)
            time.sleep(min(interval, max(timeout - waited, 0.0)))
            interval = min(interval * 1.5, MAX_POLL_S)
    finally:
        bar.close()
    missing = {s: _missing(rank_dir, manifest, s, waited) for s in wanted if s not in ready}
    return StepsWait(sorted(ready), missing, waited)
