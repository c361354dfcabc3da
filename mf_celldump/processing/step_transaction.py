"""Processing one step of one rank, in an order that survives being killed at any point.

1. read names, records and csv rows; number calls; group entries (metadata only);
2. assemble the output under ``step{N}/.{rank}.partial`` (tensor files hard-linked, so the
   raw files stay intact), then swap it into place in one rename;
3. write ``_raw/rank{R}/_processed/step{N}.json`` naming what was consumed;
4. only then delete the raw inputs (each renamed away first), then that marker.

A re-run finds either the raw data (and redoes 2-4 with the same result), or the marker
with the output in place (and finishes 4). Any problem keeps the raw data. A failure of
the file system (permissions, a full disk, a link where our file should be) ends this
step with a problem that says what and where; the other steps go on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Tuple

from mf_celldump import fsutil
from mf_celldump.dtypes import dtype_names
from mf_celldump.errors import CellDumpError, NpyReadError, UnsafePathError
from mf_celldump.layout import naming
from mf_celldump.layout.reader import output_run_id
from mf_celldump.processing import msprobe_json, npystats, raw_cleanup, space
from mf_celldump.processing.capture_index import CaptureIndex, RecordsIndexer
from mf_celldump.processing.consumer_parts import ContentOf
from mf_celldump.processing.entries import Entry, ShapeOf
from mf_celldump.processing.entry_build import BodyOf, EntryStore, HeldStore, build_step
from mf_celldump.processing.existing_output import foreign_in_output, is_output, links_in_output
from mf_celldump.processing.file_tasks import FAILED, FileResult, FileTask, Folders
from mf_celldump.processing.observer import ProcessingObserver
from mf_celldump.processing.outcome import INCOMPLETE, StepOutcome, counted, entries_text
from mf_celldump.processing.worker_pool import FileRunner
from mf_celldump.rawformat import markers, names
from mf_celldump.rawformat.kbk_csv import captured_directions, read_statistic_csvs
from mf_celldump.rawformat.keys import KIND_TENSOR, Capture
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
class _Inputs:
    captures: List[Capture]
    digest: Optional[str]
    kbk_sizes: Dict[str, int]
    problems: List[str]
    warnings: List[str]
    index: Optional[CaptureIndex] = None  # the records, when too large to hold (then not in ``captures``)


def _read_inputs(ctx: RankContext, source: StepSource) -> _Inputs:
    """What a step's raw data holds; the caller closes ``index`` (``_transact``)."""
    inputs = _Inputs([], None, {}, [], [])
    if source.raw_dir is not None:
        indexer = RecordsIndexer(os.path.join(ctx.rank_dir, names.PROCESSED_DIR))
        listed = list_step_files(source.raw_dir, ctx.root_real, None if source.kbk_csvs else indexer)
        inputs.index = indexer.index
        if indexer.failed:
            raise StepProblem(indexer.failed)
        inputs.captures.extend(listed.captures)
        inputs.problems.extend(listed.problems)
        inputs.warnings.extend(listed.warnings)
        inputs.digest = listed.digest
    inputs.kbk_sizes = {os.path.relpath(p, ctx.rank_dir): os.lstat(p).st_size for p in source.kbk_csvs}
    if source.kbk_csvs:
        kbk = read_statistic_csvs(source.kbk_csvs, ctx.manifest.statistics, first_order=len(inputs.captures),
                                  directions=captured_directions(ctx.manifest))
        inputs.captures.extend(kbk.captures)
        inputs.problems.extend(kbk.problems)
        inputs.warnings.extend(kbk.warnings)
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


_SHAPE_HEAD_BYTES = 4096  # a raw file's header is one 64-byte multiple, far below this


