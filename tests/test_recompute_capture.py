"""Cells under ``Cell.recompute()`` (MindFormers' full recompute) in both modes.

MindSpore runs a recomputed cell's forward again during backward, which would run our capture ops a
second time: an extra forward call per cell and gradients filed under it. Attach refuses such a
selection with a message naming the cells and the workaround, and a selection that leaves them out
dumps the other cells as it would without recompute.
"""

import pytest

import mf_celldump
from mf_celldump.capture.session import AttachError, find_attached
from tests.support import capture_net as cn
from tests.support.rawread import raw_steps, read_step

MODES = ["graph", "pynative"]


def _recomputed_train(mode):
    """The capture net with ``split`` (and so ``split.proj``) under recompute, in its training wrapper."""
    cn.set_mode(mode)
    net = cn.make_net()
    net.split.recompute()
    return net, cn.train_one_step_cell(net)


@pytest.mark.parametrize("mode", MODES)
def test_attach_refuses_cells_under_recompute_and_says_how_to_dump(tmp_path, mode):
    net, train = _recomputed_train(mode)
    plain_construct = net.split.construct
    with pytest.raises(AttachError) as caught:
        mf_celldump.attach(train, {"dump_path": str(tmp_path), "task": "statistics", "steps": "0"})
    message = str(caught.value)
    assert "2 selected cells run under recompute ('split', 'split.proj'" in message
    assert "recompute() was called on 'split'" in message
    assert ("graph mode" if mode == "graph" else "PyNative") in message
    assert "second forward call" in message
    assert "Turn recompute off for the dumped run" in message and "recompute: false" in message
    # nothing stays attached: the cells are as built and the network trains
    assert find_attached(train) is None
    assert net.split.construct == plain_construct
    assert train(cn.make_input()).asnumpy().shape == ()


def _step_records(dump_path):
    """{(cell name, dir, slot, path, call): value} of step 0, forward and backward (``rawread``)."""
    manifest, steps = raw_steps(dump_path)
    out = {}
    for key, value in read_step(steps[0], manifest).items():
        if isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in ("seq", "t", "time")}
        out[key] = value
    return out


@pytest.mark.parametrize("mode", MODES)
def test_leaving_recomputed_cells_out_dumps_the_rest_as_without_recompute(tmp_path, mode):
    config = {"task": "statistics", "steps": "0", "exclude": ["split", "split.*"]}
    dumps = {}
    for recompute in (False, True):
        cn.set_mode(mode)
        net = cn.make_net()
        if recompute:
            net.split.recompute()
        train = cn.train_one_step_cell(net)
        path = str(tmp_path / str(recompute))
        dump = mf_celldump.attach(train, {**config, "dump_path": path})
        dump.begin_step(0)
        train(cn.make_input())
        dump.end_step()
        dump.detach()
        dumps[recompute] = _step_records(path)
    assert not any(key[0].startswith("split") for key in dumps[False])
    assert {key[1] for key in dumps[False]} == {"forward", "backward"}
    assert dumps[True].keys() == dumps[False].keys()
    for key, value in dumps[False].items():
        assert repr(dumps[True][key]) == repr(value), key
