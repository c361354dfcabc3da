"""Each slot's noise bound follows what its cell computes, over every cell kind of the three tiny models.

The models are the example YAMLs' tiny MindFormers LLaMA, Qwen3 (mcore) and DeepSeek-V3 (mcore: MLA,
router, experts, MTP), trained one step through ``mindformers.Trainer`` on CPU with a tensor dump
(``tests/support/mcore_models.py train``). Per model:

* null pairs stay clean: the same run twice, and graph mode against PyNative (DeepSeek-V3: its forward;
  its MLA backward differs between the modes, see ``FORWARD_ONLY``);
* for every class of cell that holds weights (a lookup, a matmul, a norm: embedding, projections,
  router, experts, lm_head, the norms, MTP's projection), one cell drawn at random gets one weight
  element changed by at least ten times the larger of two sizes fixed before the run that is judged:
  the weight's own bound, and the change that moves each slot reading the weight (its cell's
  floating outputs) by that slot's bound. In that run, no slot that reads a changed weight is within
  its bound.

And the learning-rate case: the README's main job twice, the second with a doubled learning rate.
Step 0 agrees; at step 1 every weight differs after the optimizer, the embedding's output row and
the next cells' input rows (the same tensor) diverge together, the first divergence is the
embedding, and a statistics dump of the second run names the same first divergence and weight.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mf_celldump.analysis.compare import noise
from mf_celldump.cli import main as celldump_main
from tests.support.mcore_models import DumpFolder, run_driver

pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("llama", "qwen3", "deepseek3")


def _train(where, model, mode="pynative", changes=None, settings=(), steps=1, task="tensor"):
    """One run of the example trainer; the dump root."""
    args = ["train"]
    if changes is not None:
        path = os.path.join(where, "changes.json")
        os.makedirs(where, exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(changes, handle)
        args += ["--change-weights", path]
    args += ["--", "--model", model, "--mode", mode, "--output-dir", str(where), "--steps", str(steps),
             "--dump", f"task={task}", "--dump", f"steps=0-{steps - 1}"]
    for item in settings:
        args += ["--set", item]
    os.makedirs(where, exist_ok=True)
    proc = run_driver(args, cwd=str(where), timeout=1500)
    out, _ = proc.communicate(timeout=1500)
    assert proc.returncode == 0, out[-4000:]
    return os.path.join(str(where), "celldump")


def compare(capsys, target, baseline, out):
    code = celldump_main(["compare", str(target), str(baseline), "-o", str(out), "--json", "--jobs", "1"])
    result = json.loads(capsys.readouterr().out)
    with open(result["csv"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    return code, result, rows


@pytest.fixture(scope="module", params=MODELS)
def clean(request, tmp_path_factory):
    """Per model: two identical PyNative runs and one in graph mode."""
    model = request.param
    root = tmp_path_factory.mktemp(model)
    return model, root, {name: _train(root / name, model, mode) for name, mode in
                         (("a", "pynative"), ("again", "pynative"), ("graph", "graph"))}


# DeepSeek-V3's backward is no null pair between graph mode and PyNative on CPU: the forward is bit-identical,
# but the input gradients of the MLA ``linear_kvb`` projections (decoder and MTP layers) keep their norm and
# lose their direction (cosine 0.03 to 0.2, rel_err 1.3): other values, not other roundings. Only its forward
# is held to agree.
FORWARD_ONLY = {("deepseek3", "graph")}


def test_null_pairs_of_every_model_stay_clean(clean, tmp_path, capsys):
    model, _, runs = clean
    for other in ("again", "graph"):
        code, result, rows = compare(capsys, runs[other], runs["a"], tmp_path / other)
        diverged = [(r["entry"], r["slot"], r["max_abs_err"], r["noise_bound"]) for r in rows
                    if r["status"] == "diverged"]
        if (model, other) in FORWARD_ONLY:
            forward = [d for d, r in zip(diverged, (r for r in rows if r["status"] == "diverged"))
                       if r["direction"] == "forward"]
            assert not forward and any(r["direction"] == "forward" and r["status"] == "ok" for r in rows), forward
            continue
        assert code == 0 and result["verdict"] == "within thresholds", (model, other, result["headline"], diverged)


def _forward_entries(folder):
    for name, body in folder.data.items():
        parts = name.split(".")
        if len(parts) >= 5 and parts[-2] == "forward":
            yield name, ".".join(parts[1:-3]), parts[-3], int(parts[-1]), body


def _bounds(rows):
    return {(r["entry"], r["slot"]): float(r["noise_bound"]) for r in rows if r["noise_bound"]}


def _element(kind, weight, inputs, output):
    """The index of the weight element to change: the one the largest input value multiplies (a matmul), a
    token of the batch's row (a lookup), the largest output column's (a norm)."""
    if kind == "lookup":
        ids = next(v for v in inputs if not np.issubdtype(v.dtype, np.floating))
        return (int(ids.ravel()[0]),) + (0,) * (weight.ndim - 1)
    floats = [v for v in inputs if np.issubdtype(v.dtype, np.floating) and v.ndim]
    if kind == "norm" or not floats or floats[0].shape[-1] not in weight.shape:
        return np.unravel_index(int(np.argmax(np.abs(weight))), weight.shape)
    x = floats[0]
    j = int(np.argmax(np.abs(x.reshape(-1, x.shape[-1])).max(0)))
    axis = weight.ndim - 1 if weight.shape[-1] == x.shape[-1] else list(weight.shape).index(x.shape[-1])
    index = [0] * weight.ndim
    index[axis] = j
    other = [a for a in range(weight.ndim) if a != axis][-1]
    if weight.shape[other] > j:
        index[other] = j  # a diagonal element of a square weight: the same change whichever way it is laid out
    return tuple(index)


def _draw(folder, seed):
    """One cell per class with weights (inside the layers and outside apart), drawn at random:
    (weight name ending, index, a small change, entry, weight slot, kind)."""
    rng = np.random.default_rng(seed)
    by_class = {}
    for name, cell, cls, call, body in _forward_entries(folder):
        weights = body.get("parameters") or {}
        if call == 0 and weights:  # a class inside the layers and outside (the head) are two kinds
            inside = any(part.isdigit() for part in cell.split("."))
            by_class.setdefault((cls, inside), []).append((name, cell, body))
    chosen = []
    for key in sorted(by_class):
        name, cell, body = by_class[key][int(rng.integers(len(by_class[key])))]
        kind = noise.cell_reductions(key[0], body).kind
        weight_name = max(body["parameters"], key=lambda w: len(body["parameters"][w]["shape"]))
        weight = folder.value(body["parameters"][weight_name])
        inputs = [folder.value(v) for v in body["input_args"] if isinstance(v, dict) and "data_name" in v]
        index = _element(kind, weight, inputs, folder.value(body["output"][0]))
        small = 1e-3 * float(np.abs(weight).max())
        chosen.append([f"{cell}.{weight_name}", [int(i) for i in index], small, name, f"param.{weight_name}", kind])
    return chosen


def _reads(rows, chosen):
    """Per change, the slots that read the weight: itself and its cell's floating outputs that moved."""
    by_slot = {(r["entry"], r["slot"]): r for r in rows}
    out = []
    for _, _, _, entry, slot, _ in chosen:
        moved = [key for key, r in by_slot.items() if key[0] == entry and key[1].startswith("output")
                 and r["dtype"].startswith(("float", "bfloat")) and float(r["max_abs_err"] or 0) > 0]
        out.append([(entry, slot)] + moved)
    return out


