"""Processing one step of one rank, in an order that survives being killed at any point.

1. read names, records and csv rows; number calls; group entries (metadata only);
2. assemble the output under ``step{N}/.{rank}.partial`` (tensor files hard-linked, so the
   raw files stay intact), then swap it into place in one rename;
3. write ``_raw/rank{R}/_processed/step{N}.json`` naming what was consumed;
4. only then delete the raw inputs (each renamed away first), then that marker.

A re-run finds either the raw data (and redoes 2-4 with the same result), or the marker
with the output in place (and finishes 4). Any problem keeps the raw data.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mf_celldump import fsutil, naming
from mf_celldump.processing import msprobe_json
from mf_celldump.processing.entries import Entry, assign_calls, group_entries, link_parents
from mf_celldump.processing.file_tasks import FAILED, FileResult, FileTask, Folders
from mf_celldump.processing.observer import ProcessingObserver
from mf_celldump.processing.worker_pool import FileRunner
from mf_celldump.rawformat import markers, names
from mf_celldump.rawformat.captured import Capture
from mf_celldump.rawformat.kbk_csv import read_statistic_csvs
from mf_celldump.rawformat.keys import KIND_TENSOR
from mf_celldump.rawformat.manifest import Manifest
from mf_celldump.rawformat.scan import StepSource, list_step_files, step_folder_digest

logger = logging.getLogger(__name__)


@dataclass
class RankContext:
    """One rank being processed: where its raw data is and where its output goes."""

    root_real: str
    rank: int
    rank_dir: str
    manifest: Manifest
    out_rank_name: str


@dataclass
class StepOutcome:
    """What happened to one step of one rank (a row of the report)."""

    rank: int
    step: int
    output: str
    status: str  # processed | already-processed | skipped-incomplete
    complete: bool = True
    entries: int = 0
    files: int = 0  # raw tensor files read (statistics computed, tensor linked into the output)
    records: int = 0  # captures that came from records.jsonl or statistic.csv, not from a file
    raw_removed: bool = False
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)


@dataclass
class _Inputs:
    captures: List[Capture]
    digest: Optional[str]
    kbk_sizes: Dict[str, int]
    problems: List[str]
    warnings: List[str]


def _read_inputs(ctx: RankContext, source: StepSource) -> _Inputs:
    inputs = _Inputs([], None, {}, [], [])
    if source.raw_dir is not None:
        listed = list_step_files(source.raw_dir, ctx.root_real)
        inputs.captures.extend(listed.captures)
        inputs.problems.extend(listed.problems)
        inputs.warnings.extend(listed.warnings)
        inputs.digest = listed.digest
    inputs.kbk_sizes = {os.path.relpath(p, ctx.rank_dir): os.path.getsize(p) for p in source.kbk_csvs}
    if source.kbk_csvs:
        kbk = read_statistic_csvs(source.kbk_csvs, ctx.manifest.statistics, first_order=len(inputs.captures))
        inputs.captures.extend(kbk.captures)
        inputs.problems.extend(kbk.problems)
    return inputs


def _marker_path(ctx: RankContext, step: int) -> str:
    return os.path.join(ctx.rank_dir, names.PROCESSED_DIR, names.processed_marker_name(step))


def _covered_by(marker: dict, source: StepSource, inputs: _Inputs) -> bool:
    """True when every raw input still present was consumed by the output the marker describes."""
    if source.raw_dir is not None and (
        marker.get("raw_dir") != os.path.basename(source.raw_dir) or marker.get("raw_digest") != inputs.digest
    ):
        return False
    consumed = marker.get("kbk") or {}
    return all(consumed.get(rel) == size for rel, size in inputs.kbk_sizes.items())


def _build_entries(ctx: RankContext, captures: List[Capture], problems: List[str]) -> List[Entry]:
    """Entries in execution order with parents and data names; duplicates become problems."""
    assign_calls(captures)
    entries = group_entries(captures, ctx.manifest.cells, problems)
    link_parents(entries)
    for entry in entries:
        fsutil.check_component(entry.name)
        seen: Dict[Tuple[str, str], Capture] = {}
        for capture in entry.captures:
            label = msprobe_json.label_of(capture, entry.cell.params)
            io = capture.key.msprobe_io
            first = seen.get((io, label))
            if first is not None:
                problems.append(f"{capture.origin}: a second capture of {entry.name}.{io}.{label} "
                                f"(first: {first.origin}); not used, raw data kept")
                continue
            seen[(io, label)] = capture
            capture.data_name = fsutil.check_component(naming.data_name(entry.name, io, label))
    return entries


def _read_files(ctx: RankContext, source: StepSource, entries: List[Entry], data_dir: Optional[str],
                runner: FileRunner, observer: ProcessingObserver, outcome: StepOutcome) -> Dict[int, bool]:
    """Statistics/values of every file-backed capture, tensors linked into ``data_dir``; returns failures."""
    by_index: List[Capture] = []
    tasks: List[FileTask] = []
    for entry in entries:
        for capture in entry.captures:
            if capture.file is None or capture.data_name is None:
                continue
            linked = data_dir is not None and capture.key.kind == KIND_TENSOR
            tasks.append(FileTask(len(by_index), capture.file, capture.data_name if linked else None,
                                  capture.key.kind))
            by_index.append(capture)
    failed: Dict[int, bool] = {}

    def on_result(result: FileResult) -> None:
        index, status, dtype_or_msg, shape, payload = result
        capture = by_index[index]
        if status == FAILED:
            failed[id(capture)] = True
            outcome.problems.append(dtype_or_msg)
        elif capture.key.kind == KIND_TENSOR:
            capture.shape, capture.stats = shape, payload
        else:
            capture.value = payload
        observer.on_file()

    runner.run(tasks, ctx.manifest.statistics, Folders(source.raw_dir or "", data_dir), on_result)
    outcome.files = len(tasks) - len(failed)
    return failed


def _write_output(ctx: RankContext, partial: str, target: str, entries: List[Entry],
                  failed: Dict[int, bool]) -> None:
    tensor_task = ctx.manifest.task == "tensor"
    final_data_dir = os.path.join(target, naming.TENSOR_DIR) if tensor_task else None

    def bodies():
        for entry in entries:
            leaves = {}
            for capture in entry.captures:
                if capture.data_name is None:
                    continue
                has_file = tensor_task and capture.file is not None and id(capture) not in failed
                leaves[id(capture)] = msprobe_json.record_of(capture, capture.data_name if has_file else None)
            yield entry.name, msprobe_json.entry_body(entry, leaves)

    fsutil.write_new_text(os.path.join(partial, naming.DUMP_JSON),
                          msprobe_json.dump_json_lines(ctx.manifest.task, final_data_dir, bodies()))
    fsutil.write_new_text(os.path.join(partial, naming.CONSTRUCT_JSON), [msprobe_json.construct_json(entries)])
    fsutil.write_new_text(os.path.join(partial, naming.STACK_JSON), [msprobe_json.stack_json(entries)])


def _assemble(ctx: RankContext, source: StepSource, inputs: _Inputs, runner: FileRunner,
              observer: ProcessingObserver, outcome: StepOutcome) -> None:
    """Steps 1-2: entries, files, JSON in a partial folder, swapped into place."""
    entries = _build_entries(ctx, inputs.captures, outcome.problems)
    step_out = fsutil.child(ctx.root_real, ctx.root_real, naming.step_dir_name(source.step))
    target = fsutil.child(ctx.root_real, step_out, ctx.out_rank_name)
    fsutil.make_dir(step_out)
    partial = fsutil.child(ctx.root_real, step_out, naming.partial_output_dir_name(ctx.out_rank_name))
    fsutil.remove_tree(partial)
    fsutil.make_dir(partial)
    data_dir = None
    if ctx.manifest.task == "tensor":
        data_dir = fsutil.make_dir(os.path.join(partial, naming.TENSOR_DIR))
    failed = _read_files(ctx, source, entries, data_dir, runner, observer, outcome)
    outcome.records = sum(1 for c in inputs.captures if c.file is None)
    _write_output(ctx, partial, target, entries, failed)
    retired = fsutil.child(ctx.root_real, step_out, naming.retired_output_dir_name(ctx.out_rank_name))
    fsutil.swap_into_place(partial, target, retired)
    outcome.entries = len(entries)
    observer.on_stage(ctx.rank, source.step, "output")


def process_step(ctx: RankContext, source: StepSource, runner: FileRunner, remove_raw: bool,
                 observer: ProcessingObserver) -> StepOutcome:
    """Process one step of one rank (see the module docstring for the order of work)."""
    output = os.path.join(naming.step_dir_name(source.step), ctx.out_rank_name)
    outcome = StepOutcome(ctx.rank, source.step, output, "processed", complete=source.complete)
    inputs = _read_inputs(ctx, source)
    outcome.warnings.extend(inputs.warnings)
    marker_path = _marker_path(ctx, source.step)
    marker = markers.read_processed(marker_path, ctx.root_real) if os.path.lexists(marker_path) else None
    target = os.path.join(ctx.root_real, output)
    if marker is not None and os.path.isfile(os.path.join(target, naming.DUMP_JSON)) and \
            _covered_by(marker, source, inputs):
        outcome.status = "already-processed"
        if remove_raw:
            _remove_sources(ctx, source, inputs, marker_path, outcome)
        return outcome
    outcome.problems.extend(inputs.problems)
    _assemble(ctx, source, inputs, runner, observer, outcome)
    if outcome.problems:
        logger.warning("step %d rank %d: %d problem(s); raw data kept", source.step, ctx.rank,
                       len(outcome.problems))
        return outcome
    fsutil.make_dir(os.path.dirname(marker_path))
    raw_name = os.path.basename(source.raw_dir) if source.raw_dir else None
    markers.write_processed(marker_path, source.step, output, raw_name, inputs.digest, inputs.kbk_sizes)
    observer.on_stage(ctx.rank, source.step, "marker")
    if remove_raw:
        _remove_sources(ctx, source, inputs, marker_path, outcome)
        observer.on_stage(ctx.rank, source.step, "removed")
    return outcome


def _remove_sources(ctx: RankContext, source: StepSource, inputs: _Inputs, marker_path: str,
                    outcome: StepOutcome) -> None:
    """Delete the consumed raw inputs (output and marker are in place), then the marker."""
    if source.raw_dir is not None:
        if not source.complete and step_folder_digest(source.raw_dir) != inputs.digest:
            outcome.warnings.append(f"{source.raw_dir}: files appeared while processing (step still being "
                                    "written?); raw data kept")
            return
        name = os.path.basename(source.raw_dir)
        fsutil.retire_and_remove(source.raw_dir, os.path.join(ctx.rank_dir, names.removing_dir_name(name)))
    for folder in source.kbk_dirs():
        removing = os.path.join(os.path.dirname(folder), names.removing_dir_name(os.path.basename(folder)))
        fsutil.retire_and_remove(folder, removing)
    if os.path.lexists(marker_path):
        os.unlink(marker_path)
    outcome.raw_removed = True
