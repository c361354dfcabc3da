"""Which cells get captured, and under which names.

Names are the user model's own: training wrappers around the model (TrainOneStepCell,
MindFormers' wrappers, ``_VirtualDatasetCell``, pipeline / gradient-accumulation /
micro-batch wrappers, WithLossCell; found by what they hold, ``capture/wrappers.py``)
are peeled off first, and the remaining model's
``cells_and_names()`` gives the names. So ``LlamaForCausalLM`` inside
``MFTrainOneStepCell`` yields ``model.layers.0.attention.wq`` (not
``network.model.layers...``), the same with or without wrappers. The model root itself
has the empty name and is not captured.
"""

from __future__ import annotations

import fnmatch
import inspect
import logging
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from mf_celldump.capture.construct import construct_params
from mf_celldump.capture.parameters import weight_names
from mf_celldump.capture.wrappers import is_wrapper, peel
from mf_celldump.config import DumpConfig
from mf_celldump.rawformat.manifest import CellRecord

logger = logging.getLogger(__name__)

SKIPPED_NAMES = ("grad_reducer",)


@dataclass(frozen=True)
class SelectedCell:
    """One captured cell: its manifest record and the live cell object."""

    record: CellRecord
    cell: object = field(compare=False, repr=False)

    @property
    def cell_id(self) -> int:
        return self.record.cell_id

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def params(self) -> Tuple[str, ...]:
        return self.record.params


def unwrap(network):
    """Peel training wrappers off ``network``; returns the user model."""
    return peel(network).model


def _definition_site(cell) -> Tuple[str, str, int]:
    klass = type(cell)
    module = klass.__module__
    try:
        file = inspect.getsourcefile(klass) or ""
    except TypeError:
        file = ""
    construct = getattr(klass, "construct", None)
    code = getattr(construct, "__code__", None)
    line = code.co_firstlineno if code is not None else 0
    return module, file, line


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _skip_reason(name: str, cell, config: DumpConfig) -> Optional[str]:
    class_name = type(cell).__name__
    if class_name.startswith("_"):
        return "framework-internal class"
    if is_wrapper(cell):
        return "training wrapper"
    if name.split(".")[-1] in SKIPPED_NAMES:
        return "gradient reducer"
    if class_name in config.exclude_classes:
        return "class in exclude_classes"
    if not _matches(name, config.include):
        return "not matched by include"
    if config.exclude and _matches(name, config.exclude):
        return "matched by exclude"
    return None


def select_cells(model, config: DumpConfig) -> List[SelectedCell]:
    """Cells of ``model`` to capture, in ``cells_and_names()`` order, with stable ids."""
    chosen: List[SelectedCell] = []
    for name, cell in model.cells_and_names():
        if not name:
            continue  # the model root
        reason = _skip_reason(name, cell, config)
        if reason:
            logger.debug("not capturing %s (%s): %s", name, type(cell).__name__, reason)
            continue
        module, file, line = _definition_site(cell)
        record = CellRecord(cell_id=len(chosen), name=name, class_name=type(cell).__name__, module=module,
                            file=file, line=line, params=construct_params(cell),
                            weights=weight_names(cell) if config.parameters else ())
        chosen.append(SelectedCell(record, cell))
    return chosen


def selection_warnings(model, config: DumpConfig, chosen: List[SelectedCell]) -> List[str]:
    """What the configuration selects that the model does not have: an ``include`` pattern that
    matches no cell, and a selection that leaves no cell at all (nothing would be dumped)."""
    named = [(name, type(cell).__name__) for name, cell in model.cells_and_names() if name]
    model_name = type(model).__name__
    examples = ", ".join(name for name, _ in named[:3]) + (", ..." if len(named) > 3 else "")
    out = [f"include pattern {pattern!r} matches no cell of {model_name} (its cells are named like {examples})"
           for pattern in config.include if not any(_matches(name, (pattern,)) for name, _ in named)]
    if named and not chosen:
        out.append(f"no cell of {model_name} is captured: include={list(config.include)}, "
                   f"exclude={list(config.exclude)}, exclude_classes={list(config.exclude_classes)} leave none of "
                   f"its {len(named)} cells; nothing will be dumped")
    return out
