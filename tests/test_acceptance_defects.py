"""The acceptance checks catch every defect they guard against: each re-injected, one at a time, makes them FAIL.

The scenarios of ``examples/ascend/acceptance_scenarios.py`` run here against the CPU
emulation of the Ascend primitives (tests/support/ascend_emulation.py), as
``examples/ascend/acceptance.sh --emulate`` runs them. Clean, every check passes. Then each
defect is put back by a monkeypatch of the fixed code (or of the emulated primitive the
fixed code calls), its scenario runs again, and at least one check must FAIL with a line
naming that defect. docs/acceptance.md is the table of what is re-injected and how it is caught.
"""

from __future__ import annotations

import os
import sys

import pytest
from mindspore.ops.primitive import constexpr

from mf_celldump.capture import parameters
from mf_celldump.capture import session as capture_session
from mf_celldump.capture.backends import tensordump as tensordump_backend
from mf_celldump.capture.backends.kbk_statistics import KbkStatisticsBackend
from mf_celldump.capture.backends.tensordump import TensorDumpBackend
from mf_celldump.capture.backends.tensordump_steps import GraphStepMap
from mf_celldump.capture.graph_switch import GraphSwitch
from mf_celldump.integrations.run import TrainingRun
from mf_celldump.processing import consumer_parts, entries, entry_build
from tests.support.ascend_emulation import AscendEmulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples", "ascend"))

import acceptance_checks as ac  # noqa: E402
import acceptance_scenarios as sc  # noqa: E402

pytestmark = pytest.mark.slow


# -- the defects, put back -----------------------------------------------------------------------------------
def _markers_only_on_captured_steps(patch):
    """The update-step marker sent only after captured steps: MindSpore's graph step counter lags."""
    original = TensorDumpBackend._step_boundary

    def boundary(self, step, captured):
        if captured:
            original(self, step, captured)
        else:
            self.primitives.synchronize()

    patch.setattr(TensorDumpBackend, "_step_boundary", boundary)


def _no_step_done_marker(patch):
    """No step-done marker after a captured step's files: nothing tells processing MindSpore has finished it."""
    def boundary(self, step, captured):
        self.primitives.synchronize()
        if captured:
            self.steps.note_captured(step)
        self._send(self.primitives.send_update_marker, f"the end of step {step}")

    patch.setattr(TensorDumpBackend, "_step_boundary", boundary)


def _no_waiting_for_the_writer(patch):
    """A step is processed as soon as training ends it, not after waiting for MindSpore's writer (whose files
    trail the steps on the emulated device)."""
    patch.setattr(TrainingRun, "_wait_s", lambda self, failed=False: 0.0)


def _captured_graph_on_every_step(patch):
    """Every step runs the graph with capture ops, as every step of a selected sink does in dataset sink mode
    (one graph runs sink_size steps; ``capture/graph_switch.py``): elsewhere an unselected step runs a graph
    without TensorDump, and the two defects below that act on unselected steps could not show."""
    patch.setattr(GraphSwitch, "compiles_captured", lambda self: True)


def _markers_only_on_captured_steps_every_step_captured(patch):
    _captured_graph_on_every_step(patch)
    _markers_only_on_captured_steps(patch)


def _empty_filter_for_nothing_every_step_captured(patch):
    _captured_graph_on_every_step(patch)
    _empty_filter_for_nothing(patch)


def _empty_filter_for_nothing(patch):
    """No selected step left: the empty list (MindSpore: every step) instead of an unreachable step."""
    patch.setattr(GraphStepMap, "mindspore_filter", lambda self: [] if self.counters is None else list(self.counters))


def _gradient_hook_in_the_same_mode(patch):
    """DumpGradient given the other mode than capture asks for: 'out' hooks where capture puts 'in' ones, which the
    parallel pass deletes and clones onto the consumers."""
    original = AscendEmulator.dump_gradient

    def dump_gradient(self):
        inner = original(self)

        def same_mode(path, x, input_output):
            return inner(path, x, "in" if input_output == "out" else "out")

        same_mode.add_prim_attr = inner.add_prim_attr  # still MindSpore's primitive otherwise
        return same_mode

    patch.setattr(AscendEmulator, "dump_gradient", dump_gradient)


def _gradients_from_the_optimizer_inside_the_branch(patch):
    """Weight gradients taken where the optimizer receives them, with nothing to see that a wrapper calls it under
    ``if not overflow``: the probes go into the branch (as before the parameter hook in graph mode)."""
    def no_graph_hook(self, graph_probe=None, plain=None):
        if graph_probe is not None:
            raise TypeError("parameter hooks left out")
        return original(self, graph_probe, plain)

    original = parameters.ParameterCapture.hook_parameters
    patch.setattr(parameters.ParameterCapture, "hook_parameters", no_graph_hook)
    patch.setattr(parameters, "conditional_call", lambda *args: None)


def _assign_calls_from_the_end(patch):
    """Backward calls numbered from the end of the step, ignoring the micro-batch count."""
    patch.setattr(entry_build, "assign_calls",
                  lambda captures, shape_of=None, micro_batches=1: entries.assign_calls(captures, shape_of, 1))


def _pass_unseen(patch):
    """The capture blind to MindSpore's parallel pass: a widened 'in' probe dumped and hooked as without it, so the
    pass clones both after the cast back (bfloat16 under a float32 name)."""
    patch.setattr(TensorDumpBackend, "under_parallel_pass", lambda self: False)


def _no_widened_out_refusal(patch):
    """A widened 'out' probe under the pass not refused: it records the reduced value of an AllReduce output where
    float32 probes and the tensor task record the partial sum."""
    patch.setattr(tensordump_backend, "_make_parallel_widening_refusal",
                  lambda enabled, backend: constexpr(lambda wide, head, use_in: 0))


