"""Test oracle: a processed step's ``dump.json`` leaves and tensor files, read with the literal format spec."""

import json
import os

import numpy as np

from tests.support import formats as fmt


def read_output(dump_path, step, rank_dir="rank"):
    """({(entry, io, index): leaf}, {file name: array}) of one processed step.

    ``io`` is ``input``/``output`` (by position), ``kwarg`` (by name), ``parameters`` and
    ``parameters_grad`` (by weight name); only tensor leaves are kept.
    """
    folder = os.path.join(dump_path, f"step{step}", rank_dir)
    with open(os.path.join(folder, fmt.DUMP_JSON), encoding="utf-8") as handle:
        data = json.load(handle)["data"]
    leaves = {}
    for entry, body in data.items():
        if ".parameters_grad." in entry:  # {weight: [T]}
            leaves.update(((entry, "parameters_grad", name), items[0]) for name, items in body.items())
            continue
        for name, leaf in body.get("parameters", {}).items():
            leaves[(entry, "parameters", name)] = leaf
        for io, values in (("input", body["input_args"]), ("output", body["output"])):
            for index, leaf in enumerate(values):
                if isinstance(leaf, dict) and leaf.get("type") == "mindspore.Tensor":
                    leaves[(entry, io, index)] = leaf
        for name, leaf in body["input_kwargs"].items():
            if isinstance(leaf, dict) and leaf.get("type") == "mindspore.Tensor":
                leaves[(entry, "kwarg", name)] = leaf
    tensor_dir = os.path.join(folder, fmt.TENSOR_DIR)
    arrays = {}
    if os.path.isdir(tensor_dir):
        arrays = {n: np.load(os.path.join(tensor_dir, n), allow_pickle=False) for n in os.listdir(tensor_dir)}
    return leaves, arrays
