"""``process_dump``: every raw ``_raw/rank{R}/step{N}`` of a dump becomes ``step{N}/rank[R]``.

Safe to run at any time and any number of times: a run killed anywhere is finished by
the next one with the same result, and a run with nothing left to do changes nothing.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Iterable, List, Optional, Set, Tuple, Union

from mf_celldump import fsutil
from mf_celldump.errors import (
    DumpNotFoundError,
    EmptyDumpError,
    ManifestError,
    NotACaptureDumpError,
    ProcessingError,
    UnsafePathError,
    short_repr,
)
from mf_celldump.layout import naming
from mf_celldump.processing import raw_cleanup, space
from mf_celldump.processing.existing_output import has_output, output_steps
from mf_celldump.processing.observer import ProcessingObserver, ProgressObserver
from mf_celldump.processing.outcome import ProcessingReport, ranges
from mf_celldump.processing.step_transaction import RankContext, StepOutcome, process_step
from mf_celldump.processing.worker_pool import FileRunner
from mf_celldump.rawformat import manifest as raw_manifest
from mf_celldump.rawformat import names
from mf_celldump.rawformat.scan import StepSource, find_rank_dirs, find_steps
from mf_celldump.userinput import IndexSelection, resolve_jobs

logger = logging.getLogger(__name__)

Plan = Tuple[RankContext, List[StepSource]]


def _selection(values: Union[IndexSelection, Iterable[int], None], what: str) -> Optional[IndexSelection]:
    """None for everything, else a selection (an ``IndexSelection`` or non-negative integers)."""
    if isinstance(values, IndexSelection):
        return None if values.selects_all else values
    if values is None:
        return None
    values = list(values)
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ProcessingError(f"{what}: {short_repr(value)} is not a non-negative integer")
    return IndexSelection.of(values)


def _open_dump(dump_path) -> str:
    path = os.path.abspath(os.path.expanduser(os.fspath(dump_path)))
    if not os.path.isdir(path):
        raise DumpNotFoundError(f"dump path {path} does not exist or is not a folder; pass the dump_path of the run")
    return os.path.realpath(path)


def _no_raw_data(root: str, report: ProcessingReport) -> ProcessingReport:
    if has_output(root):
        report.warnings.append("no raw data left; the dump is already processed")
        return report
    if not os.listdir(root):
        raise EmptyDumpError(f"{root} is empty: no capture data was written there (was the dump attached?)")
    raise NotACaptureDumpError(
        f"{root} is not an mf_celldump capture folder (no {names.RAW_ROOT}/rank*/{names.MANIFEST_FILE}); "
        "pass the dump_path configured for the training run"
    )


def _rank_contexts(root: str, rank_dirs, rank_filter: Optional[IndexSelection],
                   report: ProcessingReport) -> List[RankContext]:
    """A context per selected rank whose manifest reads; a bad manifest is a problem of its rank only.

    When every selected rank's manifest is unusable the dump cannot be processed at all
    (ManifestError).
    """
    contexts, failures = [], []
    single_card: Optional[int] = None
    for rank, rank_dir in rank_dirs:
        if rank_filter is not None and rank not in rank_filter:
            continue
        try:
            manifest = raw_manifest.load_manifest(os.path.join(rank_dir, names.MANIFEST_FILE), root)
        except ManifestError as err:
            failures.append(f"rank {rank}: {err}; rank not processed")
            continue
        if manifest.rank != rank:
            failures.append(f"rank {rank}: {manifest.path} is the manifest of rank {manifest.rank}, not of the rank "
                            f"its folder names (moved or copied?); rank not processed, its raw data is kept")
            continue
        if not manifest.distributed:
            if single_card is not None:
                failures.append(
                    f"rank {rank}: ranks {single_card} and {rank} are both marked single-card (distributed: false) "
                    "and would share the output folder 'rank'; rank not processed (process it from a separate "
                    "dump folder)")
                continue
            single_card = rank
        out_rank = naming.output_rank_dir_name(rank, manifest.distributed)
        contexts.append(RankContext(root, rank, rank_dir, manifest, out_rank))
    if failures and not contexts:
        raise ManifestError("; ".join(failures))
    report.problems.extend(failures)
    return contexts


def _remove_orphan_markers(ctx: RankContext, live_steps: Set[int]) -> None:
    folder = os.path.join(ctx.rank_dir, names.PROCESSED_DIR)
    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    for entry in os.scandir(folder):
        step = names.parse_processed_marker_name(entry.name)
        if step is None or step in live_steps:
            continue
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode) or (stat.S_ISREG(info.st_mode) and info.st_nlink == 1):
            os.unlink(entry.path)


def _plan_rank(ctx: RankContext, step_filter, only_complete: bool, remove_raw: bool,
               report: ProcessingReport) -> Tuple[List[StepSource], Set[int]]:
    """The steps of one rank to process now, and every raw step the rank has.

    A ``_processed`` that is not a plain folder is a problem of every step (each one's output
    is written, its raw data kept: what was consumed cannot be recorded), never of the rank.
    """
    report.warnings.extend(raw_cleanup.clean_leftovers(ctx.rank_dir, lambda step: [
        os.path.join(ctx.root_real, naming.step_dir_name(step), ctx.out_rank_name, naming.TENSOR_DIR)]))
    try:
        raw_cleanup.clean_processed_dir(os.path.join(ctx.rank_dir, names.PROCESSED_DIR))
    except UnsafePathError:
        pass  # each step says so when it records what it consumed
    sources, problems = find_steps(ctx.root_real, ctx.rank_dir, ctx.manifest, report.warnings)
    report.problems.extend(f"rank {ctx.rank}: {p}" for p in problems)
    if remove_raw:
        _remove_orphan_markers(ctx, set(sources))
    chosen = []
    for step in sorted(sources):
        source = sources[step]
        if source.discard:  # written only because the step filter stayed open: deleted, whatever the selection
            if remove_raw:
                _discard(ctx, source, report)
            continue
        if step_filter is not None and step not in step_filter:
            continue
        if source.refused is not None:
            out = os.path.join(naming.step_dir_name(step), ctx.out_rank_name)
            report.outcomes.append(StepOutcome(ctx.rank, step, out, "failed", complete=source.complete,
                                               problems=[source.refused]))
            continue
        if only_complete and not source.complete:
            out = os.path.join(naming.step_dir_name(step), ctx.out_rank_name)
            report.outcomes.append(StepOutcome(ctx.rank, step, out, "skipped-incomplete", complete=False))
            continue
        chosen.append(source)
    return chosen, set(sources)


def _discard(ctx: RankContext, source: StepSource, report: ProcessingReport) -> None:
    """Delete our files of a complete raw folder of a step that was not selected (``_td_skip_g`` marker)."""
    try:
        text = raw_cleanup.remove_raw_step(ctx.rank_dir, source.raw_dir, {}).describe(source.raw_dir)
    except OSError as err:
        report.warnings.append(f"rank {ctx.rank}: " + space.os_problem(err, f"cannot delete {source.raw_dir}"))
        return
    logger.debug("rank %d: deleted %s (step %d was written but not selected)", ctx.rank, source.raw_dir, source.step)
    if text:
        report.warnings.append(f"rank {ctx.rank}: {text}")


def _count_files(source: StepSource) -> int:
    count = len(source.kbk_csvs)
    if source.raw_dir is not None:
        try:
            with os.scandir(source.raw_dir) as entries:
                count += sum(1 for e in entries if e.name.endswith(".npy"))
        except OSError:  # unreadable: the step reports it
            pass
    return count


def _run_plans(plans: List[Plan], runner: FileRunner, remove_raw: bool, observer: ProcessingObserver,
               report: ProcessingReport) -> None:
    observer.on_start(sum(_count_files(s) for _, chosen in plans for s in chosen))
    for ctx, chosen in plans:
        for source in chosen:
            outcome = process_step(ctx, source, runner, remove_raw, observer)
            report.outcomes.append(outcome)
            logger.info("step %d rank %d: %s: %s", outcome.step, outcome.rank, outcome.status,
                        outcome.counts_text())


def _lock_rank(ctx: RankContext, report: ProcessingReport) -> Optional[fsutil.FolderLock]:
    """The rank's processing lock, or None (with a problem saying why) when it cannot be had."""
    lock = fsutil.FolderLock(os.path.join(ctx.rank_dir, names.PROCESSING_LOCK))
    try:
        if lock.acquire():
            return lock
        report.problems.append(f"rank {ctx.rank}: another process is processing {ctx.rank_dir}; "
                               "run again when it has finished")
    except UnsafePathError as err:
        report.problems.append(f"rank {ctx.rank}: {err}; rank not processed")
    except OSError as err:
        report.problems.append(f"rank {ctx.rank}: " + space.os_problem(err, "cannot create the processing lock"))
    return None