def test_a_weight_changed_by_ten_times_its_bound_is_never_within_the_bound_of_a_slot_that_reads_it(
        clean, tmp_path, capsys):
    """The change's size is fixed before the run that is judged: ten times the larger of the weight's bound and
    the change that moves each slot reading it by its bound, measured on a run with one small change per weight
    (all scaled by one factor, so a change upstream moves a slot in the same proportion in both runs)."""
    model, root, runs = clean
    _, _, null_rows = compare(capsys, runs["again"], runs["a"], tmp_path / "null")
    bounds = _bounds(null_rows)
    chosen = _draw(DumpFolder(os.path.join(runs["a"], "step0", "rank")), sum(model.encode()))
    assert {"lookup", "matmul", "norm"} <= {c[5] for c in chosen}, chosen
    small = _train(root / "small", model, changes=[c[:3] for c in chosen])
    _, _, small_rows = compare(capsys, small, runs["a"], tmp_path / "small")
    reads = _reads(small_rows, chosen)
    assert all(len(slots) > 1 for slots in reads), list(zip(chosen, reads))  # every change moves an output
    moved = {(r["entry"], r["slot"]): float(r["max_abs_err"]) for r in small_rows}
    factor = 10.0 * max(bounds[key] / moved[key] for slots in reads for key in slots)
    changed = _train(root / "changed", model, changes=[[c[0], c[1], factor * c[2]] for c in chosen])
    _, _, rows = compare(capsys, changed, runs["a"], tmp_path / "changed")
    by_slot = {(r["entry"], r["slot"]): r for r in rows}
    within = [(weight, kind, key, by_slot[key]["max_abs_err"], by_slot[key]["noise_bound"])
              for (weight, _, _, _, _, kind), slots in zip(chosen, reads) for key in slots
              if not float(by_slot[key]["max_abs_err"]) > float(by_slot[key]["noise_bound"]) > 0]
    assert not within, (model, factor, within)
    sizes = [factor * c[2] / bounds[(c[3], c[4])] for c in chosen]
    assert min(sizes) >= 10.0, sizes  # every weight changed by at least ten times its own bound


