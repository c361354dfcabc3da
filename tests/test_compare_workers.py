"""``mf-celldump compare --jobs N``: a rank folder's entries paired in N worker processes give the answer,
CSV and report one process gives; a worker that dies leaves its work to the main process."""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from mf_celldump.analysis.compare import workers
from mf_celldump.cli import main as celldump_main
from tests.support.compare_dumps import write_dump

# 150 layers x 2 cells x forward and backward: 600 entries per rank folder, several ranges of pairing.BATCH;
# 4 rank folders of 1,200 pair rows: more than SQLite's page cache holds, so the main process writes pairs to
# the file (and locks it) while the workers read entries
LAYERS = 150
SHAPE = (4, 8)


def _entries(rank, step, diverged_layer=None):
    rng = np.random.default_rng(1000 * step + rank)
    forward, backward = {}, {}
    for layer in range(LAYERS):
        for cell in ("attention", "mlp"):
            value = rng.standard_normal(SHAPE)
            if diverged_layer is not None and layer >= diverged_layer:
                value = value * 1.5
            name = f"Cell.model.layers.{layer}.{cell}.Dense"
            forward[f"{name}.forward.0"] = {"in": [value], "out": [value * 2]}
            backward[f"{name}.backward.0"] = {"in": [value * 3], "out": [value * 4]}
    forged = f"Cell.model.layers.{LAYERS - 1}.mlp.Dense.forward.0"
    forward[forged]["records"] = {"output.0": {"dtype": "quux64"}}  # a dtype no framework has: warned
    return {**forward, **dict(reversed(list(backward.items())))}


def _pair_of_runs(root):
    for step in (0, 1):
        for rank in (0, 1):
            bad = 40 if (step, rank) == (1, 1) else None
            write_dump(os.path.join(root, "run"), _entries(rank, step, bad), step=step, rank=f"rank{rank}")
            write_dump(os.path.join(root, "base"), _entries(rank, step), step=step, rank=f"rank{rank}")


def _compare(root, capsys, jobs):
    out = os.path.join(root, f"out{jobs}")
    code = celldump_main(["compare", os.path.join(root, "run"), os.path.join(root, "base"), "-o", out,
                          "--jobs", str(jobs), "--json"])
    result = json.loads(capsys.readouterr().out)
    with open(os.path.join(out, "compare_pairs.csv"), encoding="utf-8") as handle:
        return code, result, handle.read(), out


def test_worker_processes_give_the_answer_and_csv_of_one_process(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger=workers.__name__)
    _pair_of_runs(str(tmp_path))
    code1, serial, csv1, out1 = _compare(str(tmp_path), capsys, 1)
    code2, parallel, csv2, out2 = _compare(str(tmp_path), capsys, 2)
    assert "pairing in 2 worker processes" in caplog.text
    assert code1 == code2 == 1
    first = parallel["first_divergence"]
    assert (first["step"], first["rank"], first["cell"]) == (1, 1, "model.layers.40.attention")
    assert [w for w in parallel["warnings"] if "quux64" in w] and parallel["warnings"] == serial["warnings"]
    for key in ("output", "csv", "plot", "html"):
        serial.pop(key), parallel.pop(key)
    assert parallel == serial
    assert csv2 == csv1 and len(csv1.splitlines()) == 1 + 4 * 4 * LAYERS * 2
    assert os.path.getsize(os.path.join(out2, "compare_depth.png")) > 0  # drawn in a worker
    assert os.path.isfile(os.path.join(out2, "report.html"))


def _die_in_a_worker(parent_pid, start, stop):
    if os.getpid() != parent_pid:
        os._exit(3)  # a worker killed (out of memory, a signal)
    return start, stop


def test_a_worker_that_dies_leaves_its_ranges_to_this_process(caplog):
    with workers.Workers(2) as pool:
        results = list(pool.map(_die_in_a_worker, os.getpid(), workers.ranges(10, 3)))
        assert pool.jobs == 1 and not pool.worth(10 ** 9, 10 ** 12)  # later units stay here too
    assert results == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert "the worker processes stopped" in caplog.text and "pairing goes on in this process" in caplog.text


def test_only_a_large_unit_starts_workers_unless_jobs_are_given():
    auto = workers.Workers()
    assert not auto.worth(1000, 1000 * 4096) and auto.worth(100_000, 100_000 * 4096) == (auto.jobs > 1)
    assert auto.worth(100, 10 ** 10) == (auto.jobs > 1)  # few tensors, many elements
    assert workers.Workers(2).worth(1, 1) and not workers.Workers(1).worth(10 ** 9, 10 ** 12)


def test_jobs_below_one_is_refused_by_name(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), _entries(0, 0))
    code = celldump_main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "-o", str(tmp_path / "o"),
                          "--jobs", "0"])
    assert code == 2 and "--jobs 0: give 1 or more" in capsys.readouterr().err


def test_a_worker_reads_entries_while_the_main_process_holds_the_pairs_file(tmp_path):
    """The main process writes pair rows in one long transaction; once they outgrow SQLite's page cache it
    locks the pairs' file for good. A worker's reader opens the entries' file alone, so it is never kept
    waiting (a reader that also opened the pairs' file would time out: "database is locked")."""
    from mf_celldump.analysis.compare.store import ENTRIES, PAIRS, Store

    path = str(tmp_path / "pairs.sqlite")
    store = Store(path)
    store.add_target((pos, f"e{pos}", "cell", "Cls", "forward", pos, 1, {"output": []}) for pos in range(10))
    store.commit()
    store.add_pairs([dict(step=0, rank=0, pos=pos, reason="x" * 500) for pos in range(20_000)])  # ~10 MB
    reader = Store.reader(path, ENTRIES)
    reader.db.execute("pragma busy_timeout = 1000")
    try:
        assert [row[0] for row in reader.targets(2, 5)] == [2, 3, 4]
    finally:
        reader.close()
    store.commit()
    reader = Store.reader(path, PAIRS)  # once committed, the pairs are read (the plot, in a worker)
    try:
        assert reader.query("select count(*) from pairs") == [(20_000,)]
    finally:
        reader.close()
        store.close()
