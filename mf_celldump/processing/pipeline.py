"""``process_dump``: every raw ``_raw/rank{R}/step{N}`` of a dump becomes ``step{N}/rank[R]``.

Safe to run at any time and any number of times: a run killed anywhere is finished by
the next one with the same result, and a run with nothing left to do changes nothing.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Set

from mf_celldump import fsutil, naming
from mf_celldump.processing.errors import (
    DumpNotFoundError,
    EmptyDumpError,
    NotACaptureDumpError,
    ProcessingError,
)
from mf_celldump.processing.filework import FileRunner, default_jobs
from mf_celldump.processing.manifest import load_manifest
from mf_celldump.processing.progress import Progress
from mf_celldump.processing.rawscan import StepSource, find_rank_dirs, find_steps
from mf_celldump.processing.stepwork import Checkpoint, RankContext, StepOutcome, process_step

logger = logging.getLogger(__name__)


@dataclass
class ProcessingReport:
    """Outcome of a run: one row per (rank, step), plus problems not tied to a step."""

    dump_path: str
    outcomes: List[StepOutcome] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)

    @property
    def processed(self) -> List[StepOutcome]:
        return [o for o in self.outcomes if o.status == "processed"]

    @property
    def nothing_to_do(self) -> bool:
        """True when no step needed processing (e.g. a second run over the same dump)."""
        waiting = any(o.status == "skipped-incomplete" for o in self.outcomes)
        return not self.processed and not self.all_problems and not waiting

    @property
    def all_problems(self) -> List[str]:
        out = list(self.problems)
        for outcome in self.outcomes:
            out.extend(f"step {outcome.step} rank {outcome.rank}: {p}" for p in outcome.problems)
        return out

    @property
    def ok(self) -> bool:
        return not self.all_problems

    @property
    def entries(self) -> int:
        return sum(o.entries for o in self.processed)

    @property
    def files(self) -> int:
        return sum(o.files for o in self.processed)

    def summary(self, max_problems: int = 20) -> str:
        """Human-readable summary (what the CLI prints)."""
        lines = [f"dump: {self.dump_path}"]
        if self.nothing_to_do:
            lines.append("nothing to do: every captured step is already processed")
        done = self.processed
        if done:
            steps = sorted({o.step for o in done})
            ranks = sorted({o.rank for o in done})
            lines.append(
                f"processed {len(done)} step folder(s): steps {_ranges(steps)}, ranks {_ranges(ranks)}; "
                f"{self.entries} entries, {self.files} files"
            )
            shown = [o.output for o in done[:4]] + (["..."] if len(done) > 4 else [])
            lines.append(f"output in {self.dump_path}: {', '.join(shown)}")
        for status, text in (
            ("already-processed", "already processed"),
            ("skipped-incomplete", "incomplete, skipped"),
        ):
            rows = [o for o in self.outcomes if o.status == status]
            if rows:
                lines.append(
                    f"{text}: {len(rows)} step folder(s) (steps {_ranges(sorted({o.step for o in rows}))})"
                )
        finished = [o for o in self.outcomes if o.status == "already-processed" and o.raw_removed]
        if finished:
            lines.append(f"removed the raw data of {len(finished)} step folder(s) processed earlier")
        incomplete = [o for o in done if not o.complete]
        if incomplete:
            lines.append(
                f"note: {len(incomplete)} processed step(s) had no completion marker "
                f"(steps {_ranges(sorted({o.step for o in incomplete}))}): the run may have stopped mid-step"
            )
        warnings = list(self.warnings) + [w for o in self.outcomes for w in o.warnings]
        if warnings:
            lines.append(f"warnings: {len(warnings)}")
            lines.extend(f"  {w}" for w in warnings[:max_problems])
        problems = self.all_problems
        if problems:
            lines.append(f"PROBLEMS: {len(problems)} (raw data of the affected steps was kept)")
            lines.extend(f"  {p}" for p in problems[:max_problems])
            if len(problems) > max_problems:
                lines.append(f"  ... and {len(problems) - max_problems} more")
        return "\n".join(lines)


def _ranges(values: List[int]) -> str:
    if not values:
        return "-"
    parts = []
    start = prev = values[0]
    for value in values[1:] + [None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(parts)


def _selection(values: Optional[Iterable[int]], what: str) -> Optional[Set[int]]:
    if values is None:
        return None
    chosen = set()
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ProcessingError(f"{what}: {value!r} is not a non-negative integer")
        chosen.add(value)
    return chosen


def _has_output(root: str) -> bool:
    for entry in os.scandir(root):
        if naming.parse_step_dir_name(entry.name) is None or not entry.is_dir(follow_symlinks=False):
            continue
        for sub in os.scandir(entry.path):
            if naming.parse_rank_dir_name(sub.name) is not None and os.path.isfile(
                os.path.join(sub.path, naming.DUMP_JSON)
            ):
                return True
    return False


def _clean_leftovers(rank_dir: str) -> None:
    """Finish deletions a killed run left behind (folders already renamed to ``.*.removing``)."""
    for folder, dirs, _ in os.walk(rank_dir, followlinks=False):
        for name in list(dirs):
            if naming.is_removing_dir_name(name):
                fsutil.remove_tree(os.path.join(folder, name))
                dirs.remove(name)


def _remove_orphan_markers(rank_dir: str, live_steps: Set[int]) -> None:
    folder = os.path.join(rank_dir, naming.PROCESSED_DIR)
    if not os.path.isdir(folder):
        return
    for entry in os.scandir(folder):
        step = (
            naming.parse_step_dir_name(entry.name[: -len(".json")]) if entry.name.endswith(".json") else None
        )
        if step is not None and step not in live_steps:
            os.unlink(entry.path)


def _count_files(source: StepSource) -> int:
    count = len(source.kbk_csvs)
    if source.raw_dir is not None:
        with os.scandir(source.raw_dir) as entries:
            count += sum(1 for e in entries if e.name.endswith(".npy"))
    return count


def process_dump(
    dump_path,
    steps: Optional[Iterable[int]] = None,
    ranks: Optional[Iterable[int]] = None,
    jobs: Optional[int] = None,
    only_complete: bool = False,
    remove_raw: bool = True,
    progress: bool = False,
    checkpoint: Optional[Checkpoint] = None,
) -> ProcessingReport:
    """Process every raw step of ``dump_path`` (or the selected ``steps``/``ranks``).

    ``only_complete`` skips steps without ``_step_done.json`` (what training-time
    processing wants); ``remove_raw=False`` keeps the raw files. ``checkpoint`` is a test
    hook called with ``"file"``, ``"output"``, ``"marker"``, ``"removed"`` as work progresses.
    Bad input raises a :class:`ProcessingError`; per-file problems are in the report.
    """
    path = os.path.abspath(os.path.expanduser(os.fspath(dump_path)))
    if not os.path.isdir(path):
        raise DumpNotFoundError(
            f"dump path {path} does not exist or is not a folder; pass the dump_path of the run"
        )
    root = os.path.realpath(path)
    step_filter = _selection(steps, "steps")
    rank_filter = _selection(ranks, "ranks")
    jobs = default_jobs(jobs)
    report = ProcessingReport(root)
    raw_root = os.path.join(root, naming.RAW_ROOT)
    rank_dirs = find_rank_dirs(root, raw_root) if os.path.isdir(raw_root) else []
    if not rank_dirs:
        if _has_output(root):
            report.warnings.append("no raw data left; the dump is already processed")
            return report
        if not os.listdir(root):
            raise EmptyDumpError(
                f"{root} is empty: no capture data was written there (was the dump attached?)"
            )
        raise NotACaptureDumpError(
            f"{root} is not an mf_celldump capture folder "
            f"(no {naming.RAW_ROOT}/rank*/{naming.MANIFEST_FILE}); "
            "pass the dump_path configured for the training run"
        )
    contexts = []
    single_card: Optional[int] = None
    for rank, rank_dir in rank_dirs:
        if rank_filter is not None and rank not in rank_filter:
            continue
        manifest = load_manifest(os.path.join(rank_dir, naming.MANIFEST_FILE))
        if not manifest.distributed:
            if single_card is not None:
                raise ProcessingError(
                    f"ranks {single_card} and {rank} are both marked single-card (distributed: false) "
                    "and would share the output folder 'rank'; process them from separate dump folders"
                )
            single_card = rank
        out_rank = naming.output_rank_dir_name(rank, manifest.distributed)
        contexts.append(RankContext(root, root, rank, rank_dir, manifest, out_rank))

    runner = FileRunner(jobs)
    locks: List[fsutil.FolderLock] = []
    any_source = False
    try:
        plans = []
        for ctx in contexts:
            lock = fsutil.FolderLock(os.path.join(ctx.rank_dir, naming.PROCESSING_LOCK))
            if not lock.acquire():
                report.problems.append(
                    f"rank {ctx.rank}: another process is processing {ctx.rank_dir}; "
                    "run again when it has finished"
                )
                continue
            locks.append(lock)
            _clean_leftovers(ctx.rank_dir)
            sources, problems = find_steps(root, ctx.rank_dir, ctx.manifest)
            report.problems.extend(f"rank {ctx.rank}: {p}" for p in problems)
            any_source = any_source or bool(sources)
            if remove_raw:
                _remove_orphan_markers(ctx.rank_dir, set(sources))
            chosen = []
            for step in sorted(sources):
                source = sources[step]
                if step_filter is not None and step not in step_filter:
                    continue
                if only_complete and not source.complete:
                    out = os.path.join(naming.step_dir_name(step), ctx.out_rank_name)
                    report.outcomes.append(
                        StepOutcome(ctx.rank, step, out, "skipped-incomplete", complete=False)
                    )
                    continue
                chosen.append(source)
            plans.append((ctx, chosen))
        if not contexts:
            report.warnings.append(f"no rank matched the selection {sorted(rank_filter or [])}")
        elif step_filter is not None and not any(chosen for _, chosen in plans):
            report.warnings.append(f"no raw step matched the selection {sorted(step_filter)}")
        total = sum(_count_files(s) for _, chosen in plans for s in chosen)
        meter = Progress(total, show_bar=progress)
        for ctx, chosen in plans:
            for source in chosen:
                outcome = process_step(ctx, source, runner, remove_raw, checkpoint, meter.advance)
                report.outcomes.append(outcome)
                logger.info(
                    "step %d rank %d: %s (%d entries, %d files)",
                    outcome.step,
                    outcome.rank,
                    outcome.status,
                    outcome.entries,
                    outcome.files,
                )
        meter.finish()
    finally:
        runner.close()
        for lock in locks:
            lock.release()
    filtered = step_filter is not None or rank_filter is not None
    if contexts and not any_source and not filtered and not report.problems and not _has_output(root):
        raise EmptyDumpError(
            f"{root} holds capture manifests but no captured step (nothing was dumped for the selected "
            "steps/ranks); check the dump configuration's steps and ranks"
        )
    return report