def _shape_reader(ctx: RankContext, raw_dir: Optional[str], our_links: Dict[Tuple[int, int], int]) -> ShapeOf:
    """A capture's shape: known for records and csv rows, else read from its ``.npy`` header (the few
    files call pairing asks for); None when the file cannot be read (its task reports why)."""
    def shape_of(capture: Capture) -> Optional[Tuple[int, ...]]:
        if capture.shape is not None:
            return tuple(capture.shape)
        if capture.file is None or raw_dir is None:
            return None
        path = os.path.join(raw_dir, capture.file)
        try:
            with fsutil.open_own_file(path, ctx.root_real, our_links) as handle:
                # the header numpy writes is parsed without literal_eval when its first bytes are given
                return tuple(npystats.read_header(handle, path, handle.read(_SHAPE_HEAD_BYTES)).shape)
        except (OSError, ValueError, NpyReadError, UnsafePathError):
            return None

    return shape_of


_DIGEST_CHUNK = 1 << 20


def _content_reader(ctx: RankContext, raw_dir: Optional[str],
                    our_links: Dict[Tuple[int, int], int]) -> ContentOf:
    """What a capture holds, to tell a parallel-care consumer's copy of one region from another's
    (processing/consumer_parts.py): a digest of its file (header and data: copies of one shape and
    dtype have the same header), or its statistics; None when the file cannot be read."""
    def content_of(capture: Capture) -> Optional[object]:
        if capture.file is None or raw_dir is None:
            return None if capture.stats is None else tuple(sorted((k, str(v)) for k, v in capture.stats.items()))
        digest = hashlib.sha256()
        path = os.path.join(raw_dir, capture.file)
        try:
            with fsutil.open_own_file(path, ctx.root_real, our_links) as handle:
                for chunk in iter(lambda: handle.read(_DIGEST_CHUNK), b""):
                    digest.update(chunk)
        except (OSError, UnsafePathError):
            return None
        return digest.hexdigest()

    return content_of


def _read_files(ctx: RankContext, source: StepSource, entries: List[Entry], data_dir: Optional[str],
                runner: FileRunner, observer: ProcessingObserver, outcome: StepOutcome,
                our_links: Dict[Tuple[int, int], int]) -> Dict[int, int]:
    """Statistics/values of every file-backed capture, tensors linked into ``data_dir``.

    Returns the failed captures: id(capture) -> errno of the failure (0 when not an OS error).
    """
    by_index: List[Capture] = []
    tasks: List[FileTask] = []
    for entry in entries:
        for capture in entry.captures:
            if capture.file is None or capture.data_name is None:
                continue
            linked = data_dir is not None and capture.key.kind == KIND_TENSOR
            tasks.append(FileTask(len(by_index), capture.file, capture.data_name if linked else None,
                                  capture.key.kind, capture.parts))
            by_index.append(capture)
    failed: Dict[int, int] = {}

    def on_result(result: FileResult) -> None:
        index, status, dtype_or_msg, shape, payload = result
        capture = by_index[index]
        if status == FAILED:
            failed[id(capture)] = int(payload or 0)
            outcome.problems.append(dtype_or_msg)
        elif capture.key.kind == KIND_TENSOR:
            capture.shape, capture.stats = shape, payload
            _check_dtype(capture, dtype_or_msg, source.raw_dir, outcome)
            outcome.tensor_files += 1
        else:
            capture.value = payload
            outcome.value_files += 1
        observer.on_file()

    our_links = _with_twin_links(source.raw_dir, tasks, our_links)
    runner.run(tasks, ctx.manifest.statistics, Folders(source.raw_dir or "", data_dir, our_links), on_result)
    outcome.files = outcome.tensor_files + outcome.value_files
    return failed


def _check_dtype(capture: Capture, data_dtype: str, raw_dir: Optional[str], outcome: StepOutcome) -> None:
    """A raw file's name says its dtype (bfloat16 is stored as float32 data); when the data says otherwise,
    or the name's dtype is none capture writes, dump.json gives the data's dtype, and a warning says so."""
    named = capture.file_dtype or ""
    if capture.dtype is not None or named == data_dtype or (named == "bfloat16" and data_dtype == "float32"):
        return
    what = "no dtype capture writes" if named not in dtype_names() else f"dtype {named}"
    note = (f"{os.path.join(raw_dir or '', capture.file or '')}: its name says {what}, its data is {data_dtype}; "
            f"dump.json gives {data_dtype}")
    capture.file_dtype = data_dtype
    if note not in outcome.warnings:  # a weight's file serves every call of its cell
        outcome.warnings.append(note)


