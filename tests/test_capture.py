"""Capture engine on real MindSpore (CPU), PyNative and Graph mode.

The raw files are read back with an independent oracle (tests/support/rawread.py) and their
values checked against independent computations: forward outputs by re-running
fresh, unwrapped cells on the captured inputs; gradients by ``mindspore.grad`` of
fresh cells and of the whole network.
"""

import dataclasses
import os
import zlib

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import mf_celldump
from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives
from mf_celldump.capture.session import find_attached
from mf_celldump.errors import AttachError
from tests.support import capture_net as cn
from tests.support import formats as fmt
from tests.support.rawread import raw_steps, read_manifest, read_step
from tests.support.tensordump_standin import AscendNamedTensorDump

STEPS = 3


def _train(mode, config=None, steps=STEPS, begin_end=True):
    """Train the capture net; returns (losses, weights before each step, final weights, dump)."""
    cn.set_mode(mode)
    net = cn.make_net()
    train = cn.train_one_step_cell(net)
    x = cn.make_input()
    dump = mf_celldump.attach(train, config) if config is not None else None
    losses, weights = [], []
    for step in range(steps):
        weights.append(cn.snapshot(net))
        if dump is not None and begin_end:
            dump.begin_step(step)
        losses.append(train(x).asnumpy())
        if dump is not None and begin_end:
            dump.end_step()
    if dump is not None:
        dump.detach()
    return losses, weights, cn.snapshot(net), dump


@pytest.fixture(scope="module")
def baselines():
    cache = {}

    def get(mode):
        if mode not in cache:
            losses, _, final, _ = _train(mode)
            cache[mode] = (losses, final)
        return cache[mode]

    return get


def _gate_gradient_path(mode):
    """``gate(a, 2, gate=b)``: b is the second top-level tensor argument, so msprobe's backward
    ``output.1``, in both modes."""
    return (1,)


def _expected_keys(mode):
    """Every (cell, direction, slot, path, call) the capture net must produce per step."""
    keys = set()
    for name, calls in cn.CALLS_PER_STEP.items():
        for call in range(calls):
            outputs = [(0,), (1,)] if name == "split" else [(0,)]
            tensor_inputs = [("a", (0,))] + ([("a", (2,))] if name == "gate" else [])
            for path in outputs:
                keys.add((name, "forward", "o", path, call))
                keys.add((name, "backward", "o", path, call))
            for slot, path in tensor_inputs:
                keys.add((name, "forward", slot, path, call))
                if name != "embed":  # the network input needs no gradient
                    keys.add((name, "backward", slot, _gate_gradient_path(mode) if path == (2,) else path, call))
            # split's mask, left at its default, is not recorded (msprobe records what the caller passed)
            if name == "gate":
                keys.add((name, "forward", "a", (1,), call))  # the int 2
                keys.add((name, "forward", "k", (3,), call))  # keyword-only shift=0.5
        if cn.CAPTURED_CELLS[name] == "Dense":  # weights once per step, their gradients once per step
            for index in range(2):
                keys.add((name, "forward", "w", (index,), 0))
                keys.add((name, "backward", "g", (index,), 0))
    return keys


CASES = [("pynative", "tensordump"), ("pynative", "host"), ("graph", "host")]


@pytest.mark.parametrize("mode,backend", CASES)
def test_every_record_and_value(tmp_path, mode, backend):
    config = {"dump_path": str(tmp_path), "task": "tensor", "data_mode": "all", "backend": backend}
    _, weights, _, dump = _train(mode, config)
    assert dump.captured_steps == [0, 1, 2]
    manifest, steps = raw_steps(str(tmp_path))
    assert manifest["backend"] == backend
    assert {c["name"]: c["class"] for c in manifest["cells"]} == {**cn.CAPTURED_CELLS, "layers": "CellList"}
    assert sorted(steps) == [0, 1, 2]
    expected = _expected_keys(mode)
    cn.set_mode("pynative")  # independent computations run eagerly
    for step, step_dir in sorted(steps.items()):
        assert os.path.exists(os.path.join(step_dir, fmt.STEP_DONE_FILE))
        records = read_step(step_dir, manifest)
        assert set(records) == expected, f"step {step}: {set(records) ^ expected}"
        assert records[("gate", "forward", "a", (1,), 0)]["value"] == 2
        assert ("split", "forward", "a", (1,), 0) not in records  # mask left at its default
        assert records[("gate", "forward", "k", (3,), 0)]["value"] == 0.5
        _check_forward_values(records, weights[step])
        _check_backward_values(records, weights[step], mode)
        _check_weight_values(records, manifest, weights[step])


