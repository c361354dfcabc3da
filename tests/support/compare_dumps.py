"""Small dumps in msprobe's layout, written by hand for the compare and anomalies tests.

``write_dump(root, entries)`` writes ``root/step{N}/{rank}/dump.json`` (+ construct.json,
stack.json and, for the tensor task, the tensor files). ``entries`` maps an entry name
to a spec:

* ``in`` / ``out``: lists of arrays (inputs and outputs);
* ``params``: ``{weight name: array}`` (a forward entry's own weights);
* ``grads``: ``{weight name: array}`` (a ``parameters_grad`` entry);
* ``records``: ``{slot: {key: value}}`` replaces statistics of a slot's record (``output.0``,
  ``input.1``, ``param.weight``) after they are computed.

``framework="pytorch"`` writes msprobe's PyTorch spelling (``torch.Tensor``,
``torch.float32``, ``.pt`` files through torch); ``md5=True`` adds msprobe's CRC-32.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np


def tensor(array, data_name=None, dtype="Float32", framework="mindspore", md5=False):
    array = np.asarray(array, dtype=np.float32)
    record = {
        "type": "torch.Tensor" if framework == "pytorch" else "mindspore.Tensor",
        "dtype": "torch.float32" if framework == "pytorch" else dtype,
        "shape": list(array.shape),
        "Max": float(np.max(array)),
        "Min": float(np.min(array)),
        "Mean": float(np.mean(array)),
        "Norm": float(np.linalg.norm(array)),
    }
    if md5:
        record["md5"] = f"{zlib.crc32(np.ascontiguousarray(array).tobytes()) & 0xFFFFFFFF:08x}"
    if data_name:
        record["data_name"] = data_name
    return record


class _Writer:
    def __init__(self, data_dir, task, framework, md5):
        self.data_dir, self.task, self.framework, self.md5 = data_dir, task, framework, md5
        self.ext = "pt" if framework == "pytorch" else "npy"

    def record(self, array, file_stem):
        file_name = f"{file_stem}.{self.ext}" if self.task == "tensor" else None
        if file_name:
            path = os.path.join(self.data_dir, file_name)
            value = np.asarray(array, dtype=np.float32)
            if self.ext == "pt":
                import torch

                torch.save(torch.from_numpy(value.copy()), path)
            else:
                np.save(path, value)
        return tensor(array, file_name, framework=self.framework, md5=self.md5)

    def body(self, name, spec):
        if "grads" in spec:
            return {w: [self.record(a, f"{name}.{w}")] for w, a in spec["grads"].items()}
        body = {"input_args": [], "input_kwargs": {}, "output": []}
        if "params" in spec:
            body["parameters"] = {w: self.record(a, f"{name}.parameters.{w}") for w, a in spec["params"].items()}
        for key, field in (("in", "input_args"), ("out", "output")):
            kind = "input" if key == "in" else "output"
            body[field] = [self.record(a, f"{name}.{kind}.{i}") for i, a in enumerate(spec.get(key, ()))]
        for slot, values in spec.get("records", {}).items():
            _slot(body, slot).update(values)
        return body


def _slot(body, slot):
    head, _, rest = slot.partition(".")
    if head == "param":
        return body["parameters"][rest]
    return body["input_args" if head == "input" else "output"][int(rest)]


def write_dump(root, entries, task="tensor", indent=None, rank="rank", step=0, framework="mindspore", md5=False):
    folder = os.path.join(root, f"step{step}", rank)
    data_dir = os.path.join(folder, "dump_tensor_data")
    os.makedirs(data_dir, exist_ok=True)
    writer = _Writer(data_dir, task, framework, md5)
    data = {name: writer.body(name, spec) for name, spec in entries.items()}
    doc = {
        "task": task,
        "level": "L0",
        "framework": framework,
        "dump_data_dir": data_dir if task == "tensor" else None,
        "data": data,
    }
    with open(os.path.join(folder, "dump.json"), "w", encoding="utf-8") as handle:
        json.dump(doc, handle, indent=indent)
    cells = [n for n in entries if ".parameters_grad." not in n]
    for file_name, content in (("construct.json", {n: None for n in cells}), ("stack.json", {n: [] for n in cells})):
        with open(os.path.join(folder, file_name), "w", encoding="utf-8") as handle:
            json.dump(content, handle)
    return folder


RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4))


def chain(scale_child=1.0, parents_first=True):
    """A tiny two-level net: ``block`` (parent) with children ``block.fc1`` then ``block.fc2``."""
    fc1 = X * 2
    fc2 = fc1 * scale_child
    child1 = ("Cell.block.fc1.Dense.forward.0", {"in": [X], "out": [fc1]})
    child2 = ("Cell.block.fc2.Dense.forward.0", {"in": [fc1], "out": [fc2]})
    parent = ("Cell.block.Block.forward.0", {"in": [X], "out": [fc2]})
    order = [parent, child1, child2] if parents_first else [child1, child2, parent]
    return dict(order)
