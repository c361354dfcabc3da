"""Processing takes one path over either entry store: in memory, or on disk for a records file too large to hold.

Every test processes the same raw data twice, with the entries held in memory
(``entry_build.HeldStore``) and in the on-disk index (``capture_index.CaptureIndex``, its
size threshold lowered to 0), and expects the same output byte for byte, the same
problems and the same counts.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mf_celldump
from mf_celldump.processing import capture_index
from mf_celldump.processing.worker import SummarizingObserver, step_summaries
from mf_celldump.ranks.rank_summary import summarize
from tests.support import formats as fmt
from tests.support.hostile_dumps import edit_manifest
from tests.support.rawdump_builder import RawDumpBuilder, llama_net, write_llama_step

OUTPUT_FILES = ("dump.json", "construct.json", "stack.json")


def _process_both_ways(raw: str, tmp_path, monkeypatch, caplog):
    """(held, indexed) reports and dump paths of two copies of ``raw``."""
    held, indexed = str(tmp_path / "held"), str(tmp_path / "indexed")
    shutil.copytree(raw, held, symlinks=True)
    shutil.copytree(raw, indexed, symlinks=True)
    held_report = mf_celldump.process_dump(held, jobs=1)
    assert "on-disk index" not in caplog.text
    monkeypatch.setattr(capture_index, "INDEX_RECORDS_BYTES", 0)
    with caplog.at_level("INFO", logger="mf_celldump.processing.capture_index"):
        indexed_report = mf_celldump.process_dump(indexed, jobs=1)
    assert "on-disk index" in caplog.text
    return (held_report, held), (indexed_report, indexed)


def _outputs(dump: str):
    out = {}
    for step_dir in sorted(d for d in os.listdir(dump) if d.startswith("step")):
        for rank in sorted(os.listdir(os.path.join(dump, step_dir))):
            for name in OUTPUT_FILES:
                with open(os.path.join(dump, step_dir, rank, name), "rb") as handle:
                    out[(step_dir, rank, name)] = handle.read()
    return out


def _warnings(report):
    return list(report.warnings) + [w for outcome in report.outcomes for w in outcome.warnings]


def _no_index_left(dump: str) -> None:
    for folder, _, files in os.walk(os.path.join(dump, fmt.RAW_ROOT)):
        assert not [f for f in files if f.startswith(".tmp-")], folder


@pytest.fixture(scope="module", params=["pynative", "graph"])
def captured_statistics(request, tmp_path_factory):
    """Two steps of tests/support/capture_net.py captured with the statistics task, kept raw."""
    from tests.support import capture_net as cn

    dump = str(tmp_path_factory.mktemp(f"stats-{request.param}") / "D")
    cn.set_mode(request.param)
    train = cn.train_one_step_cell(cn.make_net())
    handle = mf_celldump.attach(train, {"dump_path": dump, "task": "statistics", "steps": "0-1",
                                        "process_on_train_end": False})
    for step in range(2):
        with handle.step(step):
            train(cn.make_input())
    handle.detach()
    return dump


def test_an_indexed_records_file_gives_the_output_it_gives_held_in_memory(captured_statistics, tmp_path,
                                                                          monkeypatch, caplog):
    (held_report, held), (indexed_report, indexed) = _process_both_ways(captured_statistics, tmp_path,
                                                                        monkeypatch, caplog)
    assert not held_report.all_problems and not indexed_report.all_problems
    held_out, indexed_out = _outputs(held), _outputs(indexed)
    assert len(held_out) == 6 and held_out == indexed_out
    assert [(o.step, o.entries, o.weight_grad_entries, o.records) for o in indexed_report.outcomes] == \
        [(o.step, o.entries, o.weight_grad_entries, o.records) for o in held_report.outcomes]
    assert all(o.raw_removed for o in indexed_report.outcomes)
    _no_index_left(indexed)


def _synthetic_step(dump: str, calls: int, problems: bool) -> None:
    """A statistics step of a LLaMA-like net: ``calls`` passes, calls inferred from order; ``problems`` adds
    a second capture of one value and values of a cell the manifest does not list."""
    builder = RawDumpBuilder(dump, task="statistics")
    net = llama_net(builder, 2)
    builder.write_manifest()
    writer = builder.step(0)
    rng = np.random.default_rng(0)
    write_llama_step(net, writer, lambda *_: rng.standard_normal((2, 3)).astype(np.float32),
                     explicit_calls=False, statistics_records=True, calls=calls)
    if problems:
        array = np.ones((2, 3), np.float32)
        writer.record(net.root, fmt.FORWARD, fmt.SLOT_OUTPUT, (0,), array=array, call=0)
        writer.record(999, fmt.FORWARD, fmt.SLOT_OUTPUT, (0,), array=array, call=0)
    writer.done(0)


@pytest.mark.parametrize("problems", [False, True], ids=["clean", "with-problems"])
def test_calls_parents_and_problems_are_the_same_through_the_index(tmp_path, monkeypatch, caplog, problems):
    raw = str(tmp_path / "raw")
    _synthetic_step(raw, calls=3, problems=problems)
    (held_report, held), (indexed_report, indexed) = _process_both_ways(raw, tmp_path, monkeypatch, caplog)
    assert _outputs(held) == _outputs(indexed)
    assert sorted(p.replace(held, "D") for p in held_report.all_problems) == \
        sorted(p.replace(indexed, "D") for p in indexed_report.all_problems)
    assert bool(indexed_report.all_problems) == problems
    if problems:  # the raw data is kept, and so is nothing of the index
        assert os.listdir(os.path.join(indexed, fmt.RAW_ROOT, fmt.raw_rank_dir_name(0)))
    _no_index_left(indexed)


def test_an_index_a_killed_run_left_is_deleted_by_the_next_run(tmp_path):
    raw = str(tmp_path / "raw")
    _synthetic_step(raw, calls=1, problems=False)
    processed = os.path.join(raw, fmt.RAW_ROOT, fmt.raw_rank_dir_name(0), "_processed")
    os.makedirs(processed)
    index = capture_index.CaptureIndex(processed, os.path.join(raw, "records.jsonl"))
    left = index.path
    assert os.path.basename(left).startswith(".tmp-")  # the name a killed run leaves
    report = mf_celldump.process_dump(raw, jobs=1)
    assert report.processed and not report.all_problems
    assert not os.path.exists(left)


def test_an_index_that_does_not_fit_stops_the_step_with_what_it_needs_and_keeps_the_raw_data(tmp_path,
                                                                                            monkeypatch):
    raw = str(tmp_path / "raw")
    _synthetic_step(raw, calls=3, problems=False)
    monkeypatch.setattr(capture_index, "INDEX_RECORDS_BYTES", 0)
    monkeypatch.setattr(capture_index, "MAX_INDEX_BYTES", 64 << 10)  # SQLite reports it full, as a full disk
    report = mf_celldump.process_dump(raw, jobs=1)
    [outcome] = report.outcomes
    assert outcome.status == "failed" and not outcome.raw_removed
    [problem] = outcome.problems
    assert "records.jsonl: its " in problem and "did not fit in an on-disk index" in problem
    assert "free space and run `mf-celldump process` again" in problem
    assert os.path.exists(os.path.join(raw, fmt.RAW_ROOT, fmt.raw_rank_dir_name(0), "step0", fmt.RECORDS_FILE))
    assert not os.path.exists(os.path.join(raw, "step0"))
    _no_index_left(raw)
    monkeypatch.undo()
    again = mf_celldump.process_dump(raw, jobs=1)  # with room, the same raw data is processed
    assert again.processed and not again.all_problems


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layers=st.integers(1, 2), calls=st.integers(1, 4), explicit=st.booleans(), backward=st.booleans(),
       micro_batches=st.booleans(), dropped=st.lists(st.integers(0, 10**6), max_size=4))
def test_any_step_gives_the_same_output_held_or_indexed(tmp_path_factory, layers, calls, explicit, backward,
                                                         micro_batches, dropped):
    """Calls numbered by order (backward in reverse, by micro-batch), lines missing: the same output."""
    raw = str(tmp_path_factory.mktemp("raw") / "D")
    builder = RawDumpBuilder(raw, task="statistics")
    net = llama_net(builder, layers)
    builder.write_manifest()
    if micro_batches and calls > 1:
        edit_manifest(builder.rank_dir, micro_batches=calls)
    writer = builder.step(0)
    rng = np.random.default_rng(calls)
    write_llama_step(net, writer, lambda *_: rng.standard_normal((2, 3)).astype(np.float32), backward=backward,
                     explicit_calls=explicit, statistics_records=True, calls=calls)
    records = os.path.join(writer.path, fmt.RECORDS_FILE)
    with open(records, encoding="utf-8") as handle:
        lines = handle.readlines()
    gone = {index % len(lines) for index in dropped}
    with open(records, "w", encoding="utf-8") as handle:
        handle.writelines(line for number, line in enumerate(lines) if number not in gone)
    writer.done(0)
    outputs = []
    for limit in (capture_index.INDEX_RECORDS_BYTES, 0):
        dump = str(tmp_path_factory.mktemp("copy") / "D")
        shutil.copytree(raw, dump)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(capture_index, "INDEX_RECORDS_BYTES", limit)
            report = mf_celldump.process_dump(dump, jobs=1, remove_raw=False)
        outputs.append((_outputs(dump), sorted(p.replace(dump, "D") for p in report.all_problems),
                        sorted(w.replace(dump, "D") for w in _warnings(report))))
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("limit", [capture_index.INDEX_RECORDS_BYTES, 0], ids=["held", "indexed"])
def test_the_rank_summary_made_of_the_entries_is_the_one_read_from_dump_json(captured_statistics, tmp_path,
                                                                           monkeypatch, limit):
    """The worker's summary comes from the entries as they are written (either store), not from the file."""
    dump = str(tmp_path / "D")
    shutil.copytree(captured_statistics, dump, symlinks=True)
    monkeypatch.setattr(capture_index, "INDEX_RECORDS_BYTES", limit)
    observer = SummarizingObserver()
    report = mf_celldump.process_dump(dump, jobs=1, observer=observer)
    assert not report.all_problems and sorted(observer.summaries) == [(0, 0), (0, 1)]
    for outcome in report.outcomes:
        made = observer.summaries[(outcome.rank, outcome.step)]
        read = summarize(os.path.join(dump, outcome.output, "dump.json"), outcome.step, outcome.rank)
        assert made.entries == outcome.entries > 0 and made.to_json() == read.to_json()
    assert [s.to_json() for s in step_summaries(dump, report, observer.summaries)] == \
        [observer.summaries[(o.rank, o.step)].to_json() for o in report.outcomes]


def test_the_rank_summary_of_a_tensor_step_is_made_of_the_entries_after_its_files_are_read(tmp_path):
    """In memory the bodies are made once the tensor files are read: the summary sees their statistics, a NaN
    included, as dump.json holds them."""
    dump = str(tmp_path / "D")
    builder = RawDumpBuilder(dump, task="tensor")
    net = llama_net(builder, 2)
    builder.write_manifest()
    writer = builder.step(0)
    rng = np.random.default_rng(1)

    def make_array(*_):
        array = rng.standard_normal((4, 8)).astype(np.float32)
        array[0, 0] = np.nan if rng.random() < 0.1 else array[0, 0]
        return array

    write_llama_step(net, writer, make_array, calls=2)
    writer.done(0)
    observer = SummarizingObserver()
    report = mf_celldump.process_dump(dump, jobs=1, observer=observer)
    [outcome] = report.outcomes
    assert outcome.tensor_files > 0 and not report.all_problems
    made = observer.summaries[(0, 0)]
    read = summarize(os.path.join(dump, outcome.output, "dump.json"), 0, 0)
    assert made.entries == outcome.entries and made.to_json() == read.to_json()
    assert any(item.log_norm is not None for item in made.items) and made.anomaly is not None
