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

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from mf_celldump import fsutil, naming
from mf_celldump.processing import layout
from mf_celldump.processing.captures import Capture
from mf_celldump.processing.entries import assign_calls, group_entries, link_parents
from mf_celldump.processing.filework import FAILED, FileResult, FileRunner, FileTask, Folders
from mf_celldump.processing.kbk import read_statistic_csvs
from mf_celldump.processing.manifest import Manifest
from mf_celldump.processing.rawscan import StepSource, list_step_files, source_digest, step_folder_digest
from mf_celldump.processing.records import read_records

logger = logging.getLogger(__name__)

MARKER_FORMAT = "mf_celldump-processed/1"

Checkpoint = Callable[[str], None]


@dataclass
class RankContext:
    root_real: str
    dump_root: str
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
    status: str  # processed | already-processed | skipped-incomplete | failed
    complete: bool = True
    entries: int = 0
    files: int = 0
    records: int = 0
    raw_removed: bool = False
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)


@dataclass
class _Inputs:
    captures: List[Capture]
    digest: Optional[str]
    names: List[str]
    kbk_sizes: Dict[str, int]
    problems: List[str]
    warnings: List[str]


def _read_inputs(ctx: RankContext, source: StepSource) -> _Inputs:
    captures: List[Capture] = []
    problems: List[str] = []
    warnings: List[str] = []
    names: List[str] = []
    digest = None
    if source.raw_dir is not None:
        listed = list_step_files(source.raw_dir)
        captures.extend(listed.captures)
        problems.extend(listed.problems)
        warnings.extend(listed.warnings)
        names = listed.names
        extra = {}
        if listed.records is not None:
            records = read_records(listed.records, first_order=len(captures))
            captures.extend(records.captures)
            problems.extend(records.problems)
            warnings.extend(records.warnings)
            extra[naming.RECORDS_FILE] = records.size
        digest = source_digest(names, extra)
    kbk_sizes = {os.path.relpath(p, ctx.rank_dir): os.path.getsize(p) for p in source.kbk_csvs}
    if source.kbk_csvs:
        kbk = read_statistic_csvs(source.kbk_csvs, ctx.manifest.statistics, first_order=len(captures))
        captures.extend(kbk.captures)
        problems.extend(kbk.problems)
    return _Inputs(captures, digest, names, kbk_sizes, problems, warnings)


def _marker_path(ctx: RankContext, step: int) -> str:
    return os.path.join(ctx.rank_dir, naming.PROCESSED_DIR, naming.processed_marker_name(step))


def _read_marker(path: str) -> Optional[dict]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == MARKER_FORMAT else None


def _covered_by(marker: dict, source: StepSource, inputs: _Inputs) -> bool:
    """True when every raw input still present was consumed by the output the marker describes."""
    if source.raw_dir is not None and (
        marker.get("raw_dir") != os.path.basename(source.raw_dir) or marker.get("raw_digest") != inputs.digest
    ):
        return False
    consumed = marker.get("kbk") or {}
    return all(consumed.get(rel) == size for rel, size in inputs.kbk_sizes.items())


def _assign_data_names(entries, problems: List[str]) -> None:
    """Set each kept capture's data_name; a second capture of the same value is a problem, not kept."""
    for entry in entries:
        seen: Dict[Tuple[str, str], Capture] = {}
        for capture in entry.captures:
            label = layout.label_of(capture, entry.cell.params)
            io = capture.key.msprobe_io
            first = seen.get((io, label))
            if first is not None:
                problems.append(
                    f"{capture.origin}: a second capture of {entry.name}.{io}.{label} "
                    f"(first: {first.origin}); not used, raw data kept"
                )
                continue
            seen[(io, label)] = capture
            capture.data_name = fsutil.check_component(naming.data_name(entry.name, io, label))


