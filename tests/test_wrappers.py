"""Training wrappers are found by what they hold: MindFormers' and unknown ones are peeled, or refused at attach.

Each MindFormers 1.8/1.9 wrapper (``mindformers/wrapper/wrapper.py``, ``modules/seq_pipe.py``,
as ``BaseTrainer._wrap_network_with_tool_cells[_legacy]`` builds them) and test-only
wrappers of unknown classes (tests/support/wrapper_nets.py) run for real around the
micro-batch model (tests/support/micro_batch_net.py) on CPU, PyNative and graph: the
entries are those of the unwrapped model, and each micro-batch's values and gradients
equal ``mindspore.grad`` on that micro-batch alone. The Ascend graph backends (through
the emulation) accept or refuse each wrapper exactly as they do MindSpore's own
(``nn.GradAccumulationCell``, ``nn.PipelineCell``), with the micro-batch count read from
the wrapper's slicer list.
"""

from __future__ import annotations

import json

import mindspore as ms
import numpy as np
import pytest
from mindformers.modules.seq_pipe import SequenceSplit
from mindformers.wrapper.wrapper import (
    DataOrderWrapperCell,
    GradAccumulationCellWithMultiOutputs,
    GradAccumulationCellWithTwoOutput,
    PipelineCellWithMultiOutputs,
    PipelineCellWithTwoOutput,
)
from mindspore import nn
from mindspore.nn.wrap.cell_wrapper import _VirtualDatasetCell

import mf_celldump
from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives
from mf_celldump.errors import AttachError
from tests.support import formats as fmt
from tests.support import micro_batch_net as mb
from tests.support import pipeline_schedules as ps
from tests.support import wrapper_nets as wn
from tests.support.ascend_emulation import AscendEmulator
from tests.support.processed import read_output

MICRO = 2

# name: (build the network to train around ``model``, prefix of the model's cells in the entry names)
WRAPPED = {
    "GradAccumulationCellWithMultiOutputs": (lambda m: GradAccumulationCellWithMultiOutputs(m, MICRO), ""),
    "PipelineCellWithMultiOutputs (pipeline_stages 1)": (lambda m: PipelineCellWithMultiOutputs(m, MICRO), ""),
    "GradAccumulationCellWithTwoOutput": (lambda m: GradAccumulationCellWithTwoOutput(wn.TwoOutputModel(m), MICRO),
                                          "model."),
    "PipelineCellWithTwoOutput (pipeline_stages 1)": (
        lambda m: PipelineCellWithTwoOutput(wn.TwoOutputModel(m), MICRO), "model."),
    "[_VirtualDatasetCell >] accumulation > DataOrderWrapperCell": (lambda m: _as_the_trainer_builds(m), ""),
    "MicroBatchInterleaved": (lambda m: nn.MicroBatchInterleaved(m, MICRO), ""),
    "unknown class with its own slicer list": (lambda m: wn.SlicingAccumulation(m, MICRO), ""),
}


def _as_the_trainer_builds(model):
    """What ``BaseTrainer`` builds for an mcore model with accumulation: the virtual dataset only in graph mode
    (its primitive has no CPU kernel in PyNative, and MindFormers adds it in graph mode only)."""
    network = GradAccumulationCellWithMultiOutputs(DataOrderWrapperCell(["x"], model), MICRO)
    return _VirtualDatasetCell(network) if ms.get_context("mode") == ms.GRAPH_MODE else network


@pytest.fixture(scope="module")
def reference():
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    return mb.reference(mb.make_model(), mb.make_batch(MICRO), MICRO)


def _train_step(network, model):
    """MindSpore's training step, or (for a two-output network, whose loss it cannot seed) one of an unknown class."""
    optimizer = nn.SGD(model.trainable_params(), 0.0)  # no update: the reference stays valid
    if isinstance(network, (GradAccumulationCellWithTwoOutput, PipelineCellWithTwoOutput)):
        return wn.TupleTrainStep(network, optimizer)
    return nn.TrainOneStepCell(network, optimizer)


def _capture(path, network, batches, config=None, emulator=None):
    """One captured step running ``network`` on each of ``batches``; processed; the step's entry names."""
    config = dict({"dump_path": str(path), "task": "tensor", "parameters": False, "process_on_train_end": False},
                  **(config or {}))
    with pytest.MonkeyPatch.context() as patch:
        if emulator is not None:
            patch.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
        dump = mf_celldump.attach(network, config)
        with dump.step(0):
            for batch in batches:
                network(batch)
        dump.detach()
        if emulator is not None:
            emulator.drain()
    report = mf_celldump.process_captured(dump)
    assert report.ok, report.summary()
    with open(path / "step0" / "rank" / fmt.DUMP_JSON, encoding="utf-8") as handle:
        return set(json.load(handle)["data"])


