"""The three msprobe JSON files of one output rank folder (dump, construct, stack), built from entries.

``dump.json`` is streamed one entry per line with the C JSON encoder: it stays fast for
100k tensors, and NaN/Infinity are written as Python's json (and msprobe, which loads
with it) read them back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from mf_celldump.dtypes import mindspore_dtype_name
from mf_celldump.layout import naming
from mf_celldump.processing.entries import Entry
from mf_celldump.rawformat.keys import (
    KIND_NONE,
    KIND_TENSOR,
    KIND_TYPE_NAMES,
    SLOT_KWARG,
    SLOT_WEIGHT,
    SLOT_WEIGHT_GRAD,
    WEIGHT_SLOTS,
    Capture,
)
from mf_celldump.rawformat.manifest import CellRecord

TENSOR_TYPE = "mindspore.Tensor"
# A position nobody captured (an argument capture could not represent): msprobe reads null as
# "no data" and keeps the numbering of the following arguments.
GAP = None
# A None argument is a bare null, as msprobe 26.2 writes it. A {"type": "None"} object is
# read by msprobe graph_visualize as a value it cannot pair with msprobe's own null (or with
# an argument msprobe did not record) and paints the whole node as an error.
NONE_VALUE = None


def label_of(capture: Capture, params: Tuple[str, ...]) -> str:
    """Index label of a capture in its data file name: ``1.0``, or ``mask`` for a keyword input."""
    key = capture.key
    if key.slot == SLOT_KWARG:
        return naming.arg_label(key.path, kwarg_name(key.path[0], params))
    return naming.arg_label(key.path)


def kwarg_name(index: int, params: Tuple[str, ...]) -> str:
    return params[index] if 0 <= index < len(params) else f"kwarg{index}"


def weight_name(index: int, cell: CellRecord) -> str:
    """msprobe's name of the cell's weight ``index`` (the last part of the parameter's name)."""
    return cell.weights[index] if 0 <= index < len(cell.weights) else f"weight{index}"


def io_label_of(capture: Capture, cell: CellRecord) -> Tuple[str, str]:
    """(io, label) naming a capture in its entry: ``input``/``output`` and an index label, or
    ``parameters``/``parameters_grad`` and the weight's name."""
    slot = capture.key.slot
    if slot == SLOT_WEIGHT:
        return naming.PARAMETERS, weight_name(capture.key.path[0], cell)
    if slot == SLOT_WEIGHT_GRAD:
        return naming.PARAMETERS_GRAD, weight_name(capture.key.path[0], cell)
    return capture.key.msprobe_io, label_of(capture, cell.params)


def data_name_of(entry: str, io: str, label: str) -> str:
    if io == naming.PARAMETERS_GRAD:
        return naming.parameters_grad_data_name(entry, label)
    return naming.data_name(entry, io, label)


def record_of(capture: Capture, data_name: Optional[str]) -> Optional[dict]:
    """The dump.json leaf for one capture (None when its file could not be read)."""
    kind = capture.key.kind
    if kind == KIND_NONE:
        return NONE_VALUE
    if kind != KIND_TENSOR:
        return {"type": KIND_TYPE_NAMES[kind], "value": capture.value}
    if capture.shape is None:
        return None
    dtype = capture.dtype or mindspore_dtype_name(capture.file_dtype or "")
    record = {"type": TENSOR_TYPE, "dtype": dtype, "shape": list(capture.shape)}
    record.update(capture.stats or {})
    if data_name is not None:
        record["data_name"] = data_name
    return record


# Positions left empty (null) in one argument list: a few are normal (an argument nobody
# captured), millions would come only from a corrupt index path and would cost memory.
MAX_GAPS = 1024


def index_gap_problem(captures: Iterable[Capture]) -> Optional[str]:
    """Why the index paths of one entry's captures cannot be nested (None if fine): one position both a
    tensor and a list (``p0`` beside ``p0.0``: nesting would drop the tensor from dump.json), or too many
    empty positions."""
    children: Dict[tuple, set] = {}
    leaves: Dict[tuple, Capture] = {}
    for capture in captures:
        key = capture.key
        if key.slot in WEIGHT_SLOTS or (key.slot == SLOT_KWARG and key.msprobe_io == "output"):
            continue  # named, not indexed; or appended after the outputs, never nested
        group, path = (key.msprobe_io, "kw", key.path[0]), key.path[1:]
        if key.slot != SLOT_KWARG:
            group, path = (key.msprobe_io,), key.path
        leaves.setdefault(group + path, capture)
        for depth, index in enumerate(path):
            children.setdefault(group + path[:depth], set()).add(index)
    for where, capture in leaves.items():
        if where in children:
            inner = next(c for w, c in leaves.items() if w[:len(where)] == where and len(w) > len(where))
            return (f"{'.'.join(str(p) for p in where)} is both a tensor ({_origin(capture)}) and a list "
                    f"({_origin(inner)}); one of the two names is wrong")
    for where, seen in children.items():
        if max(seen) + 1 - len(seen) > MAX_GAPS:
            return (f"index {max(seen)} under {'.'.join(str(p) for p in where)} would leave "
                    f"{max(seen) + 1 - len(seen)} empty positions (more than {MAX_GAPS}); corrupt index path?")
    return None


def _origin(capture: Capture) -> str:
    return capture.file or f"{capture.origin} seq {capture.seq}"


def _nest(pairs: List[Tuple[Tuple[int, ...], object]]) -> list:
    """Build nested lists from (index path, leaf) pairs; numeric order, gaps kept as GAP."""
    heads: Dict[int, List[Tuple[Tuple[int, ...], object]]] = {}
    for path, leaf in pairs:
        heads.setdefault(path[0], []).append((path[1:], leaf))
    out = []
    for index in range(max(heads) + 1):
        group = heads.get(index)
        if group is None:
            out.append(GAP)
            continue
        nested = [(rest, leaf) for rest, leaf in group if rest]
        if nested:
            out.append(_nest(nested))
        else:
            out.append(group[0][1])
    return out


def weights_body(entry: Entry, leaves: Dict[int, object]) -> Dict[str, object]:
    """``{weight name: leaf}`` of the weight captures of one entry, in the cell's order."""
    found = sorted((c.key.path[0], weight_name(c.key.path[0], entry.cell), leaves[id(c)])
                   for c in entry.captures if c.key.slot == SLOT_WEIGHT and id(c) in leaves)
    return {name: leaf for _, name, leaf in found}


def parameters_grad_body(entry: Entry, leaves: Dict[int, object]) -> dict:
    """A ``parameters_grad`` entry: ``{weight name: [leaf]}``, as msprobe 26.2 writes it.

    Last declared weight first: msprobe lists the weights in the order their gradient hooks
    fire, the reverse of their use in a cell that uses them as it declares them (Dense:
    ``bias`` before ``weight``), and ``graph_visualize`` pairs a node's values by position.
    """
    found = sorted(((c.key.path[0], weight_name(c.key.path[0], entry.cell), leaves[id(c)])
                    for c in entry.captures if id(c) in leaves), key=lambda item: item[0], reverse=True)
    return {name: [leaf] for _, name, leaf in found}


def entry_body(entry: Entry, leaves: Dict[int, object]) -> dict:
    """``input_args``/``input_kwargs``/``output`` of one entry; ``leaves`` maps id(capture) -> leaf."""
    params = entry.cell.params
    args: List[Tuple[Tuple[int, ...], object]] = []
    kwargs: Dict[str, List[Tuple[Tuple[int, ...], object]]] = {}
    outputs: List[Tuple[Tuple[int, ...], object]] = []
    backward_kwargs: List[Tuple[Tuple[int, ...], object]] = []
    for capture in entry.captures:
        if id(capture) not in leaves:  # not kept (a duplicate capture)
            continue
        leaf = leaves[id(capture)]
        key = capture.key
        io = key.msprobe_io
        if key.slot in WEIGHT_SLOTS:
            continue  # weights_body / parameters_grad_body
        if key.slot == SLOT_KWARG and io == "input":
            kwargs.setdefault(kwarg_name(key.path[0], params), []).append((key.path[1:], leaf))
        elif key.slot == SLOT_KWARG:
            backward_kwargs.append((key.path, leaf))
        elif io == "input":
            args.append((key.path, leaf))
        else:
            outputs.append((key.path, leaf))
    body: dict = {"input_args": _nest(args) if args else [], "input_kwargs": {}, "output": []}
    for name in sorted(kwargs, key=lambda n: params.index(n) if n in params else len(params)):
        pairs = kwargs[name]
        body["input_kwargs"][name] = (
            pairs[0][1] if len(pairs) == 1 and not pairs[0][0] else _nest([p for p in pairs if p[0]])
        )
    output = _nest(outputs) if outputs else []
    for _, leaf in sorted(backward_kwargs, key=lambda p: p[0]):
        output.append(leaf)
    body["output"] = output
    return body


def encoded(body: dict) -> str:
    """An entry's body as dump.json holds it (the C encoder: fast for 100k entries; NaN as Python's json reads it)."""
    return json.dumps(body)


# In an encoded body: a JSON string (skipped whole, so nothing inside a name counts), a null, or the
# value of a "type" key (json.dumps writes ": " after a key).
_LEAF_TOKENS = re.compile(r'"type": "((?:[^"\\]|\\.)*)"|"(?:[^"\\]|\\.)*"|\bnull\b')


@dataclass
class LeafCounts:
    """The leaves dump.json holds, counted as the file is written: tensors, and every other leaf (a number,
    a bool, None, or null where nothing was captured). The per-step log line and any reader that walks
    dump.json's leaves (tensor objects against everything else) get the same two numbers."""

    tensors: int = 0
    values: int = 0

    def add(self, body: str) -> None:
        for match in _LEAF_TOKENS.finditer(body):
            kind = match.group(1)
            if kind is not None:
                if kind == TENSOR_TYPE:
                    self.tensors += 1
                else:
                    self.values += 1
            elif match.group(0) == "null":
                self.values += 1


def dump_json_encoded(task: str, data_dir: Optional[str], bodies: Iterable[Tuple[str, str]],
                      run_id: str = "", counts: Optional[LeafCounts] = None,
                      extra_head: Optional[Dict[str, dict]] = None) -> Iterable[str]:
    """dump.json as text chunks, one entry per line, from (name, ``encoded`` body); ``run_id`` names the run
    in the head (before ``data``); ``extra_head``: our keys of the head that capture knew, e.g. the parallel
    layout (``naming.PARALLEL_KEY``) and where weight gradients were read (``naming.PARAMETERS_GRAD_KEY``),
    each written when it is a non-empty mapping; ``counts``, when given, counts the leaves as written."""
    head = {"task": task, "level": "L0", "framework": "mindspore", "dump_data_dir": data_dir}
    if run_id:
        head[naming.RUN_ID_KEY] = run_id
    for key, value in (extra_head or {}).items():
        if isinstance(value, dict) and value:
            head[key] = value
    yield "{\n"
    for key, value in head.items():
        yield f" {json.dumps(key)}: {json.dumps(value)},\n"
    yield ' "data": {'
    first = True
    for name, body in bodies:
        if counts is not None:
            counts.add(body)
        yield ("\n  " if first else ",\n  ") + json.dumps(name) + ": " + body
        first = False
    yield "\n }\n}\n"


def entry_json(entry: Entry, data_dir: Optional[str], failed: Dict[int, int], parameters: bool = False) -> dict:
    """The ``dump.json`` body of one entry. ``data_dir``: as in ``output_texts``; captures in ``failed`` (by
    id) get no ``data_name``; ``parameters``: a forward entry gets msprobe's ``parameters`` field (``{}`` for
    a cell without weights)."""
    leaves = {}
    for capture in entry.captures:
        if capture.data_name is None:
            continue
        has_file = data_dir is not None and capture.file is not None and id(capture) not in failed
        leaves[id(capture)] = record_of(capture, capture.data_name if has_file else None)
    if entry.is_parameters_grad:
        return parameters_grad_body(entry, leaves)
    body = entry_body(entry, leaves)
    if parameters and entry.direction == naming.FORWARD:
        body[naming.PARAMETERS] = weights_body(entry, leaves)
    return body


Node = Tuple[str, CellRecord, Optional[str]]  # an entry of construct.json and stack.json: name, cell, parent


def output_texts(task: str, data_dir: Optional[str], run_id: str, bodies: Iterable[Tuple[str, str]],
                 nodes: Callable[[], Iterable[Node]], counts: Optional[LeafCounts] = None,
                 extra_head: Optional[Dict[str, dict]] = None) -> Iterator[Tuple[str, Iterable[str]]]:
    """(file name, text chunks) of the three files, lazy: the caller streams one after the other.

    ``data_dir`` is the final ``dump_tensor_data`` folder (tensor task) or None; ``run_id``:
    the capture's run, recorded in dump.json's head. ``bodies``: (name, ``encoded`` body) of
    every entry in execution order; ``nodes``: a callable giving (name, cell, parent) of those
    that are nodes (not ``parameters_grad``: msprobe places them by name), twice; ``counts``: see
    :class:`LeafCounts`; ``extra_head``: see :func:`dump_json_encoded`.
    """
    yield naming.DUMP_JSON, dump_json_encoded(task, data_dir, bodies, run_id, counts, extra_head)
    yield naming.CONSTRUCT_JSON, one_per_line((name, parent) for name, _, parent in nodes())
    yield naming.STACK_JSON, one_per_line((name, stack_lines(cell)) for name, cell, _ in nodes())


def stack_lines(cell: CellRecord) -> List[str]:
    if not cell.file:
        return [f"{cell.module}.{cell.class_name}"] if cell.module else []
    line = cell.line if cell.line is not None else 0
    where = f"{cell.module}.{cell.class_name}" if cell.module else cell.class_name
    return [f"File {cell.file}, line {line}, in {where}"]


def one_per_line(items: Iterable[Tuple[str, object]]) -> Iterator[str]:
    """A JSON object with one ``key: value`` per line, as text chunks."""
    first = True
    for key, value in items:
        yield ("{\n " if first else ",\n ") + f"{json.dumps(key)}: {json.dumps(value)}"
        first = False
    yield "{}\n" if first else "\n}\n"
