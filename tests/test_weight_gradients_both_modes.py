"""One weight gradient in both modes: the tiny LLaMA trained by MindFormers 1.9 (YAML, ``CellDumpCallback``) once
in PyNative and once in graph mode, with a loss scale of 64 and gradient clipping on.

``parameters_grad`` is autodiff's gradient in both (before the training wrapper's reduction,
loss-scale division and clipping), so the two dumps agree on every weight gradient and
``mf-celldump compare`` of them is clean; the optimizer's input would differ by the clip factor.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest

from tests.support import mf_cpu_workarounds as mfcpu

pytestmark = pytest.mark.slow

LOSS_SCALE = 64.0
MAX_GRAD_NORM = 1.0  # MFTrainOneStepCell's default clipping norm


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("both_modes")
    out = {}
    for mode in ("pynative", "graph"):
        proc = mfcpu.run_driver(["--", "--mode", mode, "--steps", "2", "--output-dir", mode, "--dump", "steps=1",
                                 "--dump", "task=statistics", "--set", f"runner_wrapper.scale_sense={LOSS_SCALE}",
                                 "--set", "runner_wrapper.use_clip_grad=true"], cwd=str(root))
        assert proc.returncode == 0, proc.stdout[-6000:]
        out[mode] = root / mode / "celldump"
    return root, out


def _dump_json(dump):
    with open(dump / "step1" / "rank" / "dump.json", encoding="utf-8") as handle:
        return json.load(handle)


def _gradient_norms(data) -> dict:
    norms = {}
    for name, body in data["data"].items():
        if ".parameters_grad." in name:
            for weight, leaves in body.items():
                norms[(name, weight)] = leaves[0]["Norm"]
    return norms


def test_every_weight_gradient_is_the_same_in_both_modes(dumps):
    _, by_mode = dumps
    graph, pynative = (_dump_json(by_mode[m]) for m in ("graph", "pynative"))
    for data in (graph, pynative):
        assert data["mf_celldump_parameters_grad"] == {"point": "autodiff", "micro_batches": 1}
    graph_norms, pynative_norms = _gradient_norms(graph), _gradient_norms(pynative)
    assert len(graph_norms) == 21 and graph_norms.keys() == pynative_norms.keys()
    for key, norm in graph_norms.items():
        assert norm / pynative_norms[key] == pytest.approx(1.0, abs=1e-5), key
    # Clipping acted in this step (the unscaled global norm is above the clipping norm), so the
    # optimizer's input differs from what both dumps hold.
    global_norm = math.sqrt(sum(n * n for n in pynative_norms.values())) / LOSS_SCALE
    assert global_norm > MAX_GRAD_NORM * 1.05


def test_compare_of_the_two_modes_is_clean_with_every_pair_compared(dumps, tmp_path):
    _, by_mode = dumps
    proc = subprocess.run([sys.executable, "-m", "mf_celldump", "compare", str(by_mode["graph"]),
                           str(by_mode["pynative"]), "-o", str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["verdict"] == "within thresholds"
    assert result["weights"]["weight_grad"] == {"ok": 21, "diverged": 0, "skipped": 0, "first": None,
                                                "diverged_cells": []}
    for part in result["coverage"]["parts"]:
        assert part["compared"] == part["target_tensors"] == part["baseline_used"], part
    assert result["coverage"]["not_compared"] == []


def test_compare_leaves_out_weight_gradients_recorded_at_different_points(dumps, tmp_path):
    """A dump whose head says its weight gradients are the optimizer's input (what graph mode records where no
    parameter hook can be registered) is not compared with autodiff's on them: by design, with the reason."""
    _, by_mode = dumps
    other = tmp_path / "optimizer_input"
    shutil.copytree(by_mode["graph"], other)
    path = other / "step1" / "rank" / "dump.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["mf_celldump_parameters_grad"] = {"point": "optimizer_input", "micro_batches": 1}
    path.write_text(json.dumps(data), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "mf_celldump", "compare", str(other), str(by_mode["pynative"]),
                           "-o", str(tmp_path / "out"), "--json"], capture_output=True, text=True, timeout=600)
    result = json.loads(proc.stdout)
    assert proc.returncode == 0 and result["verdict"] == "within thresholds", proc.stdout[-3000:]
    assert result["weights"]["weight_grad"]["ok"] == 0 and result["weights"]["weight_grad"]["skipped"] == 21
    part = next(p for p in result["coverage"]["parts"] if p["kind"] == "weight_grad")
    assert part["by_design"] == 21
    with open(tmp_path / "out" / "compare_pairs.csv", encoding="utf-8") as handle:
        text = handle.read()
    assert text.count("weight gradients recorded at different points: target optimizer_input, baseline "
                      "autodiff") == 21


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_under_gradient_accumulation_the_step_accumulated_gradient_in_both_modes(tmp_path, mode):
    """``nn.GradAccumulationCell`` over 4 micro-batches (a block used twice in each): each weight's one
    ``parameters_grad`` is autodiff's gradient of the whole step, its micro-batches summed, and dump.json says so."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    import mf_celldump
    from tests.support import micro_batch_net as mb
    from tests.support.processed import read_output

    micro = 4
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    model = mb.make_model()
    params = model.trainable_params()
    want = ms.grad(nn.GradAccumulationCell(model, micro), grad_position=None, weights=params)(mb.make_batch(micro))
    want = {p.name: g.asnumpy() for p, g in zip(params, want)}
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    model = mb.make_model()
    train = nn.TrainOneStepCell(nn.GradAccumulationCell(model, micro), nn.SGD(model.trainable_params(), 0.0))
    dump = mf_celldump.attach(train, {"dump_path": str(tmp_path), "task": "tensor", "backend": "host",
                                      "process_on_train_end": False})
    with dump.step(0):
        train(mb.make_batch(micro))
    dump.detach()
    assert mf_celldump.process_captured(dump).ok
    leaves, arrays = read_output(str(tmp_path), 0)
    got = {}
    for (entry, io, weight), leaf in leaves.items():
        if io == "parameters_grad":
            cell = entry[len("Cell."):].rsplit(".parameters_grad.", 1)[0].rsplit(".", 1)[0]
            assert entry.endswith(".parameters_grad.0"), entry  # one per weight and step
            got[f"{cell}.{weight}"] = arrays[leaf["data_name"]]
    assert got.keys() == want.keys()
    for name, grad in want.items():
        np.testing.assert_allclose(got[name], grad, rtol=1e-5, atol=1e-6, err_msg=name)
    with open(tmp_path / "step0" / "rank" / "dump.json", encoding="utf-8") as handle:
        assert json.load(handle)["mf_celldump_parameters_grad"] == {"point": "autodiff", "micro_batches": micro}
