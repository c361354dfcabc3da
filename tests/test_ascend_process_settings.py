"""What MindSpore keeps once per process around TensorDump, and how Ascend graph capture lives with it.

Through the emulation of tests/support/ascend_emulation.py (only the Ascend primitives are
stood in for): the step filter and ``MS_KERNEL_LAUNCH_SKIP`` are shared by every TensorDump
of the process, so capture must not silence another user (a MindFormers-style monitor
that dumps ``finish_step`` every step), must give the filter back at detach, must refuse
a capture that would write nothing; the GE check sees every way MindSpore picks GE; the
TensorDump channel exists only under backend policy "ge"; and a dump larger than the
channel takes completes once ``MS_DUMP_SLICE_SIZE`` is set as advised.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import mindspore as ms
import numpy as np
import pytest
from mindspore import JitConfig, nn, ops

import mf_celldump
from mf_celldump.capture.backends.compile_backend import compile_backend
from mf_celldump.errors import AttachError
from mf_celldump.integrations.run import TrainingRun
from tests.support import capture_net as cn
from tests.support.ascend_emulation import AscendEmulator, DeviceSettings
from tests.support.ascend_runs import output_of, raw_step_folders, run_training, step_folders

TENSOR = {"task": "tensor", "backend": "tensordump"}
STATISTICS = {"task": "statistics", "backend": "kbk_statistics"}


@pytest.fixture
def monitor_path(tmp_path):
    """``monitor_config.dump_path`` as MindFormers' trainer sets it (``dump_local_norm_path``)."""
    path = str(tmp_path / "monitor")
    ms.set_auto_parallel_context(dump_local_norm_path=path)
    yield path
    ms.set_auto_parallel_context(dump_local_norm_path="")


def monitored(emulator, path):
    """A step cell that dumps ``finish_step`` after every training step, as MindFormers' ``MFTrainOneStepCell``
    does for its training monitor (``self.dump(self.finish_step_filename, zero)``), with the emulated TensorDump."""
    dump = emulator.tensordump()
    finish = os.path.join(path, "rank_0", "finish_step")

    class MonitoredStep(nn.Cell):
        def __init__(self, train):
            super().__init__()
            self.train = train

        def construct(self, x):
            loss = self.train(x)
            return ops.depend(loss, dump(finish, ops.zeros((1,), ms.float32)))

    return MonitoredStep


def _finish_files(emulator):
    return [p for p in emulator.written_files if os.path.basename(p).startswith("finish_step_")]


def _graph_folders(emulator, under):
    return sorted({os.path.basename(os.path.dirname(p)) for p in emulator.written_files if under in p})


# -- the step filter ---------------------------------------------------------------------------------
def test_without_capture_the_monitor_writes_once_per_step(tmp_path, monitor_path):
    emulator = AscendEmulator()
    try:
        cn.set_mode("graph")
        step_cell = monitored(emulator, monitor_path)(cn.train_one_step_cell(cn.make_net()))
        x = cn.make_input()
        for _ in range(5):
            step_cell(x)
        emulator.drain()
    finally:
        emulator.close()
    assert len(_finish_files(emulator)) == 5


def test_a_monitor_keeps_every_step_while_selected_steps_are_captured(tmp_path, monitor_path):
    """MindFormers' monitor is known (dump_local_norm_path): the filter stays open for it; the steps not
    selected run the graph without capture ops, so MindSpore writes nothing of ours in them and nothing
    waits for them; the selected steps equal those of a run without the monitor, bit for bit."""
    emulator = AscendEmulator(latency=0.002, slow_every=9, slow_seconds=0.02)
    try:
        _, summary = run_training(tmp_path / "shared", dict(TENSOR, steps="1,3"), emulator, steps=5,
                                  outer=monitored(emulator, monitor_path), wait_timeout=60)
        emulator.drain()
        assert len(_finish_files(emulator)) == 5, "the monitor's file of every step, as without capture"
        assert emulator.valid_steps == set(), "MindSpore's step filter was never narrowed"
        assert _graph_folders(emulator, "/shared/") == ["step1", "step3"]
        assert summary.problems == [] and sorted(summary.processed_steps) == [1, 3], summary.text()
        assert not [note for note in summary.notes if "still writing" in note], summary.notes
        assert step_folders(str(tmp_path / "shared")) == ["step1", "step3"]
        assert raw_step_folders(str(tmp_path / "shared")) == []
    finally:
        emulator.close()
    ms.set_auto_parallel_context(dump_local_norm_path="")
    plain = AscendEmulator()
    try:
        run_training(tmp_path / "plain", dict(TENSOR, steps="1,3"), plain, steps=5)
    finally:
        plain.close()
    for step in (1, 3):
        got_leaves, got = output_of(str(tmp_path / "shared"), step)
        want_leaves, want = output_of(str(tmp_path / "plain"), step)
        assert set(got_leaves) == set(want_leaves) and set(got) == set(want) and len(got) > 20
        for name, array in got.items():
            np.testing.assert_array_equal(array, want[name], err_msg=name)