def _check_values(path, reference, prefix="", task="tensor"):
    leaves, arrays = read_output(str(path), 0)
    for (entry, io, index), want in reference.items():
        key = (entry.replace("Cell.", f"Cell.{prefix}", 1), io, index)
        assert key in leaves, f"{key} not in dump.json"
        if task == "tensor":
            np.testing.assert_allclose(arrays[leaves[key]["data_name"]], want, rtol=1e-5, atol=1e-6, err_msg=str(key))
        else:
            wide = want.astype(np.float64)
            assert leaves[key]["Max"] == pytest.approx(wide.max(), rel=1e-5, abs=1e-6), key
            assert leaves[key]["Norm"] == pytest.approx(np.sqrt((wide * wide).sum()), rel=1e-5, abs=1e-6), key


@pytest.fixture(scope="module")
def unwrapped_names(tmp_path_factory):
    """Per mode, the entry names of the bare model trained once per micro-batch (no wrapper at all)."""
    names = {}
    for mode in ("pynative", "graph"):
        wn.set_mode(mode)
        model = mb.make_model()
        batch = mb.make_batch(MICRO)
        parts = [batch[m * mb.ROWS:(m + 1) * mb.ROWS] for m in range(MICRO)]
        names[mode] = _capture(tmp_path_factory.mktemp(mode), _train_step(model, model), parts, {"backend": "host"})
    return names


@pytest.mark.parametrize("mode", ["pynative", "graph"])
@pytest.mark.parametrize("wrapper", list(WRAPPED))
def test_wrappers_are_peeled_with_the_unwrapped_names_and_each_micro_batch_paired(tmp_path, reference, unwrapped_names,
                                                                                 wrapper, mode):
    wn.set_mode(mode)
    build, prefix = WRAPPED[wrapper]
    model = mb.make_model()
    network = build(model)
    names = _capture(tmp_path, _train_step(network, model), [mb.make_batch(MICRO)], {"backend": "host"})
    want = {name.replace("Cell.", f"Cell.{prefix}", 1) for name in unwrapped_names[mode]}
    if prefix:  # the two-output model holds the bare one, captured as a cell of its own
        want |= {f"Cell.model.Model.{direction}.{m}" for direction in ("forward", "backward") for m in range(MICRO)}
    assert names == want
    _check_values(tmp_path, reference, prefix)


def test_pynative_tensordump_pairs_a_mindformers_accumulation_like_mindspores_own(tmp_path, reference):
    wn.set_mode("pynative")
    for name, wrapper in (("mindformers", GradAccumulationCellWithMultiOutputs), ("mindspore",
                                                                                   nn.GradAccumulationCell)):
        model = mb.make_model()
        network = nn.TrainOneStepCell(wrapper(model, MICRO), nn.SGD(model.trainable_params(), 0.0))
        _capture(tmp_path / name, network, [mb.make_batch(MICRO)], {"backend": "tensordump"})
        _check_values(tmp_path / name, reference)


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_accumulation_around_a_loss_cell_trains_under_capture(tmp_path, mode):
    """The fact sheet's case: ``GradAccumulationCellWithMultiOutputs(nn.WithLossCell(net, loss), 2)`` inside
    ``nn.TrainOneStepCell`` trains on CPU, and its entries are those of ``WithLossCell(net, loss)`` alone."""
    wn.set_mode(mode)
    rng = np.random.RandomState(3)
    data = ms.Tensor(rng.randn(MICRO * mb.ROWS, mb.WIDTH).astype(np.float32))
    label = ms.Tensor(rng.randn(MICRO * mb.ROWS, mb.WIDTH).astype(np.float32))
    found = {}
    for kind in ("wrapped", "bare"):
        net = mb.make_model().front
        loss = nn.WithLossCell(net, nn.MSELoss())
        inner = GradAccumulationCellWithMultiOutputs(loss, MICRO) if kind == "wrapped" else loss
        step = nn.TrainOneStepCell(inner, nn.SGD(net.trainable_params(), 0.1))
        before = net.inp.lin.weight.asnumpy().copy()
        config = {"dump_path": str(tmp_path / kind), "backend": "host", "process_on_train_end": False}
        dump = mf_celldump.attach(step, config)
        with dump.step(0):
            value = step(data, label)
        dump.detach()
        assert np.isfinite(value.asnumpy()).all()
        assert not np.allclose(net.inp.lin.weight.asnumpy(), before)  # it trained
        assert mf_celldump.process_captured(dump).ok
        with open(tmp_path / kind / "step0" / "rank" / fmt.DUMP_JSON, encoding="utf-8") as handle:
            found[kind] = {name.rsplit(".", 1)[0] for name in json.load(handle)["data"]}  # calls differ: 2 vs 1
    assert found["wrapped"] == found["bare"]