def _with_twin_links(raw_dir: Optional[str], tasks: List[FileTask],
                    our_links: Dict[Tuple[int, int], int]) -> Dict[Tuple[int, int], int]:
    """``our_links`` plus the names this step itself gives a raw file linked more than once (a weight
    read once per step and named under each forward call): those links are ours, not a stranger's."""
    uses: Dict[str, int] = {}
    for task in tasks:
        if task.out_name is not None:
            uses[task.name] = uses.get(task.name, 0) + 1
    twins = {name: count for name, count in uses.items() if count > 1}
    if not twins or raw_dir is None:
        return our_links
    links = dict(our_links)
    for name, count in twins.items():
        try:
            info = os.lstat(os.path.join(raw_dir, name))
        except OSError:
            continue  # reported when the task opens it
        key = (info.st_dev, info.st_ino)
        links[key] = links.get(key, 0) + count - 1
    return links


def _step_store(ctx: RankContext, source: StepSource, inputs: _Inputs, outcome: StepOutcome, body_of: BodyOf,
                our_links: Dict[Tuple[int, int], int]) -> EntryStore:
    """The step's entries, built and linked in the records' index when there is one, else in memory."""
    store: EntryStore = inputs.index if inputs.index is not None else HeldStore(inputs.captures)
    build_step(ctx.manifest, store, _shape_reader(ctx, source.raw_dir, our_links), outcome.problems,
               outcome.warnings, body_of, _content_reader(ctx, source.raw_dir, our_links))
    outcome.records = store.values()
    return store


def _texts(ctx: RankContext, store: EntryStore, data_dir: Optional[str], body_of: BodyOf,
           counts: Optional[msprobe_json.LeafCounts] = None, step: Optional[int] = None
           ) -> Iterator[Tuple[str, Iterable[str]]]:
    """(file name, text chunks) of the step's three JSON files, streamed from ``store``; ``step``: the step whose
    record of the watch (why it was captured, transient or persistent) goes into the head."""
    cells = ctx.manifest.cells
    watched = (ctx.manifest.details.get(naming.WATCH_KEY) or {}).get(str(step)) if step is not None else None
    return msprobe_json.output_texts(
        ctx.manifest.task, data_dir, ctx.manifest.run_id, store.bodies(body_of),
        lambda: ((name, cells[cell], parent) for name, cell, parent in store.nodes()), counts,
        {naming.PARALLEL_KEY: ctx.manifest.details.get("parallel"),
         naming.PARAMETERS_GRAD_KEY: ctx.manifest.details.get(naming.PARAMETERS_GRAD_KEY),
         naming.WATCH_KEY: watched})


def _decoded(bodies: Iterable[Tuple[str, str]]) -> Iterator[Tuple[str, dict]]:
    """(name, body) as a reader of the step's dump.json gets them."""
    return ((name, json.loads(body)) for name, body in bodies)


