"""Run the real msprobe (mindstudio-probe 26.2) command line on our output.

msprobe is started in a child process that imports mindspore before msprobe, with the
pure-Python protobuf runtime: with protobuf >= 4 anything else fails with "Descriptors
cannot be created directly" (README.md, "Compare two runs"); with the pinned 3.20.3 the
plain ``msprobe`` script works too (tests/test_first_use.py runs it).
"""

import csv
import glob
import os
import sqlite3
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_MAIN = (
    "import sys, mindspore\n"
    "from msprobe.msprobe import main\n"
    "sys.argv = ['msprobe'] + sys.argv[1:]\n"
    "main()"
)


def msprobe_env() -> dict:
    """The environment for msprobe: with protobuf >= 4 (not the pinned 3.20.3) its C++ runtime makes
    msprobe abort on MindSpore's generated modules; the pure-Python runtime works with either."""
    env = dict(os.environ)
    env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    return env


def run_msprobe(*args, timeout=600):
    proc = subprocess.run(
        [sys.executable, "-c", _MAIN, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
        env=msprobe_env(),
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc


def compare_rows(target_step_dir, golden_step_dir, out_dir):
    """``msprobe compare -tp A/stepN -gp B/stepN``: the rows of its single CSV."""
    run_msprobe("compare", "-tp", target_step_dir, "-gp", golden_step_dir, "-o", out_dir)
    files = glob.glob(os.path.join(out_dir, "compare_result_*.csv"))
    assert len(files) == 1, files
    with open(files[0], newline="") as handle:
        return list(csv.DictReader(handle))


def graph_nodes(rank_dir, out_dir):
    """``msprobe graph_visualize -tp A/stepN/rank``: {node name: parent node} from its .vis.db."""
    run_msprobe("graph_visualize", "-tp", rank_dir, "-o", out_dir)
    dbs = glob.glob(os.path.join(out_dir, "*.vis.db"))
    assert len(dbs) == 1, dbs
    with sqlite3.connect(dbs[0]) as db:
        return dict(db.execute("select node_name, up_node from tb_nodes"))
