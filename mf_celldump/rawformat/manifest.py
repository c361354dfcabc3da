"""The rank manifest (``_raw/rank{R}/manifest.json``): written at attach, checked on every read.

It says how to read the rank's raw data: which cells the ids in raw names refer to,
the task and statistics, how raw step folders are numbered, and whether the folder is
the single-card ``rank`` or a distributed ``rank{R}`` in the output. Its ``format``
names the raw-format version; a reader reads only the one this package writes and
refuses any other with a message naming the file, the version found and the one it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from mf_celldump.errors import ManifestError, UnsafePathError, short_repr
from mf_celldump.fsutil import atomic_write_json, read_json_inside
from mf_celldump.statistics import DEFAULT_STATISTICS, STATISTICS, TASKS

FORMAT = "mf_celldump-raw/3"
MAX_MICRO_BATCHES = 1 << 20

# How raw step folders are numbered: "global" = the training run's global step (0-based);
# "graph" = the graph's own step counter, which starts at 0 in every process: add
# ``graph_step_base`` (the global step at attach time) for the global step.
NUMBERING_GLOBAL = "global"
NUMBERING_GRAPH = "graph"
STEP_NUMBERINGS = (NUMBERING_GLOBAL, NUMBERING_GRAPH)

# When a raw step folder is complete: "step_done" = capture wrote ``_step_done.json`` when
# the step ended; "tensordump_marker" = MindSpore writes the step's files after the step
# (graph-mode TensorDump) and the folder is complete once the step-done marker file
# ``_td_done_g{G}_{dtype}_{id}.npy`` is in it, written after all of them; G is the global step.
COMPLETION_STEP_DONE = "step_done"
COMPLETION_TENSORDUMP = "tensordump_marker"
STEP_COMPLETIONS = (COMPLETION_STEP_DONE, COMPLETION_TENSORDUMP)


# Manifest fields (docs/raw-format.md is generated from this table).
FIELDS = {
    "format": f"'{FORMAT}': the raw-format version; readers refuse any other version",
    "run_id": "unique per attach",
    "task": "'tensor' or 'statistics'",
    "statistics": "configured statistics names (max, min, mean, norm, md5, nan_count, inf_count)",
    "backend": "the capture backend that wrote the data",
    "rank": "int: the rank",
    "distributed": "bool: output folder rank{R} (true) or rank (false)",
    "step_numbering": f"'{NUMBERING_GLOBAL}': step folders are global steps; '{NUMBERING_GRAPH}': graph steps, "
                      "add graph_step_base",
    "graph_step_base": "int: global step = folder step + graph_step_base (graph numbering)",
    "step_completion": f"'{COMPLETION_STEP_DONE}' (default): a step folder is complete once it holds "
                       f"_step_done.json; '{COMPLETION_TENSORDUMP}': MindSpore writes the folder after the step, "
                       "and it is complete once it holds _td_done_g{G}_{dtype}_{id}.npy, which names its global step G",
    "parameters": "bool: forward entries get msprobe's 'parameters' field (weights were recorded; "
                  "false when absent)",
    "micro_batches": "int (default 1): micro-batches per step, whose backward MindSpore runs in micro-batch order; "
                     "set where backward captures carry no call (graph-mode TensorDump): processing then pairs "
                     "the k-th run of backward captures of a probe with micro-batch k (see Call index inference)",
    "cells": "list of {id, name, class, module, file, line, params, weights}: params are construct's parameter "
             "names; weights the cell's own parameters as msprobe names them (last part of the parameter's "
             "name), indexed by the w/g slots",
    "parallel": "informative, where capture knows it: {tensor_parallel, source, parallel_mode}; processing copies "
                "it into dump.json (mf_celldump_parallel) so compare merges tensor-parallel ranks without --target-tp",
    "tool_version, config, data_mode, execution_mode, device, mindspore_version, model_class": "informative",
}


MAX_CELLS = 1_000_000  # a model with every cell captured has thousands; far more is not a capture


@dataclass(frozen=True)
class CellRecord:
    """One captured cell: the id raw names use, its name and class, where it is defined."""

    cell_id: int
    name: str
    class_name: str
    module: str = ""
    file: str = ""
    line: Optional[int] = None
    params: Tuple[str, ...] = ()  # construct's parameter names (without self), to name keyword inputs
    weights: Tuple[str, ...] = ()  # the cell's own parameters (msprobe's names), indexed by the w/g slots

    def to_json(self) -> dict:
        return {"id": self.cell_id, "name": self.name, "class": self.class_name, "module": self.module,
                "file": self.file, "line": self.line, "params": list(self.params), "weights": list(self.weights)}


@dataclass(frozen=True)
class Manifest:
    rank: int
    distributed: bool
    task: str
    cells: Dict[int, CellRecord]
    statistics: Tuple[str, ...] = DEFAULT_STATISTICS
    backend: str = ""
    step_numbering: str = NUMBERING_GLOBAL
    graph_step_base: int = 0
    step_completion: str = COMPLETION_STEP_DONE
    run_id: str = ""
    parameters: bool = False  # forward entries get msprobe's 'parameters' field
    micro_batches: int = 1  # per step, backward in micro-batch order (capture/micro_batches.py)
    details: Dict[str, Any] = field(default_factory=dict)  # informative: config, versions, mode
    path: str = ""  # where it was read from ("" before it is written)

    @property
    def written_later(self) -> bool:
        """True when MindSpore writes step folders after the step (a marker file says when they are complete)."""
        return self.step_completion == COMPLETION_TENSORDUMP

    def global_step(self, folder_step: int) -> int:
        """Global step of a raw ``step{N}`` folder."""
        return folder_step + self.graph_step_base if self.step_numbering == NUMBERING_GRAPH else folder_step

    def folder_step(self, global_step: int) -> int:
        """The ``N`` of the raw ``step{N}`` folder that holds global step ``global_step``."""
        if self.step_numbering == NUMBERING_GRAPH:
            return global_step - self.graph_step_base
        return global_step

    def to_json(self) -> dict:
        out = {"format": FORMAT, "run_id": self.run_id, "task": self.task,
               "statistics": list(self.statistics), "backend": self.backend, "rank": self.rank,
               "distributed": self.distributed, "step_numbering": self.step_numbering,
               "graph_step_base": self.graph_step_base, "step_completion": self.step_completion,
               "parameters": self.parameters}
        if self.micro_batches > 1:
            out["micro_batches"] = self.micro_batches
        out.update(self.details)
        out["cells"] = [c.to_json() for c in sorted(self.cells.values(), key=lambda c: c.cell_id)]
        return out


def write_manifest(path: str, manifest: Manifest) -> None:
    atomic_write_json(path, manifest.to_json())


def _require(data: dict, key: str, kind, path: str):
    if key not in data:
        raise ManifestError(f"{path}: missing key {key!r}; the file was not written by mf_celldump's capture")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{path}: key {key!r} has invalid value {short_repr(value)}")
    return value


def _cell(raw: Any, path: str) -> CellRecord:
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: each entry of 'cells' must be an object, got {short_repr(raw)}")
    cell_id = _require(raw, "id", int, path)
    params = raw.get("params") or []
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise ManifestError(f"{path}: cell {cell_id} has invalid 'params' {short_repr(params)}")
    weights = raw.get("weights") or []
    if not isinstance(weights, list) or not all(isinstance(w, str) and w for w in weights):
        raise ManifestError(f"{path}: cell {cell_id} has invalid 'weights' {short_repr(weights)}")
    line = raw.get("line")
    name = _require(raw, "name", str, path)
    if not name:
        raise ManifestError(f"{path}: cell {cell_id} has an empty name; capture names every cell it records "
                            "(the model root, the only cell without a name, is never captured)")
    return CellRecord(
        cell_id=cell_id,
        name=name,
        class_name=_require(raw, "class", str, path),
        module=str(raw.get("module") or ""),
        file=str(raw.get("file") or ""),
        line=line if isinstance(line, int) and not isinstance(line, bool) else None,
        params=tuple(params),
        weights=tuple(weights),
    )


def _cells(data: dict, path: str) -> Dict[int, CellRecord]:
    cells: Dict[int, CellRecord] = {}
    listed = _require(data, "cells", list, path)
    if len(listed) > MAX_CELLS:
        raise ManifestError(f"{path}: {len(listed)} cells, more than the {MAX_CELLS} a capture records")
    for raw in listed:
        cell = _cell(raw, path)
        if cell.cell_id in cells:
            raise ManifestError(f"{path}: cell id {cell.cell_id} appears twice")
        cells[cell.cell_id] = cell
    return cells


def _check_format(data: dict, path: str) -> None:
    version = data.get("format")
    if version != FORMAT:
        raise ManifestError(
            f"{path}: raw format {short_repr(version)} is not one this mf_celldump reads (it reads {FORMAT!r} only); "
            "process this dump with the mf_celldump version that captured it"
        )


def _numbering(data: dict, path: str) -> Tuple[str, int]:
    numbering = data.get("step_numbering", NUMBERING_GLOBAL)
    if numbering not in STEP_NUMBERINGS:
        raise ManifestError(f"{path}: invalid 'step_numbering' {short_repr(numbering)}; "
                            f"valid: {', '.join(STEP_NUMBERINGS)}")
    base = data.get("graph_step_base", 0)
    # Negative when a second capture in one process starts at a graph step past its global step.
    if not isinstance(base, int) or isinstance(base, bool) or abs(base) > 10**15:
        raise ManifestError(f"{path}: invalid 'graph_step_base' {short_repr(base)}")
    return numbering, base


def _completion(data: dict, path: str) -> str:
    completion = data.get("step_completion", COMPLETION_STEP_DONE)
    if completion not in STEP_COMPLETIONS:
        raise ManifestError(f"{path}: invalid 'step_completion' {short_repr(completion)}; "
                            f"valid: {', '.join(STEP_COMPLETIONS)}")
    return completion


def _micro_batches(data: dict, path: str) -> int:
    count = data.get("micro_batches", 1)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_MICRO_BATCHES:
        raise ManifestError(f"{path}: invalid 'micro_batches' {short_repr(count)}; expected an int from 1 to "
                            f"{MAX_MICRO_BATCHES}")
    return count


def manifest_from_json(data: Any, path: str) -> Manifest:
    """Validate a parsed manifest; errors name the file and the key."""
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a JSON object")
    _check_format(data, path)
    task = _require(data, "task", str, path)
    if task not in TASKS:
        raise ManifestError(f"{path}: unknown task {short_repr(task)}; valid: {', '.join(TASKS)}")
    stats = data.get("statistics") or list(DEFAULT_STATISTICS)
    if not isinstance(stats, list) or any(s not in STATISTICS for s in stats):
        raise ManifestError(f"{path}: invalid 'statistics' {short_repr(stats)}; valid names: {', '.join(STATISTICS)}")
    numbering, base = _numbering(data, path)
    recorded = data.get("config")
    if isinstance(recorded, dict) and "task" in recorded and recorded["task"] != task:
        raise ManifestError(f"{path}: task {task!r} disagrees with the configuration it records (task "
                            f"{short_repr(recorded['task'])}); the manifest was changed after capture: restore it (its "
                            "raw data is kept)")
    distributed = data.get("distributed", False)
    if not isinstance(distributed, bool):
        raise ManifestError(f"{path}: key 'distributed' has invalid value {short_repr(distributed)}; valid: true or "
                            "false")
    known = {"format", "run_id", "task", "statistics", "backend", "rank", "distributed", "step_numbering",
             "graph_step_base", "step_completion", "parameters", "micro_batches", "cells"}
    return Manifest(
        rank=_require(data, "rank", int, path),
        distributed=distributed,
        task=task,
        cells=_cells(data, path),
        statistics=tuple(stats),
        backend=str(data.get("backend", "")),
        step_numbering=numbering,
        graph_step_base=base,
        step_completion=_completion(data, path),
        run_id=str(data.get("run_id", "")),
        parameters=data.get("parameters") is True,
        micro_batches=_micro_batches(data, path),
        details={k: v for k, v in data.items() if k not in known},
        path=path,
    )


def load_manifest(path: str, root_real: str) -> Manifest:
    """Read and validate one manifest (a plain file inside ``root_real``, never through a link).

    A manifest too big for the memory available is a ``ManifestError`` of its rank like any
    other bad manifest (the other ranks are processed).
    """
    try:
        return manifest_from_json(_read(path, root_real), path)
    except MemoryError:
        raise ManifestError(f"{path}: too large to read in the memory available; not a manifest capture "
                            "writes") from None


def _read(path: str, root_real: str) -> Any:
    try:
        return read_json_inside(path, root_real)
    except FileNotFoundError:
        raise ManifestError(f"{path}: missing; this rank folder was not written by mf_celldump's capture") from None
    except UnsafePathError as err:
        raise ManifestError(str(err)) from None
    except (OSError, ValueError, RecursionError) as err:
        raise ManifestError(f"{path}: unreadable ({short_repr(str(err))}); "
                            "restore it from the training run's dump folder") from None
