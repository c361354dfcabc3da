"""What MindSpore's parallel pass does to dumps beyond per-consumer copies, emulated, and what capture makes of it.

MindSpore 2.9's ``parallel_tensordump.cc`` (v2.9.0): copies go on each parallel-care consumer's input,
after any Cast (so after a statistics capture's cast back from its float32 copy); an ``'out'``
TensorDump of an op completed by a forward AllReduce is re-pointed to the partial sum, unless a Cast
stands between; a user outside the pass's consumers gets no copy and its gradient is dumped nowhere;
copies of one shard shape may hold different regions. The emulation (``RedistributedValue``,
``ForwardCommunication`` in tests/support/ascend_emulation.py) reproduces each on
tests/support/parallel_pass_net.py. Capture: every gradient hook is ``'in'`` under the pass, left on
the producer side where the outside user's share is summed in (the whole gradient, as
``mindspore.grad`` gives it); statistics refuse an ``'out'`` float32 copy under the pass (its dtype is
known at compile, before the graph runs) and dump a widened ``'in'`` probe on the producer side;
processing keeps copies of different contents as parts.
"""

from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest

import mf_celldump
from mf_celldump.capture.backends import tensordump
from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives
from mf_celldump.capture.backends.tensordump import TensorDumpBackend
from mf_celldump.errors import BackendSetupError
from tests.support import formats as fmt
from tests.support import parallel_pass_net as pn
from tests.support.ascend_emulation import AscendEmulator, ForwardCommunication, RedistributedValue
from tests.support.processed import read_output

RANKS = 2


@pytest.fixture(scope="module")
def reference():
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    return pn.reference(pn.make_net(), pn.make_input(), RANKS)


def _stem(cell_id, direction, slot, sep):
    return fmt.raw_stem(fmt.Key(cell_id, direction, slot, fmt.KIND_TENSOR, (0,), None), sep)


