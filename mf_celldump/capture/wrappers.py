"""Training wrappers found by what they are, and the user model inside them.

A class-name list breaks with each MindFormers release (1.8 and 1.9 added
``GradAccumulationCellWithMultiOutputs`` and ``PipelineCellWithMultiOutputs``), and a
wrapper taken for the model silently renames every entry and hides its micro-batches. So
each cell from the attached network inwards is read by what it holds:

* training machinery: an ``nn.Optimizer`` child, a gradient operation
  (``GradOperation``), a ``DistributedGradReducer`` child: it trains what it wraps;
* a micro-batch slicer list: a ``CellList`` of parameter-free cells without children that
  hold a ``StridedSlice`` (MindSpore's ``_MicroBatch`` and anything built like it). Its
  length is the micro-batch count; the marks MindSpore's parallel passes look for say the
  schedule: ``grad_accu_num`` on the slice or a ``forward_end`` Add (gradient
  accumulation), a ``pipeline_end`` Add (pipeline), ``interleave_num`` (micro-batch
  interleave), ``seq_split_slice`` (MindFormers' ``SequenceSplit``, which splits the
  sequence axis and is refused);
* a dataset primitive: ``_VirtualDataset`` (``_VirtualDatasetCell``), ``GetNext``
  (``_DataWrapper``).

A cell with such machinery wraps the child that holds every parameter it trains (the
optimizer's, else all its other children's); when no single child does, attach is
refused. The first cell without machinery is the model. A cell that only forwards
(``WithLossCell``, MindFormers' ``DataOrderWrapperCell``) looks like a model whose
parameters sit in one child, so those two, and MindSpore's own micro-batch wrappers
(whose subclasses may be built differently), are a fast path by class. A cell whose
``construct`` calls its parameter-holding child in a loop on slices of its input but has
no slicer list is a micro-batch loop that cannot be read: refused, never taken for the
model (a loop feeding a layer its own output, ``x = self.layer(x)``, is a model's).
"""

from __future__ import annotations

import ast
import inspect
import logging
import textwrap
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from mf_celldump.errors import WrapperError

logger = logging.getLogger(__name__)

TRAINING = "training"  # optimizer, gradient operation or gradient reducer
FORWARDING = "forwarding"  # passes its inputs on (loss cell, argument order)
DATASET = "dataset"  # virtual dataset / data-sink source
ACCUMULATION = "gradient accumulation"
PIPELINE = "pipeline"
INTERLEAVE = "micro-batch interleave"
SEQUENCE = "sequence split"
UNMARKED = "micro-batches without schedule marks"
MICRO_BATCH_KINDS = (ACCUMULATION, PIPELINE, INTERLEAVE, UNMARKED)

# Fast path: (inner attribute, kind, attribute counting micro-batches) by class name, searched along the MRO.
KNOWN = {
    "WithLossCell": ("_backbone", FORWARDING, ""),
    "DataOrderWrapperCell": ("network", FORWARDING, ""),
    "PipelineCell": ("network", PIPELINE, "micro_size"),  # mindspore.nn; mindspore.parallel.nn.Pipeline derives
    "GradAccumulationCell": ("network", ACCUMULATION, "micro_size"),
    "GradAccumulation": ("network", ACCUMULATION, "micro_size"),
    "MicroBatchInterleaved": ("network", INTERLEAVE, "interleave_num"),
}
DATASET_PRIMITIVES = ("_VirtualDataset", "GetNext")


@dataclass(frozen=True)
class Layer:
    """One wrapper peeled off: the cell, where it sits (attribute path from the attached network, "" for the
    network itself), its class, what it does, and how many micro-batches it runs per call (1: none)."""

    cell: object
    where: str
    class_name: str
    kind: str
    count: int = 1

    @property
    def place(self) -> str:
        return f"at {self.where!r} of the attached network" if self.where else "as the attached network"

    def describe(self) -> str:
        return f"{self.class_name}({self.count})" if self.count > 1 else self.class_name


@dataclass(frozen=True)
class Peeled:
    """The wrappers found around the model, outermost first, and the model."""

    layers: Tuple[Layer, ...]
    model: object
    model_where: str


def peel(network) -> Peeled:
    """Every wrapper around the user model in ``network``; raises ``WrapperError`` for one it cannot read."""
    layers: List[Layer] = []
    cell, where, seen = network, "", {id(network)}
    while True:
        found = _read(cell, where)
        if found is None:
            return Peeled(tuple(layers), cell, where)
        layer, attr, inner = found
        if layer.kind == SEQUENCE:
            raise WrapperError(_sequence_refusal(layer))
        if id(inner) in seen:
            return Peeled(tuple(layers), cell, where)
        layers.append(layer)
        logger.debug("peeled %s %s: %s", layer.describe(), layer.place, layer.kind)
        seen.add(id(inner))
        cell, where = inner, f"{where}.{attr}" if where else attr