def test_at_detach_the_filter_reopens_for_other_tensordumps(tmp_path):
    """A TensorDump user capture cannot know of (one in the user's own code) is filtered with the capture's steps
    while attached; after detach its files come again, and queued files of steps not captured never do."""
    emulator = AscendEmulator(latency=0.002)
    try:
        cn.set_mode("graph")
        train = cn.train_one_step_cell(cn.make_net())
        step_cell = monitored(emulator, str(tmp_path / "user"))(train)
        x = cn.make_input()
        run = TrainingRun(mf_celldump.DumpConfig.coerce(dict(TENSOR, steps="1", dump_path=str(tmp_path / "d"))))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(mf_celldump.capture.backends.ascend_primitives.AscendPrimitives, "from_mindspore",
                          classmethod(lambda cls: emulator.primitives()))
            run.ensure_attached(train)
            for step in range(3):
                run.begin_step(step)
                step_cell(x)
                run.end_step()
            summary = run.finish()
        during = len(_finish_files(emulator))
        for _ in range(2):  # the same compiled graph goes on after detach
            step_cell(x)
        emulator.drain()
    finally:
        emulator.close()
    assert summary.problems == [] and summary.processed_steps == [1]
    assert during == 1, "while attached, the filter passes the captured step only"
    assert len(_finish_files(emulator)) == 3, "after detach the user's TensorDump writes again"
    # Graph steps 0 and 2 (not captured) never reached disk; after detach the graph that runs on is the one
    # without capture ops, so nothing of ours is written any more.
    assert _graph_folders(emulator, "/d/") == ["step1"]
    assert emulator.valid_steps == {1, 4}  # the filter still reopens at detach for other TensorDump users


def test_statistics_beside_a_monitor_are_refused_at_attach(tmp_path, monitor_path):
    cn.set_mode("graph")
    emulator = AscendEmulator()
    try:
        with pytest.raises(AttachError, match=r"training monitor.*MS_KERNEL_LAUNCH_SKIP=TensorDump.*task: tensor"):
            mf_celldump.attach(cn.make_net(), dict(STATISTICS, dump_path=str(tmp_path)),
                               primitives=emulator.primitives())
    finally:
        emulator.close()
    assert emulator.environ == {}, "nothing was set"


def test_a_tensor_capture_after_a_statistics_capture_is_refused_at_attach(tmp_path):
    """MS_KERNEL_LAUNCH_SKIP is read once per process: after a statistics capture no TensorDump writes again,
    so a tensor capture is refused at attach (not a silent wait for files that never come)."""
    cn.set_mode("graph")
    emulator = AscendEmulator()
    primitives = emulator.primitives()
    try:
        first = mf_celldump.attach(cn.make_net(), dict(STATISTICS, dump_path=str(tmp_path / "s")),
                                   primitives=primitives)
        first.detach()
        assert "MS_KERNEL_LAUNCH_SKIP" not in emulator.environ  # restored (MindSpore keeps what it read)
        with pytest.raises(AttachError, match="statistics capture earlier in this process.*new process"):
            mf_celldump.attach(cn.make_net(), dict(TENSOR, dump_path=str(tmp_path / "t")), primitives=primitives)
    finally:
        emulator.close()
    for value in ("TensorDump", "all"):
        emulator = AscendEmulator(environ={"MS_KERNEL_LAUNCH_SKIP": value})
        try:
            with pytest.raises(AttachError, match=f"MS_KERNEL_LAUNCH_SKIP={value} makes MindSpore skip"):
                mf_celldump.attach(cn.make_net(), dict(TENSOR, dump_path=str(tmp_path / value)),
                                   primitives=emulator.primitives())
        finally:
            emulator.close()


def test_a_statistics_capture_after_a_tensor_capture_works(tmp_path):
    """The reverse order works: kernels ran before, so MindSpore read MS_KERNEL_LAUNCH_SKIP empty; the TensorDump
    kernels then run and the step filter keeps their files from being written."""
    emulator = AscendEmulator()
    try:
        run_training(tmp_path / "t", dict(TENSOR, steps="0"), emulator, steps=1)
        emulator.drain()
        before = len(emulator.written_files)
        _, summary = run_training(tmp_path / "s", dict(STATISTICS, steps="0"), emulator, steps=1)
        emulator.drain()
    finally:
        emulator.close()
    assert summary.problems == [] and summary.processed_steps == [0], summary.text()
    leaves, _ = output_of(str(tmp_path / "s"), 0)
    assert any(".backward." in k[0] for k in leaves) and any(".forward." in k[0] for k in leaves)
    assert len(emulator.written_files) == before, "no tensor file from the statistics capture"


