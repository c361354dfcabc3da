"""The replica check without a job: rank summaries, the check of one step's replicas, ``mf-celldump ranks``.

Dumps are synthetic statistics dumps in msprobe's layout (``bench/ranks_synthetic.py``):
every replica holds the same weights, activations differ by a few percent, faults go on
chosen ranks. The real jobs (msrun, 2 and 4 ranks) are in ``test_ranks_msrun.py``.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import socket
import time
import tracemalloc
import zlib

import pytest

from mf_celldump.analysis.replica_report import CheckRequest, run
from mf_celldump.cli import main as cli_main
from mf_celldump.config import DumpConfig
from mf_celldump.errors import ConfigError, ExchangeError, ReplicaSpecError
from mf_celldump.ranks.groups import ReplicaGroups
from mf_celldump.ranks.rank_summary import from_bytes, summarize
from mf_celldump.ranks.replicas import CheckOptions, ReplicaChecks
from tests.support.synthetic_ranks import Fault, write_dump

WQ = "model.layers.2.attention.wq"
W2 = "model.layers.3.feed_forward.w2"
WK = "model.layers.4.attention.wk"


def check(root, **options):
    replicas = ReplicaGroups.parse(options.pop("replicas", "all"))
    return run(CheckRequest((str(root),), replicas=replicas, options=CheckOptions(**options), progress=False))


def steps_of(result):
    return {r.step: r for r in result.results}


@pytest.fixture(scope="module")
def eight_ranks(tmp_path_factory):
    root = tmp_path_factory.mktemp("eight")
    write_dump(str(root), 8, [0, 1, 2], entries=200, faults=[
        Fault("weight", 3, 1, WQ), Fault("scale", 5, 2, W2), Fault("nan", 6, 2, WK)])
    return root


def test_a_step_summary_is_kilobytes_and_survives_the_round_trip(eight_ranks):
    summary = summarize(str(eight_ranks / "step0" / "rank0" / "dump.json"), 0, 0)
    payload = summary.to_bytes()
    assert summary.entries == 174 and len(payload) < 16 * 1024  # 5 layers of 33 entries, and 9
    back = from_bytes(payload)
    assert back.items == summary.items and back.step == 0 and back.rank == 0
    kinds = {item.kind for item in summary.items}
    assert kinds == {"weight", "grad", "act"}


def test_clean_step_and_each_fault_named_on_its_rank(eight_ranks):
    steps = steps_of(check(eight_ranks))
    assert steps[0].clean and len(steps[0].ranks) == 8
    departure = steps[1].first_departure
    assert (departure["cell"], departure["label"], departure["ranks"]) == (WQ, "param.weight", [3])
    assert departure["majority"] == 7 and not departure["no_majority"]
    assert [(r, a.cell, a.direction) for r, a in steps[2].anomaly] == [(6, WK, "forward")]
    assert [(s["rank"], s["cell"]) for s in steps[2].suspects] == [(5, W2)]
    assert steps[2].suspects[0]["deviation"] == pytest.approx(2.0, abs=0.2)  # x100


def test_lines_name_fault_rank_and_cell(eight_ranks):
    lines = check(eight_ranks).lines
    assert lines[0] == "step 0: clean (8 replicas)"
    assert lines[1] == (f"step 1: rank 3 departs first at {WQ} param.weight (weight not bit-identical; "
                        "7 of 8 replicas agree)")
    assert lines[2].startswith(f"step 2: rank 6: first NaN at {WK} (forward); suspect: rank 5 at {W2} forward.0 "
                               "output.0 (Norm x")


def test_heat_map_marks_the_faulty_ranks_layers(eight_ranks):
    steps = steps_of(check(eight_ranks))
    result = steps[2]
    layer = result.layers.index("model.layers.3")
    row = result.ranks.index(5)
    assert result.heat[row, layer] == pytest.approx(2.0, abs=0.2)
    assert result.heat[result.ranks.index(0), layer] < 0.5
    assert result.marks[result.ranks.index(6), result.layers.index("model.layers.4")] & 2
    assert steps[1].marks[steps[1].ranks.index(3), steps[1].layers.index("model.layers.2")] & 1


def test_two_replicas_show_the_higher_rank_against_the_lower(tmp_path):
    write_dump(str(tmp_path), 2, [0], entries=200, faults=[Fault("weight", 0, 0, WQ), Fault("scale", 0, 0, W2)])
    result = steps_of(check(tmp_path))[0]
    assert result.first_departure["no_majority"] and result.first_departure["ranks"] == [1]
    assert [s["rank"] for s in result.suspects] == [1] and result.suspects[0]["deviation"] < 0
    assert "no majority among 2 replicas, shown against rank 0" in check(tmp_path).lines[0]


def test_local_gradients_are_not_held_to_equality(tmp_path):
    write_dump(str(tmp_path), 4, [0], entries=200, local_grads=True)
    result = steps_of(check(tmp_path))[0]
    assert result.grads_reduced is False and result.clean
    forced = steps_of(check(tmp_path, grads="reduced"))[0]
    assert forced.grads_reduced is True and forced.varying or forced.first_departure


def test_replica_groups_keep_model_parallel_shards_apart(tmp_path):
    # Ranks 1 and 3 hold another shard (same "fault" on both): with model_parallel=2 they are replicas
    # of each other and everything agrees; taken as one group, half the ranks differ and there is no majority.
    write_dump(str(tmp_path), 4, [0], entries=200, faults=[Fault("weight", 1, 0, WQ), Fault("weight", 3, 0, WQ)])
    split = check(tmp_path, replicas="model_parallel=2")
    assert all(r.clean for r in split.results) and len(split.results) == 2
    assert split.lines[1].startswith("step 0, model-parallel rank 1: clean (2 replicas)")
    together = steps_of(check(tmp_path))[0].first_departure
    assert together["no_majority"] and together["ranks"] == [1, 3] and together["reference"] == 0


def test_a_rank_without_a_step_is_missing(tmp_path):
    write_dump(str(tmp_path), 3, [0, 1], entries=200)
    write_dump(str(tmp_path), 4, [0], entries=200, ranks_here=[3])
    result = check(tmp_path)
    assert result.missing == {(1, "0,0"): [3]}
    assert result.lines[1] == "step 1: rank 3 missing (no data for this step)"


def test_memory_of_the_check_does_not_grow_with_ranks(tmp_path):
    write_dump(str(tmp_path), 1, [0], entries=300)
    summary = summarize(str(tmp_path / "step0" / "rank0" / "dump.json"), 0, 0)
    peaks = []
    for ranks in (40, 160):
        checks = ReplicaChecks(ReplicaGroups(), CheckOptions(), 0, str(tmp_path))
        tracemalloc.start()
        for rank in range(ranks):
            summary.rank = rank
            checks.add(summary)
        results, _ = checks.finish()
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert results[0].clean and len(results[0].ranks) == ranks
    assert peaks[1] < peaks[0] * 1.25, peaks  # 4x the ranks, the same memory (but the heat map's 4 bytes a layer)


# -- the command --------------------------------------------------------------------------------
def run_cli(*args):
    out, err = io.StringIO(), io.StringIO()
    from contextlib import redirect_stderr, redirect_stdout

    with redirect_stdout(out), redirect_stderr(err):
        code = cli_main(["ranks", *args])
    return code, out.getvalue(), err.getvalue()


def test_command_writes_table_and_heat_maps_and_exits_1_on_a_departure(eight_ranks, tmp_path):
    code, out, _ = run_cli(str(eight_ranks), "-o", str(tmp_path / "out"), "--json")
    assert code == 1
    result = json.loads(out)
    assert result["table"].endswith("ranks_findings.csv") and len(result["heatmaps"]) == 3
    for path in result["heatmaps"] + [result["table"]]:
        assert os.stat(path).st_mode & 0o777 == 0o640
    rows = (tmp_path / "out" / "ranks_findings.csv").read_text().splitlines()
    assert "0,all,clean,,,,,,8" in rows
    assert f"1,all,departs,3,forward,{WQ},param.weight,weight not bit-identical to the majority,1" in rows


def test_command_on_clean_replicas_exits_0(tmp_path):
    write_dump(str(tmp_path / "dump"), 3, [0], entries=60)
    code, out, _ = run_cli(str(tmp_path / "dump"), "-o", str(tmp_path / "out"))
    assert code == 0 and "step 0: clean (3 replicas)" in out


def test_records_it_cannot_judge_are_named_not_passed_in_silence(tmp_path):
    """A Max of "NaN?" and a shape that is no list of whole numbers: the replicas are still checked on the
    rest, and the command names the records per rank folder (text and JSON), as compare and anomalies do;
    a summary saved before the count existed reads as none."""
    write_dump(str(tmp_path / "dump"), 2, [0], entries=20)
    path = tmp_path / "dump" / "step0" / "rank1" / "dump.json"
    data = json.loads(path.read_text())
    names = [name for name in data["data"] if ".forward." in name][:2]
    data["data"][names[0]]["output"][0]["Max"] = "NaN?"
    data["data"][names[1]]["output"][0]["shape"] = [10 ** 12, "x"]
    path.write_text(json.dumps(data))
    code, out, _ = run_cli(str(tmp_path / "dump"), "-o", str(tmp_path / "out"))
    line = next(line for line in out.splitlines() if "not judged" in line)
    assert line.startswith("step 0 rank 1: 2 records not judged"), out
    assert f"{names[0]} output.0: Max 'NaN?' is not a number" in line, line
    assert "is not a list of whole numbers" in line, line
    code, out, _ = run_cli(str(tmp_path / "dump"), "-o", str(tmp_path / "out2"), "--json")
    assert json.loads(out)["unjudged"] == [{"step": 0, "rank": 1, "count": 2, "first": line.split(": ", 2)[2]
                                            .split("; ")}], out
    summary = summarize(str(path), 0, 1)
    old = summary.to_json()
    del old["unjudged"]
    assert from_bytes(zlib.compress(json.dumps(old).encode())).unjudged == 0


def test_one_card_says_there_is_nothing_to_compare_and_writes_beside_the_dump(tmp_path, monkeypatch):
    """A single replica is not "clean (1 replicas)": nothing was compared. Without -o the table goes into
    the dump, not into the folder the command was started from."""
    write_dump(str(tmp_path / "dump"), 1, [0, 1], entries=60)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, out, _ = run_cli(str(tmp_path / "dump"))
    assert code == 0
    assert "step 0: no NaN/Inf; rank 0 is the only replica: nothing to compare it with" in out.splitlines(), out
    assert "replicas)" not in out
    assert f"table: {tmp_path / 'dump' / 'ranks_out' / 'ranks_findings.csv'}" in out.splitlines(), out
    assert os.listdir(tmp_path / "elsewhere") == []
    rows = (tmp_path / "dump" / "ranks_out" / "ranks_findings.csv").read_text().splitlines()
    assert "0,all,clean,,,,,the only replica: nothing to compare it with,1" in rows


def test_summary_files_without_output_folder_write_beside_the_first_file(eight_ranks, tmp_path, monkeypatch):
    (tmp_path / "node").mkdir()
    summary = str(tmp_path / "node" / "a.jsonl.gz")
    assert run_cli(str(eight_ranks), "--save-summaries", summary, "--summaries-only")[0] == 0
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(summary, "--json")
    assert code == 1 and json.loads(out)["table"] == str(tmp_path / "node" / "ranks_out" / "ranks_findings.csv")
    assert sorted(os.listdir(tmp_path)) == ["node"]


@pytest.mark.parametrize("ranks", [2, 64])
def test_heat_map_keeps_every_label_inside_the_picture(tmp_path, ranks):
    """Nothing drawn touches the picture's edge: the colour bar's label, the title and the tick labels fit."""
    import matplotlib.image

    write_dump(str(tmp_path / "dump"), ranks, [0], entries=300, faults=[Fault("scale", 1, 0, W2)])
    code, out, _ = run_cli(str(tmp_path / "dump"), "--json")
    [heatmap] = json.loads(out)["heatmaps"]
    picture = matplotlib.image.imread(heatmap)
    assert picture.shape[0] > 300 and picture.shape[1] > 500
    for edge in (picture[:4], picture[-4:], picture[:, :4], picture[:, -4:]):
        assert edge[..., :3].min() == 1.0, "something is cut off at the edge"


def test_without_matplotlib_ranks_writes_the_table_and_names_the_extra(eight_ranks, tmp_path):
    """Installed without the compare extra (and without pandas): same verdict and exit status, the table
    written, and one line instead of the heat maps saying what to install."""
    import subprocess
    import sys

    hidden = ("import sys; sys.modules['matplotlib'] = sys.modules['pandas'] = None; "
              "from mf_celldump.cli import main; sys.exit(main(sys.argv[1:]))")
    worktree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", hidden, "ranks", str(eight_ranks), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, cwd=worktree,
                          env=dict(os.environ, PYTHONPATH=worktree))
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == 'no heat maps: drawing a heat map needs matplotlib: pip install "mf_celldump[compare]"'
    assert lines[1:4] == check(eight_ranks).lines
    assert os.listdir(tmp_path / "out") == ["ranks_findings.csv"]
    assert "0,all,clean,,,,,,8" in (tmp_path / "out" / "ranks_findings.csv").read_text().splitlines()


@pytest.mark.parametrize("args, message", [
    (["--replicas", "tp=2"], "--replicas: 'tp=2' in 'tp=2' is not understood"),
    (["--replicas", "0,1;1,2"], "rank 1 is in two groups"),
    (["--replicas", "model_parallel=3,pipeline_stages=2"],
     "8 ranks are not a multiple of model_parallel=3 x pipeline_stages=2"),
    (["--summaries-only"], "--summaries-only needs --save-summaries FILE"),
    (["--factor", "1"], "--factor 1: must be greater than 1"),
])
def test_command_bad_options_exit_2_with_the_option_named(eight_ranks, tmp_path, args, message):
    code, _, err = run_cli(str(eight_ranks), "-o", str(tmp_path / "out"), *args)
    assert code == 2 and message in err, err


def test_command_bad_inputs_exit_2_naming_the_file(tmp_path):
    code, _, err = run_cli(str(tmp_path / "nowhere"))
    assert code == 2 and "no such file or folder" in err
    bad = tmp_path / "node.jsonl.gz"
    with gzip.open(bad, "wb") as handle:
        handle.write(b'{"format": "something else"}\n')
    code, _, err = run_cli(str(bad), "-o", str(tmp_path / "out"))
    assert code == 2 and f"{bad}: line 1: not a rank summary" in err
    bad.write_bytes(b"not gzip at all")
    code, _, err = run_cli(str(bad), "-o", str(tmp_path / "out"))
    assert code == 2 and f"{bad}: cannot read rank summaries" in err


def test_summaries_saved_per_node_check_like_the_dump(eight_ranks, tmp_path):
    files = [str(tmp_path / "a.jsonl.gz"), str(tmp_path / "b.jsonl.gz")]
    for path, ranks in zip(files, ("0-3", "4-7")):
        assert run_cli(str(eight_ranks), "--ranks", ranks, "--save-summaries", path, "--summaries-only")[0] == 0
        assert os.stat(path).st_mode & 0o777 == 0o640
    code, out, _ = run_cli(*files, "-o", str(tmp_path / "out"), "--json")
    assert code == 1 and json.loads(out)["lines"] == check(eight_ranks).lines


# -- configuration and replica groups -----------------------------------------------------------
def test_configuration_keys_of_the_verdict():
    config = DumpConfig.from_dict({"rank_verdict": True, "rank_verdict_timeout": 5, "rank_verdict_port": 29400,
                                   "replica_groups": "model_parallel=2,pipeline_stages=2"})
    assert config.rank_verdict is True and config.rank_verdict_timeout == 5.0 and config.rank_verdict_port == 29400
    assert config.to_dict()["replica_groups"] == "model_parallel=2,pipeline_stages=2"
    assert DumpConfig().replica_groups.describe() == "all"
    assert DumpConfig.from_dict({"rank_verdict_port": "auto"}).rank_verdict_port is None
    for key, value, message in (("rank_verdict", "yes", "rank_verdict: invalid value 'yes'"),
                                ("rank_verdict_timeout", 0, "rank_verdict_timeout: invalid value 0"),
                                ("rank_verdict_port", 80, "rank_verdict_port: invalid value 80; valid: 'auto' or a "
                                                          "TCP port from 1024 to 65535"),
                                ("rank_verdict_port", "29400", "rank_verdict_port: invalid value '29400'"),
                                ("replica_groups", "0-3;2-5", "rank 2 is in two groups")):
        with pytest.raises(ConfigError, match=message):
            DumpConfig.from_dict({key: value})


def test_verdict_is_off_unless_asked_for():
    """The verdict serves a store and runs a collective at attach: nothing a run gets without asking."""
    assert DumpConfig().rank_verdict is False
    assert DumpConfig.from_dict({}).to_dict()["rank_verdict"] is False


def test_replica_groups_follow_the_megatron_rank_order():
    groups = ReplicaGroups.parse("model_parallel=2,pipeline_stages=2")
    keys = [groups.group_of(rank, 8) for rank in range(8)]
    assert keys == [(0, 0), (0, 1), (0, 0), (0, 1), (1, 0), (1, 1), (1, 0), (1, 1)]
    assert groups.label((1, 0)) == "stage 1, model-parallel rank 0"
    listed = ReplicaGroups.parse("0-1;4,5")
    assert [listed.group_of(r, 8) for r in (0, 1, 2, 5)] == [(0,), (0,), None, (1,)]
    with pytest.raises(ReplicaSpecError, match="reversed"):
        ReplicaGroups.parse("3-1")


# -- the store the verdict goes through ---------------------------------------------------------
def test_store_presence_counter_answers_at_once_for_a_rank_that_never_posted(capfd, caplog):
    """Rank 0 reads through its store's process, where ``add(key, 0)`` answers at once (a ``get`` would wait its
    timeout). Each poster keeps one client (one registration) for all its posts, in a child process, and the
    store's registrations are logged nowhere in the processes that started them."""
    pytest.importorskip("mindspore")
    from mf_celldump.integrations import rank_exchange
    from mf_celldump.integrations.rank_verdict import Keys, Publisher, RankVerdict

    server = rank_exchange.StoreServer.start(2, None, timeout_s=30, linger_s=0)
    ip, port = server.address
    assert port not in rank_exchange.hccl_ports()
    keys = Keys(0)
    with caplog.at_level(logging.INFO, logger="mf_celldump"):
        publisher = Publisher((ip, port))
        for step in range(5):
            publisher.post(keys.summary(step, 1), b"payload")
        assert publisher.close(60) and publisher.broken is None
    assert sum("registered with rank 0's store" in r.getMessage() for r in caplog.records) == 1
    started = time.monotonic()
    assert RankVerdict._fetch(server, keys.summary(3, 2)) is None  # never posted
    assert time.monotonic() - started < 5
    assert RankVerdict._fetch(server, keys.summary(3, 1)) == b"payload"
    server.close(wait_s=30)
    assert server.process.returncode == 0
    assert "ProcessRegister" not in capfd.readouterr().err
    late = Publisher((ip, port), timeout_s=2)  # the store is gone: the client fails within the timeout, no raise
    late.post("k", b"v")
    assert late.close(60) and late.broken