def _assemble(ctx: RankContext, source: StepSource, inputs: _Inputs, runner: FileRunner,
              observer: ProcessingObserver, outcome: StepOutcome) -> None:
    """Steps 1-2: entries, files, JSON in a partial folder, swapped into place."""
    step_out = fsutil.child(ctx.root_real, ctx.root_real, naming.step_dir_name(source.step))
    target = fsutil.child(ctx.root_real, step_out, ctx.out_rank_name)
    retired = fsutil.child(ctx.root_real, step_out, naming.retired_output_dir_name(ctx.out_rank_name))
    our_links = raw_cleanup.output_links(os.path.join(target, naming.TENSOR_DIR),
                                         os.path.join(retired, naming.TENSOR_DIR))
    final_data_dir = _final_data_dir(ctx, target)
    failed: Dict[int, int] = {}  # filled as the captures' files are read, before a body is written
    parameters = ctx.manifest.parameters

    def body_of(entry: Entry) -> dict:
        return msprobe_json.entry_json(entry, final_data_dir, failed, parameters)

    store = _step_store(ctx, source, inputs, outcome, body_of, our_links)
    partial = fsutil.child(ctx.root_real, step_out, naming.partial_output_dir_name(ctx.out_rank_name))
    fsutil.make_dir(step_out)
    fsutil.remove_tree(partial)
    fsutil.make_dir(partial)
    try:
        data_dir = None
        if ctx.manifest.task == "tensor":
            data_dir = fsutil.make_dir(os.path.join(partial, naming.TENSOR_DIR))
        failed.update(_read_files(ctx, source, store.held(), data_dir, runner, observer, outcome, our_links))
        space_codes = [code for code in failed.values() if code in space.SPACE_ERRNOS]
        if space_codes:
            raise OSError(space_codes[0], os.strerror(space_codes[0]), partial)
        counts = msprobe_json.LeafCounts()
        for name, chunks in _texts(ctx, store, final_data_dir, body_of, counts, source.step):
            fsutil.write_new_text(os.path.join(partial, name), chunks)
        outcome.tensors, outcome.values = counts.tensors, counts.values
        _check_no_foreign_output(target, [source.raw_dir, data_dir, os.path.join(retired, naming.TENSOR_DIR)])
        fsutil.swap_into_place(partial, target, retired)
    except BaseException as err:
        with contextlib.suppress(OSError):
            fsutil.remove_tree(partial)  # frees what a full disk needs; the raw data is untouched
            fsutil.remove_empty_dir(step_out)
        if space.is_space_error(err):
            raise StepProblem(_space_text(ctx, source, store, final_data_dir, body_of, err,
                                          copying=bool(failed))) from None
        raise
    outcome.output_written = True
    outcome.entries, outcome.weight_grad_entries = store.counts()
    observer.on_stage(ctx.rank, source.step, "output")
    observer.on_output(ctx.rank, source.step, _decoded(store.bodies(body_of)))


def _final_data_dir(ctx: RankContext, target: str) -> Optional[str]:
    """The ``dump_tensor_data`` folder dump.json names (the tensor task's), once the output is in place."""
    return os.path.join(target, naming.TENSOR_DIR) if ctx.manifest.task == "tensor" else None


def _check_no_foreign_output(target: str, own_folders: List[Optional[str]]) -> None:
    """An output about to be replaced must hold only what processing writes (else it would be deleted),
    as files of its own: a link in place of one is refused, as everywhere in the dump (``own_folders``
    hold the other names processing gives the same files)."""
    linked = links_in_output(target, own_folders)
    if linked:
        raise StepProblem(f"{target} holds links where mf_celldump writes its own files ({', '.join(linked[:5])}): "
                          "a symbolic link, or a file with another name outside the dump; refused, the output is not "
                          "replaced and the raw data is kept (replace the links by the files and run again)")
    foreign = foreign_in_output(target)
    if foreign:
        raise StepProblem(f"{target} holds files mf_celldump did not write ({', '.join(foreign[:5])}); they would "
                          "be deleted with the output this step replaces: move them away and run again (the raw "
                          "data is kept)")


def _space_text(ctx: RankContext, source: StepSource, store: EntryStore, data_dir: Optional[str], body_of: BodyOf,
                err: OSError, copying: bool) -> str:
    """The full-disk message, with the space this step's output needs (its JSON measured, copies added)."""
    texts = (chunk for _, chunks in _texts(ctx, store, data_dir, body_of, step=source.step) for chunk in chunks)
    files = [c.file for e in store.held() for c in e.captures if c.file is not None]
    copied = 0
    if copying and source.raw_dir is not None:  # tensors were being copied (no hard links on this file system)
        copied = sum(os.lstat(os.path.join(source.raw_dir, name)).st_size for name in files)
    return space.space_problem(err, ctx.root_real, space.needed_bytes(texts, len(files), copied))


