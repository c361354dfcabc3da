"""Ascend graph-mode capture, end to end on CPU through the emulation of tests/support/ascend_emulation.py.

The real ``tensordump`` and ``kbk_statistics`` backends, the graph wrapper, MindSpore's
CPU graph compiler and autodiff, the training-run logic and processing all run; only
the Ascend primitives come from the emulator (``AscendPrimitives.from_mindspore`` is
replaced, as a platform without the kernels would). Values are checked against a
PyNative run of the same network with MindSpore's real TensorDump (verified on CPU).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

import mf_celldump
from mf_celldump.capture.backends.ascend_primitives import UNREACHABLE_STEP
from mf_celldump.capture.backends.kbk_settings import iteration_setting
from mf_celldump.capture.backends.tensordump_steps import GraphStepMap
from mf_celldump.errors import AttachError
from mf_celldump.processing.async_steps import wait_for_steps
from mf_celldump.processing.driver import process_dump
from mf_celldump.userinput import IndexSelection
from tests.support import capture_net as cn
from tests.support import formats as fmt
from tests.support.ascend_emulation import AscendEmulator
from tests.support.ascend_runs import raw_step_folders as _raw_step_folders
from tests.support.ascend_runs import run_training
from tests.support.ascend_runs import step_folders as _step_folders
from tests.support.processed import read_output

STEPS = 5
SELECTED = "1,3"


def _run(dump_path, config, emulator=None, steps=STEPS, **kwargs):
    return run_training(dump_path, config, emulator, steps=steps, **kwargs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """PyNative with MindSpore's real TensorDump: the values graph capture must reproduce."""
    path = tmp_path_factory.mktemp("reference")
    _, summary = _run(path, {"task": "tensor", "backend": "tensordump", "steps": SELECTED})
    assert summary.problems == [] and sorted(summary.processed_steps) == [1, 3]
    return str(path)


@pytest.fixture(scope="module")
def graph_run(tmp_path_factory):
    """Graph mode, emulated Ascend primitives; files trail the steps (latency, slow in-place writes)."""
    path = tmp_path_factory.mktemp("graph")
    emulator = AscendEmulator(latency=0.004, slow_every=5, slow_seconds=0.05)
    run, summary = _run(path, {"task": "tensor", "backend": "tensordump", "steps": SELECTED}, emulator)
    yield str(path), emulator, run, summary
    emulator.close()


def _assert_same_values(got_path, got_step, want_path, want_step, rtol=1e-5, atol=1e-6):
    got_leaves, got_arrays = read_output(got_path, got_step)
    want_leaves, want_arrays = read_output(want_path, want_step)
    assert set(got_leaves) == set(want_leaves), set(got_leaves) ^ set(want_leaves)
    assert got_arrays and set(got_arrays) == set(want_arrays), set(got_arrays) ^ set(want_arrays)
    for name, array in got_arrays.items():
        np.testing.assert_allclose(array, want_arrays[name], rtol=rtol, atol=atol, err_msg=name)
    assert any(".backward." in n for n in got_arrays) and any(".forward." in n for n in got_arrays)
    assert any(".parameters_grad." in n for n in got_arrays) and any(".parameters." in n for n in got_arrays)


def test_steps_1_3_give_exactly_step1_and_step3_with_pynative_values(graph_run, reference):
    path, emulator, run, summary = graph_run
    assert summary.problems == [], summary.text()
    assert sorted(summary.processed_steps) == [1, 3]
    assert _step_folders(path) == ["step1", "step3"]
    # MindSpore wrote into exactly two graph-step folders, and nothing else.
    written = {os.path.basename(os.path.dirname(p)) for p in emulator.written_files}
    assert written == {"step1", "step3"}
    for step in (1, 3):
        _assert_same_values(path, step, reference, step)
    # The files were written on MindSpore's terms: read-only, folders 0700 (SaveTensor2NPY, CreateDir).
    assert all(name.endswith(".npy") for name in emulator.written_files)