# -- the learning-rate case ----------------------------------------------------------------------


def _main_job(where, *extra):
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", "run_tiny_llama.py"), "--output-dir",
                           str(where), "--steps", "2", *extra], cwd=str(where.parent), capture_output=True,
                          text=True, timeout=1500, env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return where / "celldump"


def test_a_learning_rate_change_names_the_embedding_whose_output_diverges_with_the_next_input(tmp_path, capsys):
    base = _main_job(tmp_path / "base", "--dump", "task=tensor")
    faster = _main_job(tmp_path / "faster", "--dump", "task=tensor", "--set", "lr_schedule.learning_rate=2.e-3")
    code, result, rows = compare(capsys, faster, base, tmp_path / "out")
    assert code == 1
    assert not [r for r in rows if r["step"] == "0" and r["status"] == "diverged"]
    step1 = [r for r in rows if r["step"] == "1" and r["direction"] == "forward"]
    embedding = next(r for r in step1 if r["cell"] == "model.tok_embeddings" and r["slot"] == "output.0")
    same_tensor = [r for r in step1 if r["slot"] == "input.0" and r["target_norm"] == embedding["target_norm"]
                   and r["cell"] != "model.tok_embeddings"]
    assert {r["cell"] for r in same_tensor} >= {"model.layers.0", "model.layers.0.attention_norm"}, same_tensor
    assert {r["status"] for r in same_tensor} == {embedding["status"]} == {"diverged"}, (embedding, same_tensor)
    first = result["first_divergence"]
    assert (first["cell"], first["step"]) == ("model.tok_embeddings", 1), result["headline"]
    first_weight = result["weights"]["weight"]["first"]
    assert first_weight["cell"] == "model.tok_embeddings", first_weight

    stats = _main_job(tmp_path / "stats", "--dump", "task=statistics", "--set", "lr_schedule.learning_rate=2.e-3")
    code, by_stats, _ = compare(capsys, stats, base, tmp_path / "out-stats")
    assert code == 1
    assert (by_stats["first_divergence"]["cell"], by_stats["first_divergence"]["step"]) == (
        "model.tok_embeddings", 1), by_stats["headline"]
    assert by_stats["weights"]["weight"]["first"]["cell"] == first_weight["cell"], by_stats["weights"]