class StepProblem(CellDumpError):
    """One step cannot be completed now; the message says why and what to do (its raw data is kept)."""


def process_step(ctx: RankContext, source: StepSource, runner: FileRunner, remove_raw: bool,
                 observer: ProcessingObserver) -> StepOutcome:
    """Process one step of one rank (see the module docstring for the order of work).

    Never raises for bad input or a failing file system: the outcome then has status
    ``failed`` (no output written) or a problem, and the step's raw data is kept.
    """
    output = os.path.join(naming.step_dir_name(source.step), ctx.out_rank_name)
    outcome = StepOutcome(ctx.rank, source.step, output, "processed", complete=source.complete)
    try:
        _transact(ctx, source, runner, remove_raw, observer, outcome)
    except StepProblem as err:
        _failed(outcome, str(err))
    except OSError as err:
        if space.is_space_error(err):
            _failed(outcome, space.space_problem(err, ctx.root_real, space.FIXED_OVERHEAD_BYTES))
        else:
            _failed(outcome, space.os_problem(err, f"step {source.step}: cannot {_doing(outcome)}"))
    except (ValueError, RecursionError) as err:  # UnsafePathError is a ValueError
        _failed(outcome, f"{err}; the raw data is kept")
    except MemoryError:
        _failed(outcome, f"out of memory while processing step {source.step}; the raw data is kept (use fewer "
                         "--jobs, or process on a machine with more memory)")
    return outcome


def _doing(outcome: StepOutcome) -> str:
    if outcome.output_written or outcome.status == "already-processed":
        return "finish the step (its output is in place; a re-run finishes it)"
    return "read the raw data or write the output"


def _failed(outcome: StepOutcome, message: str) -> None:
    if not outcome.output_written and outcome.status == "processed":
        outcome.status = "failed"
    outcome.problems.append(message)
    logger.warning("step %d rank %d: %s", outcome.step, outcome.rank, message)


def _transact(ctx: RankContext, source: StepSource, runner: FileRunner, remove_raw: bool,
              observer: ProcessingObserver, outcome: StepOutcome) -> None:
    target = os.path.join(ctx.root_real, outcome.output)
    fsutil.check_plain_dir(os.path.dirname(target))  # no link in place of step{N}/ or step{N}/rank is followed
    fsutil.check_plain_dir(target)
    inputs = _read_inputs(ctx, source)
    try:
        _transact_inputs(ctx, source, inputs, runner, remove_raw, observer, outcome)
    finally:
        if inputs.index is not None:
            inputs.index.close()


def _transact_inputs(ctx: RankContext, source: StepSource, inputs: _Inputs, runner: FileRunner, remove_raw: bool,
                     observer: ProcessingObserver, outcome: StepOutcome) -> None:
    target = os.path.join(ctx.root_real, outcome.output)
    outcome.warnings.extend(inputs.warnings)
    marker_path = _marker_path(ctx, source.step)
    marker = markers.read_processed(marker_path, ctx.root_real) if os.path.lexists(marker_path) else None
    if marker is not None and is_output(target) and _covered_by(marker, source, inputs):
        outcome.status = "already-processed"
        if inputs.problems:  # something changed since (e.g. a link planted): keep everything
            outcome.problems.extend(inputs.problems)
        elif remove_raw:
            _remove_sources(ctx, source, inputs, marker_path, outcome)
        return
    outcome.problems.extend(inputs.problems)
    _check_same_run(ctx, target)
    _assemble(ctx, source, inputs, runner, observer, outcome)
    if not source.complete and source.raw_dir is not None:
        outcome.problems.append(_incomplete_text(ctx, source, outcome))
    if outcome.problems:
        logger.warning("step %d rank %d: %d problem(s); raw data kept", source.step, ctx.rank,
                       len(outcome.problems))
        return
    _make_marker_dir(os.path.dirname(marker_path))
    _check_replaceable(marker_path)
    raw_name = os.path.basename(source.raw_dir) if source.raw_dir else None
    markers.write_processed(marker_path, source.step, outcome.output, raw_name, inputs.digest, inputs.kbk_sizes)
    observer.on_stage(ctx.rank, source.step, "marker")
    if remove_raw:
        _remove_sources(ctx, source, inputs, marker_path, outcome)
        observer.on_stage(ctx.rank, source.step, "removed")