def _plan(contexts: List[RankContext], locks: List[fsutil.FolderLock], step_filter, only_complete: bool,
          remove_raw: bool, report: ProcessingReport) -> Tuple[List[Plan], Set[int]]:
    """Lock and plan every rank; a rank that cannot be locked or read is a problem, the others go on.

    Returns the plans and the raw steps found in the planned ranks.
    """
    plans: List[Plan] = []
    raw_steps: Set[int] = set()
    for ctx in contexts:
        lock = _lock_rank(ctx, report)
        if lock is None:
            continue
        locks.append(lock)
        try:
            chosen, found = _plan_rank(ctx, step_filter, only_complete, remove_raw, report)
        except UnsafePathError as err:
            report.problems.append(f"rank {ctx.rank}: {err}; rank not processed")
            continue
        except OSError as err:
            report.problems.append(f"rank {ctx.rank}: " + space.os_problem(err, f"cannot read {ctx.rank_dir}"))
            continue
        raw_steps |= found
        plans.append((ctx, chosen))
    return plans, raw_steps


def _release(locks: List[fsutil.FolderLock]) -> None:
    """Unlock every rank; no lock file and no empty ``_processed/`` stay behind."""
    for lock in locks:
        folder = os.path.join(os.path.dirname(lock.path), names.PROCESSED_DIR)
        if os.path.isdir(folder) and not os.path.islink(folder):
            fsutil.remove_empty_dir(folder)
        lock.release(remove=True)


