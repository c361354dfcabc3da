"""``process_dump``: every raw ``_raw/rank{R}/step{N}`` of a dump becomes ``step{N}/rank[R]``.

Safe to run at any time and any number of times: a run killed anywhere is finished by
the next one with the same result, and a run with nothing left to do changes nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, List, Optional, Set, Tuple, Union

from mf_celldump import fsutil, naming
from mf_celldump.config import IndexSelection, resolve_jobs, short_repr
from mf_celldump.processing.errors import (
    DumpNotFoundError,
    EmptyDumpError,
    ManifestError,
    NotACaptureDumpError,
    ProcessingError,
)
from mf_celldump.processing.observer import ProcessingObserver, ProgressObserver
from mf_celldump.processing.report import ProcessingReport
from mf_celldump.processing.step_transaction import RankContext, StepOutcome, process_step
from mf_celldump.processing.worker_pool import FileRunner
from mf_celldump.rawformat import manifest as raw_manifest
from mf_celldump.rawformat import names
from mf_celldump.rawformat.scan import StepSource, find_rank_dirs, find_steps

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


def _has_output(root: str) -> bool:
    for entry in os.scandir(root):
        if naming.parse_step_dir_name(entry.name) is None or not entry.is_dir(follow_symlinks=False):
            continue
        for sub in os.scandir(entry.path):
            if naming.parse_output_rank_dir_name(sub.name) is not None and os.path.isfile(
                os.path.join(sub.path, naming.DUMP_JSON)
            ):
                return True
    return False


def _open_dump(dump_path) -> str:
    path = os.path.abspath(os.path.expanduser(os.fspath(dump_path)))
    if not os.path.isdir(path):
        raise DumpNotFoundError(f"dump path {path} does not exist or is not a folder; pass the dump_path of the run")
    return os.path.realpath(path)


def _no_raw_data(root: str, report: ProcessingReport) -> ProcessingReport:
    if _has_output(root):
        report.warnings.append("no raw data left; the dump is already processed")
        return report
    if not os.listdir(root):
        raise EmptyDumpError(f"{root} is empty: no capture data was written there (was the dump attached?)")
    raise NotACaptureDumpError(
        f"{root} is not an mf_celldump capture folder (no {names.RAW_ROOT}/rank*/{names.MANIFEST_FILE}); "
        "pass the dump_path configured for the training run"
    )


def _rank_contexts(root: str, rank_dirs, rank_filter: Optional[IndexSelection]) -> List[RankContext]:
    contexts = []
    single_card: Optional[int] = None
    for rank, rank_dir in rank_dirs:
        if rank_filter is not None and rank not in rank_filter:
            continue
        try:
            manifest = raw_manifest.load_manifest(os.path.join(rank_dir, names.MANIFEST_FILE), root)
        except raw_manifest.ManifestError as err:
            raise ManifestError(str(err)) from None
        if not manifest.distributed:
            if single_card is not None:
                raise ProcessingError(
                    f"ranks {single_card} and {rank} are both marked single-card (distributed: false) "
                    "and would share the output folder 'rank'; process them from separate dump folders"
                )
            single_card = rank
        out_rank = naming.output_rank_dir_name(rank, manifest.distributed)
        contexts.append(RankContext(root, rank, rank_dir, manifest, out_rank))
    return contexts


def _remove_orphan_markers(ctx: RankContext, live_steps: Set[int]) -> None:
    folder = os.path.join(ctx.rank_dir, names.PROCESSED_DIR)
    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    for entry in os.scandir(folder):
        step = names.parse_processed_marker_name(entry.name)
        if step is not None and step not in live_steps and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)


def _clean_leftovers(rank_dir: str) -> None:
    """Finish deletions a killed run left behind (folders already renamed to ``.*.removing``)."""
    for folder, dirs, _ in os.walk(rank_dir, followlinks=False):
        for name in list(dirs):
            if names.is_removing_dir_name(name):
                fsutil.remove_tree(os.path.join(folder, name))
                dirs.remove(name)


def _plan_rank(ctx: RankContext, step_filter, only_complete: bool, remove_raw: bool,
               report: ProcessingReport) -> Tuple[List[StepSource], bool]:
    """The steps of one rank to process now; second value: whether the rank has any raw step."""
    _clean_leftovers(ctx.rank_dir)
    sources, problems = find_steps(ctx.root_real, ctx.rank_dir, ctx.manifest)
    report.problems.extend(f"rank {ctx.rank}: {p}" for p in problems)
    if remove_raw:
        _remove_orphan_markers(ctx, set(sources))
    chosen = []
    for step in sorted(sources):
        source = sources[step]
        if step_filter is not None and step not in step_filter:
            continue
        if only_complete and not source.complete:
            out = os.path.join(naming.step_dir_name(step), ctx.out_rank_name)
            report.outcomes.append(StepOutcome(ctx.rank, step, out, "skipped-incomplete", complete=False))
            continue
        chosen.append(source)
    return chosen, bool(sources)


def _count_files(source: StepSource) -> int:
    count = len(source.kbk_csvs)
    if source.raw_dir is not None:
        with os.scandir(source.raw_dir) as entries:
            count += sum(1 for e in entries if e.name.endswith(".npy"))
    return count


def _run_plans(plans: List[Plan], runner: FileRunner, remove_raw: bool, observer: ProcessingObserver,
               report: ProcessingReport) -> None:
    observer.on_start(sum(_count_files(s) for _, chosen in plans for s in chosen))
    for ctx, chosen in plans:
        for source in chosen:
            outcome = process_step(ctx, source, runner, remove_raw, observer)
            report.outcomes.append(outcome)
            logger.info("step %d rank %d: %s (%d entries, %d raw tensor files)", outcome.step, outcome.rank,
                        outcome.status, outcome.entries, outcome.files)


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
    rank_dirs = find_rank_dirs(root, os.path.join(root, names.RAW_ROOT))
    if not rank_dirs:
        return _no_raw_data(root, report)
    contexts = _rank_contexts(root, rank_dirs, rank_filter)
    locks: List[fsutil.FolderLock] = []
    any_source = False
    try:
        plans: List[Plan] = []
        for ctx in contexts:
            lock = fsutil.FolderLock(os.path.join(ctx.rank_dir, names.PROCESSING_LOCK))
            if not lock.acquire():
                report.problems.append(f"rank {ctx.rank}: another process is processing {ctx.rank_dir}; "
                                       "run again when it has finished")
                continue
            locks.append(lock)
            chosen, has_source = _plan_rank(ctx, step_filter, only_complete, remove_raw, report)
            any_source = any_source or has_source
            plans.append((ctx, chosen))
        _note_empty_selection(report, contexts, plans, step_filter, rank_filter)
        _run_plans(plans, runner, remove_raw, observer, report)
    finally:
        observer.on_finish()
        runner.close()
        for lock in locks:
            lock.release()
    filtered = step_filter is not None or rank_filter is not None
    if contexts and not any_source and any(ctx.manifest.written_later for ctx in contexts):
        # Graph-mode TensorDump: MindSpore writes step folders after the steps (processing/async_steps.py).
        report.warnings.append("no raw step folder yet: MindSpore writes graph-mode TensorDump files after each "
                               "step; run again once training has written them")
    elif contexts and not any_source and not filtered and not report.problems and not _has_output(root):
        raise EmptyDumpError(
            f"{root} holds capture manifests but no captured step (nothing was dumped for the selected "
            "steps/ranks); check the dump configuration's steps and ranks"
        )
    return report


def _note_empty_selection(report: ProcessingReport, contexts, plans: List[Plan], step_filter, rank_filter) -> None:
    if rank_filter is not None and not contexts:
        report.selection_matched_nothing = True
        report.warnings.append(f"no rank matched the selection {rank_filter.describe()}")
    elif step_filter is not None and not any(chosen for _, chosen in plans) and not report.outcomes:
        report.selection_matched_nothing = True
        report.warnings.append(f"no raw step matched the selection {step_filter.describe()}")