def test_nothing_is_recreated_under_raw_after_processing(graph_run):
    path, emulator, _, _ = graph_run
    emulator.drain()
    assert _raw_step_folders(path) == []


def test_resumed_run_numbers_folders_from_its_global_step(tmp_path, reference):
    emulator = AscendEmulator(latency=0.002)
    try:
        run, summary = _run(tmp_path, {"task": "tensor", "backend": "tensordump", "steps": "101,103"}, emulator,
                            initial_step=100)
        emulator.drain()
    finally:
        emulator.close()
    assert summary.problems == [] and _step_folders(str(tmp_path)) == ["step101", "step103"]
    # Global step 101 is this run's second step, like step 1 of the reference run.
    _assert_same_values(str(tmp_path), 101, reference, 1)
    _assert_same_values(str(tmp_path), 103, reference, 3)
    # MindSpore's graph counter started at 0 in this process: graph folders 1 and 3 held them.
    assert {os.path.basename(os.path.dirname(p)) for p in emulator.written_files} == {"step1", "step3"}


@pytest.mark.parametrize("backend", ["tensordump", "kbk_statistics"])
def test_selection_all_in_the_past_captures_and_writes_nothing(tmp_path, backend):
    emulator = AscendEmulator()
    calls = []
    emulator.tensordump_set_step = calls.append  # what MindSpore's filter is told, if anything
    try:
        run, summary = _run(tmp_path / "dump", {"task": "tensor", "backend": backend, "steps": SELECTED}, emulator,
                            steps=3, initial_step=100)
        emulator.drain()
    finally:
        emulator.close()
    assert summary.problems == [] and summary.captured_steps == []
    assert run.dump.cells == [] and run.dump.backend is None
    assert not (tmp_path / "dump").exists()
    assert emulator.written_files == [] and calls == [] and emulator.environ == {}


def test_processing_waits_then_names_what_is_missing_and_never_reads_a_partial_step(tmp_path):
    emulator = AscendEmulator(slow_every=1, slow_seconds=0.01)
    emulator.pause()  # MindSpore's writer thread has not caught up when training ends
    try:
        run, summary = _run(tmp_path, {"task": "tensor", "backend": "tensordump", "steps": "0-1"}, emulator,
                            steps=3, wait_timeout=1.0)
        assert summary.processed_steps == [] and _step_folders(str(tmp_path)) == []
        assert len(summary.problems) == 2, summary.problems
        for step, problem in zip((0, 1), summary.problems):
            assert problem.startswith(f"rank 0 step {step}: MindSpore had not finished writing")
            assert f"_td_done_g{step}_*.npy" in problem and "mf-celldump process" in problem
        # Offline, with the writer still behind: an incomplete step is not processed.
        report = process_dump(str(tmp_path), only_complete=True, jobs=1)
        assert report.processed == []
        emulator.resume()
        waited = wait_for_steps(str(tmp_path), 0, [0, 1], timeout=60)
        assert waited.ready == [0, 1] and waited.missing == {}
        report = process_dump(str(tmp_path), only_complete=True, jobs=1)
        assert report.ok and sorted(o.step for o in report.processed) == [0, 1], report.summary()
        emulator.drain()
    finally:
        emulator.close()
    assert _step_folders(str(tmp_path)) == ["step0", "step1"] and _raw_step_folders(str(tmp_path)) == []


