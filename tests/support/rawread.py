"""Test oracle: read a raw capture step folder back into {(cell, dir, io-slot, path, call): value}.

Written independently of mf_celldump.processing so capture tests do not depend on it;
it applies the documented call-inference rule (docs/raw-format.md) itself.
"""

import json
import os
from collections import defaultdict

import numpy as np

from tests.support import formats as fmt


def read_manifest(rank_dir):
    with open(os.path.join(rank_dir, fmt.MANIFEST_FILE)) as handle:
        return json.load(handle)


def read_step(step_dir, manifest):
    """Returns {(cell_name, direction, slot, path, call): array | record dict}."""
    names = {c["id"]: c["name"] for c in manifest["cells"]}
    items = []  # (seq, key, value)
    for file_name in os.listdir(step_dir):
        parsed = fmt.parse_raw_tensor_name(file_name)
        if parsed is not None:
            value = np.load(os.path.join(step_dir, file_name), allow_pickle=False)
            if parsed.key.kind != fmt.KIND_TENSOR:  # a non-tensor value sent as a scalar tensor
                value = {"value": None if parsed.key.kind == fmt.KIND_NONE else value.item()}
            items.append((parsed.seq, parsed.key, value))
    records = os.path.join(step_dir, fmt.RECORDS_FILE)
    if os.path.exists(records):
        with open(records) as handle:
            for line in handle:
                rec = json.loads(line)
                key = fmt.Key(rec["cell"], rec["dir"], rec["slot"], rec["kind"], tuple(rec["path"]),
                                      rec["call"])
                items.append((rec["seq"], key, rec))
    items.sort(key=lambda item: item[0])
    by_probe = defaultdict(list)
    for _seq, key, value in items:
        by_probe[(key.cell_id, key.direction, key.slot, key.path)].append((key, value))
    out = {}
    for (cell, direction, slot, path), occurrences in by_probe.items():
        count = len(occurrences)
        for k, (key, value) in enumerate(occurrences):
            if key.call is not None:
                call = key.call
            elif direction == fmt.FORWARD or slot == "g":  # weight gradients count in order
                call = k
            else:
                call = count - 1 - k
            full = (names[cell], direction, slot, path, call)
            assert full not in out, f"duplicate record {full}"
            out[full] = value
    return out


def raw_steps(dump_path, rank=0):
    """(manifest, {step: raw step folder}) of one rank of a raw dump."""
    rank_dir = os.path.join(dump_path, fmt.RAW_ROOT, fmt.raw_rank_dir_name(rank))
    manifest = read_manifest(rank_dir)
    steps = {}
    for name in os.listdir(rank_dir):
        step = fmt.parse_step_dir_name(name)
        if step is not None:
            steps[step] = os.path.join(rank_dir, name)
    return manifest, steps
