"""The watch: rules over what a step already computed, and the capture of the step that goes wrong.

Training runs (``tests/support/watch_train.py``, ``Model.train`` with ``CellDumpCallback``, real
MindSpore on CPU) go in subprocesses, one per mode: a cell whose output turns NaN from a step on
under a wrapper that skips the update on overflow; the same fault in the first execution of the
step only; a loss spike; no fault. The rules themselves and the configuration are checked in
process with plain numbers.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tracemalloc

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

from mf_celldump.analysis.anomalies import scan
from mf_celldump.config import DumpConfig
from mf_celldump.errors import ConfigError
from mf_celldump.integrations.watching import StepWatch, signals_from_outputs, stopping_callbacks_before
from mf_celldump.userinput import IndexSelection
from mf_celldump.watch import MIN_HISTORY, StepSignals, Watch, WatchRules

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "watch_train.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAULT_STEP = 3
SPIKE_STEP = 6  # a spike is measured against at least MIN_HISTORY earlier steps
MODES = ["pynative", "graph"]


def _train(tmp_path, mode, scenario, task="statistics", fault_step=FAULT_STEP):
    dump = tmp_path / f"{scenario}-{mode}-{task}"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, DRIVER, mode, scenario, str(dump), task, str(fault_step)], cwd=tmp_path,
                          env=env, timeout=300, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(result[-1][len("RESULT "):]), proc.stdout, dump


def _step_folders(dump):
    return sorted(p.name for p in dump.iterdir() if p.name.startswith("step")) if dump.exists() else []


def _watch_head(dump, step):
    with open(dump / f"step{step}" / "rank" / "dump.json", encoding="utf-8") as handle:
        return json.load(handle).get("mf_celldump_watch")


def _first_anomaly(dump):
    found = scan(str(dump), IndexSelection(), IndexSelection(), None)["first"]
    return [(f.step, f.direction, f.cell) for f in found]


# -- training runs -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["statistics", "tensor"])
@pytest.mark.parametrize("mode", MODES)
def test_a_step_whose_update_was_skipped_is_rerun_and_its_dump_names_the_faulty_cell(tmp_path, mode, task):
    result, out, dump = _train(tmp_path, mode, "nan", task)
    assert f"watch: step {FAULT_STEP} rank 0: rule nan_inf_loss fired (value nan)" in out
    assert f"watch: step {FAULT_STEP} rank 0: rule overflow fired" in out
    assert result["captured"] == [FAULT_STEP] and result["processed"] == [FAULT_STEP]
    assert result["problems"] == []
    assert _step_folders(dump) == [f"step{FAULT_STEP}"]
    assert any(f"step {FAULT_STEP} rerun on the same batch and weights" in n and "persistent" in n
               for n in result["notes"])
    assert _first_anomaly(dump) == [(FAULT_STEP, "forward", "net.faulty")]
    assert _watch_head(dump, FAULT_STEP) == {"rule": "nan_inf_loss", "fired_at_step": FAULT_STEP,
                                             "capture": "rerun", "fault": "persistent", "exact": True}


@pytest.mark.parametrize("mode", MODES)
def test_a_fault_in_the_first_execution_only_is_labelled_transient_and_training_is_unchanged(tmp_path, mode):
    result, _, dump = _train(tmp_path, mode, "transient")
    plain, _, _ = _train(tmp_path, mode, "plain-transient")
    assert any("did not come back: transient" in n for n in result["notes"])
    assert _step_folders(dump) == [f"step{FAULT_STEP}"]
    assert _first_anomaly(dump) == []  # the rerun ran without the fault
    assert _watch_head(dump, FAULT_STEP)["fault"] == "transient"
    assert len(result["losses"]) == len(plain["losses"])
    for got, expected in zip(result["losses"], plain["losses"]):  # the rerun did not update anything
        assert got == expected or (math.isnan(got) and math.isnan(expected))


@pytest.mark.parametrize("mode", MODES)
def test_a_loss_spike_fires_its_rule_and_the_next_step_is_captured(tmp_path, mode):
    assert SPIKE_STEP >= MIN_HISTORY
    result, out, dump = _train(tmp_path, mode, "spike", fault_step=SPIKE_STEP)
    assert f"watch: step {SPIKE_STEP} rank 0: rule loss_spike fired" in out
    assert any(f"capturing step {SPIKE_STEP + 1}, the step after it" in n for n in result["notes"])
    assert _step_folders(dump) == [f"step{SPIKE_STEP + 1}"]
    assert result["processed"] == [SPIKE_STEP + 1] and result["problems"] == []
    assert _watch_head(dump, SPIKE_STEP + 1) == {"rule": "loss_spike", "fired_at_step": SPIKE_STEP,
                                                 "capture": "next_step"}


@pytest.mark.parametrize("mode", MODES)
def test_a_run_without_a_fault_captures_nothing_and_creates_no_step_folder(tmp_path, mode):
    result, out, dump = _train(tmp_path, mode, "clean")
    assert result["captured"] == [] and result["processed"] == []
    assert "watch: no rule fired" in result["notes"]
    assert _step_folders(dump) == []
    assert "fired" not in out.replace("no rule fired", "")


def test_stop_ends_training_after_the_captured_step_and_still_processes_it(tmp_path):
    result, _, dump = _train(tmp_path, "pynative", "stop")
    assert len(result["losses"]) == FAULT_STEP + 1  # the rerun happens inside the firing step, then training stops
    assert result["processed"] == [FAULT_STEP]
    assert _step_folders(dump) == [f"step{FAULT_STEP}"]


def test_under_dataset_sink_mode_on_cpu_the_faulty_step_is_rerun_as_without_sink(tmp_path):
    """MindSpore does not sink on CPU (``Model._train`` falls back to ``_train_process``): one step per step end,
    with its batch, so the watch works as without sink."""
    result, out, dump = _train(tmp_path, "graph", "sink")
    assert f"watch: step {FAULT_STEP} rank 0: rule nan_inf_loss fired (value nan)" in out
    assert result["captured"] == [FAULT_STEP] and result["processed"] == [FAULT_STEP]
    assert _watch_head(dump, FAULT_STEP)["capture"] == "rerun"
    assert _first_anomaly(dump) == [(FAULT_STEP, "forward", "net.faulty")]


@pytest.mark.parametrize("sink_size, refused", [(2, True), (-1, True), (1, False)])
def test_steps_anomaly_under_a_graph_sink_of_several_steps_is_refused_at_train_begin(tmp_path, sink_size, refused):
    """What ``Model._train_dataset_sink_process`` hands the callbacks on a device (it cannot run on CPU):
    ``dataset_sink_mode`` and ``sink_size`` in the callback params, one step end per sink."""
    import mindspore.dataset as ds
    from mindspore.train.callback import RunContext, _InternalCallbackParam

    import mf_celldump
    from mf_celldump.errors import AttachError
    from tests.support import capture_net as cn

    cn.set_mode("graph")
    network = cn.train_one_step_cell(cn.make_net())
    params = _InternalCallbackParam(train_network=network, cur_step_num=0, dataset_sink_mode=True,
                                   sink_size=sink_size, list_callback=[],
                                   train_dataset=ds.NumpySlicesDataset({"x": np.zeros((4, 2), np.float32)}))
    callback = mf_celldump.CellDumpCallback(dump_path=str(tmp_path / "dump"), steps="anomaly", watch=True,
                                            backend="host", layer_mapping=None)
    try:
        if refused:
            with pytest.raises(AttachError, match="steps: 'anomaly' cannot run under dataset sink mode with "
                                                  f"sink_size {sink_size} .*Train with sink_size: 1"):
                callback.on_train_begin(RunContext(params))
            assert callback.dump is None
        else:
            callback.on_train_begin(RunContext(params))
            assert callback.dump is not None and callback.dump.attached
    finally:
        callback.close()


# -- configuration ---------------------------------------------------------------------------------------------
def test_steps_anomaly_without_watch_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="steps: 'anomaly' captures the step after a watch rule fires, but watch "
                                          "is off; add watch: true"):
        DumpConfig.from_dict({"steps": "anomaly"})


@pytest.mark.parametrize("values, message", [
    ({"watch": "yes"}, "watch: invalid value 'yes'; valid: true, false, or a mapping"),
    ({"watch": {"loss_spik": 2}}, "watch: unknown rule 'loss_spik' (did you mean 'loss_spike'"),
    ({"watch": {"loss_spike": 0.5}}, "watch.loss_spike: invalid value 0.5; valid: a factor > 1"),
    ({"watch": {"spike_window": 0}}, "watch.spike_window: invalid value 0; valid: an integer from 1"),
    ({"watch": {"stop": "yes"}}, "watch.stop: invalid value 'yes'; valid: true or false"),
    ({"watch": {r: False for r in ("nan_inf_loss", "nan_inf_grad_norm", "overflow", "loss_spike",
                                   "grad_norm_spike")}}, "watch: every rule is off"),
    ({"watch": True, "anomaly_captures": 2}, "anomaly_captures: 2 bounds the captures of steps: 'anomaly'"),
    ({"watch": True, "steps": "anomaly", "anomaly_captures": 0}, "anomaly_captures: invalid value 0"),
    ({"watch": True, "steps": "anomaly", "anomaly_max_bytes": True}, "anomaly_max_bytes: invalid value True"),
])
def test_watch_keys_are_checked_when_the_configuration_is_built(values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DumpConfig.from_dict(values)


def _shared_nest(depth):
    """A list whose full repr has 2**depth leaves in a few dozen objects, as a YAML alias bomb builds."""
    value = [0]
    for _ in range(depth):
        value = [value, value]
    return value


@pytest.mark.parametrize("watch", [_shared_nest(24), {"stop": _shared_nest(24)}, {"loss_spike": _shared_nest(24)},
                                   {repr(_shared_nest(3)) * 10_000: True}])
def test_a_bad_watch_value_of_any_size_is_shown_bounded(watch):
    """Its repr would be 16 million leaves long: the message shows a few, in little memory."""
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError) as caught:
            WatchRules.parse(watch)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(str(caught.value)) < 400 and "..." in str(caught.value)
    assert peak < 4 << 20


def test_a_watch_configuration_reads_back_from_what_the_manifest_records():
    config = DumpConfig.from_dict({"steps": "anomaly", "watch": {"stop": True, "loss_spike": 5},
                                   "anomaly_captures": 3, "anomaly_max_bytes": 10**9})
    assert config.steps.on_anomaly and config.steps.describe() == "anomaly" and 7 not in config.steps
    assert config.to_dict()["watch"]["loss_spike"] == 5.0
    assert DumpConfig.from_dict(config.to_dict()) == config
    assert DumpConfig.from_dict(DumpConfig().to_dict()) == DumpConfig()


def test_steps_anomaly_with_graph_tensordump_is_refused_at_attach(tmp_path):
    import mf_celldump
    from mf_celldump.errors import AttachError
    from tests.support import capture_net as cn
    from tests.support.ascend_emulation import AscendEmulator

    cn.set_mode("graph")
    emulator = AscendEmulator()
    try:
        with pytest.raises(AttachError, match="the tensordump backend in graph mode has MindSpore select the "
                                              "captured steps from a list given before training.*backend: host"):
            mf_celldump.attach(cn.train_one_step_cell(cn.make_net()),
                               {"dump_path": str(tmp_path / "dump"), "task": "tensor", "backend": "tensordump",
                                "steps": "anomaly", "watch": True}, primitives=emulator.primitives(),
                               watched_by_trainer=True)
    finally:
        emulator.close()
    assert not (tmp_path / "dump" / "_raw").exists() or not any((tmp_path / "dump" / "_raw").iterdir())


# -- the rules -------------------------------------------------------------------------------------------------
def test_nan_and_inf_fire_on_the_loss_the_gradient_norm_and_the_overflow_flag():
    watch = Watch(WatchRules(), rank=2)
    fired = watch.check(7, StepSignals(loss=float("nan"), grad_norm=float("inf"), overflow=True))
    assert [(f.step, f.rank, f.rule) for f in fired] == [(7, 2, "nan_inf_loss"), (7, 2, "nan_inf_grad_norm"),
                                                         (7, 2, "overflow")]
    assert fired[0].text() == "watch: step 7 rank 2: rule nan_inf_loss fired (value nan)"


def test_a_spike_needs_earlier_values_and_is_measured_against_their_median():
    watch = Watch(WatchRules(loss_spike=3.0, spike_window=10))
    for step in range(MIN_HISTORY - 1):
        assert watch.check(step, StepSignals(loss=1.0 + step * 0.01)) == []
    assert watch.check(MIN_HISTORY - 1, StepSignals(loss=float("nan")))[0].rule == "nan_inf_loss"
    assert watch.check(MIN_HISTORY, StepSignals(loss=100.0)) == []  # four finite values: the window is too short
    assert watch.check(MIN_HISTORY + 1, StepSignals(loss=2.9)) == []  # median 1.02: 2.9 is below 3x
    fired = watch.check(MIN_HISTORY + 2, StepSignals(loss=50.0))
    assert [f.rule for f in fired] == ["loss_spike"] and "x the median" in fired[0].text()


def test_the_signals_are_read_from_what_the_training_wrapper_returned():
    loss = Tensor(np.float32(0.5))
    assert signals_from_outputs(loss) == StepSignals(loss=0.5)
    three = signals_from_outputs((loss, Tensor(True), Tensor(np.float32(1024.0))))
    assert three == StepSignals(loss=0.5, overflow=True, loss_scale=1024.0)
    five = (loss, Tensor(False), Tensor(np.float32(1.0)), Tensor(np.float32(1e-4)), Tensor(np.float32(7.0)))
    assert signals_from_outputs(five) == StepSignals(loss=0.5, grad_norm=7.0, overflow=False, loss_scale=1.0)
    assert signals_from_outputs(None) == StepSignals()
    assert ms.__version__  # real MindSpore tensors above


def test_captures_stop_at_anomaly_captures_and_later_firings_are_only_logged():
    config = DumpConfig.from_dict({"steps": "anomaly", "watch": True, "anomaly_captures": 1})
    watched = StepWatch(config)
    watched.after_step(None, 2, StepSignals(loss=float("nan")))  # the one capture: step 3, the step after it
    assert watched.pending is not None and not watched.wants_snapshot
    watched.before_step(None, 3)
    watched.after_step(None, 5, StepSignals(loss=float("nan")))
    assert watched.pending is None and not watched.wants_snapshot
    assert any("anomaly_captures=1 captures are done" in n for n in watched.notes)


def test_a_capture_that_would_pass_anomaly_max_bytes_is_refused_and_training_goes_on(tmp_path):
    import mf_celldump
    from tests.support import capture_net as cn

    cn.set_mode("pynative")
    values = {"dump_path": str(tmp_path / "dump"), "steps": "anomaly", "watch": True, "anomaly_max_bytes": 1000}
    dump = mf_celldump.attach(cn.train_one_step_cell(cn.make_net()), values, watched_by_trainer=True)  # StepWatch
    try:
        (tmp_path / "dump" / "earlier.bin").write_bytes(b"x" * 2000)
        watched = StepWatch(DumpConfig.from_dict(values))
        watched.after_step(dump, 4, StepSignals(loss=float("inf")))
        watched.before_step(dump, 5)
        assert watched.captured == [] and not dump.step_selected(5)
        assert any("would pass anomaly_max_bytes=1000; training goes on" in n for n in watched.notes)
    finally:
        dump.detach()


def test_a_mindformers_monitor_that_stops_training_before_the_watch_is_named():
    from mindformers.core.callback.callback import TrainingStateMonitor

    monitor = TrainingStateMonitor(origin_epochs=1, dataset_size=8, check_for_nan_in_loss_and_grad=True)
    quiet = TrainingStateMonitor(origin_epochs=1, dataset_size=8)
    owner = object()
    assert stopping_callbacks_before([quiet, monitor, owner], owner) == [
        "TrainingStateMonitor (check_for_nan_in_loss_and_grad)"]
    assert stopping_callbacks_before([owner, monitor], owner) == []