def _consumer_side_hooks(patch):
    """An 'in' probe's gradient hooked 'out' (msprobe 26.2's pairing) under the pass: cloned onto the parallel-care
    consumers only, so a user outside them is missing from the recorded gradient."""
    patch.setattr(tensordump_backend, "_hook_modes", lambda parallel: ("out", "in"))


def _copies_never_one_value(patch):
    """Copies of one shape taken for different values, as if only a redistribution could make a copy."""
    patch.setattr(consumer_parts._CallMerger, "_contents_differ", lambda self, copies: True)


def _contents_not_compared(patch):
    """Copies of one shard shape taken for one region without comparing what they hold."""
    patch.setattr(consumer_parts._CallMerger, "_contents_differ", lambda self, copies: False)


def _iteration_from_the_process_start(patch):
    """The statistics dump's iteration left where MindSpore starts it (0 in every process), not pinned to the
    global step at attach and at each step."""
    setup = KbkStatisticsBackend.setup

    def begin_step(self, step, captured):
        self._check_consecutive(step)
        return False

    patch.setattr(KbkStatisticsBackend, "setup", lambda self, initial_step: setup(self, 0))
    patch.setattr(KbkStatisticsBackend, "begin_step", begin_step)


DEFECTS = {
    # label: (scenario, how it is re-injected)
    ac.STEP_MARKERS: ("steps", _markers_only_on_captured_steps_every_step_captured),
    ac.STEP_DONE: ("steps", _no_step_done_marker),
    ac.WRITER_RACE: ("steps", _no_waiting_for_the_writer),
    ac.EMPTY_FILTER: ("past", _empty_filter_for_nothing_every_step_captured),
    ac.IN_PAIRING: ("in_pairing", _gradient_hook_in_the_same_mode),
    ac.TD_FLAG: ("statistics", lambda p: p.setattr(TensorDumpBackend, "_mark_forward_primitives", lambda self: None)),
    ac.KBK_ITERATION: ("statistics_resumed", _iteration_from_the_process_start),
    ac.VERSION: ("version", lambda p: p.setattr(capture_session, "mindspore_version_problem", lambda installed: None)),
    ac.MICRO_BATCHES: ("micro_batches", _assign_calls_from_the_end),
    ac.REDISTRIBUTION: ("redistribution", lambda p: p.setattr(entry_build, "merge_consumer_parts",
                                                              lambda captures, *args, **kwargs: captures)),
    ac.EVERY_CONSUMER: ("redistribution", _copies_never_one_value),
    ac.WIDENED_IN: ("parallel_pass", _pass_unseen),
    ac.FORWARD_COMM: ("parallel_pass", _no_widened_out_refusal),
    ac.REGIONS: ("parallel_pass", _contents_not_compared),
    ac.OUTSIDE_USER: ("parallel_pass", _consumer_side_hooks),
    ac.CONTROL_FLOW: ("control_flow", _gradients_from_the_optimizer_inside_the_branch),
    ac.STEP_FILTER: ("step_filter", lambda p: p.setattr(TensorDumpBackend, "teardown", lambda self: None)),
    ac.SECOND_KIND: ("second_kind", lambda p: p.setattr(tensordump_backend, "check_tensordump_can_write",
                                                        lambda environ: None)),
    ac.SLICING: ("slicing", lambda p: p.setattr(tensordump_backend, "advise_slicing", lambda environ: None)),
    ac.BF16: ("bf16", lambda p: p.setattr(KbkStatisticsBackend, "widens_low_precision", False)),
    ac.GE_CHECK: ("ge_check", lambda p: p.setattr("mf_celldump.capture.backends.kbk_statistics.compile_backend",
                                                  _jit_level_only)),
    ac.CHANNEL: ("channel", lambda p: p.setattr(tensordump_backend, "check_channel", lambda policy: None)),
}


def _jit_level_only(cells, environ, soc_version):
    """The GE check as it was: only jit_level O2 (global or a cell's) means GE."""
    from mf_celldump.capture.backends import compile_backend as cb

    level = next((c.jit_config_dict.get("jit_level") for c in cells if getattr(c, "jit_config_dict", None)), "")
    level = level or cb._global_level()
    return cb.CompileBackend(cb.GE if level == "O2" else cb.MS_BACKEND, f"jit_level={level!r}")


def _run(scenario, workdir):
    os.makedirs(workdir, exist_ok=True)
    return sc.SCENARIOS[scenario](str(workdir), True)


@pytest.fixture(autouse=True)
def short_waits(monkeypatch):
    monkeypatch.setattr(sc, "WAIT_S", 5.0)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Every scenario once, nothing re-injected."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sc, "WAIT_S", 5.0)
        return {name: _run(name, tmp_path_factory.mktemp(name)) for name in sc.SCENARIOS}


def test_every_check_passes_without_a_defect(clean):
    failed = [text for checks in clean.values() for ok, text in checks if not ok]
    assert not failed, failed
    labels = {text[1:].split("]", 1)[0] for checks in clean.values() for _, text in checks}
    assert set(DEFECTS) <= labels, set(DEFECTS) - labels


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_each_defect_put_back_makes_a_check_fail_naming_it(tmp_path, monkeypatch, defect):
    scenario, inject = DEFECTS[defect]
    inject(monkeypatch)
    checks = _run(scenario, tmp_path / "run")
    failed = [text for ok, text in checks if not ok]
    print(f"{defect}: " + (" | ".join(f"FAIL {text}" for text in failed) or "no FAIL"))  # shown with -s / -rA
    assert any(text.startswith(f"[{defect}]") for text in failed), checks
