"""Which run a rank's data in a dump folder belongs to: an attach starts a run, or resumes the one there.

A rank's data in ``dump_path`` (raw step folders under ``_raw/rank{R}``, output folders
``step{N}/rank[R]``) belongs to one run, named by the ``run_id`` of the rank's manifest,
of its step markers and of every ``dump.json`` (``layout.naming.RUN_ID_KEY``). An attach
into a folder holding another run's data is refused before training starts: the two
runs' steps would sit side by side as if they were one run, and equal step numbers would
replace each other. An attach that resumes that run (the same cells and task, starting
after step 0, as a resumed MindFormers run does) continues it under its run id, so its
steps join the earlier ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Set, Tuple

from mf_celldump.errors import DumpInUseError, ManifestError
from mf_celldump.layout import naming
from mf_celldump.layout.reader import output_run_id
from mf_celldump.rawformat import names
from mf_celldump.rawformat.manifest import CellRecord, Manifest, load_manifest


@dataclass
class EarlierRun:
    """What an earlier run left for one rank: its manifest (None: unreadable or gone), run ids, steps."""

    manifest: Optional[Manifest] = None
    manifest_problem: str = ""
    run_ids: Set[str] = field(default_factory=set)
    steps: Set[int] = field(default_factory=set)
    statistics_csv: bool = False  # kernel-by-kernel statistics not processed yet (their steps unknown here)

    @property
    def has_data(self) -> bool:
        return bool(self.steps) or self.statistics_csv


def _entries(folder: str) -> List[os.DirEntry]:
    """The entries of ``folder``; none when it is missing or unreadable."""
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError:
        return []


def _raw_data(rank_dir: str, earlier: EarlierRun) -> None:
    for entry in _entries(rank_dir):
        folder_step = names.parse_step_dir_name(entry.name)
        if folder_step is not None and entry.is_dir(follow_symlinks=False):
            earlier.steps.add(earlier.manifest.global_step(folder_step) if earlier.manifest else folder_step)
        elif entry.name == names.KBK_DIR and entry.is_dir(follow_symlinks=False):
            earlier.statistics_csv = any(names.KBK_STATISTIC_CSV in files
                                         for _, _, files in os.walk(entry.path, followlinks=False))


def _outputs(dump_path: str, out_rank: str, earlier: EarlierRun) -> None:
    for entry in _entries(dump_path):
        step = naming.parse_step_dir_name(entry.name)
        if step is None or not entry.is_dir(follow_symlinks=False):
            continue
        dump_json = os.path.join(entry.path, out_rank, naming.DUMP_JSON)
        if os.path.isfile(dump_json) and not os.path.islink(dump_json):
            earlier.steps.add(step)
            run_id = output_run_id(dump_json)
            if run_id is not None:
                earlier.run_ids.add(run_id)


def find_earlier_run(dump_path: str, rank: int, distributed: bool) -> EarlierRun:
    """What ``dump_path`` already holds for ``rank`` (nothing: an ``EarlierRun`` without data)."""
    earlier = EarlierRun()
    rank_dir = os.path.join(dump_path, names.RAW_ROOT, names.rank_dir_name(rank))
    manifest_path = os.path.join(rank_dir, names.MANIFEST_FILE)
    if os.path.lexists(manifest_path):
        try:
            earlier.manifest = load_manifest(manifest_path, os.path.realpath(dump_path))
        except ManifestError as err:
            earlier.manifest_problem = str(err)
        else:
            if earlier.manifest.run_id:
                earlier.run_ids.add(earlier.manifest.run_id)
    _raw_data(rank_dir, earlier)
    _outputs(dump_path, naming.output_rank_dir_name(rank, distributed), earlier)
    return earlier


def _cell_list(cells: Sequence[CellRecord]) -> List[Tuple[str, str]]:
    return [(cell.name, cell.class_name) for cell in sorted(cells, key=lambda c: c.cell_id)]


def _not_a_resume(earlier: EarlierRun, cells: Sequence[CellRecord], task: str, initial_step: int) -> Optional[str]:
    """Why this attach does not continue the earlier run; None when it resumes it."""
    if earlier.manifest is None:
        return earlier.manifest_problem or "its manifest is gone, so it cannot be continued"
    if len(earlier.run_ids) > 1:
        return f"it already holds data of {len(earlier.run_ids)} runs ({', '.join(sorted(earlier.run_ids))})"
    if initial_step == 0:
        return "this run starts at step 0 (a resumed run starts after the steps it has done)"
    if earlier.manifest.task != task:
        return f"it captured task {earlier.manifest.task!r}, this run task {task!r}"
    if _cell_list(earlier.manifest.cells.values()) != _cell_list(cells):
        model = earlier.manifest.details.get("model_class", "another model")
        return f"it captured {len(earlier.manifest.cells)} cells of {model}, this run {len(cells)} other cells"
    return None


def claim(dump_path: str, rank: int, distributed: bool, run_id: str, cells: Sequence[CellRecord], task: str,
          initial_step: int, given: str = "dump_path") -> str:
    """The run id this attach writes under: its own ``run_id``, or the one of the run it resumes.

    Raises ``DumpInUseError`` when ``dump_path`` holds another run's data for this rank. A second run
    is refused rather than sent to a new folder of our choosing: every rank must write to the same
    folder, which the user (and the compare command) names, and never two runs mix in one. ``given``
    names what the user set that made this folder (``dump_path``, or ``output_dir`` when it is unset),
    so that the way out names it.
    """
    earlier = find_earlier_run(dump_path, rank, distributed)
    if not earlier.has_data:
        return run_id
    why = _not_a_resume(earlier, cells, task, initial_step)
    if why is None:
        return next(iter(earlier.run_ids), run_id)
    steps = _describe_steps(sorted(earlier.steps)) + (" and statistics not processed yet"
                                                      if earlier.statistics_csv else "")
    named = f"run {sorted(earlier.run_ids)[0]!r}" if len(earlier.run_ids) == 1 else "an earlier run"
    raise DumpInUseError(
        f"{dump_path} already holds the dump of {named} for rank {rank} ({steps}), and this is not a resume of it: "
        f"{why}. Its steps and this run's would mix, and equal step numbers would replace each other. Set "
        f"{given} to a new folder, or move that dump away first; nothing was written")


def _describe_steps(steps: List[int]) -> str:
    if not steps:
        return "no step"
    shown = ",".join(str(s) for s in steps[:5]) + (",..." if len(steps) > 5 else "")
    return f"step{'s' if len(steps) > 1 else ''} {shown}"