def is_wrapper(cell) -> bool:
    """True for a known wrapper class or a cell holding training machinery or a micro-batch slicer list (a
    wrapper nested inside a model is not captured). Cheap: it runs for every cell of the model."""
    return _known(cell, "") is not None or bool(_machinery(cell)) or bool(_slicer_lists(cell))


def _read(cell, where: str) -> Optional[Tuple[Layer, str, object]]:
    """(layer, inner attribute, inner cell) when ``cell`` is a wrapper; None when it is the model."""
    known = _known(cell, where)
    if known is not None:
        return known
    machinery = _machinery(cell)
    slicers = _slicer_lists(cell)
    if not machinery and not slicers:
        _refuse_unreadable_loop(cell, where)
        return None
    attr, inner = _holder(cell, where, machinery + [name for name, _ in slicers])
    if slicers:
        if len(slicers) > 1:
            raise WrapperError(f"{type(cell).__name__} {_place(where)} holds {len(slicers)} lists of micro-batch "
                               f"slicers ({', '.join(name for name, _ in slicers)}): which one feeds "
                               f"{attr} cannot be told; {_what_to_do()}")
        kind, count = _slicer_kind(cell, slicers[0][1]), len(slicers[0][1])
    else:
        kind, count = (DATASET if machinery == ["dataset"] else TRAINING), 1
    return Layer(cell, where, type(cell).__name__, kind, count), attr, inner


def _known(cell, where: str) -> Optional[Tuple[Layer, str, object]]:
    for klass in type(cell).__mro__:
        entry = KNOWN.get(klass.__name__)
        if entry is None:
            continue
        attr, kind, count_attr = entry
        inner = getattr(cell, attr, None)
        if inner is None:
            return None
        count = getattr(cell, count_attr, 1) if count_attr else 1
        count = count if isinstance(count, int) and count > 0 else 1
        return Layer(cell, where, type(cell).__name__, kind, count), attr, inner
    return None


def _machinery(cell) -> List[str]:
    """Names of the training / dataset machinery ``cell`` holds itself (children and attributes)."""
    from mindspore import nn
    from mindspore.ops.composite.base import GradOperation, _Grad

    found = []
    for name, child in cell.name_cells().items():
        if isinstance(child, nn.Optimizer) or type(child).__name__ in ("DistributedGradReducer",
                                                                       "PipelineGradReducer"):
            found.append(name)
    if any(isinstance(value, (GradOperation, _Grad)) for value in vars(cell).values()):
        found.append("gradient operation")
    if any(type(prim).__name__ in DATASET_PRIMITIVES for prim in _primitives(cell)):
        found.append("dataset")
    return found


def _primitives(cell) -> List[object]:
    """The primitives ``cell`` holds: registered ones and those kept in a list attribute (``add_list``)."""
    out = list(getattr(cell, "_primitives", {}).values())
    for value in vars(cell).values():
        if isinstance(value, (list, tuple)):
            out.extend(item for item in value if hasattr(item, "attrs") and hasattr(item, "name"))
    return [prim for prim in out if prim is not None]


def _is_slicer(cell) -> bool:
    """A parameter-free cell without children holding a ``StridedSlice``: what a micro-batch slicer is."""
    if cell.name_cells() or next(iter(cell.get_parameters()), None) is not None:
        return False
    return any(type(prim).__name__ == "StridedSlice" for prim in _primitives(cell))


def _slicer_lists(cell) -> List[Tuple[str, list]]:
    from mindspore import nn

    found = []
    for name, child in cell.name_cells().items():
        if isinstance(child, nn.CellList) and len(child) > 0 and all(_is_slicer(each) for each in child):
            found.append((name, list(child)))
    return found


def _marks(cells: Sequence[object]) -> set:
    """The attribute names of every primitive the cells hold: the marks MindSpore's passes read."""
    return {name for cell in cells for prim in _primitives(cell) for name in getattr(prim, "attrs", {})}


def _slicer_kind(cell, slicers: Sequence[object]) -> str:
    marks = _marks(slicers)
    if "seq_split_slice" in marks:
        return SEQUENCE
    if "interleave_num" in marks:
        return INTERLEAVE
    if "grad_accu_num" in marks:
        return ACCUMULATION
    ends = _marks([cell])
    if "pipeline_end" in ends:
        return PIPELINE
    if "forward_end" in ends:
        return ACCUMULATION
    return UNMARKED


def _place(where: str) -> str:
    return f"at {where!r} of the attached network" if where else "(the attached network)"


def _what_to_do() -> str:
    return ("mf_celldump must know what every cell between the training wrapper and the model does: use "
            "MindSpore's or MindFormers' wrappers, or build yours like them (the model one child holding every "
            "trained parameter; micro-batches cut by a CellList of slicer cells, one per micro-batch, each holding "
            "a StridedSlice)")


