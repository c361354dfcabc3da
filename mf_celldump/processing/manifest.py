"""The rank manifest (``_raw/rank{R}/manifest.json``): what processing needs from it, validated."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from mf_celldump.config import STATISTICS, TASKS
from mf_celldump.processing.errors import ManifestError


@dataclass(frozen=True)
class CellInfo:
    cell_id: int
    name: str
    class_name: str
    module: str = ""
    file: str = ""
    line: Optional[int] = None
    params: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Manifest:
    path: str
    rank: int
    distributed: bool
    task: str
    statistics: Tuple[str, ...]
    backend: str
    step_numbering: str
    graph_step_base: int
    cells: Dict[int, CellInfo]
    run_id: str = ""

    def output_step(self, folder_step: int) -> int:
        """Global step of a raw ``step{N}`` folder (graph-step folders are offset by the attach step)."""
        return folder_step + self.graph_step_base if self.step_numbering == "graph" else folder_step


def _require(data: dict, key: str, kind, path: str):
    if key not in data:
        raise ManifestError(f"{path}: missing key {key!r}; the file was not written by mf_celldump's capture")
    value = data[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ManifestError(f"{path}: key {key!r} has invalid value {value!r}")
    return value


def _cell(raw, path: str) -> CellInfo:
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: each entry of 'cells' must be an object, got {raw!r}")
    cell_id = _require(raw, "id", int, path)
    name = _require(raw, "name", str, path)
    class_name = _require(raw, "class", str, path)
    params = raw.get("params") or []
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise ManifestError(f"{path}: cell {cell_id} has invalid 'params' {params!r}")
    line = raw.get("line")
    return CellInfo(
        cell_id=cell_id,
        name=name,
        class_name=class_name,
        module=str(raw.get("module") or ""),
        file=str(raw.get("file") or ""),
        line=line if isinstance(line, int) and not isinstance(line, bool) else None,
        params=tuple(params),
    )


def load_manifest(path: str) -> Manifest:
    """Read and validate one manifest; errors say which file and which key."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        raise ManifestError(
            f"{path}: missing; this rank folder was not written by mf_celldump's capture"
        ) from None
    except (OSError, ValueError) as err:
        raise ManifestError(
            f"{path}: unreadable ({err}); restore it from the training run's dump folder"
        ) from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a JSON object")
    task = _require(data, "task", str, path)
    if task not in TASKS:
        raise ManifestError(f"{path}: unknown task {task!r}; valid: {', '.join(TASKS)}")
    stats = data.get("statistics") or ["max", "min", "mean", "norm"]
    if not isinstance(stats, list) or any(s not in STATISTICS for s in stats):
        raise ManifestError(f"{path}: invalid 'statistics' {stats!r}; valid names: {', '.join(STATISTICS)}")
    cells_raw = _require(data, "cells", list, path)
    cells: Dict[int, CellInfo] = {}
    for raw in cells_raw:
        cell = _cell(raw, path)
        if cell.cell_id in cells:
            raise ManifestError(f"{path}: cell id {cell.cell_id} appears twice")
        cells[cell.cell_id] = cell
    numbering = data.get("step_numbering", "global")
    if numbering not in ("global", "graph"):
        raise ManifestError(f"{path}: invalid 'step_numbering' {numbering!r}; valid: global, graph")
    base = data.get("graph_step_base", 0)
    if not isinstance(base, int) or isinstance(base, bool) or base < 0:
        raise ManifestError(f"{path}: invalid 'graph_step_base' {base!r}")
    return Manifest(
        path=path,
        rank=_require(data, "rank", int, path),
        distributed=bool(data.get("distributed", False)),
        task=task,
        statistics=tuple(stats),
        backend=str(data.get("backend", "")),
        step_numbering=numbering,
        graph_step_base=base,
        cells=cells,
        run_id=str(data.get("run_id", "")),
    )
