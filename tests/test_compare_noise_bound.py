"""The noise-derived verdict, with no threshold given: rounding noise flags nothing, faults are named first.

Five fault classes (tests/support/fault_net.py: a scaled weight element, a wrong epsilon, a
dropped bias, a wrong softmax scale, a swapped rotary half), each injected at layers drawn at
random (a seeded generator, two draws per class) of a small LLaMA-like MindSpore network, one
training step captured in PyNative on CPU: compare names the cell that carries the fault first,
and the fault moves that cell's output by more than ten times its noise bound. The runs that
differ only in their rounding (tensor parallel against one rank, graph against PyNative) are in
test_compare_shards_msrun.py and below.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mf_celldump.cli import main as celldump_main
from tests.support import fault_net
from tests.support.msrun import msrun_env

DRAWS = 2
CASES = [(fault, int(layer)) for fault in fault_net.FAULTS
         for layer in np.random.default_rng(sum(fault.encode())).choice(fault_net.LAYERS, DRAWS, replace=False)]
TP_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "tp_train.py")


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return fault_net.capture(str(tmp_path_factory.mktemp("clean") / "dump"))


def compare(capsys, target, baseline, out):
    code = celldump_main(["compare", str(target), str(baseline), "-o", str(out), "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("fault, layer", CASES, ids=[f"{f}-layer{n}" for f, n in CASES])
def test_each_fault_is_named_first_with_no_threshold_given(clean, tmp_path, capsys, fault, layer):
    faulty = fault_net.capture(str(tmp_path / "dump"), fault, layer)
    code, result = compare(capsys, faulty, clean, tmp_path / "out")
    first = result["first_divergence"]
    expected = f"model.layers.{layer}.{fault_net.FAULTS[fault]}"
    assert code == 1 and first is not None and first["cell"] == expected, (result["headline"], first and first["cell"])
    assert first["direction"] == "forward" and not first["inputs_differ"]
    with open(result["csv"], newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["entry"] == first["name"] and r["slot"] == "output.0"]
    (output,) = rows
    assert float(output["max_abs_err"]) > 10 * float(output["noise_bound"]) > 0, output


def test_a_run_against_itself_flags_nothing(clean, tmp_path, capsys):
    again = fault_net.capture(str(tmp_path / "dump"))
    code, result = compare(capsys, again, clean, tmp_path / "out")
    assert code == 0 and result["first_divergence"] is None, result["headline"]


def test_graph_against_pynative_flags_nothing(tmp_path, capsys):
    runs = {}
    for mode in ("graph", "pynative"):
        runs[mode] = tmp_path / mode
        proc = subprocess.run([sys.executable, TP_SCRIPT, "--mode", mode, "--steps", "2", "--dump-path",
                               str(runs[mode]), "--dump", "task=tensor"], cwd=tmp_path, env=msrun_env(),
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    code, result = compare(capsys, runs["graph"], runs["pynative"], tmp_path / "out")
    assert code == 0 and result["verdict"] == "within thresholds", result["headline"]


# -- bfloat16 runs whose reduction order differs ----------------------------------------------------------
# MindSpore has no bfloat16 MatMul on CPU (tests/support/low_precision_net.py), so these two runs are computed
# here as a bfloat16 model computes: float32 accumulation, every cell's output rounded to bfloat16.


def _bf16_rounded(values):
    """Round float32 to the nearest bfloat16 (ties to even), kept in float32 as dumps store it."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def _bf16_run(parts, scaled_layer=None, rounding=None):
    """Four Dense + Tanh layers on 32 tokens of 64 features; each matmul adds its inputs in ``parts`` partial
    sums (another tensor-parallel size or batch split: another order), ``scaled_layer`` has one row of its
    weight scaled by 1.5."""
    _bf16 = rounding or _bf16_rounded
    rng = np.random.default_rng(21)
    x = _bf16(rng.normal(size=(32, 64)))
    entries = {}
    for n in range(4):
        w = _bf16(rng.normal(0, 0.15, (64, 64)))
        if n == scaled_layer:
            w[3] *= 1.5
        chunks = np.array_split(np.arange(64), parts)
        y = _bf16(sum(x[:, c].astype(np.float32) @ w[:, c].T.astype(np.float32) for c in chunks))
        a = _bf16(np.tanh(y))
        bf = {"dtype": "BFloat16"}
        entries[f"Cell.layers.{n}.fc.Dense.forward.0"] = {"in": [x], "out": [y], "params": {"weight": w},
                                                          "records": {"input.0": bf, "output.0": bf,
                                                                      "param.weight": bf}}
        entries[f"Cell.layers.{n}.act.Tanh.forward.0"] = {"in": [y], "out": [a],
                                                          "records": {"input.0": bf, "output.0": bf}}
        x = a
    return entries


def test_bfloat16_runs_whose_reduction_order_differs_flag_nothing_and_a_fault_is_named(tmp_path, capsys):
    from tests.support.compare_dumps import write_dump

    write_dump(str(tmp_path / "one"), _bf16_run(1))
    write_dump(str(tmp_path / "two"), _bf16_run(2))
    write_dump(str(tmp_path / "four"), _bf16_run(4))
    for other in ("two", "four"):
        code, result = compare(capsys, tmp_path / other, tmp_path / "one", tmp_path / f"out-{other}")
        assert code == 0 and result["first_divergence"] is None, result["headline"]
    write_dump(str(tmp_path / "fault"), _bf16_run(2, scaled_layer=2))
    code, result = compare(capsys, tmp_path / "fault", tmp_path / "one", tmp_path / "out-fault")
    assert code == 1 and result["first_divergence"]["cell"] == "layers.2.fc", result["headline"]


