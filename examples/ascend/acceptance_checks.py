"""The acceptance checks: plain functions over what a run left, each guarding against one named defect.

Every check returns ``(ok, text)``; ``text`` starts with the defect it guards against in
brackets (``[micro-batch pairing] ...``), so a FAIL line names the defect that came back.
The checks read only the processed output (msprobe's layout: ``step{N}/rank/dump.json``
and ``dump_tensor_data/``), the run's problems and log, and reference values; they use
no mf_celldump code, so a defect in it cannot hide itself. No missing file is tolerated.
"""

from __future__ import annotations

import json
import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

Check = Tuple[bool, str]
Leaves = Dict[tuple, dict]
Arrays = Dict[str, np.ndarray]

# The defects, as the FAIL lines name them (docs/acceptance.md has the table).
STEP_MARKERS = "steps filter mapping (update-step marker every step)"
EMPTY_FILTER = "empty step filter means every step"
STEP_DONE = "step-done marker after MindSpore's files of a step"
WRITER_RACE = "asynchronous write race (processing waits for MindSpore's writer)"
IN_PAIRING = "gradient hooks 'in' under the parallel pass (producer side, named '_in')"
TD_FLAG = "td_flag on forward dumps (statistics rows named as ours)"
VERSION = "MindSpore < 2.7 refusal"
KBK_ITERATION = "statistics dump iteration pinned to the global step"
MICRO_BATCHES = "micro-batch pairing (backward.k of micro-batch k)"
REDISTRIBUTION = "redistribution (per-consumer dumps are one call, gradient their sum)"
CONTROL_FLOW = "TensorDump in control flow (optimizer under a run-time condition)"
STEP_FILTER = "process-wide step filter given back at detach"
SECOND_KIND = "second capture kind in one process (MS_KERNEL_LAUNCH_SKIP read once)"
SLICING = "big dumps need MS_DUMP_SLICE_SIZE / MS_DUMP_WAIT_TIME"
BF16 = "bf16 statistics computed in float32, not the input dtype"
GE_CHECK = "GE backend check (every way MindSpore picks GE, not only jit_level)"
CHANNEL = "TensorDump channel exists only under backend policy 'ge'"
WIDENED_IN = "widened 'in' probes under the parallel pass (copies after the cast back: producer side instead)"
FORWARD_COMM = "widened 'out' dumps before a forward AllReduce (refused under the parallel pass)"
EVERY_CONSUMER = "copies for every parallel-care consumer (the producer's layout too: one value)"
REGIONS = "copies of one shard shape holding different regions (contents compared)"
OUTSIDE_USER = "a gradient user outside the pass's consumers (its share in the recorded gradient)"


def _line(ok: bool, defect: str, text: str) -> Check:
    return ok, f"[{defect}] {text}"


# -- reading a processed step ---------------------------------------------------------------------------
def step_folders(dump_path: str) -> List[str]:
    if not os.path.isdir(dump_path):
        return []
    return sorted((n for n in os.listdir(dump_path) if n.startswith("step") and n[4:].isdigit()),
                  key=lambda n: int(n[4:]))


def raw_leftovers(dump_path: str) -> List[str]:
    """Step folders with files under ``_raw`` (processing removes each once done)."""
    raw, found = os.path.join(dump_path, "_raw"), []
    for rank in sorted(os.listdir(raw)) if os.path.isdir(raw) else []:
        folder = os.path.join(raw, rank)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if name.startswith("step") and os.listdir(os.path.join(folder, name)):
                found.append(f"{rank}/{name}")
    return found


def _flatten(value, prefix: str, out: List[Tuple[str, dict]]) -> None:
    if isinstance(value, dict) and value.get("type") == "mindspore.Tensor":
        out.append((prefix, value))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _flatten(item, f"{prefix}.{index}" if prefix else str(index), out)


