"""Steps of two runs are never mixed or overwritten: a run has an identity, in its raw manifest,
its step markers and every dump.json; a second run into a used dump folder is refused before
it trains, and a resumed run continues the run it resumes (real MindSpore, PyNative, CPU; the
real msprobe reads the result).
"""

from __future__ import annotations

import json
import os

import pytest

import mf_celldump
from mf_celldump.errors import AttachError
from mf_celldump.integrations.captured import wait_for_files
from mf_celldump.processing.driver import process_dump
from tests.support import capture_net as cn
from tests.support import formats as fmt
from tests.support.hostile_dumps import build_dump
from tests.support.msprobe_cli import compare_rows

RUN_ID_KEY = "mf_celldump_run_id"  # our key in dump.json's head


def _capture(dump, make_net, steps, initial_step=0, process=True):
    cn.set_mode("pynative")
    train = cn.train_one_step_cell(make_net())
    config = {"dump_path": dump, "task": "tensor", "steps": "all", "process_on_train_end": False}
    handle = mf_celldump.attach(train, config, initial_step=initial_step)
    for step in steps:
        with handle.step(step):
            train(cn.make_input())
    handle.detach()
    if process:
        assert mf_celldump.process_captured(handle).ok
    return handle


def _dump_json(dump, step):
    with open(os.path.join(dump, f"step{step}", "rank", fmt.DUMP_JSON), encoding="utf-8") as handle:
        return json.load(handle)


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


def _outputs(dump):
    return {name: _read(os.path.join(dump, name, "rank", fmt.DUMP_JSON))
            for name in sorted(os.listdir(dump)) if name.startswith("step")}


def test_another_model_into_a_used_dump_folder_is_refused_before_it_trains(tmp_path):
    """The first run's steps 0-2 stay as they were; the second model captures nothing there."""
    dump = str(tmp_path / "dump")
    first = _capture(dump, cn.make_net, [0, 1, 2])
    before = _outputs(dump)
    with pytest.raises(AttachError) as raised:
        _capture(dump, cn.make_two_heads, [0, 2])
    message = str(raised.value)
    assert f"already holds the dump of run {first.run_id!r} for rank 0 (steps 0,1,2)" in message
    assert "Set dump_path to a new folder" in message and "nothing was written" in message
    assert _outputs(dump) == before
    assert os.listdir(os.path.join(dump, fmt.RAW_ROOT, "rank0")) == [fmt.MANIFEST_FILE]


def test_the_same_model_again_from_step_0_is_another_run_and_refused(tmp_path):
    dump = str(tmp_path / "dump")
    _capture(dump, cn.make_net, [0, 1])
    with pytest.raises(AttachError, match="this run starts at step 0"):
        _capture(dump, cn.make_net, [0, 1])


def test_a_resumed_run_continues_the_run_and_msprobe_reads_it(tmp_path):
    """Steps 0-1, then a resume from step 2 into the same folder: one run, four steps, one run id."""
    dump = str(tmp_path / "dump")
    first = _capture(dump, cn.make_net, [0, 1])
    before = _outputs(dump)
    second = _capture(dump, cn.make_net, [2, 3], initial_step=2)
    assert second.run_id == first.run_id
    assert {_dump_json(dump, s)[RUN_ID_KEY] for s in range(4)} == {first.run_id}
    assert {k: v for k, v in _outputs(dump).items() if k in before} == before
    with open(os.path.join(dump, fmt.RAW_ROOT, "rank0", fmt.MANIFEST_FILE), encoding="utf-8") as handle:
        assert json.load(handle)["run_id"] == first.run_id
    # msprobe reads a dump.json with our key in its head: every compared tensor of the same
    # network one training step apart gives a number
    rows = compare_rows(os.path.join(dump, "step1"), os.path.join(dump, "step3"), str(tmp_path / "compare"))
    forward = [r for r in rows if ".forward." in r["NPU Name"] and r["NPU Name"].endswith(".output.0")]
    assert forward and all(r["Cosine"] not in ("", "N/A", "nan") for r in forward), rows[:3]


def test_processing_never_replaces_an_output_of_another_run(tmp_path):
    """Raw data of run B for a step whose output run A wrote: refused, both kept."""
    dump = str(tmp_path / "dump")
    builder = build_dump(dump, steps=1)
    assert process_dump(dump, jobs=1).ok
    output = _read(os.path.join(dump, "step0", "rank", fmt.DUMP_JSON))
    assert json.loads(output)[RUN_ID_KEY] == "test-run"
    other = build_dump(dump, steps=1)
    path = os.path.join(other.rank_dir, fmt.MANIFEST_FILE)
    with open(path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(dict(manifest, run_id="run-b"), handle)
    report = process_dump(dump, jobs=1)
    assert [o.status for o in report.outcomes] == ["failed"]
    assert "holds the output of run 'test-run'" in report.outcomes[0].problems[0]
    assert _read(os.path.join(dump, "step0", "rank", fmt.DUMP_JSON)) == output
    assert os.listdir(os.path.join(builder.rank_dir, "step0")), "run B's raw data is kept"


def test_a_step_counts_as_processed_only_with_an_output_of_its_own_run(tmp_path):
    """An output under the same step number from another run is not this step's output."""
    dump = str(tmp_path / "dump")
    handle = _capture(dump, cn.make_net, [0, 1], process=False)
    assert wait_for_files(handle).ready == [0, 1]
    assert mf_celldump.process_captured(handle, steps=[0]).ok
    folder = os.path.join(dump, "step1", "rank")
    os.makedirs(folder)
    with open(os.path.join(folder, fmt.DUMP_JSON), "w", encoding="utf-8") as out:
        json.dump({"task": "tensor", RUN_ID_KEY: "an-earlier-run", "data": {}}, out)
    assert wait_for_files(handle).ready == [1]