# -- a run that computes a branch in float16, against one that computes it in float32 ------------------


def _capture_low_precision(path, fp_dtype=None):
    """tests/support/low_precision_net.py (a bfloat16 and a float16 branch), one step in PyNative; ``fp_dtype``
    replaces the float16 branch's dtype."""
    import mindspore as ms
    from mindspore import nn

    import mf_celldump
    from tests.support import low_precision_net as lp

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    net = lp.make_net()
    if fp_dtype is not None:
        for up in (net.fp.up1, net.fp.up2, net.fp.up3, net.fp.up4):
            up.dtype = getattr(ms, fp_dtype)
    train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), 0.0))
    dump = mf_celldump.attach(train, {"dump_path": str(path), "task": "tensor", "process_on_train_end": False})
    with dump.step(0):
        train(lp.make_input())
    dump.detach()
    assert mf_celldump.process_captured(dump).ok
    return path


def test_a_dtype_change_is_said_first_and_later_values_get_the_narrower_dtypes_noise(tmp_path, capsys):
    half = _capture_low_precision(tmp_path / "half")
    again = _capture_low_precision(tmp_path / "again")
    single = _capture_low_precision(tmp_path / "single", "float32")
    code, null = compare(capsys, again, half, tmp_path / "out-null")
    assert code == 0 and null["dtype_change"] is None, null["headline"]
    code, result = compare(capsys, single, half, tmp_path / "out")
    change = result["dtype_change"]
    assert (change["entry"], change["slot"], change["dtype"], change["baseline_dtype"]) == (
        "Cell.fp.up1.Up.forward.0", "output.0", "float32", "float16"), change
    with open(null["csv"], newline="") as handle:
        null_bounds = {(r["entry"], r["slot"]): float(r["noise_bound"]) for r in csv.DictReader(handle)}
    with open(result["csv"], newline="") as handle:
        rows = {(r["entry"], r["slot"]): r for r in csv.DictReader(handle)}
    after = rows[("Cell.fp.down.Down.forward.0", "output.0")]  # float32 on both sides, computed from float16
    assert after["dtype"] == after["baseline_dtype"] == "float32"
    assert float(after["noise_bound"]) > 100 * null_bounds[("Cell.fp.down.Down.forward.0", "output.0")]
    celldump_main(["compare", str(single), str(half), "-o", str(tmp_path / "out-text")])
    text = capsys.readouterr().out
    assert "DTYPE CHANGES first at Cell.fp.up1.Up.forward.0 output.0" in text, text
    verdict = [line for line in text.splitlines() if line.startswith(("FIRST DIVERGENCE", "no divergence", "DTYPE"))]
    assert verdict[0].startswith("DTYPE CHANGES"), verdict
    assert code == 0 or result["headline"].startswith("DTYPE CHANGES first at"), result["headline"]  # JSON, page
    assert text.count("DTYPE CHANGES first at") == 1, text


def _f32_run(parts, scaled_layer=None):
    """``_bf16_run`` computed and kept in float32: another reduction order moves the last bits of every value."""
    entries = _bf16_run(parts, scaled_layer, rounding=lambda values: np.asarray(values, np.float32))
    for spec in entries.values():
        spec["records"] = {slot: {"dtype": "Float32"} for slot in spec["records"]}
    return entries


def test_statistics_name_the_tensor_dumps_first_divergence_and_list_what_they_cannot_decide(tmp_path, capsys):
    """Runs as above in float32: a statistics dump of another reduction order is within thresholds and lists the
    pairs whose statistics differ within their bound; a statistics dump of the fault names the cell the tensor
    dump names."""
    from tests.support.compare_dumps import write_dump

    write_dump(str(tmp_path / "one"), _f32_run(1))
    write_dump(str(tmp_path / "two"), _f32_run(3), task="statistics")
    code, result = compare(capsys, tmp_path / "two", tmp_path / "one", tmp_path / "out-two")
    assert code == 0 and result["first_divergence"] is None, result["headline"]
    undecided = result["statistics_undecided"]
    assert undecided and undecided["count"] >= 1 and len(undecided["first"]) <= 5, undecided
    celldump_main(["compare", str(tmp_path / "two"), str(tmp_path / "one"), "-o", str(tmp_path / "out-text")])
    assert f"statistics cannot decide {undecided['count']} pairs in all" in capsys.readouterr().out
    write_dump(str(tmp_path / "fault-tensor"), _f32_run(3, scaled_layer=2))
    write_dump(str(tmp_path / "fault-stats"), _f32_run(3, scaled_layer=2), task="statistics")
    named = []
    for fault in ("fault-tensor", "fault-stats"):
        code, result = compare(capsys, tmp_path / fault, tmp_path / "one", tmp_path / f"out-{fault}")
        named.append((code, result["first_divergence"]["cell"]))
    assert named == [(1, "layers.2.fc"), (1, "layers.2.fc")], named