def _incomplete_text(ctx: RankContext, source: StepSource, outcome: StepOutcome) -> str:
    """A step whose raw writes did not all complete (no completion marker): what it holds, and that it is not
    whole. Its output is written for a look at what was captured, never recorded as consumed: its raw data
    stays, and every run says so again (a problem, so the command exits non-zero). A step of MindSpore's
    statistics files alone has no marker of ours (it counts as complete once a later iteration exists): it
    keeps the report's note."""
    return (f"{INCOMPLETE}: step {source.step} rank {ctx.rank} was not completed by the capture (its completion "
            "marker is missing: "
            f"the run ended, or is still running, before every raw write of the step finished): "
            f"{entries_text(outcome.entries, outcome.weight_grad_entries)} and {counted(outcome.files, 'raw file')} "
            f"were found; {outcome.output} holds only those, it is not the whole step; the raw data is kept in "
            f"{source.raw_dir}")


def _check_same_run(ctx: RankContext, target: str) -> None:
    """An output in place is replaced only by data of the run that wrote it (steps of two runs never mix)."""
    if not ctx.manifest.run_id or not is_output(target):
        return
    other = output_run_id(os.path.join(target, naming.DUMP_JSON))
    if other is not None and other != ctx.manifest.run_id:
        raise StepProblem(f"{target} holds the output of run {other!r}, and this raw data is of run "
                          f"{ctx.manifest.run_id!r} ({ctx.manifest.path}): not replaced, the raw data is kept; "
                          "process it in a dump folder of its own (move its _raw/rank folder there)")


def _make_marker_dir(folder: str) -> None:
    try:
        fsutil.make_dir(folder)
    except UnsafePathError:
        raise StepProblem(f"{folder} is not a plain folder (a file, or a symlink); refused: what this step "
                          "consumed cannot be recorded there, so its output is written and its raw data kept (move "
                          "it away and run again)") from None


def _check_replaceable(path: str) -> None:
    """An existing file we are about to replace must be ours: a plain file with no other name."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    fsutil.check_own_file(info, path)


def _remove_sources(ctx: RankContext, source: StepSource, inputs: _Inputs, marker_path: str,
                    outcome: StepOutcome) -> None:
    """Delete the consumed raw inputs we wrote (output and marker are in place), then the marker."""
    if source.raw_dir is not None:
        if not source.complete and step_folder_digest(source.raw_dir) != inputs.digest:
            outcome.warnings.append(f"{source.raw_dir}: files appeared while processing (step still being "
                                    "written?); raw data kept")
            return
        links = raw_cleanup.output_links(os.path.join(ctx.root_real, outcome.output, naming.TENSOR_DIR))
        removal = raw_cleanup.remove_raw_step(ctx.rank_dir, source.raw_dir, links)
        outcome.foreign_kept = removal.foreign
        note = removal.describe(source.raw_dir)
        if removal.refused:
            outcome.problems.append(note)
            return
        if note:
            outcome.warnings.append(note)
    for path in raw_cleanup.remove_kbk_csvs(source.kbk_csvs, os.path.join(ctx.rank_dir, names.KBK_DIR)):
        outcome.problems.append(f"{path} also has a name outside its folder (hard link); refused to delete it")
    if os.path.lexists(marker_path):
        os.unlink(marker_path)
    outcome.raw_removed = True