def read_step(dump_path: str, step: int, rank_dir: str = "rank") -> Tuple[Leaves, Arrays]:
    """({(entry, io, index path): leaf}, {file name: array}) of a processed step; empty if absent."""
    folder = os.path.join(dump_path, f"step{step}", rank_dir)
    if not os.path.isfile(os.path.join(folder, "dump.json")):
        return {}, {}
    with open(os.path.join(folder, "dump.json"), encoding="utf-8") as handle:
        data = json.load(handle)["data"]
    leaves: Leaves = {}
    for entry, body in data.items():
        if ".parameters_grad." in entry:
            leaves.update(((entry, "parameters_grad", name), items[0]) for name, items in body.items())
            continue
        for io, values in (("input", body.get("input_args", [])), ("output", body.get("output", []))):
            found: List[Tuple[str, dict]] = []
            _flatten(values, "", found)
            leaves.update(((entry, io, path), leaf) for path, leaf in found)
        for name, value in body.get("input_kwargs", {}).items():
            found = []
            _flatten(value, name, found)
            leaves.update(((entry, "kwarg", path), leaf) for path, leaf in found)
    tensor_dir = os.path.join(folder, "dump_tensor_data")
    arrays = {n: np.load(os.path.join(tensor_dir, n)) for n in os.listdir(tensor_dir)} \
        if os.path.isdir(tensor_dir) else {}
    return leaves, arrays


def statistics_of(array: np.ndarray) -> Dict[str, float]:
    wide = np.asarray(array, dtype=np.float64)
    return {"Max": float(wide.max()), "Min": float(wide.min()), "Mean": float(wide.mean()),
            "Norm": float(np.sqrt((wide * wide).sum()))}


# -- the checks -------------------------------------------------------------------------------------------
def check_ran(name: str, error: Optional[str]) -> Check:
    return error is None, f"{name} run finished" + ("" if error is None else f": {error.splitlines()[-1][:300]}")


def check_step_folders(dump_path: str, want: Sequence[int], defect: str = STEP_MARKERS) -> Check:
    got = step_folders(dump_path)
    names = [f"step{k}" for k in want]
    return _line(got == names, defect, f"exactly {', '.join(names) or 'no'} step folders (got {got or 'none'})")


def check_nothing_written(dump_path: str, defect: str = EMPTY_FILTER) -> Check:
    """A selection whose steps all lie before the run's steps: MindSpore writes nothing, nothing is processed."""
    got, left = step_folders(dump_path), raw_leftovers(dump_path)
    return _line(not got and not left, defect,
                 f"steps all in the past: nothing written (step folders {got or 'none'}, raw {left or 'none'})")


def check_no_problem(name: str, problems: Sequence[str], defect: str = STEP_DONE) -> Check:
    first = f": {problems[0][:300]}" if problems else ""
    return _line(not problems, defect, f"{name}: no problem reported ({len(problems)}){first}")


def check_no_raw_left(dump_path: str, defect: str = STEP_DONE) -> Check:
    left = raw_leftovers(dump_path)
    return _line(not left, defect, f"no raw data left under _raw after processing (left: {left or 'none'})")


def check_no_missing_file(got: Arrays, want: Arrays, step: int, defect: str = WRITER_RACE) -> Check:
    """Zero tolerance: every tensor file of the reference is there (a step read before MindSpore finished it
    misses some)."""
    missing = sorted(set(want) - set(got))
    return _line(bool(want) and not missing, defect, f"step{step}: all {len(want)} tensor files of the reference "
                 f"present ({len(missing)} missing{': ' + missing[0] if missing else ''})")


def check_no_foreign_file(got: Arrays, want: Arrays, step: int, defect: str = STEP_MARKERS) -> Check:
    """No file the reference step lacks (another step's calls in this step's folder)."""
    extra = sorted(set(got) - set(want))
    return _line(not extra, defect, f"step{step}: no tensor file the reference step lacks ({len(extra)} "
                 f"unexpected{': ' + extra[0] if extra else ''})")


def check_same_values(got: Arrays, want: Arrays, step: int, rtol: float, atol: float,
                      defect: str = STEP_MARKERS) -> Check:
    shared = sorted(set(got) & set(want))
    bad = [n for n in shared if got[n].shape != want[n].shape
           or not np.allclose(got[n].astype(np.float64), want[n].astype(np.float64), rtol=rtol, atol=atol)]
    return _line(bool(shared) and not bad, defect, f"step{step}: {len(shared)} tensor files equal the reference's "
                 f"within rtol {rtol} ({len(bad)} differ{': ' + ', '.join(bad[:3]) if bad else ''})")


