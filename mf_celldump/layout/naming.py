"""msprobe's names (the output contract): entries, tensor files, step and rank folders.

``Cell.{cell}.{Class}.{forward|backward}.{n}`` entries, ``{entry}.{input|output}.{index
path}.npy`` tensor files in ``dump_tensor_data/``, ``step{N}`` and ``rank``/``rank{R}``
folders, and the temporary names processing uses while it assembles an output folder.
Names under ``_raw/`` belong to the raw format (``mf_celldump.rawformat.names``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Tuple

FORWARD = "forward"
BACKWARD = "backward"
DIRECTIONS = (FORWARD, BACKWARD)
# A forward entry's field holding the cell's own weights ({name: T}), and the entry kind
# holding their gradients: Cell.{cell}.{Class}.parameters_grad.{n} = {name: [T]}.
PARAMETERS = "parameters"
PARAMETERS_GRAD = "parameters_grad"

DUMP_JSON = "dump.json"
# Our key in dump.json's head: the run (the capture, resumed or not) whose data the folder holds.
# msprobe reads the keys it knows (task, level, framework, dump_data_dir, data) and ignores others.
RUN_ID_KEY = "mf_celldump_run_id"
# Our key in dump.json's head: the parallel layout capture knew (``{"tensor_parallel": T, ...}``), for compare.
PARALLEL_KEY = "mf_celldump_parallel"
# Our key in dump.json's head (and the raw manifest's): where the parameters_grad entries were read,
# {"point": "autodiff" | "optimizer_input", "micro_batches": N}; docs/capture.md, "Weight gradients".
PARAMETERS_GRAD_KEY = "mf_celldump_parameters_grad"
# Our key in dump.json's head (and, per step, the raw manifest's): why the watch captured the step, and for a rerun
# whether the fault came back, {"rule", "fired_at_step", "capture": "rerun" | "next_step", "fault", "exact"};
# docs/watch.md.
WATCH_KEY = "mf_celldump_watch"
GRADIENT_POINT_AUTODIFF = "autodiff"
GRADIENT_POINT_OPTIMIZER = "optimizer_input"
CONSTRUCT_JSON = "construct.json"
STACK_JSON = "stack.json"
TENSOR_DIR = "dump_tensor_data"

# Numbers as ``str(int)`` writes them: a name is ours only if it reads back to itself
# (``step01`` is not step 1's folder).
_STEP_RE = re.compile(r"^step(0|[1-9]\d{0,11})$")
_RANK_RE = re.compile(r"^rank(0|[1-9]\d{0,8})?$")


def step_dir_name(step: int) -> str:
    return f"step{step}"


def parse_step_dir_name(name: str) -> Optional[int]:
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def output_rank_dir_name(rank: int, distributed: bool) -> str:
    """msprobe's folder: ``rank`` in a single-card run, ``rank{R}`` in a distributed one."""
    return f"rank{rank}" if distributed else "rank"


def parse_output_rank_dir_name(name: str) -> Optional[int]:
    """``rank3`` -> 3, ``rank`` -> 0 (single card), anything else -> None."""
    m = _RANK_RE.match(name)
    if m is None:
        return None
    return int(m.group(1)) if m.group(1) else 0


def cell_prefix(cell_name: str, class_name: str) -> str:
    return f"Cell.{cell_name}.{class_name}"


def entry_name(cell_name: str, class_name: str, direction: str, call: int) -> str:
    return f"{cell_prefix(cell_name, class_name)}.{direction}.{call}"


def arg_label(path: Tuple[int, ...], kwarg_name: Optional[str] = None) -> str:
    """Index path as msprobe writes it: ``1.0``; a keyword input uses its name first."""
    head = [kwarg_name] if kwarg_name is not None else [str(path[0])]
    return ".".join(head + [str(i) for i in path[1:]])


def data_name(entry: str, io: str, label: str) -> str:
    """``{entry}.{input|output}.{label}.npy`` (the file in dump_tensor_data/); a weight of a forward
    entry: ``{entry}.parameters.{weight}.npy``."""
    return f"{entry}.{io}.{label}.npy"


def parameters_grad_entry_name(cell_name: str, class_name: str, n: int) -> str:
    """``Cell.{cell}.{Class}.parameters_grad.{n}``; ``n`` counts the gradients of the cell's weights in the step."""
    return f"{cell_prefix(cell_name, class_name)}.{PARAMETERS_GRAD}.{n}"


def parameters_grad_data_name(entry: str, weight: str) -> str:
    """``{parameters_grad entry}.{weight}.npy``."""
    return f"{entry}.{weight}.npy"


def parse_parameters_grad_name(name: str) -> Optional[EntryName]:
    """``Cell.{cell}.{Class}.parameters_grad.{n}`` as an :class:`EntryName` of direction ``parameters_grad``;
    None for any other name."""
    parts = name.split(".")
    if len(parts) < 5 or parts[0] not in CELL_PREFIXES or parts[-2] != PARAMETERS_GRAD or not parts[-1].isdigit():
        return None
    return EntryName(".".join(parts[1:-3]), parts[-3], PARAMETERS_GRAD, int(parts[-1]))


# A parsed entry: MindSpore cells are ``Cell.*``, msprobe's PyTorch modules ``Module.*``.
CELL_PREFIXES = ("Cell", "Module")


@dataclass(frozen=True)
class EntryName:
    """A parsed cell entry name: ``Cell.{cell}.{cls}.{direction}.{call}``."""

    cell: str
    cls: str
    direction: str
    call: int


def parse_entry_name(name: str, parameters_grad: bool = False) -> Optional[EntryName]:
    """Parse a cell/module entry name; None for anything else (API entries, and ``parameters_grad``
    entries unless asked for: their ``direction`` is then ``parameters_grad``)."""
    parts = name.split(".")
    kinds = (*DIRECTIONS, PARAMETERS_GRAD) if parameters_grad else DIRECTIONS
    if len(parts) < 5 or parts[0] not in CELL_PREFIXES or parts[-2] not in kinds:
        return None
    if not parts[-1].isdigit():
        return None
    return EntryName(".".join(parts[1:-3]), parts[-3], parts[-2], int(parts[-1]))


# -- temporary names inside the output tree (processing's own) -------------------------


def partial_output_dir_name(rank_dir: str) -> str:
    """Where an output rank folder is assembled before it is renamed into place."""
    return f".{rank_dir}.partial"


def retired_output_dir_name(rank_dir: str) -> str:
    """Where a replaced output rank folder waits for deletion."""
    return f".{rank_dir}.retired"


def layer_of(cell: str) -> str:
    """Depth group of a cell: its name up to the first numbered part (``model.layers.1``), else itself."""
    parts = cell.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: index + 1])
    return cell