def test_a_ranks_client_ends_at_once_when_rank0s_store_is_gone():
    """A TCPStore client finalised after its store is gone blocks its process for minutes: the rank's client
    lives in a child process that exits without finalising it."""
    pytest.importorskip("mindspore")
    from mf_celldump.integrations import rank_exchange

    server = rank_exchange.StoreServer.start(2, None, linger_s=0)
    poster = rank_exchange.StorePoster.start(server.address)
    poster.post("k", b"v")
    assert server.fetch("k") == b"v"
    server.close(wait_s=30)
    started = time.monotonic()
    poster.close()
    poster.process.wait(10)
    assert time.monotonic() - started < 5


def test_store_on_a_port_in_use_is_refused_with_the_port_named():
    pytest.importorskip("mindspore")
    from mf_celldump.integrations import rank_exchange

    with socket.socket() as taken:
        taken.bind((rank_exchange.reachable_ip(), 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ExchangeError, match=f"cannot serve the store on .*:{port}"):
            rank_exchange.StoreServer.start(2, port, timeout_s=5)


def test_verdict_on_a_port_among_hccls_is_refused(monkeypatch):
    from mf_celldump.integrations.rank_verdict import RankVerdict

    monkeypatch.setenv("HCCL_IF_BASE_PORT", "50000")
    config = DumpConfig.from_dict({"rank_verdict": True, "rank_verdict_port": 50010})
    assert RankVerdict.problem(config) == ("rank_verdict_port: 50010 is among HCCL's host ports 50000-50031 "
                                           "(HCCL_IF_BASE_PORT); choose a port outside them, or 'auto'")
    monkeypatch.delenv("HCCL_IF_BASE_PORT")
    assert RankVerdict.problem(config) is None
    assert "60000-60031" in RankVerdict.problem(DumpConfig.from_dict({"rank_verdict_port": 60000}))


def test_verdict_on_a_mindspore_whose_store_is_msruns_is_refused(monkeypatch):
    """MindSpore 2.7's TCPStore (its interface as documented for r2.7.0: no host, port or add of its own).

    2.7 cannot be installed beside 2.9, so its class stands in here; the check reads only the interface.
    """
    pytest.importorskip("mindspore")
    import mindspore.mint.distributed as distributed

    from mf_celldump.integrations.rank_verdict import RankVerdict

    class StoreOfMsrunsScheduler:
        def __init__(self, host_name=None, port=None, world_size=None, is_master=False, timeout=300,
                     wait_for_workers=True, multi_tenant=False, master_listen_fd=None, use_libuv=True):
            pass

        def set(self, key, value):
            pass

        def get(self, key):
            pass

    config = DumpConfig.from_dict({"rank_verdict": True})
    assert RankVerdict.problem(config) is None  # the installed MindSpore serves a store of its own
    monkeypatch.setattr(distributed, "TCPStore", StoreOfMsrunsScheduler)
    message = RankVerdict.problem(config)
    assert "TCPStore has no 'add'" in message and "Set rank_verdict: false (the default)" in message
    StoreOfMsrunsScheduler.add = lambda self, key, amount: 0
    message = RankVerdict.problem(config)
    assert "TCPStore ignores host and port (its store is msrun's scheduler" in message
    assert "`mf-celldump ranks DUMP`" in message


def test_verdict_is_off_in_a_single_process_run():
    pytest.importorskip("mindspore")
    from mf_celldump.integrations.rank_verdict import RankVerdict

    assert RankVerdict.start(DumpConfig(), 0, 0) is None
    assert RankVerdict.start(DumpConfig.from_dict({"rank_verdict": True}), 0, 0) is None
