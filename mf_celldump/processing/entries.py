"""From captures to msprobe entries: call numbering, grouping, execution order, parents.

Everything here is sorting and dictionary work, O(n log n) in the number of captures.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from mf_celldump.layout import naming
from mf_celldump.rawformat.keys import (
    KIND_NONE,
    KIND_TENSOR,
    SLOT_ARG,
    SLOT_KWARG,
    SLOT_WEIGHT,
    SLOT_WEIGHT_GRAD,
    Capture,
)
from mf_celldump.rawformat.manifest import CellRecord

ShapeOf = Callable[[Capture], Optional[Tuple[int, ...]]]  # a capture's shape, None when unreadable


@dataclass
class Entry:
    """One call of one cell in one direction: ``Cell.{name}.{Class}.{direction}.{call}``."""

    cell: CellRecord
    direction: str  # forward, backward, or naming.PARAMETERS_GRAD
    call: int
    name: str
    first: Tuple[int, int]
    captures: List[Capture] = field(default_factory=list)
    parent: Optional[str] = None
    weights_only: bool = False  # so far only weights (read at step start) or gradient gaps: they do not place it

    @property
    def is_parameters_grad(self) -> bool:
        return self.direction == naming.PARAMETERS_GRAD


def is_gradient_gap(capture: Capture) -> bool:
    """A backward input slot whose gradient cannot exist (an explicit null, docs/raw-format.md).

    Written when the forward call runs, so, like a weight, it does not place its entry, and
    an entry holding nothing else (the call had no backward) is dropped.
    """
    key = capture.key
    return key.direction == naming.BACKWARD and key.kind == KIND_NONE and key.slot in (SLOT_ARG, SLOT_KWARG)


def _entry_kind(capture: Capture) -> str:
    return naming.PARAMETERS_GRAD if capture.key.slot == SLOT_WEIGHT_GRAD else capture.key.direction


def _entry_name(cell: CellRecord, kind: str, call: int) -> str:
    if kind == naming.PARAMETERS_GRAD:
        return naming.parameters_grad_entry_name(cell.name, cell.class_name, call)
    return naming.entry_name(cell.name, cell.class_name, kind, call)


def assign_calls(captures: List[Capture], shape_of: Optional[ShapeOf] = None, micro_batches: int = 1) -> None:
    """Number calls where the raw name says ``nx`` (docs/raw-format.md, "Call index inference").

    Per probe (cell, direction, slot, path): forward, the k-th occurrence in execution
    order is call k; backward, the k-th counted from the end is call k, so that
    ``backward.n`` pairs with ``forward.n`` when gradients flow in reverse order. Where the
    forward calls' shapes differ and ``shape_of`` can read them, a gradient goes to the
    call whose value has its shape instead (a cell applied to independent tensors, whose
    gradients are not scheduled in reverse order). With ``micro_batches`` > 1 (the manifest's:
    MindSpore runs the micro-batches' backward in micro-batch order) a probe's calls split into
    that many equal runs: the k-th run of backward occurrences in execution order belongs to
    micro-batch k, whose forward calls are the k-th run of forward calls, and the rules above
    apply inside it. A weight gradient (slot ``g``) counts in order, as msprobe numbers
    ``parameters_grad``.
    """
    unknown: Dict[tuple, List[Capture]] = {}
    for capture in captures:
        if capture.key.call is None:
            unknown.setdefault(capture.probe + (is_gradient_gap(capture),), []).append(capture)
        else:
            capture.call = capture.key.call
    # A gradient gap is written when its call runs forward: counted in order, like forward captures.
    in_reverse = {probe for probe in unknown
                  if probe[1] == naming.BACKWARD and probe[2] != SLOT_WEIGHT_GRAD and not probe[4]}
    for probe, group in unknown.items():
        if probe not in in_reverse:
            group.sort(key=lambda c: c.sort_key)
            for call, capture in enumerate(group):
                capture.call = call
    forward = _forward_values(captures) if shape_of is not None else None
    for probe in in_reverse:
        group = sorted(unknown[probe], key=lambda c: c.sort_key)
        runs = micro_batches if micro_batches > 1 and len(group) % micro_batches == 0 else 1
        size = len(group) // runs
        calls = (forward.get(_forward_probe(probe, forward)) or []) if forward is not None else []
        if len(calls) != len(group):
            calls = []  # shapes pair only calls that all had a backward
        for run in range(runs):
            ordered = group[run * size:(run + 1) * size][::-1]
            if calls and len(ordered) > 1:
                ordered = _paired_by_shape(ordered, calls[run * size:(run + 1) * size], shape_of)
            for offset, capture in enumerate(ordered):
                capture.call = run * size + offset


def _forward_values(captures: List[Capture]) -> Dict[tuple, List[Capture]]:
    """(cell, slot, path) -> that forward probe's captures by call; also (cell, "ranks") -> the paths of
    the cell's top-level tensor arguments in order (a backward input path is a rank among them)."""
    forward: Dict[tuple, List[Capture]] = {}
    for capture in captures:
        if capture.key.direction == naming.FORWARD and capture.key.kind == KIND_TENSOR:
            forward.setdefault((capture.key.cell_id, capture.key.slot, capture.key.path), []).append(capture)
    ranks: Dict[int, set] = {}
    for (cell_id, slot, path), group in forward.items():
        group.sort(key=lambda c: c.call)
        if slot == SLOT_ARG and len(path) == 1:
            ranks.setdefault(cell_id, set()).add(path)
    for cell_id, paths in ranks.items():
        forward[(cell_id, "ranks")] = sorted(paths)
    return forward


def _forward_probe(probe: tuple, forward: Dict[tuple, list]) -> Optional[tuple]:
    """The forward probe whose value a backward probe is the gradient of."""
    cell_id, _, slot, path = probe[:4]
    if slot != SLOT_ARG:
        return (cell_id, slot, path)
    paths = forward.get((cell_id, "ranks")) or []
    if len(path) != 1 or not 0 <= path[0] < len(paths):
        return None
    return (cell_id, slot, paths[path[0]])


def _paired_by_shape(backward: List[Capture], forward: List[Capture], shape_of: ShapeOf) -> List[Capture]:
    """``backward`` reordered so that the k-th holds a gradient of forward call k's shape; the
    reverse-order guess is kept among equal shapes, and whole when shapes cannot tell calls apart."""
    forward_shapes = [shape_of(c) for c in forward]
    if None in forward_shapes or len(set(forward_shapes)) == 1:
        return backward
    by_call: List[Optional[Capture]] = [None] * len(forward)
    free = list(range(len(forward)))
    for capture in backward:
        shape = shape_of(capture)
        call = next((k for k in free if shape is not None and forward_shapes[k] == shape), None)
        if call is None:
            return backward
        free.remove(call)
        by_call[call] = capture
    return by_call


def group_entries(captures: List[Capture], cells: Dict[int, CellRecord], problems: List[str]) -> List[Entry]:
    """Entries in execution order (order of their first capture); unknown cells are problems."""
    entries: Dict[Tuple[int, str, int], Entry] = {}
    unknown_cells: Dict[int, int] = {}
    for capture in captures:
        cell = cells.get(capture.key.cell_id)
        if cell is None:
            unknown_cells[capture.key.cell_id] = unknown_cells.get(capture.key.cell_id, 0) + 1
            continue
        kind = _entry_kind(capture)
        ident = (cell.cell_id, kind, capture.call)
        weight = capture.key.slot == SLOT_WEIGHT or is_gradient_gap(capture)
        entry = entries.get(ident)
        if entry is None:
            entry = entries[ident] = Entry(cell, kind, capture.call, _entry_name(cell, kind, capture.call),
                                           capture.sort_key, weights_only=weight)
        elif not weight and (entry.weights_only or capture.sort_key < entry.first):
            entry.first, entry.weights_only = capture.sort_key, False
        entry.captures.append(capture)
    for cell_id, count in sorted(unknown_cells.items()):
        problems.append(
            f"{count} capture(s) of cell id {cell_id}, which manifest.json does not list; skipped"
        )
    ordered = sorted(_called_cells_only(entries.values()), key=lambda e: (e.first, e.name))
    _weights_for_every_call(ordered)
    for entry in ordered:
        entry.captures.sort(key=lambda c: c.sort_key)
    return ordered


def _weights_for_every_call(entries: List[Entry]) -> None:
    """Weights are read once per step (call 0); msprobe records them at every forward call,
    each under its own entry's file names, so later calls get copies of call 0's captures."""
    first: Dict[int, List[Capture]] = {}
    for entry in entries:
        if entry.direction != naming.FORWARD:
            continue
        weights = [c for c in entry.captures if c.key.slot == SLOT_WEIGHT]
        if weights:
            first.setdefault(entry.cell.cell_id, weights)
        elif entry.cell.cell_id in first:
            for capture in first[entry.cell.cell_id]:
                copy = capture.copy()
                copy.call = entry.call
                entry.captures.append(copy)


def _called_cells_only(entries) -> List[Entry]:
    """Without the weights and weight gradients of cells that did not run in the step (msprobe
    records them at the cell's call): a forward entry holding only weights, and the
    ``parameters_grad`` entries of a cell with no other entry."""
    entries = [e for e in entries if not e.weights_only]
    ran = {e.cell.cell_id for e in entries if not e.is_parameters_grad}
    return [e for e in entries if not e.is_parameters_grad or e.cell.cell_id in ran]


def ancestor_names(name: str):
    """``a.b.c`` -> ``a.b``, ``a``, then the root cell's empty name."""
    parts = name.split(".") if name else []
    for i in range(len(parts) - 1, -1, -1):
        yield ".".join(parts[:i])


def link_parents(entries: List[Entry], of: Optional[List[Entry]] = None) -> None:
    """Set the parent of each entry of ``of`` (default: of ``entries``): the nearest captured ancestor
    cell's call in the same direction, among ``entries`` (execution order; ``of`` among them).

    Walking up the dotted name skips names that are not captured cells, which covers a
    CellList/SequentialCell member (``model.layers.3`` -> ``model``). Forward, the ancestor's
    call chosen is the last whose first capture precedes the child's first capture. Backward
    mirrors the forward tree: ``child.backward.k`` goes under the backward of the call that
    holds ``child.forward.k``, because graph mode may record a parent's gradient after its
    child's (capture ops with no consumer are scheduled freely); by order only where the
    forward call is missing.
    """
    calls: Dict[Tuple[str, str], List[Entry]] = {}
    for entry in entries:  # already in execution order
        if not entry.is_parameters_grad:  # not in msprobe's construct.json, no parent
            calls.setdefault((entry.direction, entry.cell.name), []).append(entry)
    by_order = _parent_by_order(calls)
    forward_parent = {(e.cell.cell_id, e.call): by_order(e) for e in entries if e.direction == naming.FORWARD}
    backward_names = {(e.cell.name, e.call): e.name for e in entries if e.direction == naming.BACKWARD}
    forward_entries = {e.name: e for e in entries if e.direction == naming.FORWARD}
    for entry in entries if of is None else of:
        if entry.is_parameters_grad:
            continue
        if entry.direction == naming.FORWARD:
            entry.parent = forward_parent[(entry.cell.cell_id, entry.call)]
            continue
        mirrored = forward_entries.get(forward_parent.get((entry.cell.cell_id, entry.call)) or "")
        if mirrored is not None and (mirrored.cell.name, mirrored.call) in backward_names:
            entry.parent = backward_names[(mirrored.cell.name, mirrored.call)]
        else:
            entry.parent = by_order(entry)


def _parent_by_order(calls: Dict[Tuple[str, str], List[Entry]]) -> Callable[[Entry], Optional[str]]:
    """``parent(entry)``: the last call of the nearest captured ancestor (same direction) whose
    first capture precedes the entry's first capture."""
    starts = {key: [e.first for e in group] for key, group in calls.items()}
    parent_cell: Dict[Tuple[str, str], Optional[str]] = {}

    def parent(entry: Entry) -> Optional[str]:
        lookup = (entry.direction, entry.cell.name)
        if lookup not in parent_cell:
            parent_cell[lookup] = next((candidate for candidate in ancestor_names(entry.cell.name)
                                        if (entry.direction, candidate) in calls), None) if entry.cell.name else None
        ancestor = parent_cell[lookup]
        if ancestor is None:
            return None
        key = (entry.direction, ancestor)
        index = bisect.bisect_left(starts[key], entry.first) - 1
        return calls[key][max(index, 0)].name

    return parent


# Calls a cell may have made in a step without leaving a capture (a call number past the
# calls present by more than this is not a count of calls).
MAX_CALL_GAP = 1024


def implausible_calls(entries: List[Entry]) -> List[str]:
    """Warnings for entries whose call number lies far past the calls of their cell in the step.

    Capture numbers a cell's calls 0, 1, 2, ... in each step, so a raw name saying call
    999999999 beside a handful of calls is forged or corrupt; the entry is kept under that
    number (it is what the raw data says), and said.
    """
    calls: Dict[Tuple[int, str], int] = {}
    for entry in entries:
        key = (entry.cell.cell_id, entry.direction)
        calls[key] = calls.get(key, 0) + 1
    out = []
    for entry in entries:
        count = calls[(entry.cell.cell_id, entry.direction)]
        if entry.call > count + MAX_CALL_GAP:
            out.append(f"{entry.name}: call number {entry.call}, but the step holds {count} call(s) of this cell "
                       "in this direction; a capture numbers calls 0, 1, 2, ... (forged or corrupt raw name?); kept "
                       "under that number")
    return out
