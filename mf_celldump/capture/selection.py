"""Which cells get captured, and under which names.

Names are the user model's own: training wrappers around the model (TrainOneStepCell,
MindFormers' wrappers, ``_VirtualDatasetCell``, pipeline / gradient-accumulation /
micro-batch wrappers, WithLossCell) are peeled off first, and the remaining model's
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
from typing import List, Tuple

from mf_celldump.config import DumpConfig

logger = logging.getLogger(__name__)

# Training wrappers and the attribute that holds what they wrap.
WRAPPER_CLASSES = {
    "TrainOneStepCell": "network",
    "TrainOneStepWithLossScaleCell": "network",
    "MFTrainOneStepCell": "network",
    "MFPipelineWithLossScaleCell": "network",
    "PipelineCell": "network",
    "PipelineGradReducer": "network",
    "GradAccumulationCell": "network",
    "GradAccumulation": "network",
    "MicroBatchInterleaved": "network",
    "_MicroBatch": "network",
    "_VirtualDatasetCell": "_backbone",
    "WithLossCell": "_backbone",
    "WithGradCell": "network",
    "_DataWrapper": "network",
    "DataOrderWrapperCell": "network",  # MindFormers 1.x puts it around the model
    "_TrainGradAccuStepCell": "network",
    "_TrainPipelineAccuStepCell": "network",
}
SKIPPED_NAMES = ("grad_reducer",)


@dataclass(frozen=True)
class CellInfo:
    """One captured cell, as the raw manifest records it."""

    id: int
    name: str
    class_name: str
    module: str
    file: str
    line: int
    params: Tuple[str, ...]
    cell: object = field(compare=False, repr=False)

    def manifest_entry(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "class": self.class_name,
            "module": self.module,
            "file": self.file,
            "line": self.line,
            "params": list(self.params),
        }


def is_wrapper(cell) -> bool:
    """True for training wrappers whose inner network is the thing to name."""
    for klass in type(cell).__mro__:
        attr = WRAPPER_CLASSES.get(klass.__name__)
        if attr is not None and hasattr(cell, attr):
            return True
    return False


def unwrap(network):
    """Peel training wrappers off ``network``; returns the user model."""
    seen = set()
    while id(network) not in seen:
        seen.add(id(network))
        inner = None
        for klass in type(network).__mro__:
            attr = WRAPPER_CLASSES.get(klass.__name__)
            if attr is not None:
                inner = getattr(network, attr, None)
                break
        if inner is None:
            break
        network = inner
    return network


def _construct_params(cell) -> Tuple[str, ...]:
    try:
        signature = inspect.signature(type(cell).construct)
    except (TypeError, ValueError):
        return ()
    names = []
    for name, param in signature.parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        names.append(name)
    return tuple(names)


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


def select_cells(model, config: DumpConfig) -> List[CellInfo]:
    """Cells of ``model`` to capture, in ``cells_and_names()`` order, with stable ids."""
    chosen: List[CellInfo] = []
    for name, cell in model.cells_and_names():
        if not name:
            continue  # the model root
        class_name = type(cell).__name__
        reason = None
        if class_name.startswith("_"):
            reason = "framework-internal class"
        elif is_wrapper(cell):
            reason = "training wrapper"
        elif name.split(".")[-1] in SKIPPED_NAMES:
            reason = "gradient reducer"
        elif class_name in config.exclude_classes:
            reason = "class in exclude_classes"
        elif not _matches(name, config.include):
            reason = "not matched by include"
        elif config.exclude and _matches(name, config.exclude):
            reason = "matched by exclude"
        if reason:
            logger.debug("not capturing %s (%s): %s", name, class_name, reason)
            continue
        module, file, line = _definition_site(cell)
        chosen.append(
            CellInfo(
                id=len(chosen),
                name=name,
                class_name=class_name,
                module=module,
                file=file,
                line=line,
                params=_construct_params(cell),
                cell=cell,
            )
        )
    return chosen
