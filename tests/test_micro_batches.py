"""Micro-batches: ``backward.k`` holds the gradients of the micro-batch whose forward is ``forward.k``.

Every value is checked against ``mindspore.grad`` of the model on that micro-batch alone
(tests/support/micro_batch_net.py). On CPU MindSpore's own wrappers run (``nn.GradAccumulationCell``,
``mindspore.parallel.nn.GradAccumulation``), PyNative and graph. The Ascend graph backends,
whose files carry no call, run through the emulation in the orders MindSpore's pipeline and
accumulation schedulers produce (tests/support/pipeline_schedules.py), with the micro-batch
count the capture reads from the wrapper; where MindSpore fixes no order, attach refuses.
"""

from __future__ import annotations

import json
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.parallel.nn import GradAccumulation

import mf_celldump
from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives
from mf_celldump.errors import AttachError
from tests.support import formats as fmt
from tests.support import micro_batch_net as mb
from tests.support import pipeline_schedules as ps
from tests.support.ascend_emulation import AscendEmulator
from tests.support.msrun import msrun_available, run_two_ranks
from tests.support.processed import read_output
from tests.support.rawread import raw_steps

MICRO = 4
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "support", "micro_batch_worker.py")
WRAPPERS = {"GradAccumulationCell": nn.GradAccumulationCell, "GradAccumulation": GradAccumulation}


@pytest.fixture(scope="module")
def reference():
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    return mb.reference(mb.make_model(), mb.make_batch(MICRO), MICRO)


def _run(path, network, config, emulator=None, before_processing=None):
    """One captured step of ``network`` on the micro-batch input; processed."""
    config = dict({"dump_path": str(path), "task": "tensor", "parameters": False, "process_on_train_end": False},
                  **config)
    with pytest.MonkeyPatch.context() as patch:
        if emulator is not None:
            patch.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
        dump = mf_celldump.attach(network, config)
        with dump.step(0):
            network(mb.make_batch(MICRO))
        dump.detach()
        if emulator is not None:
            emulator.drain()
    if before_processing is not None:
        before_processing()
    report = mf_celldump.process_captured(dump)
    assert report.ok, report.summary()
    return read_output(str(path), 0)


def _check_values(path, reference, task="tensor"):
    leaves, arrays = read_output(str(path), 0)
    for key, want in reference.items():
        assert key in leaves, f"{key} not in dump.json"
        if task == "tensor":
            np.testing.assert_allclose(arrays[leaves[key]["data_name"]], want, rtol=1e-5, atol=1e-6,
                                       err_msg=str(key))
        else:
            wide = want.astype(np.float64)
            for name, value in (("Max", wide.max()), ("Min", wide.min()), ("Mean", wide.mean()),
                                ("Norm", np.sqrt((wide * wide).sum()))):
                assert leaves[key][name] == pytest.approx(value, rel=1e-5, abs=1e-6), (key, name)


@pytest.mark.parametrize("mode,backend,wrapper", [
    ("pynative", "tensordump", "GradAccumulationCell"),
    ("pynative", "host", "GradAccumulation"),
    ("graph", "host", "GradAccumulationCell"),
    ("graph", "host", "GradAccumulation"),
])
def test_gradient_accumulation_pairs_each_backward_with_its_micro_batch(tmp_path, reference, mode, backend, wrapper):
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    model = mb.make_model()
    train = nn.TrainOneStepCell(WRAPPERS[wrapper](model, MICRO), nn.SGD(model.trainable_params(), 0.0))
    _run(tmp_path, train, {"backend": backend})
    _check_values(tmp_path, reference)


def _emulated_job(parallel_context):
    emulator = AscendEmulator(parallel=True, latency=0.001)
    emulator.parallel_context = parallel_context
    return emulator


SCHEDULES = {
    # name: (order, chunks, wrapper, MindSpore's parallel settings of the job)
    "1f1b stage 0 of 2": (ps.one_f_one_b(0, 2, MICRO), 1, mb.ScheduledPipeline, {"pipeline_stages": 2}),
    "interleaved stage 0 of 2": (ps.interleaved(0, 2, MICRO, 2), 2, mb.ScheduledPipeline,
                                 {"pipeline_stages": 2, "pipeline_interleave": True}),
    "interleaved stage 1 of 2": (ps.interleaved(1, 2, MICRO, 2), 2, mb.ScheduledPipeline,
                                 {"pipeline_stages": 2, "pipeline_interleave": True}),
    "gradient accumulation": (ps.grad_accumulation(MICRO), 1, mb.ScheduledGradAccumulation, {}),
}