def _check_weight_values(records, manifest, weights):
    """Slot w holds the network's parameters before the step, slot g exactly ``mindspore.grad``
    of the loss w.r.t. them (msprobe's ``parameters`` / ``parameters_grad``)."""
    net = cn.make_net(weights)
    params = net.trainable_params()
    _, grads = ms.value_and_grad(net, None, params)(cn.make_input())
    by_name = {p.name: (weights[p.name], g.asnumpy()) for p, g in zip(params, grads)}
    seen = 0
    for cell in manifest["cells"]:
        for index, weight in enumerate(cell["weights"]):
            value, grad = by_name[f"{cell['name']}.{weight}"]
            np.testing.assert_array_equal(records[(cell["name"], "forward", "w", (index,), 0)], value)
            np.testing.assert_array_equal(records[(cell["name"], "backward", "g", (index,), 0)], grad,
                                          err_msg=f"{cell['name']}.{weight}")
            seen += 1
    assert seen == len(params)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_weight_statistics_and_switch(tmp_path, mode):
    """Statistics task: the weights' and weight gradients' statistics are those of the network's
    parameters and of ``mindspore.grad``; ``parameters: false`` records neither."""
    _, weights, _, _ = _train(mode, {"dump_path": str(tmp_path / "on"), "task": "statistics", "steps": "1"}, steps=2)
    _train(mode, {"dump_path": str(tmp_path / "off"), "task": "statistics", "steps": "1", "parameters": False},
           steps=2)
    manifest, steps = raw_steps(str(tmp_path / "on"))
    records = read_step(steps[1], manifest)
    cn.set_mode("pynative")
    net = cn.make_net(weights[1])
    params = net.trainable_params()
    _, grads = ms.value_and_grad(net, None, params)(cn.make_input())
    by_name = {p.name: (weights[1][p.name], g.asnumpy()) for p, g in zip(params, grads)}
    for cell in manifest["cells"]:
        for index, weight in enumerate(cell["weights"]):
            for direction, slot, want in zip(("forward", "backward"), "wg", by_name[f"{cell['name']}.{weight}"]):
                stats = records[(cell["name"], direction, slot, (index,), 0)]["stats"]
                got = [stats[k] for k in ("Max", "Min", "Mean", "Norm")]
                np.testing.assert_allclose(got, [want.max(), want.min(), want.mean(), np.linalg.norm(want)],
                                           rtol=1e-6, atol=1e-9)
    manifest_off, steps_off = raw_steps(str(tmp_path / "off"))
    records_off = read_step(steps_off[1], manifest_off)
    assert not [key for key in records_off if key[2] in ("w", "g")]
    assert all(cell["weights"] == [] for cell in manifest_off["cells"])


def _fresh_cell(weights, name):
    net = cn.make_net(weights)
    cell = dict(net.cells_and_names())[name]
    return net, cell


def _inputs(records, name, call):
    args = [Tensor(records[(name, "forward", "a", (0,), call)])]
    kwargs = {}
    if name == "gate":
        args.append(records[(name, "forward", "a", (1,), call)]["value"])
        kwargs["gate"] = Tensor(records[(name, "forward", "a", (2,), call)])
        kwargs["shift"] = records[(name, "forward", "k", (3,), call)]["value"]
    return args, kwargs


def _outputs(records, name, call, direction="forward"):
    paths = [(0,), (1,)] if name == "split" else [(0,)]
    return [records[(name, direction, "o", path, call)] for path in paths]


def _check_forward_values(records, weights):
    for name, calls in cn.CALLS_PER_STEP.items():
        _, cell = _fresh_cell(weights, name)
        for call in range(calls):
            args, kwargs = _inputs(records, name, call)
            out = cell(*args, **kwargs)
            out = out if isinstance(out, tuple) else (out,)
            for got, want in zip(_outputs(records, name, call), out):
                np.testing.assert_allclose(got, want.asnumpy(), rtol=1e-6, atol=1e-7, err_msg=name)


