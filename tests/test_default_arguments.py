"""Defaulted arguments follow msprobe's convention: a call records what
its caller passed, nothing left at its default, in PyNative and graph mode alike.

tests/support/defaults_net.py calls one cell with int, float, bool, ``None`` and keyword-only
defaults three ways (everything left out, some passed, everything passed) and dumps the
step with us (PyNative, graph) and with msprobe 26.2's own L0 dumper, each in a process
of its own. Then every forward entry has the same input slots as msprobe's, the values
agree, and ``msprobe graph_visualize`` shows no error node.
"""

from __future__ import annotations

import glob
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from tests.support.msprobe_cli import run_msprobe

pytest.importorskip("msprobe")
pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ERROR_INDEX = 0.6  # graph_visualize paints a node as an error at or above this precision index


def _dump(out, *args):
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "support", "defaults_net.py"), str(out), *args],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (rank_dir,) = glob.glob(os.path.join(str(out), "step0", "rank*"))
    return rank_dir


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("defaults")
    return {
        "pynative": _dump(root / "ours", "--tool", "ours"),
        "graph": _dump(root / "ours_graph", "--tool", "ours", "--mode", "graph"),
        "msprobe": _dump(root / "msprobe", "--tool", "msprobe"),
    }


def _forward_inputs(rank_dir):
    """{forward entry: (input_args, input_kwargs)}."""
    with open(os.path.join(rank_dir, "dump.json"), encoding="utf-8") as handle:
        data = json.load(handle)["data"]
    return {name: (body.get("input_args", []), body.get("input_kwargs", {}))
            for name, body in data.items() if ".forward." in name}


def _values(items):
    return [item.get("value", item.get("Max")) if isinstance(item, dict) else item for item in items]


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_each_call_records_what_its_caller_passed(dumps, mode):
    ours, theirs = _forward_inputs(dumps[mode]), _forward_inputs(dumps["msprobe"])
    scale = {name: ours[name] for name in ours if ".Scale.forward." in name}
    assert len(scale) == 3
    for name, (args, kwargs) in theirs.items():
        assert name in ours, name
        our_args, our_kwargs = ours[name]
        assert len(our_args) == len(args), (name, our_args, args)
        assert sorted(our_kwargs) == sorted(kwargs), name
        assert _values(our_args[1:]) == _values(args[1:]), name  # the non-tensor arguments
        assert _values(list(our_kwargs.values())) == _values(list(kwargs.values())), name
    # Left at their defaults: only x; some passed: x, times and the keyword-only shift.
    assert [len(scale[f"Cell.scale.Scale.forward.{n}"][0]) for n in (0, 1)] == [1, 2]
    assert scale["Cell.other.Scale.forward.0"][0][1:4] == [
        {"type": "int", "value": 3}, {"type": "float", "value": 0.25}, {"type": "bool", "value": False}]
    assert list(scale["Cell.scale.Scale.forward.1"][1]) == ["shift"]


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_graph_visualize_shows_no_error_node(dumps, tmp_path, mode):
    out = tmp_path / "vis"
    run_msprobe("graph_visualize", "-tp", dumps[mode], "-gp", dumps["msprobe"], "-o", str(out))
    (db,) = glob.glob(str(out / "*.vis.db"))
    with sqlite3.connect(db) as con:
        nodes = con.execute("select node_name, precision_index, matched_node_link from tb_nodes "
                            "where data_source = 'NPU'").fetchall()
    assert len(nodes) >= 6
    errors = [name for name, index, _ in nodes if index is not None and index >= ERROR_INDEX]
    assert errors == []
    unmatched = [name for name, _, link in nodes if not link or link == "[]"]
    assert unmatched == []
