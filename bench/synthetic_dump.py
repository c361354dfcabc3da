"""Synthetic raw dumps for the benchmarks, written by mf_celldump's own raw writer.

A LLaMA-like cell tree (the names, nesting and execution order of a decoder stack:
``model``, ``tok_embeddings``, ``layers.N`` with ``attention_norm``,
``attention.{wq,wk,wv,wo}``, ``ffn_norm``, ``feed_forward.{w1,w3,w2}``, then ``norm_out``)
and its steps' values, one input and one output per cell and call, forward then backward,
written through ``mf_celldump.rawformat.writer.RawWriter``: the very files (names, headers,
records, markers) a capture writes. Call numbers are left to processing (``nx``, as graph
mode writes them) unless ``explicit_calls``.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from mf_celldump.dtypes import mindspore_dtype_name
from mf_celldump.rawformat.keys import BACKWARD, FORWARD, KIND_TENSOR, SLOT_ARG, SLOT_OUTPUT, ProbeKey
from mf_celldump.rawformat.manifest import CellRecord, Manifest
from mf_celldump.rawformat.writer import RawWriter
from mf_celldump.statistics import DEFAULT_STATISTICS, compute_statistics

# (cell id, direction, slot, call): one value of a step, in execution order
Value = Tuple[int, str, str, int]


@dataclass
class CellTree:
    """Cells (manifest records) and, per cell id, its children in call order."""

    cells: List[CellRecord] = field(default_factory=list)
    children: Dict[int, List[int]] = field(default_factory=dict)

    def add(self, name: str, cls: str, parent: Optional[int], params: Sequence[str] = ("x",)) -> int:
        cell_id = len(self.cells)
        self.cells.append(CellRecord(cell_id, name, cls, "synthetic_model", "/src/synthetic_model.py", 10,
                                     tuple(params)))
        self.children[cell_id] = []
        if parent is not None:
            self.children[parent].append(cell_id)
        return cell_id


def llama_tree(layers: int) -> CellTree:
    """The cell tree of a LLaMA-like decoder stack of ``layers`` layers (12 cells per layer, 3 more)."""
    tree = CellTree()
    root = tree.add("model", "LlamaModel", None, ("input_ids",))
    tree.add("model.tok_embeddings", "LlamaEmbedding", root, ("input_ids",))
    for i in range(layers):
        layer = tree.add(f"model.layers.{i}", "LLamaDecodeLayer", root, ("x", "freqs_cis", "mask"))
        tree.add(f"model.layers.{i}.attention_norm", "LlamaRMSNorm", layer)
        attention = tree.add(f"model.layers.{i}.attention", "LLamaAttention", layer, ("x", "freqs_cis", "mask"))
        for proj in ("wq", "wk", "wv", "wo"):
            tree.add(f"model.layers.{i}.attention.{proj}", "Linear", attention)
        tree.add(f"model.layers.{i}.ffn_norm", "LlamaRMSNorm", layer)
        ffn = tree.add(f"model.layers.{i}.feed_forward", "LlamaFeedForward", layer)
        for proj in ("w1", "w3", "w2"):
            tree.add(f"model.layers.{i}.feed_forward.{proj}", "Linear", ffn)
    tree.add("model.norm_out", "LlamaRMSNorm", root)
    return tree


def flat_tree(cells: int) -> CellTree:
    """``cells`` sibling cells (one value each in ``flat_order``): few large tensors."""
    tree = CellTree()
    for i in range(cells):
        tree.add(f"model.layers.{i}", "LLamaDecodeLayer", None)
    return tree


def call_order(tree: CellTree, calls: int = 1, backward: bool = True) -> Iterator[Value]:
    """The values of ``calls`` passes through the tree from its first cell, in execution order: per cell
    call its input, its children, its output; then the backward passes in reverse."""
    counts: Dict[Tuple[int, str], int] = {}

    def run(cell: int, direction: str) -> Iterator[Value]:
        call = counts[(cell, direction)] = counts.get((cell, direction), -1) + 1
        first, last = (SLOT_ARG, SLOT_OUTPUT) if direction == FORWARD else (SLOT_OUTPUT, SLOT_ARG)
        yield cell, direction, first, call
        children = tree.children[cell] if direction == FORWARD else reversed(tree.children[cell])
        for child in children:
            yield from run(child, direction)
        yield cell, direction, last, call

    for _ in range(calls):
        yield from run(0, FORWARD)
    for _ in range(calls if backward else 0):
        yield from run(0, BACKWARD)


def flat_order(tree: CellTree) -> Iterator[Value]:
    return ((cell.cell_id, FORWARD, SLOT_ARG, 0) for cell in tree.cells)


class SyntheticDump:
    """One rank of a raw dump at ``dump_path``, written by the package's ``RawWriter``."""

    def __init__(self, dump_path: str, tree: CellTree, task: str = "tensor",
                 statistics: Sequence[str] = DEFAULT_STATISTICS):
        self.tree = tree
        self.task = task
        self.statistics = tuple(statistics)
        self.writer = RawWriter(dump_path, 0, "bench")
        self.writer.write_manifest(Manifest(rank=0, distributed=False, task=task,
                                            cells={c.cell_id: c for c in tree.cells}, statistics=self.statistics,
                                            backend="host"))
        self._seq = itertools.count()

    @property
    def rank_dir(self) -> str:
        return self.writer.rank_dir

    def step_dir(self, step: int) -> str:
        return self.writer.step_dir(step)

    def write_step(self, step: int, values: Iterable[Value], make_array: Callable[[Value], np.ndarray],
                   explicit_calls: bool = False) -> int:
        """Write ``values`` as the raw data of ``step`` (tensor files, or statistics records) and mark the step
        complete; returns when everything is on disk. Returns the number of values."""
        self.writer.prepare_step(step)
        count = 0
        for value in values:
            cell, direction, slot, call = value
            key = ProbeKey(cell, direction, slot, KIND_TENSOR, (0,), call if explicit_calls else None)
            array = make_array(value)
            if self.task == "tensor":
                self.writer.write_tensor(step, key, array, array.dtype.name, next(self._seq))
            else:
                self.writer.append_record(step, key, next(self._seq), dtype=mindspore_dtype_name(array.dtype.name),
                                          shape=list(array.shape), stats=compute_statistics(array, self.statistics))
            count += 1
        self.writer.complete_step(step)
        self.writer.flush()
        return count

    def remove_step(self, step: int) -> None:
        import shutil

        shutil.rmtree(self.writer.step_dir(step))

    def close(self) -> None:
        self.writer.close()


def records_path(dump_path: str, step: int = 0) -> str:
    """The records file of ``step`` of rank 0 (statistics task)."""
    from mf_celldump.rawformat import names

    return os.path.join(dump_path, names.RAW_ROOT, names.rank_dir_name(0), names.step_dir_name(step),
                        names.RECORDS_FILE)