def check_in_pairing(leaves: Leaves, arrays: Arrays, reference: Dict[tuple, np.ndarray]) -> Check:
    """Under (semi-)auto parallel: values the layer mapping dumps in 'in' mode, forward and backward, present
    and equal to the reference (a gradient hooked 'out' would be cloned onto the parallel-care consumers only)."""
    missing = [k for k in reference if k not in leaves or leaves[k].get("data_name") not in arrays]
    bad = [k for k in reference if k not in missing
           and not np.allclose(arrays[leaves[k]["data_name"]], reference[k], rtol=1e-5, atol=1e-6)]
    return _line(not missing and not bad, IN_PAIRING, f"{len(reference)} 'in'-mode values and their gradients "
                 f"recorded and equal to PyNative's ({len(missing)} missing, {len(bad)} differ"
                 f"{': ' + str((missing + bad)[0][:2]) if missing or bad else ''})")


def check_statistics(got: Leaves, want_arrays: Dict[tuple, np.ndarray], rtol: float, defect: str,
                     directions: Iterable[str] = ("forward", "backward")) -> Check:
    """Statistics recorded for every reference value, both directions, equal to float64 statistics of it."""
    missing = sorted(str(k[:2]) for k in want_arrays if k not in got)
    off = [str(k[:2]) for k, want in want_arrays.items() if k in got for name, value in statistics_of(want).items()
           if not np.isclose(float(got[k].get(name, np.nan)), value, rtol=rtol, atol=1e-6)]
    seen = {k[0].split(".")[-2] for k in got if k[0].split(".")[-2] in ("forward", "backward")}
    ok = not missing and not off and set(directions) <= seen
    return _line(ok, defect, f"{len(want_arrays)} statistics, directions {sorted(seen)}, equal to float64 "
                 f"statistics within rtol {rtol} ({len(missing)} missing, {len(off)} values off"
                 f"{': ' + (missing + off)[0] if missing or off else ''})")


def check_micro_batches(leaves: Leaves, arrays: Arrays, reference: Dict[tuple, np.ndarray]) -> Check:
    """Each reference value (per micro-batch, from ``mindspore.grad`` of that micro-batch alone) under its key."""
    wrong, missing = [], []
    for key, want in reference.items():
        leaf = leaves.get(key)
        if leaf is None or leaf.get("data_name") not in arrays:
            missing.append(key)
        elif not np.allclose(arrays[leaf["data_name"]], want, rtol=1e-5, atol=1e-6):
            holds = [k for k, other in reference.items() if k[1:] == key[1:] and k[0].rsplit(".", 1)[0] ==
                     key[0].rsplit(".", 1)[0] and other.shape == want.shape
                     and np.allclose(arrays[leaf["data_name"]], other, rtol=1e-5, atol=1e-6)]
            wrong.append(f"{key[0]} holds {holds[0][0] if holds else 'no micro-batch'}'s value")
    return _line(not wrong and not missing, MICRO_BATCHES,
                 f"{len(reference)} values, each under its own micro-batch's call ({len(missing)} missing, "
                 f"{len(wrong)} paired wrong{': ' + wrong[0] if wrong else ''})")


def check_redistribution(leaves: Leaves, arrays: Arrays, cell: str, want_input: Optional[np.ndarray],
                         want_gradient: Optional[np.ndarray]) -> Check:
    """A value fed to several redistributing consumers: one forward and one backward call; where the consumers
    take one layout, the value once and the gradient the sum of their parts (``None``: calls only)."""
    calls = sorted({k[0] for k in leaves if k[0].startswith(f"Cell.{cell}.")})
    want_calls = [f"Cell.{cell}.Fan.backward.0", f"Cell.{cell}.Fan.forward.0"]
    ok, what = calls == want_calls, ""
    if want_input is not None:
        forward = leaves.get((want_calls[1], "input", "0"), {}).get("data_name")
        backward = leaves.get((want_calls[0], "output", "0"), {}).get("data_name")
        ok = ok and forward in arrays and backward in arrays and np.array_equal(arrays[forward], want_input) \
            and np.allclose(arrays[backward], want_gradient, rtol=1e-6, atol=1e-6)
        what = ", the value once and the gradient the sum of the consumers' parts"
    return _line(ok, REDISTRIBUTION, f"{cell}: one forward and one backward call (got {len(calls)}: "
                 f"{', '.join(calls[:4])}){what}")