def process_step(
    ctx: RankContext,
    source: StepSource,
    runner: FileRunner,
    remove_raw: bool,
    checkpoint: Optional[Checkpoint],
    on_file: Callable[[], None],
) -> StepOutcome:
    manifest = ctx.manifest
    step_dir_name = naming.step_dir_name(source.step)
    outcome = StepOutcome(
        ctx.rank,
        source.step,
        os.path.join(step_dir_name, ctx.out_rank_name),
        "processed",
        complete=source.complete,
    )
    inputs = _read_inputs(ctx, source)
    outcome.warnings.extend(inputs.warnings)
    step_out = fsutil.child(ctx.root_real, ctx.dump_root, step_dir_name)
    target = fsutil.child(ctx.root_real, step_out, ctx.out_rank_name)
    marker_path = _marker_path(ctx, source.step)
    marker = _read_marker(marker_path) if os.path.exists(marker_path) else None
    if (
        marker is not None
        and os.path.isfile(os.path.join(target, naming.DUMP_JSON))
        and _covered_by(marker, source, inputs)
    ):
        outcome.status = "already-processed"
        if remove_raw:
            _remove_sources(ctx, source, inputs, marker_path, outcome)
        return outcome

    problems = outcome.problems
    problems.extend(inputs.problems)
    captures = inputs.captures
    assign_calls(captures)
    entries = group_entries(captures, manifest.cells, problems)
    link_parents(entries)
    for entry in entries:
        fsutil.check_component(entry.name)
    _assign_data_names(entries, problems)

    fsutil.make_dir(step_out)
    partial = fsutil.child(ctx.root_real, step_out, naming.partial_output_dir_name(ctx.out_rank_name))
    fsutil.remove_tree(partial)
    fsutil.make_dir(partial)
    tensor_task = manifest.task == "tensor"
    data_dir = os.path.join(partial, naming.TENSOR_DIR)
    if tensor_task:
        fsutil.make_dir(data_dir)

    by_index: List[Capture] = []
    tasks: List[FileTask] = []
    for entry in entries:
        for capture in entry.captures:
            if capture.file is None or capture.data_name is None:
                continue
            linked = tensor_task and capture.key.vkind == naming.VKIND_TENSOR
            out_name = capture.data_name if linked else None
            tasks.append(FileTask(len(by_index), capture.file, out_name, capture.key.vkind))
            by_index.append(capture)
    failed: Dict[int, bool] = {}

    def on_result(result: FileResult) -> None:
        index, status, dtype_or_msg, shape, payload = result
        capture = by_index[index]
        if status == FAILED:
            failed[id(capture)] = True
            problems.append(dtype_or_msg)
        elif capture.key.vkind == naming.VKIND_TENSOR:
            capture.shape, capture.stats = shape, payload
        else:
            capture.value = payload
        on_file()
        if checkpoint is not None:
            checkpoint("file")

    folders = Folders(source.raw_dir or "", data_dir if tensor_task else None)
    runner.run(tasks, manifest.statistics, folders, on_result)
    task_count = len(tasks)
    del tasks  # the per-file task list is the largest metadata; results are in the captures now
    outcome.files = task_count - len(failed)
    outcome.records = sum(1 for c in captures if c.file is None)

    final_data_dir = os.path.join(target, naming.TENSOR_DIR) if tensor_task else None

    def bodies():
        for entry in entries:
            leaves = {}
            for capture in entry.captures:
                if capture.data_name is None:
                    continue
                has_file = tensor_task and capture.file is not None and id(capture) not in failed
                leaves[id(capture)] = layout.record_of(capture, capture.data_name if has_file else None)
            yield entry.name, layout.entry_body(entry, leaves)

    fsutil.write_new_text(
        os.path.join(partial, naming.DUMP_JSON),
        layout.dump_json_lines(manifest.task, final_data_dir, bodies()),
    )
    fsutil.write_new_text(os.path.join(partial, naming.CONSTRUCT_JSON), [layout.construct_json(entries)])
    fsutil.write_new_text(os.path.join(partial, naming.STACK_JSON), [layout.stack_json(entries)])
    retired = fsutil.child(ctx.root_real, step_out, naming.retired_output_dir_name(ctx.out_rank_name))
    fsutil.swap_into_place(partial, target, retired)
    outcome.entries = len(entries)
    if checkpoint is not None:
        checkpoint("output")
    if problems:
        logger.warning("step %d rank %d: %d problem(s); raw data kept", source.step, ctx.rank, len(problems))
        return outcome

    marker = {
        "format": MARKER_FORMAT,
        "step": source.step,
        "output": outcome.output,
        "raw_dir": os.path.basename(source.raw_dir) if source.raw_dir else None,
        "raw_digest": inputs.digest,
        "kbk": inputs.kbk_sizes,
    }
    fsutil.make_dir(os.path.dirname(marker_path))
    fsutil.atomic_write_bytes(marker_path, json.dumps(marker, indent=1, sort_keys=True).encode("utf-8"))
    if checkpoint is not None:
        checkpoint("marker")
    if remove_raw:
        _remove_sources(ctx, source, inputs, marker_path, outcome)
        if checkpoint is not None:
            checkpoint("removed")
    return outcome


def _remove_sources(
    ctx: RankContext, source: StepSource, inputs: _Inputs, marker_path: str, outcome: StepOutcome
) -> None:
    """Delete the consumed raw inputs (output and marker are in place), then the marker."""
    if source.raw_dir is not None:
        if not source.complete and step_folder_digest(source.raw_dir) != inputs.digest:
            outcome.warnings.append(
                f"{source.raw_dir}: files appeared while processing (step still being written?); "
                "raw data kept"
            )
            return
        name = os.path.basename(source.raw_dir)
        fsutil.retire_and_remove(source.raw_dir, os.path.join(ctx.rank_dir, naming.removing_dir_name(name)))
    for folder in source.kbk_dirs():
        removing = os.path.join(os.path.dirname(folder), naming.removing_dir_name(os.path.basename(folder)))
        fsutil.retire_and_remove(folder, removing)
    if os.path.exists(marker_path):
        os.unlink(marker_path)
    outcome.raw_removed = True