def _check_backward_values(records, weights, mode):
    # Truth at the top: loss = mean(h*h), so dL/dh = 2h/N for the last layer's output.
    h = records[("layers.1", "forward", "o", (0,), 0)]
    np.testing.assert_allclose(records[("layers.1", "backward", "o", (0,), 0)], 2 * h / h.size, rtol=1e-5)
    # Each cell: gradients w.r.t. inputs follow from the captured gradients w.r.t. outputs.
    for name, calls in cn.CALLS_PER_STEP.items():
        _, cell = _fresh_cell(weights, name)
        for call in range(calls):
            args, kwargs = _inputs(records, name, call)
            douts = [Tensor(d) for d in _outputs(records, name, call, "backward")]
            tensor_kw = kwargs.get("gate")

            def weighted(x, gate=None, _cell=cell, _args=args, _kwargs=kwargs, _douts=douts):
                call_kwargs = dict(_kwargs, gate=gate) if gate is not None else dict(_kwargs)
                out = _cell(x, *_args[1:], **call_kwargs)
                out = out if isinstance(out, tuple) else (out,)
                return sum((o * d).sum() for o, d in zip(out, _douts))

            if name == "embed":
                continue  # its input has no gradient
            if tensor_kw is not None:
                gx, gk = ms.grad(weighted, grad_position=(0, 1))(args[0], tensor_kw)
                got = records[(name, "backward", "a", _gate_gradient_path(mode), call)]
                np.testing.assert_allclose(got, gk.asnumpy(), rtol=1e-5, atol=1e-6)
            else:
                gx = ms.grad(weighted, grad_position=0)(args[0])
            np.testing.assert_allclose(records[(name, "backward", "a", (0,), call)], gx.asnumpy(),
                                       rtol=1e-5, atol=1e-6, err_msg=f"{name}.{call}")
    # The shared cell's two calls pair forward and backward correctly: their weight
    # gradients add up to the whole network's gradient of shared.weight.
    net = cn.make_net(weights)
    params = [p for p in net.trainable_params() if p.name == "shared.weight"]
    _, (grad_w,) = ms.value_and_grad(net, None, params)(cn.make_input())
    total = sum(
        records[("shared", "backward", "o", (0,), c)].T @ records[("shared", "forward", "a", (0,), c)]
        for c in range(2)
    )
    np.testing.assert_allclose(total, grad_w.asnumpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("task", ["tensor", "statistics"])
@pytest.mark.parametrize("data_mode", ["forward", "backward", "all"])
def test_training_is_bitwise_unchanged(tmp_path, baselines, mode, task, data_mode):
    want_losses, want_final = baselines(mode)
    config = {"dump_path": str(tmp_path), "task": task, "data_mode": data_mode}
    losses, _, final, dump = _train(mode, config)
    for got, want in zip(losses, want_losses):
        np.testing.assert_array_equal(got, want)
    for name, value in want_final.items():
        np.testing.assert_array_equal(final[name], value, err_msg=name)
    _, steps = raw_steps(str(tmp_path))
    assert sorted(steps) == [0, 1, 2]
    files = os.listdir(steps[1])
    directions = {fmt.parse_raw_tensor_name(f).key.direction for f in files if f.endswith(".npy")}
    if task == "tensor":
        assert directions == ({"forward", "backward"} if data_mode == "all" else {data_mode})
    else:
        assert not directions, "statistics task must write no tensor files"


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_statistics_equal_numpy(tmp_path, mode):
    stats = ["max", "min", "mean", "norm", "md5", "nan_count", "inf_count"]
    _train(mode, {"dump_path": str(tmp_path / "t"), "task": "tensor"})
    _train(mode, {"dump_path": str(tmp_path / "s"), "task": "statistics", "statistics": stats})
    manifest_t, steps_t = raw_steps(str(tmp_path / "t"))
    manifest_s, steps_s = raw_steps(str(tmp_path / "s"))
    assert manifest_s["backend"] == ("device_stats" if mode == "pynative" else "host")
    for step in range(STEPS):
        assert not [f for f in os.listdir(steps_s[step]) if f.endswith(".npy")]
        tensors = read_step(steps_t[step], manifest_t)
        records = read_step(steps_s[step], manifest_s)
        assert set(records) == set(tensors)
        compared = 0
        for key, array in tensors.items():
            record = records[key]
            if not isinstance(array, np.ndarray):
                assert record["value"] == array["value"]
                continue
            wide = array.astype(np.float64).ravel()
            want = {"Max": array.max(), "Min": array.min(), "Mean": wide.mean(), "Norm": np.sqrt(wide @ wide)}
            assert record["dtype"] == "Float32" and record["shape"] == list(array.shape)
            for name, value in want.items():
                assert record["stats"][name] == pytest.approx(float(value), rel=1e-5, abs=1e-6), (key, name)
            assert record["stats"]["md5"] == f"{zlib.crc32(array.tobytes()) & 0xFFFFFFFF:08x}", key
            assert record["stats"]["nan_count"] == int(np.isnan(array).sum()), key
            assert record["stats"]["inf_count"] == int(np.isinf(array).sum()), key
            compared += 1
        assert compared >= 20, f"step {step}: only {compared} tensors compared"


def _all_files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_detach_restores_cells_and_stops_writing(tmp_path, mode):
    cn.set_mode(mode)
    net = cn.make_net()
    train = cn.train_one_step_cell(net)
    before = {name: dict(cell.__dict__) for name, cell in train.cells_and_names()}
    mf_celldump.attach(train, {"dump_path": str(tmp_path / "unused")}).detach()
    for name, cell in train.cells_and_names():
        assert cell.__dict__ == before[name], f"attach/detach left something on {name!r}"
    dump = mf_celldump.attach(train, {"dump_path": str(tmp_path), "task": "tensor"})
    assert find_attached(train) is dump and find_attached(net) is dump
    assert "construct" in net.embed.__dict__
    x = cn.make_input()
    with dump.step(0):
        train(x)
    dump.detach()
    assert find_attached(train) is None
    for name, cell in train.cells_and_names():
        assert "construct" not in cell.__dict__, name
        assert not [k for k in cell.__dict__ if "celldump" in k], name
        assert cell.construct.__func__ is type(cell).construct
    written = _all_files(tmp_path)
    for _ in range(2):
        train(x)
    after = _all_files(tmp_path)
    assert after == written
    with pytest.raises(AttachError, match="is detached; attach again"):
        dump.begin_step(5)  # a detached dump refuses further steps
    train(x)
    assert dump.end_step() is None
    assert not os.path.exists(os.path.join(tmp_path, fmt.RAW_ROOT, "rank0", "step5"))


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_step_selection_writes_nothing_for_other_steps(tmp_path, mode):
    _, _, _, dump = _train(mode, {"dump_path": str(tmp_path), "task": "tensor", "steps": "1"})
    assert dump.captured_steps == [1]
    _, steps = raw_steps(str(tmp_path))
    assert sorted(steps) == [1]


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_unselected_rank_writes_nothing(tmp_path, mode):
    path = tmp_path / "dump"
    _, _, _, dump = _train(mode, {"dump_path": str(path), "task": "tensor", "ranks": [1]})
    assert dump.rank == 0 and dump.captured_steps == []
    assert not path.exists()


def test_processing_a_rank_outside_ranks_says_it_writes_nothing(tmp_path):
    """`ranks: "5"` on a single card is legal: processing says this rank captures nothing."""
    cn.set_mode("pynative")
    net = cn.make_net()
    dump = mf_celldump.attach(net, {"dump_path": str(tmp_path / "dump"), "ranks": "5"})
    with dump.step(0):
        net(cn.make_input())
    dump.detach()
    report = mf_celldump.process_captured(dump)
    assert report.nothing_to_do and report.ok
    assert "rank 0 is not in ranks=5: this rank captures nothing" in report.summary()


def test_rank_comes_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK_ID", "3")
    monkeypatch.setenv("RANK_SIZE", "4")
    cn.set_mode("pynative")
    dump = mf_celldump.attach(cn.make_net(), {"dump_path": str(tmp_path), "ranks": "3"})
    assert (dump.rank, dump.distributed) == (3, True)
    dump.detach()
    assert read_manifest(str(tmp_path / fmt.RAW_ROOT / "rank3"))["distributed"] is True


def test_names_do_not_depend_on_wrappers(tmp_path):
    cn.set_mode("pynative")
    names = []
    for index, wrap in enumerate((lambda n: n, cn.train_one_step_cell,
                                  lambda n: cn.train_one_step_cell(nn.WithLossCell(n, nn.MSELoss())))):
        net = cn.make_net()
        dump = mf_celldump.attach(wrap(net), {"dump_path": str(tmp_path / str(index))})
        names.append([c.name for c in dump.cells])
        dump.detach()
    assert names[0] == names[1] == names[2]
    assert "embed" in names[0] and not any(n.startswith(("network", "_backbone")) for n in names[0])


def test_attach_errors(tmp_path):
    cn.set_mode("pynative")
    with pytest.raises(AttachError, match="needs a mindspore.nn.Cell"):
        mf_celldump.attach(object(), {"dump_path": str(tmp_path)})
    net = cn.make_net()
    dump = mf_celldump.attach(net, {"dump_path": str(tmp_path)})
    with pytest.raises(AttachError, match="already attached"):
        mf_celldump.attach(cn.train_one_step_cell(net), {"dump_path": str(tmp_path)})
    dump.detach()
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(AttachError, match="cannot be created"):
        mf_celldump.attach(net, {"dump_path": str(blocker / "sub")})
    with pytest.raises(mf_celldump.ConfigError, match="data_mode"):
        mf_celldump.attach(net, {"dump_path": str(tmp_path), "data_mode": "both"})
    assert find_attached(net) is None


def test_cell_selection_include_exclude(tmp_path):
    cn.set_mode("pynative")
    net = cn.make_net()
    dump = mf_celldump.attach(net, {"dump_path": str(tmp_path), "include": ["layers.*", "shared", "split*"],
                                    "exclude": ["split.proj"], "exclude_classes": ["ReLU"]})
    assert [c.name for c in dump.cells] == ["split", "shared", "layers.0", "layers.1"]
    dump.detach()


def test_layer_mapping_modes_reach_the_captured_files(tmp_path, monkeypatch):
    """Per-argument in/out modes from a user mapping file are applied by argument index."""
    monkeypatch.setattr(ms.ops, "TensorDump", AscendNamedTensorDump)
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("Net:\n  gate: gate([in, _], [in])  # x in, scale default; output in\n"
                       "TopLayer:\n  split: split([], [_, in])\n")
    _, _, _, dump = _train("pynative", {"dump_path": str(tmp_path / "d"), "task": "tensor",
                                        "backend": "tensordump", "layer_mapping": [str(mapping)]}, steps=1)
    ids = {c.name: c.cell_id for c in dump.cells}
    _, steps = raw_steps(str(tmp_path / "d"))
    modes = {}
    for name in os.listdir(steps[0]):
        parsed = fmt.parse_raw_tensor_name(name)
        if parsed is not None:
            key = parsed.key
            modes[(key.direction, key.cell_id, key.slot, key.path)] = "in" if parsed.in_mode else "out"
    for direction in ("forward", "backward"):
        assert modes[(direction, ids["gate"], "a", (0,))] == "in"
        assert modes[(direction, ids["gate"], "o", (0,))] == "in"
        assert modes[(direction, ids["split"], "o", (1,))] == "in"
        assert modes[(direction, ids["split"], "o", (0,))] == "out"
    assert modes[("forward", ids["embed"], "a", (0,))] == "out"
    assert modes[("forward", ids["gate"], "a", (1,))] == "out"


def test_graph_tensordump_path_compiles_up_to_the_ascend_kernel(tmp_path):
    """Ascend-only path, checked as far as CPU allows: the graph wrapper with TensorDump /
    DumpGradient parses and builds its file paths; only kernel selection fails on CPU."""
    from mf_celldump.capture.backends.tensordump import _make_graph_path

    graph_path = _make_graph_path()
    assert graph_path("/r/{step}/", (3, 2), "b", (1, 0), ".") == "/r/{step}/c3.b.o.t.nx.p1.0"
    assert graph_path("/d/", (0, 0), "f", (0,), "-") == "/d/c0-f-a-t-nx-p0"
    cn.set_mode("graph")
    train = cn.train_one_step_cell(cn.make_net())
    config = {"dump_path": str(tmp_path), "task": "tensor", "backend": "tensordump"}
    # MindSpore's real primitives; on CPU its backend policy is "ms", so there is no TensorDump channel
    # (tdt_manager.cc OpenTsd) and attach refuses. Claiming the Ascend policy lets the compile go on.
    with pytest.raises(AttachError, match="backend policy is 'ms'"):
        mf_celldump.attach(train, config)
    primitives = dataclasses.replace(AscendPrimitives.from_mindspore(), backend_policy=lambda: "ge")
    dump = mf_celldump.attach(train, config, primitives=primitives)
    dump.begin_step(0)
    with pytest.raises(RuntimeError, match=r"Unsupported op \[TensorDump\] on CPU"):
        train(cn.make_input())
    dump.detach()


PLAIN_USE = """
import sys
import mf_celldump
from tests.support import capture_net as cn
for mode, task in (("pynative", "tensor"), ("pynative", "statistics"), ("graph", "tensor")):
    cn.set_mode(mode)
    train = cn.train_one_step_cell(cn.make_net())
    dump = mf_celldump.attach(train, {"dump_path": f"{sys.argv[1]}/{mode}-{task}", "task": task, "jobs": 1})
    for step in range(2):
        with dump.step(step):
            train(cn.make_input())
    dump.detach()
    assert [o.step for o in mf_celldump.process_captured(dump).processed] == [0, 1]
print("DONE")
"""


def test_plain_use_on_cpu_prints_no_mindspore_error(tmp_path):
    """The default backends on CPU (tensordump, device_stats, host), both modes: MindSpore prints no [ERROR]
    line (its device synchronize refuses the CPU with one, so it is not called there)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", PLAIN_USE, str(tmp_path)], capture_output=True, text=True,
                          timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "[ERROR]" in line]
    assert errors == [], errors


def test_a_step_is_a_global_step_number_or_refused_at_the_call(tmp_path):
    """'a', None, -1, 1.5, 10**30, True: refused before anything runs, so nothing lands where processing never
    looks; the handle stays usable; after detach every step is refused."""
    cn.set_mode("pynative")
    net = cn.make_net()
    dump = mf_celldump.attach(net, {"dump_path": str(tmp_path), "task": "tensor"})
    for bad in ("a", None, -1, 1.5, 10**30, True, float("nan")):
        refused = pytest.raises(mf_celldump.StepError, match=r"not a training step: .* an int from 0 to 999999999999")
        with refused, dump.step(bad):
            net(cn.make_input())
    assert os.listdir(tmp_path / fmt.RAW_ROOT / "rank0") == [fmt.MANIFEST_FILE]
    with dump.step(np.int64(3)):
        net(cn.make_input())
    dump.detach()
    with pytest.raises(AttachError, match="detached"), dump.step(4):
        net(cn.make_input())
    assert dump.captured_steps == [3]
    assert [o.step for o in mf_celldump.process_captured(dump).processed] == [3]


def test_a_step_that_raises_is_left_raw_and_unfinished(tmp_path):
    cn.set_mode("pynative")
    net = cn.make_net()
    dump = mf_celldump.attach(net, {"dump_path": str(tmp_path), "task": "tensor"})
    with dump.step(0):
        net(cn.make_input())
    with pytest.raises(ValueError, match="boom"), dump.step(1):
        net(cn.make_input())
        raise ValueError("boom")
    dump.detach()
    assert dump.captured_steps == [0]
    _, steps = raw_steps(str(tmp_path))
    assert os.path.exists(os.path.join(steps[0], fmt.STEP_DONE_FILE))
    assert not os.path.exists(os.path.join(steps[1], fmt.STEP_DONE_FILE))
    assert [f for f in os.listdir(steps[1]) if f.endswith(".npy")]


def test_leaving_the_attach_block_on_an_exception_aborts_the_running_step(tmp_path):
    cn.set_mode("pynative")
    net = cn.make_net()
    with pytest.raises(ValueError, match="boom"), \
            mf_celldump.attach(net, {"dump_path": str(tmp_path), "task": "tensor"}) as dump:
        dump.begin_step(0)
        net(cn.make_input())
        raise ValueError("boom")
    assert not dump.attached and dump.captured_steps == []
    _, steps = raw_steps(str(tmp_path))
    assert not os.path.exists(os.path.join(steps[0], fmt.STEP_DONE_FILE))
    assert [f for f in os.listdir(steps[0]) if f.endswith(".npy")]  # kept raw for `mf-celldump process`
    assert mf_celldump.process_captured(dump).processed == []


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_backward_call_k_is_the_gradient_of_forward_call_k(tmp_path, mode):
    """Only the call number the running graph hands to each probe pairs backward.k with forward.k here."""
    cn.set_mode(mode)
    train = cn.train_one_step_cell(cn.make_two_heads())
    dump = mf_celldump.attach(train, {"dump_path": str(tmp_path), "task": "tensor", "data_mode": "all"})
    with dump.step(0):
        train(cn.make_input())
    dump.detach()
    manifest, steps = raw_steps(str(tmp_path))
    records = read_step(steps[0], manifest)
    q, k = (records[("rotate", "forward", "o", (0,), call)] for call in (0, 1))
    assert (q.shape, k.shape) == ((2, 2, 2), (2, 1, 2))
    cn.set_mode("pynative")
    expected = ms.grad(cn.attention, grad_position=(0, 1))(Tensor(q), Tensor(k))
    for call, gradient in enumerate(expected):
        np.testing.assert_allclose(records[("rotate", "backward", "o", (0,), call)], gradient.asnumpy(), rtol=1e-6)
        np.testing.assert_allclose(records[("rotate", "backward", "a", (0,), call)], 2 * gradient.asnumpy(),
                                   rtol=1e-6)
