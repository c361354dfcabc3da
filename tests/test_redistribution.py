"""Values MindSpore's parallel pass dumps once per redistributing consumer are one call, one value, one gradient.

Under (semi-)auto parallel MindSpore replaces a value's ``'in'`` TensorDump by one per
parallel-care consumer, also one that takes the producer's layout and needs no redistribution
(``parallel_tensordump.cc``, MindSpore 2.9: ``ParallelProcessor::StepRedistribution`` hands
every such consumer to the handler); it would do the same to an ``'out'`` DumpGradient, but
capture hooks gradients ``'in'`` under the pass, which it leaves on the producer side. The
emulation reproduces that pass (``RedistributedValue``, tests/support/ascend_emulation.py)
on a network whose probed inputs feed 2 and 3 such consumers
(tests/support/redistribution_net.py). Processing must record one forward value
per call, the copies named as parts where their shapes differ, and the one whole gradient;
it must never count consumers as calls. Values are checked against ``mindspore.grad``.
"""

from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest

import mf_celldump
from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives
from tests.support import formats as fmt
from tests.support import redistribution_net as rn
from tests.support.ascend_emulation import AscendEmulator, RedistributedValue
from tests.support.processed import read_output


@pytest.fixture(scope="module")
def reference():
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    return rn.reference(rn.make_net(), rn.make_input())


def _stems(cell_id, sep):
    forward = fmt.raw_stem(fmt.Key(cell_id, fmt.FORWARD, fmt.SLOT_ARG, fmt.KIND_TENSOR, (0,), None), sep)
    backward = fmt.raw_stem(fmt.Key(cell_id, fmt.BACKWARD, fmt.SLOT_ARG, fmt.KIND_TENSOR, (0,), None), sep)
    return forward, backward


def _capture(tmp_path, backend, data_mode):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    emulator = AscendEmulator(parallel=True, latency=0.001)
    values = {name: RedistributedValue(emulator, layouts) for name, layouts in rn.LAYOUTS.items()}
    net = rn.make_net({name: [value.consumer(i) for i in range(len(value.layouts))] for name, value in values.items()})
    mapping = tmp_path / "fans.yaml"
    mapping.write_text(rn.MAPPING)
    config = {"dump_path": str(tmp_path / "dump"), "backend": backend, "data_mode": data_mode,
              "task": "statistics" if backend == "kbk_statistics" else "tensor", "layer_mapping": [str(mapping)],
              "parameters": False, "process_on_train_end": False}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
        try:
            dump = mf_celldump.attach(net, config)
            cells = {s.name: s.cell_id for s in dump.cells}
            sep = "-" if backend == "kbk_statistics" else "."
            for name, value in values.items():
                value.bind(*_stems(cells[name], sep))
            with dump.step(0):
                ms.grad(net, weights=net.trainable_params())(rn.make_input())
            dump.detach()
            emulator.drain()
        finally:
            emulator.close()
    report = mf_celldump.process_captured(dump)
    assert report.ok, report.summary()
    return read_output(str(tmp_path / "dump"), 0), report


def _entries(leaves, name):
    return sorted({key[0] for key in leaves if key[0].startswith(f"Cell.{name}.Fan.")})


def test_tensor_task_one_value_or_named_parts_and_the_whole_gradient(tmp_path, reference):
    (leaves, arrays), report = _capture(tmp_path, "tensordump", "all")
    for name in ("fan2", "fan3"):
        assert _entries(leaves, name) == [f"Cell.{name}.Fan.backward.0", f"Cell.{name}.Fan.forward.0"]
        # The gradient hooked on the producer side: every consumer's share, brought back to its layout, summed.
        gradient = arrays[leaves[(f"Cell.{name}.Fan.backward.0", "output", 0)]["data_name"]]
        np.testing.assert_allclose(gradient, reference[name]["gradient"], rtol=1e-6, atol=1e-6)
    # Two consumers, one layout: the value once.
    np.testing.assert_array_equal(arrays[leaves[("Cell.fan2.Fan.forward.0", "input", 0)]["data_name"]],
                                  reference["fan2"]["input"])
    # Three consumers, one of them on a shard: the shapes differ, so the forward copies are parts.
    forward = _nested(tmp_path, "Cell.fan3.Fan.forward.0", "input_args")
    assert [leaf["shape"] for leaf in forward] == [list(t.shape) for t in reference["fan3"]["takes"]]
    for leaf, take in zip(forward, reference["fan3"]["takes"]):
        np.testing.assert_array_equal(arrays[leaf["data_name"]], take)
    warnings = [w for outcome in report.outcomes for w in outcome.warnings]
    assert any("3 parts" in w and "shapes differ" in w for w in warnings), report.summary()