def capture(tmp_path, backend, data_mode, patch=None, row_dtype=ms.float32):
    """One captured step of the network under the emulated parallel pass; (leaves, arrays), report."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    emulator = AscendEmulator(parallel=True, latency=0.001)
    values = {name: RedistributedValue(emulator, layouts) for name, layouts in pn.LAYOUTS.items()}
    comm = ForwardCommunication(emulator, RANKS)
    net = pn.make_net({name: [v.consumer(i) for i in range(len(v.layouts))] for name, v in values.items()},
                      comm.allreduce(), row_dtype)
    mapping = tmp_path / "pass.yaml"
    mapping.write_text(pn.MAPPING)
    config = {"dump_path": str(tmp_path / "dump"), "backend": backend, "data_mode": data_mode,
              "task": "statistics" if backend == "kbk_statistics" else "tensor", "layer_mapping": [str(mapping)],
              "parameters": False, "process_on_train_end": False}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
        if patch is not None:
            patch(mp)
        try:
            dump = mf_celldump.attach(net, config)
            cells = {s.name: s.cell_id for s in dump.cells}
            sep = "-" if backend == "kbk_statistics" else "."
            for name, value in values.items():
                # a statistics capture names its float32 copy of a bfloat16 value (names.raw_stem widened_from)
                wide = "-wbfloat16" if name == "widened" and sep == "-" else ""
                value.bind(_stem(cells[name], fmt.FORWARD, fmt.SLOT_ARG, sep) + wide,
                           _stem(cells[name], fmt.BACKWARD, fmt.SLOT_ARG, sep) + wide)
            comm.bind(_stem(cells["row"], fmt.FORWARD, fmt.SLOT_OUTPUT, sep))
            with dump.step(0):
                ms.grad(net, weights=net.trainable_params())(pn.make_input())
            dump.detach()
            emulator.drain()
        finally:
            emulator.close()
    report = mf_celldump.process_captured(dump)
    return read_output(str(tmp_path / "dump"), 0), report


def _nested(tmp_path, entry, io):
    with open(tmp_path / "dump" / "step0" / "rank" / fmt.DUMP_JSON, encoding="utf-8") as handle:
        return json.load(handle)["data"][entry][io][0]


def _stats(array):
    wide = np.asarray(array, np.float64)
    return {"Max": wide.max(), "Min": wide.min(), "Mean": wide.mean(), "Norm": np.sqrt((wide * wide).sum())}


def _stats_close(leaf, array, rtol) -> bool:
    return all(leaf[k] == pytest.approx(v, rel=rtol, abs=1e-7) for k, v in _stats(array).items())


def test_copies_of_one_shard_shape_holding_different_regions_stay_parts(tmp_path, reference):
    (leaves, arrays), report = capture(tmp_path, "tensordump", "all")
    assert report.ok, report.summary()
    want = reference["regions"]
    forward = _nested(tmp_path, "Cell.regions.Regions.forward.0", "input_args")
    assert len(forward) == 2
    for leaf, take in zip(forward, want["takes"]):
        np.testing.assert_array_equal(arrays[leaf["data_name"]], take)
    # the gradient is taken on the producer side: one value, the regions' shares brought back and summed
    backward = arrays[leaves[("Cell.regions.Regions.backward.0", "output", 0)]["data_name"]]
    np.testing.assert_allclose(backward, want["gradient"], rtol=1e-6, atol=1e-6)
    warnings = [w for outcome in report.outcomes for w in outcome.warnings]
    assert any("contents differ" in w for w in warnings), report.summary()


def _consumer_side_hooks(mp):
    """Put back: an 'in' probe's gradient hooked 'out' (msprobe 26.2's pairing), which the pass clones per consumer."""
    mp.setattr(tensordump, "_hook_modes", lambda parallel: ("out", "in"))


@pytest.mark.parametrize("backend, put_back", [("tensordump", False), ("kbk_statistics", False),
                                               ("tensordump", True)],
                         ids=["tensor", "statistics", "put_back_consumer_side_hook"])
def test_a_user_outside_the_pass_consumers_adds_to_the_recorded_gradient(tmp_path, reference, backend, put_back):
    """The pass deletes an 'out' gradient hook for every user of the value and clones it only onto the
    parallel-care consumers (PTD HandleDumpAfterRedistributionNode), so a user outside them adds to the gradient
    where no clone sees it. Capture hooks 'in', which the pass leaves on the producer side: the recorded gradient
    is the whole one, as mindspore.grad gives it in PyNative without the pass. Put back, only the consumer's share
    is recorded."""
    (leaves, arrays), report = capture(tmp_path, backend, "all", _consumer_side_hooks if put_back else None)
    assert report.ok, report.summary()
    want = reference["outside"]
    assert not np.allclose(want["parts"][0], want["gradient"], rtol=1e-3)  # the consumer's share alone differs
    forward = leaves[("Cell.outside.Outside.forward.0", "input", 0)]
    backward = leaves[("Cell.outside.Outside.backward.0", "output", 0)]
    if backend == "kbk_statistics":
        assert _stats_close(forward, want["input"], 2e-6)
        assert _stats_close(backward, want["gradient"], 2e-6)
        return
    np.testing.assert_array_equal(arrays[forward["data_name"]], want["input"])
    got = arrays[backward["data_name"]]
    assert np.allclose(got, want["parts"][0], rtol=1e-6, atol=1e-6) is put_back
    assert np.allclose(got, want["gradient"], rtol=1e-6, atol=1e-6) is not put_back


def test_an_out_dump_of_an_allreduce_output_holds_the_partial_sum(tmp_path, reference):
    (leaves, arrays), _ = capture(tmp_path, "tensordump", "forward")
    got = arrays[leaves[("Cell.row.Row.forward.0", "output", 0)]["data_name"]]
    np.testing.assert_array_equal(got, reference["row"]["partial"])
    assert not np.array_equal(got, reference["row"]["reduced"])


def test_statistics_refuse_an_out_probe_of_a_widened_value_under_the_parallel_pass(tmp_path):
    with pytest.raises(BackendSetupError, match="MakeOutModeDumpBeforeFwdComm"):
        capture(tmp_path, "kbk_statistics", "all", row_dtype=ms.bfloat16)


def _pass_unseen(mp):
    mp.setattr(TensorDumpBackend, "under_parallel_pass", lambda self: False)


def test_the_pass_unseen_puts_bfloat16_in_the_copies_and_the_reduced_value_in_out_dumps(tmp_path, reference):
    """What capture avoids, as the emulation models it: a widened 'in' dump left to the pass is cloned after the
    cast back (its statistics rounded to bfloat16), and a widened 'out' dump of an AllReduce output keeps the
    reduced value where a float32 one is given the partial sum."""
    (leaves, _), _ = capture(tmp_path, "kbk_statistics", "forward", _pass_unseen, ms.bfloat16)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    row_reference = pn.reference(pn.make_net(row_dtype=ms.bfloat16), pn.make_input(), RANKS)["row"]
    row = leaves[("Cell.row.Row.forward.0", "output", 0)]
    assert _stats_close(row, row_reference["reduced"], 1e-6)
    assert not _stats_close(row, row_reference["partial"], 1e-3)
    widened = leaves[("Cell.widened.Widened.forward.0", "input", 0)]
    exact = _stats(reference["widened"]["input"])
    assert widened["Norm"] != pytest.approx(exact["Norm"], rel=1e-6)
    assert widened["Norm"] == pytest.approx(exact["Norm"], rel=1e-2)


@pytest.mark.parametrize("seen", [True, False], ids=["producer_side", "put_back_pass_unseen"])
def test_statistics_take_a_widened_in_probe_on_the_producer_side(tmp_path, reference, seen):
    """Under the pass a widened 'in' probe is dumped and hooked on its float32 copy, which the pass leaves in
    place: float32 statistics of the value and of its whole gradient. Put back (the pass not seen): the
    clones come after the cast back, so the statistics come back in bfloat16 under a float32 name."""
    (leaves, _), report = capture(tmp_path, "kbk_statistics", "all", None if seen else _pass_unseen)
    assert report.ok, report.summary()
    want = reference["widened"]
    forward = leaves[("Cell.widened.Widened.forward.0", "input", 0)]
    backward = leaves[("Cell.widened.Widened.backward.0", "output", 0)]
    assert _stats_close(forward, want["input"], 2e-6) is seen
    assert _stats_close(backward, want["gradient"], 2e-6) is seen
