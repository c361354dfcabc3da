"""Writes synthetic raw capture dumps in the documented raw format (docs/raw-format.md).

Names come from ``tests.support.formats`` (literal, independent of the package); data is real
numpy arrays written with ``np.save``. Used by the processing tests and the processing benchmark. A
:class:`StepWriter` hands out ``seq`` numbers in the order values are written, so the
order of calls below *is* the execution order the raw dump describes.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tests.support import formats as fmt

# fmt: off
KBK_HEADER = [
    "Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size", "Data Type",
    "Shape",
    "Max Value", "Min Value", "Avg Value", "Count", "Negative Zero Count", "Positive Zero Count", "NaN Count",
    "Negative Inf Count", "Positive Inf Count", "Zero Count", "L2Norm Value",
]
# fmt: on


@dataclass
class CellSpec:
    cell_id: int
    name: str
    cls: str
    params: Tuple[str, ...] = ()
    module: str = "tests.synthetic_model"
    file: str = "/src/synthetic_model.py"
    line: int = 10


def numpy_stats(array: np.ndarray) -> Dict[str, object]:
    """Reference statistics straight from numpy (what the processed dump.json must show)."""
    wide = array.astype(np.float64)
    return {
        "Max": array.max().item(),
        "Min": array.min().item(),
        "Mean": float(wide.mean()),
        "Norm": float(np.sqrt(np.dot(wide.ravel(), wide.ravel()))),
    }


@dataclass
class RawDumpBuilder:
    """One rank of a raw dump: manifest plus step folders."""

    dump_path: str
    rank: int = 0
    task: str = "tensor"
    statistics: Sequence[str] = ("max", "min", "mean", "norm")
    distributed: bool = False
    backend: str = "tensordump"
    step_numbering: str = "global"
    graph_step_base: int = 0
    cells: List[CellSpec] = field(default_factory=list)

    @property
    def rank_dir(self) -> str:
        return os.path.join(self.dump_path, fmt.RAW_ROOT, fmt.raw_rank_dir_name(self.rank))

    def cell(self, name: str, cls: str, params: Sequence[str] = (), **extra) -> int:
        spec = CellSpec(len(self.cells), name, cls, tuple(params), **extra)
        self.cells.append(spec)
        return spec.cell_id

    def write_manifest(self) -> str:
        os.makedirs(self.rank_dir, exist_ok=True)
        manifest = {
            "format": fmt.RAW_FORMAT,
            "run_id": "test-run",
            "config": {"task": self.task},
            "task": self.task,
            "statistics": list(self.statistics),
            "backend": self.backend,
            "rank": self.rank,
            "distributed": self.distributed,
            "step_numbering": self.step_numbering,
            "graph_step_base": self.graph_step_base,
            "mindspore_version": "2.9.0",
            "cells": [
                {
                    "id": c.cell_id,
                    "name": c.name,
                    "class": c.cls,
                    "module": c.module,
                    "file": c.file,
                    "line": c.line,
                    "params": list(c.params),
                }
                for c in self.cells
            ],
        }
        path = os.path.join(self.rank_dir, fmt.MANIFEST_FILE)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=1)
        return path

    def step(self, folder_step: int) -> StepWriter:
        return StepWriter(self, os.path.join(self.rank_dir, fmt.step_dir_name(folder_step)))

    def kbk_csv(
        self, iteration: int, rows: List[Dict[str, object]], graph: str = "0", name: str = "statistic.csv"
    ):
        """Write a MindSpore-style statistic.csv (documented columns) for one iteration."""
        folder = os.path.join(self.rank_dir, fmt.KBK_DIR, "Net", graph, str(iteration))
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, name)
        with open(path, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=KBK_HEADER)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: row.get(k, "") for k in KBK_HEADER})
        return path


def kbk_rows(
    key: fmt.Key, array: np.ndarray, timestamp: int, dtype: Optional[str] = None
) -> List[dict]:
    """The rows MindSpore writes for one TensorDump kernel: the file-name input (slot 0) and the tensor."""
    op_name = f"Default/network/TensorDump-op{timestamp}|{fmt.raw_stem(key, sep='-')}"
    stats = numpy_stats(array)
    common = {"Op Type": "TensorDump", "Op Name": op_name, "Task ID": "1", "Stream ID": "0"}
    common.update({"Timestamp": timestamp, "IO": "input"})
    text_row = dict(common, Slot=0, **{"Data Type": "string", "Shape": "()"})
    tensor_row = dict(
        common,
        Slot=1,
        **{
            "Data Size": array.nbytes,
            "Data Type": dtype or array.dtype.name,
            "Shape": "(" + ",".join(str(d) for d in array.shape) + ")",
            "Max Value": repr(stats["Max"]),
            "Min Value": repr(stats["Min"]),
            "Avg Value": repr(stats["Mean"]),
            "L2Norm Value": repr(stats["Norm"]),
            "NaN Count": int(np.isnan(array).sum()) if array.dtype.kind == "f" else 0,
            "Negative Inf Count": int(np.isneginf(array).sum()) if array.dtype.kind == "f" else 0,
            "Positive Inf Count": int(np.isposinf(array).sum()) if array.dtype.kind == "f" else 0,
        },
    )
    return [text_row, tensor_row]


@dataclass
class StepWriter:
    builder: RawDumpBuilder
    path: str
    seq: int = 0

    def __post_init__(self):
        os.makedirs(self.path, exist_ok=True)

    def _next(self) -> int:
        value = self.seq
        self.seq += 1
        return value

    def tensor(
        self,
        cell: int,
        direction: str,
        slot: str,
        path: Sequence[int],
        array: np.ndarray,
        call: Optional[int] = None,
        dtype_name: Optional[str] = None,
        in_mode: bool = False,
    ) -> str:
        """A raw tensor file; ``dtype_name='bfloat16'`` stores float32 data under a bfloat16 name."""
        key = fmt.Key(cell, direction, slot, fmt.KIND_TENSOR, tuple(path), call)
        dtype = dtype_name or array.dtype.name
        seq = self._next()
        suffix = "_in" if in_mode else ""
        name = f"{fmt.raw_stem(key)}{suffix}_{dtype}_{seq}.npy"
        target = os.path.join(self.path, name)
        np.save(target, array)
        return target

    def value_file(
        self,
        cell: int,
        direction: str,
        slot: str,
        path: Sequence[int],
        kind: str,
        value,
        call: Optional[int] = None,
    ) -> str:
        """A non-tensor value travelling as a scalar tensor file."""
        key = fmt.Key(cell, direction, slot, kind, tuple(path), call)
        array = np.array(0 if value is None else value)
        seq = self._next()
        target = os.path.join(self.path, fmt.raw_tensor_file_name(key, array.dtype.name, seq))
        np.save(target, array)
        return target

    def record(
        self,
        cell: int,
        direction: str,
        slot: str,
        path: Sequence[int],
        kind: str = fmt.KIND_TENSOR,
        array: Optional[np.ndarray] = None,
        value=None,
        call: Optional[int] = None,
        stats: Optional[Dict[str, object]] = None,
        dtype: Optional[str] = None,
    ) -> dict:
        """One records.jsonl line (statistics of a tensor, or a non-tensor value)."""
        obj = {
            "seq": self._next(),
            "cell": cell,
            "dir": direction,
            "slot": slot,
            "kind": kind,
            "call": call,
            "path": list(path),
        }
        if kind == fmt.KIND_TENSOR:
            spelling = {"float32": "Float32", "float16": "Float16", "int64": "Int64"}
            obj["dtype"] = dtype or spelling[array.dtype.name]
            obj["shape"] = list(array.shape)
            obj["stats"] = stats if stats is not None else numpy_stats(array)
        else:
            obj["value"] = value
        with open(os.path.join(self.path, fmt.RECORDS_FILE), "a", encoding="utf-8") as handle:
            handle.write(json.dumps(obj) + "\n")
        return obj

    def done(self, step: int) -> None:
        with open(os.path.join(self.path, fmt.STEP_DONE_FILE), "w", encoding="utf-8") as handle:
            json.dump({"step": step, "complete": True}, handle)


# ---------------------------------------------------------------------------
# A LLaMA-like network: names, nesting and execution order of a real decoder stack
# ---------------------------------------------------------------------------


@dataclass
class Net:
    """Cell tree of a small LLaMA-like model; ``children[id]`` in call order."""

    builder: RawDumpBuilder
    root: int
    children: Dict[int, List[int]]


def llama_net(builder: RawDumpBuilder, layers: int) -> Net:
    children: Dict[int, List[int]] = {}

    def add(name: str, cls: str, parent: Optional[int], params=("x",)) -> int:
        cid = builder.cell(name, cls, params)
        children[cid] = []
        if parent is not None:
            children[parent].append(cid)
        return cid

    root = add("model", "LlamaModel", None, ("input_ids",))
    add("model.tok_embeddings", "LlamaEmbedding", root, ("input_ids",))
    for i in range(layers):
        layer = add(f"model.layers.{i}", "LLamaDecodeLayer", root, ("x", "freqs_cis", "mask"))
        add(f"model.layers.{i}.attention_norm", "LlamaRMSNorm", layer)
        attention = add(f"model.layers.{i}.attention", "LLamaAttention", layer, ("x", "freqs_cis", "mask"))
        for proj in ("wq", "wk", "wv", "wo"):
            add(f"model.layers.{i}.attention.{proj}", "Linear", attention)
        add(f"model.layers.{i}.ffn_norm", "LlamaRMSNorm", layer)
        ffn = add(f"model.layers.{i}.feed_forward", "LlamaFeedForward", layer)
        for proj in ("w1", "w3", "w2"):
            add(f"model.layers.{i}.feed_forward.{proj}", "Linear", ffn)
    add("model.norm_out", "LlamaRMSNorm", root)
    return Net(builder, root, children)


def write_llama_step(
    net: Net,
    writer: StepWriter,
    make_array,
    backward: bool = True,
    explicit_calls: bool = True,
    statistics_records: bool = False,
    calls: int = 1,
) -> int:
    """Forward (and backward) of ``calls`` passes through ``net``; one input and one output per cell.

    ``make_array(cell, direction, slot, call)`` returns the data; returns the number of values written.
    """
    count = 0
    call_count: Dict[Tuple[int, str], int] = {}

    def emit(cell: int, direction: str, slot: str):
        nonlocal count
        call = call_count[(cell, direction)]
        array = make_array(cell, direction, slot, call)
        explicit = call if explicit_calls else None
        if statistics_records:
            writer.record(cell, direction, slot, (0,), array=array, call=explicit)
        else:
            writer.tensor(cell, direction, slot, (0,), array, call=explicit)
        count += 1

    def forward(cell: int):
        key = (cell, fmt.FORWARD)
        call_count[key] = call_count.get(key, -1) + 1
        emit(cell, fmt.FORWARD, fmt.SLOT_ARG)
        for sub in net.children[cell]:
            forward(sub)
        emit(cell, fmt.FORWARD, fmt.SLOT_OUTPUT)

    def backward_pass(cell: int):
        key = (cell, fmt.BACKWARD)
        call_count[key] = call_count.get(key, -1) + 1
        emit(cell, fmt.BACKWARD, fmt.SLOT_OUTPUT)
        for sub in reversed(net.children[cell]):
            backward_pass(sub)
        emit(cell, fmt.BACKWARD, fmt.SLOT_ARG)

    for _ in range(calls):
        forward(net.root)
    if backward:
        # explicit backward call numbers pair with forward ones: the last forward is backward call 0
        if explicit_calls:
            for (cell, direction), _n in list(call_count.items()):
                if direction == fmt.FORWARD:
                    call_count[(cell, fmt.BACKWARD)] = -1
        for _ in range(calls):
            backward_pass(net.root)
    return count


def read_output(dump_path: str, step: int, rank_dir: str = "rank") -> Dict[str, object]:
    """The processed folder's three JSON files, parsed: {"dump": ..., "construct": ..., "stack": ...}."""
    folder = os.path.join(dump_path, fmt.step_dir_name(step), rank_dir)
    out = {}
    for key, name in (
        ("dump", fmt.DUMP_JSON),
        ("construct", fmt.CONSTRUCT_JSON),
        ("stack", fmt.STACK_JSON),
    ):
        with open(os.path.join(folder, name), encoding="utf-8") as handle:
            out[key] = json.load(handle)
    out["folder"] = folder
    return out


def snapshot_tree(path: str) -> Dict[str, bytes]:
    """Relative path -> content of every JSON file, plus relative paths of other files (content b"")."""
    out = {}
    for folder, _, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, path)
            if name.endswith(".json"):
                with open(full, "rb") as handle:
                    out[rel] = handle.read()
            else:
                out[rel] = b""
    return out