def _param_ids(cell) -> set:
    return {id(param) for param in cell.trainable_params()}


def _holder(cell, where: str, machinery: Sequence[str]) -> Tuple[str, object]:
    """The child of wrapper ``cell`` that holds every parameter it trains (the optimizer's parameters when it
    holds one, else those of all its non-machinery children)."""
    from mindspore import nn

    children = {name: child for name, child in cell.name_cells().items() if name not in machinery}
    optimizers = [child for child in cell.name_cells().values() if isinstance(child, nn.Optimizer)]
    if optimizers:
        target = {id(param) for opt in optimizers for param in getattr(opt, "parameters", ())}
    else:
        target = set().union(*(_param_ids(child) for child in children.values())) if children else set()
    held = {name: _param_ids(child) & target for name, child in children.items()}
    holders = [name for name, ids in held.items() if target and ids == target]
    if len(holders) > 1:  # a list that also holds the model: the model itself is the holder
        holders = [name for name in holders if not isinstance(children[name], nn.CellList)]
    if len(holders) == 1:
        return holders[0], children[holders[0]]
    spread = ", ".join(f"{name}: {len(ids)}" for name, ids in held.items() if ids) or "none"
    raise WrapperError(f"{type(cell).__name__} {_place(where)} is a training wrapper ({', '.join(machinery)}) but no "
                       f"single child holds the {len(target)} parameters it trains (held by child: {spread}), so the "
                       f"model inside it cannot be found; {_what_to_do()}")


def _single_holder(cell) -> Optional[str]:
    """The name of the only child of ``cell`` that holds trainable parameters, when ``cell`` holds none itself."""
    holders = [name for name, child in cell.name_cells().items() if _param_ids(child)]
    if len(holders) != 1:
        return None
    return holders[0] if _param_ids(cell) == _param_ids(cell.name_cells()[holders[0]]) else None


def _slices_input(argument: ast.AST, loop_names: set) -> bool:
    """True when ``argument`` takes a slice (``x[a:b]``) or an item picked by the loop (``parts[i]``)."""
    for node in ast.walk(argument):
        if not isinstance(node, ast.Subscript):
            continue
        if isinstance(node.slice, ast.Slice):
            return True
        if any(isinstance(name, ast.Name) and name.id in loop_names for name in ast.walk(node.slice)):
            return True
    return False


def _slices_in_loop(construct, attr: str) -> bool:
    """True when ``construct``'s source calls ``self.<attr>(...)`` inside a ``for`` or ``while`` loop on a slice of
    something (a micro-batch loop); a call on the loop's own result (``x = self.layer(x)``) is a model's loop."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(construct)))
    except (OSError, TypeError, SyntaxError):
        return False
    for loop in ast.walk(tree):
        if not isinstance(loop, (ast.For, ast.While)):
            continue
        loop_names = {node.id for node in ast.walk(loop.target)
                      if isinstance(node, ast.Name)} if isinstance(loop, ast.For) else set()
        for node in ast.walk(loop):
            func = getattr(node, "func", None) if isinstance(node, ast.Call) else None
            if (isinstance(func, ast.Attribute) and func.attr == attr and isinstance(func.value, ast.Name)
                    and func.value.id == "self"
                    and any(_slices_input(arg, loop_names) for arg in list(node.args) + list(node.keywords))):
                return True
    return False


def _refuse_unreadable_loop(cell, where: str) -> None:
    """A machinery-free cell that runs the one child holding its parameters in a loop on slices of its input cuts
    micro-batches (or sequence chunks) in a way that cannot be read: refused rather than taken for the model."""
    attr = _single_holder(cell)
    if attr is None or not _slices_in_loop(getattr(cell, "construct", None), attr):
        return
    raise WrapperError(f"{type(cell).__name__} {_place(where)} calls {attr} ({type(getattr(cell, attr)).__name__}, "
                       "which holds all its parameters) in a loop on slices of its input, without a micro-batch "
                       "slicer list: it runs the model several times per step in a way mf_celldump cannot read (how "
                       "many times, on which "
                       f"part of the batch), so calls and gradients could not be paired; {_what_to_do()}")


def _sequence_refusal(layer: Layer) -> str:
    return (f"{layer.class_name} {layer.place} runs the model on {layer.count} chunks of the sequence axis "
            "(MindFormers' seq_split_num, SequenceSplit): every cell would be recorded once per chunk, with a part of "
            "the sequence, while a Megatron / msprobe dump holds the whole sequence of each micro-batch. The chunks "
            "cannot be joined into that: a later chunk's attention reads the earlier chunks' keys and values from a "
            "cache, so its gradients are not the rows of the whole sequence's. Set parallel_config.seq_split_num: 1 "
            "for the captured run")
