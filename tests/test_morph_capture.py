"""Cells computed by a ``Morph`` whose declared infer_dtype / infer_shape are wrong are captured as computed.

Graph mode infers a ``Morph`` from its declared functions first and re-infers the graph only after
expanding it (docs/capture.md): values handed to the capture op are the computed ones, but what the
compiler knew at first (the dtype code in the op's key) is the declared one. ``tests/support/morph_net.py``
declares int32 for a float32 embedding (as MindFormers' mcore ``VocabParallelEmbedding``), float16
of another shape for a float32 row sum, and int32 for a 0-d float32. Captured values (and
statistics) must be the ones numpy computes, in both modes, and training bitwise unchanged.
"""

import logging
import os

import mindspore as ms
import numpy as np
import pytest

import mf_celldump
from tests.support import formats as fmt
from tests.support import morph_net as mnet
from tests.support.rawread import read_manifest, read_step

STEPS = 2
MODES = ["graph", "pynative"]


def _train(mode, config=None):
    """Losses and final weights of STEPS steps, the weights step 0 ran with, and the dump's step 0 records."""
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    with pytest.MonkeyPatch.context() as patch:
        if mode == "pynative":
            mnet.run_morph_eagerly(patch)
        net = mnet.Top()
        train = mnet.train_one_step_cell(net)
        initial = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
        dump = mf_celldump.attach(train, config) if config is not None else None
        losses = []
        for step in range(STEPS):
            if dump is not None:
                dump.begin_step(step)
            losses.append(train(mnet.make_input()).asnumpy())
            if dump is not None:
                dump.end_step()
        if dump is not None:
            dump.detach()
    weights = {p.name: p.asnumpy().copy() for p in net.trainable_params()}
    return losses, weights, initial


def _step0(dump_path):
    rank_dir = os.path.join(dump_path, fmt.RAW_ROOT, fmt.raw_rank_dir_name(0))
    return read_step(os.path.join(rank_dir, fmt.step_dir_name(0)), read_manifest(rank_dir))


@pytest.fixture(scope="module")
def baselines():
    return {mode: _train(mode) for mode in MODES}


@pytest.mark.parametrize("task", ["tensor", "statistics"])
@pytest.mark.parametrize("mode", MODES)
def test_morph_values_are_captured_as_computed(tmp_path, baselines, mode, task, caplog):
    config = {"dump_path": str(tmp_path), "task": task, "data_mode": "all", "backend": "host"}
    with caplog.at_level(logging.WARNING, logger="mf_celldump.capture.backends.host"):
        losses, weights, initial = _train(mode, config)
    want_losses, want_weights, _ = baselines[mode]
    for got, want in zip(losses, want_losses):
        np.testing.assert_array_equal(got, want)
    for name, value in want_weights.items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)

    records = _step0(str(tmp_path))
    for (cell, direction, slot, index), want in mnet.expected(initial).items():
        got = records[(cell, direction, slot, (index,), 0)]
        what = f"{mode} {task} {cell} {direction} {slot}{index}"
        zero_d_graph = np.ndim(want) == 0 and mode == "graph"
        # A 0-d tensor reaches the graph-mode capture op as a Python scalar: with a declared dtype of
        # another kind its width is unknown, so it is recorded exactly as float64, with a warning.
        dtype = "float64" if zero_d_graph else "float32"
        if task == "tensor":
            assert got.dtype == np.dtype(dtype) and got.shape == np.shape(want), what
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=what)
        else:
            assert got["dtype"] == dtype.capitalize() and got["shape"] == list(np.shape(want)), what
            want = np.asarray(want, dtype=np.float64)
            stats = {"Max": want.max(), "Min": want.min(), "Mean": want.mean(), "Norm": np.linalg.norm(want)}
            for name, value in stats.items():
                np.testing.assert_allclose(got["stats"][name], value, rtol=1e-6, err_msg=f"{what} {name}")
    warned = [r.getMessage() for r in caplog.records if "0-d tensor" in r.getMessage()]
    if mode == "graph":
        energy = next(c["id"] for c in read_manifest(os.path.join(str(tmp_path), fmt.RAW_ROOT, fmt.raw_rank_dir_name(
            0)))["cells"] if c["name"] == "energy")
        assert len(warned) == 2 and all(m.startswith(f"cell id {energy} ") and "declared int32" in m
                                        for m in warned), warned  # once per probe: forward and backward output
    else:
        assert not warned