# -- refused at attach ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_sequence_split_is_refused_at_attach_with_the_reason(tmp_path, mode):
    wn.set_mode(mode)
    model = mb.make_model()
    network = nn.TrainOneStepCell(SequenceSplit(model, split_num=2), nn.SGD(model.trainable_params(), 0.0))
    with pytest.raises(AttachError) as caught:
        mf_celldump.attach(network, {"dump_path": str(tmp_path), "backend": "host"})
    text = str(caught.value)
    assert "SequenceSplit at 'network'" in text and "sequence axis" in text and "seq_split_num: 1" in text
    assert not (tmp_path / fmt.RAW_ROOT).exists()  # refused before anything is written


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_unknown_wrapper_that_slices_in_a_loop_is_refused_naming_class_place_and_remedy(tmp_path, mode):
    wn.set_mode(mode)
    model = mb.make_model()
    network = nn.TrainOneStepCell(wn.LoopingAccumulation(model, MICRO), nn.SGD(model.trainable_params(), 0.0))
    with pytest.raises(AttachError) as caught:
        mf_celldump.attach(network, {"dump_path": str(tmp_path), "backend": "host"})
    text = str(caught.value)
    assert "LoopingAccumulation at 'network'" in text and "calls net (Model" in text and "slicer" in text


def test_training_wrapper_without_a_single_model_child_is_refused(tmp_path):
    wn.set_mode("pynative")
    with pytest.raises(AttachError) as caught:
        mf_celldump.attach(wn.two_model_step(), {"dump_path": str(tmp_path), "backend": "host"})
    text = str(caught.value)
    assert "TwoModelStep (the attached network)" in text and "network: 6, shadow: 6" in text


# -- the Ascend graph backends, through the emulation ----------------------------------------------
def _attach_outcome(tmp_path, network, settings, parallel):
    """(accepted, micro-batch count or the refusal's text) of a tensordump attach in the emulated job."""
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    emulator = AscendEmulator(parallel=parallel)
    emulator.parallel_context = settings
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
            dump = mf_celldump.attach(network, {"dump_path": str(tmp_path), "backend": "tensordump"})
            dump.detach()
            return True, dump.micro_batches.count
    except AttachError as err:
        return False, str(err).split(" with ", 1)[1].split(":", 1)[1].strip()[:40]
    finally:
        emulator.close()


JOBS = {  # name: (MindSpore's auto-parallel settings of the job, semi_auto_parallel)
    "stand-alone": ({}, False),
    "semi-auto": ({}, True),
    "semi-auto, 2 stages 1f1b": ({"pipeline_stages": 2}, True),
    "semi-auto, 2 stages seqpipe": ({"pipeline_stages": 2, "pipeline_interleave": True,
                                     "pipeline_scheduler": "seqpipe"}, True),
}
LIKE_MINDSPORE = {  # wrapper: (build around the model, MindSpore's own wrapper it must behave like)
    "GradAccumulationCellWithMultiOutputs": (lambda m: GradAccumulationCellWithMultiOutputs(m, MICRO),
                                             nn.GradAccumulationCell),
    "GradAccumulationCellWithTwoOutput": (lambda m: GradAccumulationCellWithTwoOutput(wn.TwoOutputModel(m), MICRO),
                                          nn.GradAccumulationCell),
    "PipelineCellWithMultiOutputs": (lambda m: PipelineCellWithMultiOutputs(m, MICRO), nn.PipelineCell),
    "PipelineCellWithTwoOutput": (lambda m: PipelineCellWithTwoOutput(wn.TwoOutputModel(m), MICRO), nn.PipelineCell),
    "unknown class, slicers marked grad_accu_num": (lambda m: wn.SlicingAccumulation(m, MICRO, True),
                                                   nn.GradAccumulationCell),
}