# -- the GE backend and the TensorDump channel ---------------------------------------------------------
def _net_with(jit_config=None):
    net = cn.make_net()
    if jit_config is not None:
        net.set_jit_config(jit_config)
    return net


@pytest.mark.parametrize("case,device,environ,jit_config,ge", [
    ("cell jit_level O2", DeviceSettings(), {}, JitConfig(jit_level="O2"), True),
    ("cell backend GE", DeviceSettings(), {}, JitConfig(jit_level="O1", backend="GE"), True),
    ("cell jit_level O1", DeviceSettings(soc_version="ascend910"), {}, JitConfig(jit_level="O1"), False),
    ("910A default", DeviceSettings(soc_version="ascend910"), {}, None, True),
    ("910B default", DeviceSettings(soc_version="ascend910b"), {}, None, False),
    ("rank table", DeviceSettings(), {"RANK_TABLE_FILE": "/cluster/rank_table.json"}, None, True),
    ("rank table under msrun", DeviceSettings(), {"RANK_TABLE_FILE": "/x.json", "MS_ROLE": "MS_WORKER"}, None,
     False),
])
def test_statistics_are_refused_whenever_mindspore_would_compile_with_ge(tmp_path, case, device, environ,
                                                                          jit_config, ge):
    cn.set_mode("graph")
    emulator = AscendEmulator(device=device, environ=dict(environ))
    config = dict(STATISTICS, dump_path=str(tmp_path / "d"))
    try:
        if ge:
            with pytest.raises(AttachError, match="GE backend does not have"):
                mf_celldump.attach(_net_with(jit_config), config, primitives=emulator.primitives())
        else:
            mf_celldump.attach(_net_with(jit_config), config, primitives=emulator.primitives()).detach()
    finally:
        emulator.close()


def test_a_global_jit_level_counts_unless_the_cell_sets_its_own(monkeypatch):
    monkeypatch.setattr(ms.context, "get_jit_config", lambda: {"jit_level": "O2"})
    assert compile_backend([cn.make_net()], {}, lambda: "ascend910b").is_ge
    choice = compile_backend([_net_with(JitConfig(jit_level="O0"))], {}, lambda: "ascend910b")
    assert not choice.is_ge and "set_jit_config" in choice.reason
    # Training wrappers copy the inner network's config (Cell._get_attr_from_cell): the model's counts.
    choice = compile_backend([cn.make_net(), _net_with(JitConfig(backend="GE"))], {}, lambda: "ascend910b")
    assert choice.is_ge and "backend='GE'" in choice.reason


def _dumping_cell(dump, path):
    class Dumps(nn.Cell):
        def construct(self, x):
            return ops.depend(x * 2.0, dump(path, x))

    return Dumps()


def test_the_tensordump_channel_exists_only_under_backend_policy_ge(tmp_path):
    """tdt_manager.cc OpenTsd: no channel (nothing written) unless the policy is "ge"; capture refuses then."""
    cn.set_mode("graph")
    written = {}
    for policy in ("ge", "ms"):
        emulator = AscendEmulator(device=DeviceSettings(backend_policy=policy))
        try:
            _dumping_cell(emulator.tensordump(), str(tmp_path / policy / "x"))(ms.Tensor(np.ones((2, 2), np.float32)))
            emulator.drain()
            written[policy] = list(emulator.written_files)
            if policy != "ge":
                with pytest.raises(AttachError, match=r"backend policy is 'ms'.*OpenTsd"):
                    mf_celldump.attach(cn.make_net(), dict(TENSOR, dump_path=str(tmp_path / "d")),
                                       primitives=emulator.primitives())
        finally:
            emulator.close()
    assert len(written["ge"]) == 1 and written["ms"] == []


# -- big dumps --------------------------------------------------------------------------------------
BIG = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024) / 1000.0  # 2 MiB
LIMIT = 1 << 20  # what the emulated device can put on the channel in one piece


def _dump_big(tmp_path, environ):
    cn.set_mode("graph")
    emulator = AscendEmulator(environ=environ, device=DeviceSettings(mbuf_limit_bytes=LIMIT))
    try:
        dump = mf_celldump.attach(cn.Big(), dict(TENSOR, dump_path=str(tmp_path), data_mode="forward"),
                                  primitives=emulator.primitives())
        try:
            with dump.step(0):
                dump.network(ms.Tensor(BIG))
        finally:
            dump.detach()
        report = mf_celldump.process_captured(dump, timeout=60)
    finally:
        emulator.close()
    return emulator, report


