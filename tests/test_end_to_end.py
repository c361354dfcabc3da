"""Real capture (CPU, PyNative and Graph) -> processing -> the real msprobe compare / graph_visualize."""

import json
import os

import pytest

import mf_celldump
from tests.support import capture_net as cn
from tests.support import formats as fmt
from tests.support.msprobe_cli import compare_rows, graph_nodes

pytest.importorskip("msprobe")

PERTURBED = "layers.0"


def _run(mode, task, dump_path, perturb=False, steps=2):
    cn.set_mode(mode)
    net = cn.make_net()
    if perturb:
        layer = dict(net.cells_and_names())[PERTURBED]
        layer.weight.set_data(layer.weight + 0.05)
    train = cn.train_one_step_cell(net)
    dump = mf_celldump.attach(train, {"dump_path": dump_path, "task": task})
    for step in range(steps):
        with dump.step(step):
            train(cn.make_input())
    dump.detach()
    report = mf_celldump.process_captured(dump)
    assert report.ok, report.summary()
    return dump_path


def _tensor_rows(rows):
    return [r for r in rows if r["NPU Dtype"] == "Float32"]


def _leaf_count(rank_dir):
    with open(os.path.join(rank_dir, "dump.json")) as handle:
        data = json.load(handle)["data"]
    count = 0
    for name, body in data.items():
        if ".parameters_grad." in name:  # {weight: [T]}
            values = [t for items in body.values() for t in items]
        else:
            values = list(body["input_args"]) + list(body["input_kwargs"].values()) + list(body["output"])
            values += list(body.get("parameters", {}).values())
        count += sum(value is not None and value.get("type") == "mindspore.Tensor" for value in values)
    return count


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_identical_runs_compare_clean(tmp_path, mode, task):
    a = _run(mode, task, str(tmp_path / "a"))
    b = _run(mode, task, str(tmp_path / "b"))
    for step in (0, 1):
        rows = compare_rows(os.path.join(a, f"step{step}"), os.path.join(b, f"step{step}"),
                            str(tmp_path / f"out{step}"))
        tensor_rows = _tensor_rows(rows)
        assert len(tensor_rows) == _leaf_count(os.path.join(a, f"step{step}", "rank"))
        assert all(r["Bench Name"] == r["NPU Name"] for r in tensor_rows)
        if task == "tensor":
            assert all(float(r["Cosine"]) == 1.0 and float(r["MaxAbsErr"]) == 0.0 for r in tensor_rows)
        else:
            for column in ("Max diff", "Min diff", "Mean diff", "L2norm diff"):
                assert all(float(r[column]) == 0.0 for r in tensor_rows), column


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_perturbed_layer_is_where_mismatches_start(tmp_path, mode):
    a = _run(mode, "tensor", str(tmp_path / "a"), perturb=True, steps=1)
    b = _run(mode, "tensor", str(tmp_path / "b"), steps=1)
    rows = _tensor_rows(compare_rows(os.path.join(a, "step0"), os.path.join(b, "step0"), str(tmp_path / "o")))
    weights = {r["NPU Name"]: float(r["MaxAbsErr"]) for r in rows if ".parameters." in r["NPU Name"]}
    assert weights.pop(f"Cell.{PERTURBED}.Dense.forward.0.parameters.weight") == pytest.approx(0.05)
    assert weights and all(err == 0.0 for err in weights.values())
    forward = [r for r in rows if ".forward." in r["NPU Name"] and ".parameters." not in r["NPU Name"]]
    first_bad = next(i for i, r in enumerate(forward) if float(r["MaxAbsErr"]) > 0)
    assert forward[first_bad]["NPU Name"] == f"Cell.{PERTURBED}.Dense.forward.0.output.0"
    assert float(forward[first_bad]["Cosine"]) < 1.0
    assert all(float(r["MaxAbsErr"]) == 0.0 for r in forward[:first_bad])
    assert f"Cell.{PERTURBED}.Dense.forward.0.input.0" in {r["NPU Name"] for r in forward[:first_bad]}


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_graph_visualize_builds_the_model_hierarchy(tmp_path, mode):
    dump = _run(mode, "tensor", str(tmp_path / "a"), steps=1)
    rank_dir = os.path.join(dump, "step0", "rank")
    nodes = graph_nodes(rank_dir, str(tmp_path / "vis"))
    with open(os.path.join(rank_dir, "construct.json")) as handle:
        construct = json.load(handle)
    assert set(construct) <= set(nodes)
    assert nodes["Cell.split.proj.Dense.forward.0"] == "Cell.split.Split.forward.0"
    assert nodes["Cell.gate.lin.Dense.backward.0"] == "Cell.gate.Gate.backward.0"
    for entry, parent in construct.items():
        if parent is not None:
            assert nodes[entry] == parent, entry
        else:
            assert not str(nodes[entry]).startswith("Cell."), entry
    assert {fmt.split_entry_name(entry)[0] for entry in construct} == set(cn.CAPTURED_CELLS)
    assert len(construct) == 2 * sum(cn.CALLS_PER_STEP.values())