def process_dump(dump_path, steps: Union[IndexSelection, Iterable[int], None] = None,
                 ranks: Union[IndexSelection, Iterable[int], None] = None,
                 jobs: Optional[int] = None, only_complete: bool = False, remove_raw: bool = True,
                 observer: Optional[ProcessingObserver] = None) -> ProcessingReport:
    """Process every raw step of ``dump_path`` (or the selected ``steps``/``ranks``).

    ``only_complete`` skips steps without ``_step_done.json`` (what training-time
    processing wants); ``remove_raw=False`` keeps the raw files; ``observer`` sees the
    progress (default: a log line now and then). Bad input raises a
    :class:`ProcessingError`; per-file problems are in the report.
    """
    root = _open_dump(dump_path)
    step_filter, rank_filter = _selection(steps, "steps"), _selection(ranks, "ranks")
    runner = FileRunner(resolve_jobs(jobs))
    observer = observer or ProgressObserver()
    report = ProcessingReport(root)
    try:
        rank_dirs = find_rank_dirs(root, os.path.join(root, names.RAW_ROOT), report.problems, report.warnings)
    except OSError as err:
        raise ProcessingError(space.os_problem(err, "cannot read the raw data folder")) from None
    if not rank_dirs:
        if report.problems:
            raise ProcessingError("; ".join(report.problems))
        return _no_raw_data(root, report)
    contexts = _rank_contexts(root, rank_dirs, rank_filter, report)
    locks: List[fsutil.FolderLock] = []
    try:
        plans, raw_steps = _plan(contexts, locks, step_filter, only_complete, remove_raw, report)
        _note_empty_selection(report, contexts, plans, raw_steps, step_filter, rank_filter)
        _run_plans(plans, runner, remove_raw, observer, report)
    finally:
        observer.on_finish()
        runner.close()
        _release(locks)
    filtered = step_filter is not None or rank_filter is not None
    if contexts and not raw_steps and any(ctx.manifest.written_later for ctx in contexts):
        # Graph-mode TensorDump: MindSpore writes step folders after the steps (processing/async_steps.py).
        report.warnings.append("no raw step folder yet: MindSpore writes graph-mode TensorDump files after each "
                               "step; run again once training has written them")
    elif contexts and not raw_steps and not filtered and not report.problems and not has_output(root):
        raise EmptyDumpError(
            f"{root} holds capture manifests but no captured step (nothing was dumped for the selected "
            "steps/ranks); check the dump configuration's steps and ranks"
        )
    return report


def _note_empty_selection(report: ProcessingReport, contexts, plans: List[Plan], raw_steps: Set[int], step_filter,
                          rank_filter) -> None:
    """Say so, in one sentence, when ``--steps``/``--ranks`` match nothing in this dump (raw or processed)."""
    if rank_filter is not None and not contexts and not report.problems:
        report.selection_matched_nothing = True
        report.selection_message = (f"nothing processed: no rank of this dump matches the selection "
                                    f"{rank_filter.describe()}")
        return
    if step_filter is None or any(chosen for _, chosen in plans) or report.outcomes or report.problems:
        return
    processed = output_steps(report.dump_path, {ctx.out_rank_name for ctx, _ in plans})
    if any(step in step_filter for step in processed):
        return  # already processed: nothing to do, not an empty selection
    report.selection_matched_nothing = True
    report.selection_message = (f"nothing processed: no step of this dump matches the selection "
                                f"{step_filter.describe()} (raw steps here: {ranges(sorted(raw_steps))}; "
                                f"processed steps: {ranges(sorted(processed))})")