def test_files_in_any_order_still_make_complete_steps(tmp_path, reference):
    """MindSpore's queue is FIFO; shuffling the data between markers shows nothing else relies on order."""
    emulator = AscendEmulator(shuffle=True, seed=3, latency=0.001)
    try:
        _, summary = _run(tmp_path, {"task": "tensor", "backend": "tensordump", "steps": "1",
                                     "exclude": ["shared"]}, emulator, steps=2)
    finally:
        emulator.close()
    assert summary.problems == [] and _step_folders(str(tmp_path)) == ["step1"]
    got_leaves, got_arrays = read_output(str(tmp_path), 1)
    _, want_arrays = read_output(reference, 1)
    assert len(got_arrays) > 20
    for name, array in got_arrays.items():  # cells called once per step: no call order to infer
        np.testing.assert_allclose(array, want_arrays[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_second_capture_in_the_same_process_starts_clean(tmp_path):
    emulator = AscendEmulator()
    try:
        _run(tmp_path / "first", {"task": "tensor", "backend": "tensordump", "steps": SELECTED}, emulator)
        # The first detach reopened the filter from graph step 6 on (one more update marker); the second
        # capture must reset it, and its steps land in graph folders 6 and 7 (the counter went on), which
        # the step-done markers map back.
        assert emulator.valid_steps == {1, 3, 6}
        _, summary = _run(tmp_path / "second", {"task": "tensor", "backend": "tensordump", "steps": "all"},
                          emulator, steps=2)
        emulator.drain()
    finally:
        emulator.close()
    assert summary.problems == [] and _step_folders(str(tmp_path / "second")) == ["step0", "step1"]
    second = [p for p in emulator.written_files if "/second/" in p]
    assert {os.path.basename(os.path.dirname(p)) for p in second} == {"step6", "step7"}
    # After detach: the steps whose files may still be queued, and everything from graph step 9 on.
    assert emulator.valid_steps == {6, 7, 9} and emulator.step[0] == 9


@pytest.mark.parametrize("data_mode", ["forward", "backward"])
def test_data_mode(tmp_path, data_mode):
    emulator = AscendEmulator()
    try:
        _, summary = _run(tmp_path, {"task": "tensor", "backend": "tensordump", "steps": "0",
                                     "data_mode": data_mode}, emulator, steps=1)
    finally:
        emulator.close()
    assert summary.problems == []
    _, arrays = read_output(str(tmp_path), 0)
    assert len(arrays) > 10
    assert {"forward" if ".forward." in n else "backward" for n in arrays} == {data_mode}


def test_under_the_parallel_pass_every_gradient_hook_is_in_mode(tmp_path):
    """Under (semi-)auto parallel MindSpore names 'in' dumps and 'in' gradient hooks ``_in``. Every hook is 'in',
    whatever the forward dump's mode: the pass leaves an 'in' hook on the producer side, where the whole gradient
    is (an 'out' one it clones onto the parallel-care consumers only)."""
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("Net:\n  gate: gate([in, _, in], [in])\n  shared: shared([in], [out])\n")
    emulator = AscendEmulator(parallel=True)
    try:
        _, summary = _run(tmp_path / "d", {"task": "tensor", "backend": "tensordump", "steps": "0",
                                           "layer_mapping": [str(mapping)]}, emulator, steps=1)
        emulator.drain()
    finally:
        emulator.close()
    assert summary.problems == []
    in_named = {}
    for path in emulator.written_files:
        parsed = fmt.parse_raw_tensor_name(os.path.basename(path))
        if parsed is not None and parsed.key.kind == fmt.KIND_TENSOR:  # not an explicit null (a plain TensorDump)
            key = parsed.key
            in_named[(key.direction, key.cell_id, key.slot, key.path)] = parsed.in_mode
    forward = {k[1:]: v for k, v in in_named.items() if k[0] == fmt.FORWARD}
    hooks = {k[1:]: v for k, v in in_named.items()
             if k[0] == fmt.BACKWARD and k[2] in (fmt.SLOT_ARG, fmt.SLOT_KWARG, fmt.SLOT_OUTPUT)}
    assert any(forward.values()), "the mapping's 'in' modes reach the forward dumps"
    assert not all(forward.values()), "and 'out' ones stay"
    assert hooks and all(hooks.values()), sorted(probe for probe, in_mode in hooks.items() if not in_mode)
    # Processing reads both spellings: gate's input and output made it into the output.
    leaves, _ = read_output(str(tmp_path / "d"), 0)
    assert ("Cell.gate.Gate.forward.0", "input", 0) in leaves and ("Cell.gate.Gate.backward.0", "output", 0) in leaves


# -- statistics: MindSpore's kernel-by-kernel dump --------------------------------------------------
@pytest.mark.parametrize("op_names", ["raw", "replaced"])
def test_statistics_give_forward_and_backward_values(tmp_path, reference, op_names):
    """``raw``: Op Names as MindSpore > 2.7.0 writes them; ``replaced``: '/', '.' -> '_' (<= 2.7.0)."""
    emulator = AscendEmulator(csv_op_name_style=op_names)
    try:
        _, summary = _run(tmp_path, {"task": "statistics", "backend": "kbk_statistics", "steps": SELECTED,
                                     "statistics": ["max", "min", "mean", "norm", "nan_count"]}, emulator)
    finally:
        emulator.close()
    assert summary.problems == [], summary.text()
    assert emulator.written_files == [], "MS_KERNEL_LAUNCH_SKIP=TensorDump: no tensor file"
    assert _step_folders(str(tmp_path)) == ["step1", "step3"]
    with open(os.path.join(tmp_path, "_raw", "rank0", "manifest.json")) as handle:
        assert json.load(handle)["statistics"] == ["max", "min", "mean", "norm"]
    for step in (1, 3):
        got, _ = read_output(str(tmp_path), step)
        want, _ = read_output(reference, step)
        assert set(got) == set(want), set(got) ^ set(want)
        assert {k[0].split(".")[-2] for k in got} == {"forward", "backward", "parameters_grad"}
        for key, leaf in got.items():
            assert leaf["dtype"] == want[key]["dtype"] and leaf["shape"] == want[key]["shape"], key
            for stat in ("Max", "Min", "Mean", "Norm"):
                assert leaf[stat] == pytest.approx(want[key][stat], rel=1e-5, abs=1e-6), (key, stat)


def test_statistics_row_of_another_tensordump_is_named_as_theirs(tmp_path):
    """A TensorDump of the user's own model (no td_flag) is dumped too; its row is named as not ours, not dropped."""
    emulator = AscendEmulator()
    user_dump = emulator.tensordump()  # ops.TensorDump() in the user's model, on this platform
    user_path = os.path.join(str(tmp_path), "mine")

    class WithUserDump(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.inner = cn.make_net()

        def construct(self, x):
            x = ms.ops.depend(x, user_dump(user_path, x))
            return self.inner(x)

    try:
        _, summary = _run(tmp_path / "d", {"task": "statistics", "backend": "kbk_statistics", "steps": "0",
                                           "process_on_train_end": False}, emulator, steps=1,
                          net_factory=WithUserDump)
    finally:
        emulator.close()
    report = process_dump(str(tmp_path / "d"), jobs=1)
    assert report.ok and [o.step for o in report.processed] == [0], report.summary()
    warnings = [w for o in report.outcomes for w in o.warnings]
    assert len(warnings) == 1 and "statistic.csv:" in warnings[0] and "Default/TensorDump-op" in warnings[0]
    assert "not mf_celldump's" in warnings[0]


def test_statistics_settings_mindspore_would_refuse_fail_at_attach(tmp_path):
    cn.set_mode("graph")
    cases = [
        ({"dump_path": str(tmp_path / "run.1")}, {}, r"has '\.'"),
        ({}, {"MINDSPORE_DUMP_CONFIG": "/elsewhere/dump.json"}, "MINDSPORE_DUMP_CONFIG is already set"),
        ({}, {"MS_KERNEL_LAUNCH_SKIP": "MatMul"}, "exactly 'TensorDump'"),
        ({"statistics": ["md5"]}, {}, "only max, min, mean and norm"),
    ]
    for keys, environ, message in cases:
        emulator = AscendEmulator(environ=dict(environ))
        config = dict({"dump_path": str(tmp_path / "d"), "task": "statistics", "backend": "kbk_statistics"}, **keys)
        try:
            with pytest.raises(AttachError, match=message):
                mf_celldump.attach(cn.train_one_step_cell(cn.make_net()), config, primitives=emulator.primitives())
        finally:
            emulator.close()
    # MindSpore parses its dump config once per process: a second, different one is refused.
    emulator = AscendEmulator()
    primitives = emulator.primitives()
    first = mf_celldump.attach(cn.make_net(), {"dump_path": str(tmp_path / "a"), "task": "statistics",
                                               "backend": "kbk_statistics"}, primitives=primitives)
    first.detach()
    with pytest.raises(AttachError, match="once per process"):
        mf_celldump.attach(cn.make_net(), {"dump_path": str(tmp_path / "b"), "task": "statistics",
                                           "backend": "kbk_statistics"}, primitives=primitives)
    emulator.close()


def test_iteration_setting_and_step_map():
    assert iteration_setting(IndexSelection.parse("1,3,10-20", "steps"), 0) == "1|3|10-20"
    assert iteration_setting(IndexSelection.parse("1,3,10-20", "steps"), 12) == "12-20"
    assert iteration_setting(IndexSelection(None), 7) == "all"
    steps = GraphStepMap.start(IndexSelection.parse("101,103", "steps"), 100, 0)
    assert (steps.base, steps.mindspore_filter()) == (100, [1, 3])
    steps.note_captured(101)
    assert steps.realign(105, 2)  # a jump: step 105 begins at graph step 2
    assert steps.mindspore_filter() == [1] and steps.captured_counters == [1]
    assert GraphStepMap.start(IndexSelection.parse("5", "steps"), 6, 0).mindspore_filter() == [UNREACHABLE_STEP]


def test_mindspore_older_than_2_7_is_refused_at_attach(tmp_path, monkeypatch):
    monkeypatch.setattr(ms, "__version__", "2.6.0")
    with pytest.raises(AttachError, match=r"needs MindSpore 2\.7\.0 or later.*installed: MindSpore 2\.6\.0"):
        mf_celldump.attach(cn.make_net(), {"dump_path": str(tmp_path)})
    assert not any(tmp_path.iterdir())


def test_mindspore_2_11_attaches_with_the_untested_version_warning(tmp_path, monkeypatch, caplog):
    """MindFormers 2.1 requires MindSpore 2.11: the requirement admits it, and attach warns that it is untested."""
    import tomllib
    from packaging.specifiers import SpecifierSet

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    requirement = next(r for r in pyproject["project"]["dependencies"] if r.startswith("mindspore"))
    assert "2.11.0" in SpecifierSet(requirement[len("mindspore"):])
    monkeypatch.setattr(ms, "__version__", "2.11.0")
    with caplog.at_level(logging.WARNING, logger="mf_celldump"):
        dump = mf_celldump.attach(cn.make_net(), {"dump_path": str(tmp_path)})
    dump.detach()
    assert "MindSpore 2.11.0 is newer than the newest version mf_celldump is tested with (2.10.x)" in caplog.text


def test_statistics_under_jit_level_o2_are_refused(tmp_path, monkeypatch):
    """GE (jit_level O2) has no kernel-by-kernel dump; MindSpore would only warn and dump nothing."""
    cn.set_mode("graph")
    monkeypatch.setattr(ms.context, "get_jit_config", lambda: {"jit_level": "O2"})
    emulator = AscendEmulator()
    try:
        with pytest.raises(AttachError, match=r"GE backend does not have.*jit_config=\{'jit_level': 'O2'\}"):
            mf_celldump.attach(cn.make_net(), {"dump_path": str(tmp_path), "task": "statistics",
                                               "backend": "kbk_statistics"}, primitives=emulator.primitives())
    finally:
        emulator.close()
    assert emulator.environ == {}


def test_bfloat16_values_are_stored_as_float32_under_their_own_name(tmp_path):
    """TensorDump saves bfloat16 as float32 data named ``bfloat16`` (tensordump_utils.cc SaveTensor2NPY)."""

    class ToBf16(ms.nn.Cell):
        def construct(self, x):
            return ms.ops.cast(x * 3.0, ms.bfloat16)

    class Net(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.to_bf16 = ToBf16()

        def construct(self, x):
            return ms.ops.cast(self.to_bf16(x), ms.float32).sum()

    cn.set_mode("graph")
    emulator = AscendEmulator()
    x = ms.Tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4))
    try:
        dump = mf_celldump.attach(Net(), {"dump_path": str(tmp_path), "task": "tensor", "backend": "tensordump",
                                          "data_mode": "forward"}, primitives=emulator.primitives())
        with dump.step(0):
            dump.network(x)
        dump.detach()
        report = mf_celldump.process_captured(dump, timeout=60)
    finally:
        emulator.close()
    assert report.ok, report.summary()
    names = [os.path.basename(p) for p in emulator.written_files]
    assert any("_bfloat16_" in n for n in names), names
    leaves, arrays = read_output(str(tmp_path), 0)
    leaf = leaves[("Cell.to_bf16.ToBf16.forward.0", "output", 0)]
    assert leaf["dtype"] == "BFloat16"
    array = arrays[leaf["data_name"]]
    assert array.dtype == np.float32
    want = (ms.Tensor(x.asnumpy() * 3.0).astype(ms.bfloat16)).astype(ms.float32).asnumpy()
    np.testing.assert_array_equal(array, want)


def test_without_processing_the_run_still_waits_for_mindspore_to_finish(tmp_path):
    """The process may exit after training: MindSpore's writer must have finished by then."""
    emulator = AscendEmulator(latency=0.01)
    try:
        _, summary = _run(tmp_path, {"task": "tensor", "backend": "tensordump", "steps": "0-1",
                                     "process_on_train_end": False}, emulator, steps=2)
        raw = os.path.join(tmp_path, fmt.RAW_ROOT, "rank0")
        markers = sorted(n.split("_")[3] for d in _raw_step_folders(str(tmp_path))
                         for n in os.listdir(os.path.join(raw, d)) if n.startswith("_td_done_g"))
        assert markers == ["g0", "g1"], "the run returned before MindSpore had written every step"
    finally:
        emulator.close()
    assert summary.problems == [] and _step_folders(str(tmp_path)) == []
    assert _raw_step_folders(str(tmp_path)) == ["step0", "step1"]
    assert "process_on_train_end is false" in summary.text()


@pytest.mark.parametrize("backend,task", [("tensordump", "tensor"), ("kbk_statistics", "statistics")])
def test_a_cell_applied_to_independent_tensors_pairs_backward_with_forward(tmp_path, backend, task):
    """TensorDump names are fixed at compile time (call ``x``): processing numbers forward calls in execution
    order (here the key's first) and backward.k must still be forward.k's gradient, whatever order graph mode
    runs them in (tests/test_processing.py covers gradients in call order, paired by shape)."""
    emulator = AscendEmulator()
    try:
        _, summary = _run(tmp_path / "graph", {"task": task, "backend": backend, "steps": "0"}, emulator,
                          steps=1, net_factory=cn.make_two_heads)
    finally:
        emulator.close()
    assert summary.problems == [], summary.text()
    _run(tmp_path / "pynative", {"task": "tensor", "backend": "tensordump", "steps": "0"}, steps=1,
         net_factory=cn.make_two_heads)
    got, _ = read_output(str(tmp_path / "graph"), 0)
    want, _ = read_output(str(tmp_path / "pynative"), 0)  # PyNative: call 0 is the query's (program order)
    seen = set()
    for k in range(2):
        heads = got[(f"Cell.rotate.Rotate.forward.{k}", "output", 0)]["shape"][1]
        pynative_call = {2: 0, 1: 1}[heads]
        seen.add(pynative_call)
        for direction, io in (("forward", "output"), ("backward", "input"), ("backward", "output")):
            mine = got[(f"Cell.rotate.Rotate.{direction}.{k}", io, 0)]
            theirs = want[(f"Cell.rotate.Rotate.{direction}.{pynative_call}", io, 0)]
            assert mine["shape"] == theirs["shape"] == [2, heads, 2], (direction, io, k)
            for stat in ("Max", "Min", "Mean", "Norm"):
                assert mine[stat] == pytest.approx(theirs[stat], rel=1e-5, abs=1e-6), (direction, io, k, stat)
    assert seen == {0, 1}