@pytest.mark.parametrize("job", list(JOBS))
@pytest.mark.parametrize("wrapper", list(LIKE_MINDSPORE))
def test_ascend_graph_backends_accept_or_refuse_a_wrapper_as_mindspores_own(tmp_path, wrapper, job):
    settings, parallel = JOBS[job]
    build, own = LIKE_MINDSPORE[wrapper]
    theirs = _attach_outcome(tmp_path / "theirs", build(mb.make_model()), settings, parallel)
    ours = _attach_outcome(tmp_path / "own", own(mb.make_model(), MICRO), settings, parallel)
    assert theirs == ours


def test_ascend_graph_backends_refuse_an_unknown_slicer_list_without_schedule_marks(tmp_path):
    network = wn.SlicingAccumulation(mb.make_model(), MICRO)
    with pytest.raises(AttachError) as caught:
        _attach_strict(tmp_path, network)
    assert "SlicingAccumulation slices micro-batches without the marks" in str(caught.value)


def _attach_strict(path, network):
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    emulator = AscendEmulator(parallel=True)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
            mf_celldump.attach(network, {"dump_path": str(path), "backend": "tensordump"}).detach()
    finally:
        emulator.close()


@pytest.mark.parametrize("kind,backend", [("accumulation", "tensordump"), ("accumulation", "kbk_statistics"),
                                          ("pipeline", "tensordump")])
def test_ascend_graph_backends_pair_an_unknown_wrapper_read_from_its_slicer_list(tmp_path, reference, kind, backend):
    """Run in the order MindSpore's scheduler gives (emulated: the CPU graph has neither ReorderGradAccumulation nor
    pipeline stages), the micro-batch count and schedule read from the wrapper's structure pair each backward
    with its micro-batch."""
    if kind == "accumulation":
        order, settings = ps.grad_accumulation(MICRO), {}
    else:
        order, settings = ps.one_f_one_b(0, 2, MICRO), {"pipeline_stages": 2}
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    network = wn.ScheduledMarked(mb.make_model(), MICRO, order, 1, kind, folder=str(tmp_path / "source"))
    assert not hasattr(network, "micro_size")
    emulator = AscendEmulator(parallel=True, latency=0.001)
    emulator.parallel_context = settings
    task = "statistics" if backend == "kbk_statistics" else "tensor"
    try:
        _capture(tmp_path / "dump", network, [mb.make_batch(MICRO)], {"backend": backend, "task": task}, emulator)
    finally:
        emulator.close()
    with open(tmp_path / "dump" / fmt.RAW_ROOT / "rank0" / fmt.MANIFEST_FILE, encoding="utf-8") as handle:
        assert json.load(handle)["micro_batches"] == MICRO
    _check_values(tmp_path / "dump", reference, task=task)


def test_the_whole_chain_a_mindformers_run_builds_is_peeled_to_the_model():
    """Data sink's ``_DataWrapper`` > ``MFTrainOneStepCell`` (clipping, its own parameters) > virtual dataset >
    accumulation > ``DataOrderWrapperCell`` > a MindFormers LLaMA: built (not run), each layer read by structure."""
    from mindformers.core.optim import AdamW
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM
    from mindformers.wrapper.wrapper import MFTrainOneStepCell
    from mindspore.train.dataset_helper import _DataWrapper

    from mf_celldump.capture.wrappers import peel

    wn.set_mode("graph")
    llama = LlamaForCausalLM(LlamaConfig(batch_size=2, seq_length=8, hidden_size=16, num_layers=1, num_heads=2,
                                         vocab_size=32, intermediate_size=32, use_flash_attention=False,
                                         compute_dtype="float32", param_init_type="float32",
                                         layernorm_compute_type="float32", softmax_compute_type="float32",
                                         rotary_dtype="float32", checkpoint_name_or_path=""))
    inner = _VirtualDatasetCell(GradAccumulationCellWithMultiOutputs(DataOrderWrapperCell(["input_ids"], llama), 4))
    step = MFTrainOneStepCell(inner, AdamW(llama.trainable_params()), use_clip_grad=True)
    sink = _DataWrapper(step, [ms.int32], [(8, 9)], "queue")
    peeled = peel(sink)
    assert peeled.model is llama
    assert [(layer.where, layer.class_name, layer.kind, layer.count) for layer in peeled.layers] == [
        ("", "_DataWrapper", "dataset", 1),
        ("network", "MFTrainOneStepCell", "training", 1),
        ("network.network", "_VirtualDatasetCell", "dataset", 1),
        ("network.network._backbone", "GradAccumulationCellWithMultiOutputs", "gradient accumulation", 4),
        ("network.network._backbone.network", "DataOrderWrapperCell", "forwarding", 1)]