ADVICE_LOGGER = "mf_celldump.capture.backends.tensordump_process"


def _advice(caplog):
    return [r.getMessage() for r in caplog.records if r.name == ADVICE_LOGGER]


def test_a_dump_above_the_channel_limit_fails_unsliced_and_completes_with_the_advised_settings(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=ADVICE_LOGGER)
    with pytest.raises(RuntimeError, match="exceed the 1048576 bytes"):
        _dump_big(tmp_path / "unsliced", {})
    assert any("MS_DUMP_SLICE_SIZE is not set" in m and "export MS_DUMP_SLICE_SIZE=" in m for m in _advice(caplog))
    caplog.clear()
    emulator, report = _dump_big(tmp_path / "sliced", {"MS_DUMP_SLICE_SIZE": "1", "MS_DUMP_WAIT_TIME": "60"})
    assert _advice(caplog) == [], "no advice once MindSpore slices"
    assert report.ok, report.summary()
    assert emulator.tdt.slices_sent and all(n >= 2 for n in emulator.tdt.slices_sent)
    leaves, arrays = output_of(str(tmp_path / "sliced"), 0)
    for io, want in (("input", BIG), ("output", BIG * 2.0)):
        leaf = leaves[("Cell.double.Doubles.forward.0", io, 0)]
        np.testing.assert_array_equal(arrays[leaf["data_name"]], want)


def test_slice_settings_outside_mindspore_range_are_ignored_as_mindspore_does(tmp_path):
    with pytest.raises(RuntimeError, match="MS_DUMP_SLICE_SIZE=0 MB"):
        _dump_big(tmp_path, {"MS_DUMP_SLICE_SIZE": "4096"})  # GetEnvIntValue: out of [0, 2048] -> 0


def test_statistics_whose_forward_kernels_lost_td_flag_are_a_problem_not_someone_elses_rows(tmp_path, monkeypatch):
    """Rows without td_flag are normally another user's; if no forward row is ours beside them, ours lost it."""
    from mf_celldump.capture.backends.tensordump import TensorDumpBackend

    monkeypatch.setattr(TensorDumpBackend, "_mark_forward_primitives", lambda self: None)
    emulator = AscendEmulator()
    try:
        _, summary = run_training(tmp_path / "d", dict(STATISTICS, steps="0"), emulator, steps=1)
    finally:
        emulator.close()
    assert len(summary.problems) == 1, summary.problems
    assert "no statistics row names a forward value captured by mf_celldump" in summary.problems[0]
    assert "lose it" in summary.problems[0]


# -- the emulation against MindSpore itself ------------------------------------------------------------
PYTHON_PATH_SEQUENCE = """
import os, sys
import numpy as np
from mindspore import Tensor, ops
from mindspore._c_expression import _tensordump_set_step as set_step
out = sys.argv[1]
t = Tensor(np.ones(2, np.float32))
dump = ops.tensordump
"""
STEPS_OF_THE_SEQUENCE = """
dump(os.path.join(out, "a_{step}"), t)
dump("<tensordump-update-step>", t)
dump(os.path.join(out, "b_{step}"), t)
set_step([1])
dump(os.path.join(out, "c_{step}"), t)
set_step([0])
dump(os.path.join(out, "d_{step}"), t)
set_step([])
"""


def _stems(folder):
    return sorted(name.rsplit("_", 2)[0] for name in os.listdir(folder))


def test_the_emulated_python_path_tensordump_follows_the_installed_mindspore(tmp_path):
    """The eager ``ops.tensordump`` runs on CPU: MindSpore 2.7.1 and later fill ``{step}`` from the graph counter
    and check both counters against the filter (2.7.0 used the python counter for both; docs/ascend-emulation.md)."""
    real, emulated = tmp_path / "real", tmp_path / "emulated"
    real.mkdir()
    emulated.mkdir()
    proc = subprocess.run([sys.executable, "-c", PYTHON_PATH_SEQUENCE + STEPS_OF_THE_SEQUENCE, str(real)],
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    emulator = AscendEmulator()
    try:
        namespace = {"out": str(emulated), "t": ms.Tensor(np.ones(2, np.float32)), "os": os,
                     "dump": emulator.tensordump_python, "set_step": emulator.tensordump_set_step}
        exec(STEPS_OF_THE_SEQUENCE, namespace)  # noqa: S102 - the same calls, on the emulator
    finally:
        emulator.close()
    assert _stems(emulated) == _stems(real) == ["a_step0", "b_step0"]