def _nested(tmp_path, entry, io):
    """The list a value recorded as parts becomes in dump.json (position 0 of ``io``)."""
    with open(tmp_path / "dump" / "step0" / "rank" / fmt.DUMP_JSON, encoding="utf-8") as handle:
        return json.load(handle)["data"][entry][io][0]


def _stats(array):
    wide = array.astype(np.float64)
    return {"Max": wide.max(), "Min": wide.min(), "Mean": wide.mean(), "Norm": np.sqrt((wide * wide).sum())}


def _stats_match(leaf, array) -> bool:
    return list(leaf["shape"]) == list(array.shape) and all(
        leaf[k] == pytest.approx(v, rel=1e-5, abs=1e-6) for k, v in _stats(array).items())


def test_statistics_task_one_value_and_the_whole_gradient(tmp_path, reference):
    """The gradient is hooked on the producer side, so its statistics are those of the whole gradient: no parts,
    whose statistics could not be added up."""
    (leaves, _), report = _capture(tmp_path, "kbk_statistics", "all")
    for name in ("fan2", "fan3"):
        assert _entries(leaves, name) == [f"Cell.{name}.Fan.backward.0", f"Cell.{name}.Fan.forward.0"]
        assert _stats_match(leaves[(f"Cell.{name}.Fan.backward.0", "output", 0)], reference[name]["gradient"])
    assert _stats_match(leaves[("Cell.fan2.Fan.forward.0", "input", 0)], reference["fan2"]["input"])
    forward = _nested(tmp_path, "Cell.fan3.Fan.forward.0", "input_args")
    assert all(_stats_match(leaf, take) for leaf, take in zip(forward, reference["fan3"]["takes"]))
    warnings = [w for outcome in report.outcomes for w in outcome.warnings]
    assert not any("statistics of a sum" in w for w in warnings), report.summary()


def test_forward_only_capture_counts_no_consumer_as_a_call(tmp_path, reference):
    (leaves, arrays), _ = _capture(tmp_path, "tensordump", "forward")
    for name in ("fan2", "fan3"):
        assert _entries(leaves, name) == [f"Cell.{name}.Fan.forward.0"]
    np.testing.assert_array_equal(arrays[leaves[("Cell.fan2.Fan.forward.0", "input", 0)]["data_name"]],
                                  reference["fan2"]["input"])
    assert len(_nested(tmp_path, "Cell.fan3.Fan.forward.0", "input_args")) == 3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_parts_are_summed_exactly_and_rounded_once(tmp_path, dtype):
    """Three parts chosen so that adding them in float32 one after the other loses a bit the exact sum keeps."""
    from mf_celldump.processing.part_sums import round_to_bfloat16, sum_files

    rng = np.random.RandomState(0)
    parts = [rng.randn(64, 33).astype(np.float32) * scale for scale in (1.0, 1e-4, 3e3)]
    if dtype == "bfloat16":
        parts = [round_to_bfloat16(p.astype(np.float64)) for p in parts]
    paths = []
    for index, part in enumerate(parts):
        path = tmp_path / f"c1.b.a.t.nx.p0_{dtype}_{index}.npy"
        np.save(path, part)
        paths.append(str(path))
    out = tmp_path / "sum.npy"
    name, shape, stats = sum_files(paths, str(out), ("max", "norm"), dtype == "bfloat16", 0)
    exact = parts[0].astype(np.float64) + parts[1] + parts[2]
    want = round_to_bfloat16(exact) if dtype == "bfloat16" else exact.astype(np.float32)
    got = np.load(out, allow_pickle=False)
    assert name == "float32" and shape == (64, 33) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(want, (parts[0] + parts[1]) + parts[2]) or dtype == "bfloat16"
    assert stats["Max"] == pytest.approx(float(want.max()))
    assert oct(out.stat().st_mode & 0o777) == "0o640"