def check_one_value_from_copies(leaves: Leaves, arrays: Arrays, cell: str, want_input: np.ndarray) -> Check:
    """Copies a consumer in the producer's layout took (MindSpore copies for it too, no redistribution needed):
    the value recorded once, not as parts."""
    entry = f"Cell.{cell}.Fan.forward.0"
    name = leaves.get((entry, "input", "0"), {}).get("data_name")
    parts = sorted(k[2] for k in leaves if k[0] == entry and k[1] == "input" and "." in k[2])
    ok = name in arrays and np.array_equal(arrays[name], want_input) and not parts
    return _line(ok, EVERY_CONSUMER, f"{cell}: the copies of consumers in the producer's layout are its input once "
                 f"(got {len(parts)} parts{': ' + ', '.join(parts) if parts else ''})")


def check_regions(leaves: Leaves, arrays: Arrays, entry: str, takes: Sequence[np.ndarray]) -> Check:
    """Copies of one shard shape from different regions: forward parts, each what its consumer took (taken for
    one value, a copy would stand for a region it does not hold)."""
    forward = [leaves.get((f"{entry}.forward.0", "input", f"0.{i}"), {}).get("data_name") for i in range(len(takes))]
    ok = all(n in arrays for n in forward) and all(np.array_equal(arrays[n], t) for n, t in zip(forward, takes))
    return _line(ok, REGIONS, f"{entry}: {len(takes)} forward parts equal to what each consumer took (got "
                 f"{len([n for n in forward if n in arrays])} forward parts)")


def check_whole_gradient(leaves: Leaves, arrays: Arrays, entry: str, want: np.ndarray, defect: str) -> Check:
    """A probed input's recorded gradient: one value, equal to the whole gradient (``mindspore.grad``), every
    user's share included."""
    backward = sorted(k[2] for k in leaves if k[0] == f"{entry}.backward.0" and k[1] == "output")
    name = leaves.get((f"{entry}.backward.0", "output", "0"), {}).get("data_name")
    close = name in arrays and arrays[name].shape == want.shape and np.allclose(arrays[name], want, rtol=1e-6,
                                                                                 atol=1e-6)
    return _line(close and backward == ["0"], defect, f"{entry}: the input gradient recorded once and equal to "
                 f"mindspore.grad's (got {backward}, {'equal' if close else 'not equal'})")


def check_refused(name: str, error: Optional[str], pattern: str, defect: str) -> Check:
    said = error is not None and pattern in error
    return _line(said, defect, f"{name}: refused at attach, saying {pattern!r} (got: "
                 f"{(error or 'no refusal').splitlines()[0][:200]})")


def check_said(name: str, log: str, pattern: str, defect: str) -> Check:
    return _line(pattern in log, defect, f"{name}: the log says {pattern!r}")


def check_count(name: str, got: int, want: int, defect: str) -> Check:
    return _line(got == want, defect, f"{name}: {want} expected, {got} found")


def check_weight_gradients_before_the_branch(leaves: Leaves, dump_path: str, step: int = 0) -> Check:
    """Optimizer under ``if not overflow``: the weight gradients are recorded where autodiff gives them (a hook
    compiled into the backward graph, which runs before the branch), never by probes put inside the branch."""
    grads = [k for k in leaves if k[1] == "parameters_grad"]
    point = None
    path = os.path.join(dump_path, f"step{step}", "rank", "dump.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as handle:
            point = (json.load(handle).get("mf_celldump_parameters_grad") or {}).get("point")
    return _line(bool(grads) and point == "autodiff", CONTROL_FLOW, f"weight gradients recorded where autodiff "
                 f"gives them, before the overflow branch ({len(grads)} recorded, point {point})")