@pytest.mark.parametrize("schedule,backend", [
    ("1f1b stage 0 of 2", "tensordump"),
    ("interleaved stage 0 of 2", "tensordump"),
    ("interleaved stage 1 of 2", "kbk_statistics"),
    ("gradient accumulation", "tensordump"),
])
def test_ascend_graph_backends_pair_micro_batches_in_schedule_order(tmp_path, reference, schedule, backend):
    order, chunks, wrapper, settings = SCHEDULES[schedule]
    ps.check(order, MICRO, chunks)
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    network = wrapper(mb.make_model(), MICRO, order, chunks, folder=str(tmp_path / "source"))
    emulator = _emulated_job(settings)
    task = "statistics" if backend == "kbk_statistics" else "tensor"
    try:
        _run(tmp_path / "dump", network, {"backend": backend, "task": task}, emulator,
             lambda: task == "tensor" and _assert_backward_ran_in_micro_batch_order(emulator, reference))
    finally:
        emulator.close()
    manifest, _ = raw_steps(str(tmp_path / "dump"))
    assert manifest["micro_batches"] == MICRO
    _check_values(tmp_path / "dump", reference, task)


def _assert_backward_ran_in_micro_batch_order(emulator, reference):
    """The raw gradient files of ``back.out`` (one call per micro-batch), by TensorDump id, hold micro-batches
    0, 1, 2, ...: the order numbering backward calls from the end would pair wrongly."""
    found = []
    for path in emulator.written_files:
        parsed = fmt.parse_raw_tensor_name(os.path.basename(path))
        if parsed is None or (parsed.key.direction, parsed.key.slot) != ("backward", "o"):
            continue
        with open(path, "rb") as handle:
            array = np.load(handle, allow_pickle=False)
        for m in range(MICRO):
            want = reference[(f"Cell.back.out.Block.backward.{m}", "input", 0)]
            if array.shape == want.shape and np.allclose(array, want, rtol=1e-5, atol=1e-6):
                found.append((parsed.seq, m))
    assert [m for _, m in sorted(found)] == list(range(MICRO)), found


def _attach_graph(tmp_path, network, settings, data_mode="all", parallel=True):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    emulator = AscendEmulator(parallel=parallel)
    emulator.parallel_context = settings
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
        try:
            dump = mf_celldump.attach(network, {"dump_path": str(tmp_path), "backend": "tensordump",
                                                "data_mode": data_mode})
            dump.detach()
            return dump
        finally:
            emulator.close()


@pytest.mark.parametrize("case", ["stand-alone accumulation", "micro-batch interleave", "seqpipe schedule"])
def test_backward_capture_is_refused_where_mindspore_fixes_no_micro_batch_order(tmp_path, case):
    model = mb.make_model()
    if case == "stand-alone accumulation":
        network, settings, parallel, hint = nn.GradAccumulationCell(model, MICRO), {}, False, "parallel_mode is"
    elif case == "micro-batch interleave":
        network = nn.PipelineCell(nn.MicroBatchInterleaved(model, 2), MICRO)
        settings, parallel, hint = {"pipeline_stages": 2}, True, "micro_batch_interleave_num"
    else:
        network = nn.PipelineCell(model, MICRO)
        settings = {"pipeline_stages": 2, "pipeline_interleave": True, "pipeline_scheduler": "seqpipe"}
        parallel, hint = True, "'seqpipe'"
    with pytest.raises(AttachError) as caught:
        _attach_graph(tmp_path / "all", network, settings, parallel=parallel)
    assert hint in str(caught.value) and "data_mode: forward" in str(caught.value)
    assert not (tmp_path / "all" / fmt.RAW_ROOT / "rank0" / fmt.MANIFEST_FILE).exists()
    dump = _attach_graph(tmp_path / "forward", network, settings, "forward", parallel)  # forward only: no pairing
    assert dump.micro_batches.count == MICRO * (2 if case == "micro-batch interleave" else 1)
    with open(tmp_path / "forward" / fmt.RAW_ROOT / "rank0" / fmt.MANIFEST_FILE, encoding="utf-8") as handle:
        assert json.load(handle)["micro_batches"] == dump.micro_batches.count


@pytest.fixture(scope="module")
def two_rank_job(tmp_path_factory):
    """One 2-rank data-parallel msrun job; each rank checks its own dump (tests/support/micro_batch_worker.py)."""
    if not msrun_available():
        pytest.skip("msrun is not installed next to this Python")
    out = tmp_path_factory.mktemp("two_ranks")
    proc, logs = run_two_ranks(WORKER, [str(out)], str(out / "msrun_log"), str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + logs
    results = {}
    for rank in (0, 1):
        with open(out / f"result_rank{rank}.json", encoding="utf-8") as handle:
            results[rank] = json.load(handle)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("case", ["pynative/tensordump/GradAccumulationCell", "graph/host/GradAccumulation"])
def test_two_rank_data_parallel_accumulation_pairs_micro_batches_on_each_rank(two_rank_job, case):
    for rank in (0, 1):
        result = two_rank_job[rank][case]
        assert result["distributed"] and result["checked"] > 50 and result["bad"] == [], (rank, result)
    assert two_rank_job[0][case]["first"] != two_rank_job[1][case]["first"]  # each rank had its own data
