"""MindFormers' own training monitor keeps writing with an Ascend graph capture attached (emulated primitives).

``monitor_config`` (``monitor_on``, ``dump_path``, ``device_local_norm_format``,
``local_norm_format``) in a MindFormers 1.9 YAML makes the trainer set
``dump_local_norm_path`` and ``MFTrainOneStepCell`` dump ``finish_step`` and
``device_local_norm`` with ``P.TensorDump`` on every step; the ``TrainingStateMonitor``
callback counts steps by the ``finish_step`` files. MindSpore's TensorDump step filter is
one for the whole process, so capturing step 1 must not silence those files on steps 0, 2
and 3. One real MindFormers training of the tiny LLaMA in graph mode, with every
TensorDump of the process (ours and MindFormers') emulated by tests/support/ascend_emulation.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.support import formats as fmt

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EMULATION = os.path.join(REPO, "tests", "support", "ascend_emulation.py")
STEPS = 4


@pytest.fixture(scope="module")
def monitored_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("monitor")
    with open(os.path.join(REPO, "examples", "tiny_llama.yaml"), encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    monitor = str(work / "monitor")
    config["monitor_config"] = {"monitor_on": True, "dump_path": monitor, "step_interval": 1,
                                "device_local_norm_format": ["log"], "local_norm_format": ["log"]}
    config_path = work / "monitored.yaml"
    config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
    report = work / "emulator.json"
    out = work / "out"
    proc = subprocess.run(
        [sys.executable, EMULATION, "--user-tensordump", "--report", str(report), "--",
         "--config", str(config_path), "--mode", "graph", "--steps", str(STEPS), "--output-dir", str(out),
         "--dump", "task=tensor", "--dump", "backend=tensordump", "--dump", "steps=1"],
        cwd=str(work), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900, check=False,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert proc.returncode == 0, proc.stdout[-5000:]
    with open(report, encoding="utf-8") as handle:
        written = json.load(handle)["written"]
    with open(out / "run_tiny_llama.log", encoding="utf-8", errors="replace") as handle:
        log = handle.read()
    return monitor, written, out / "celldump", log


def _ids(written, folder, prefix):
    pattern = re.compile(rf"^{prefix}_float32_(\d+)\.npy$")
    names = [os.path.basename(p) for p in written if os.path.dirname(p) == folder]
    return sorted(int(m[1]) for m in map(pattern.match, names) if m)


def test_the_monitor_files_appear_on_every_step_with_capture_attached(monitored_run):
    monitor, written, _, log = monitored_run
    folder = os.path.join(monitor, "rank_0")
    finish = _ids(written, folder, "finish_step")
    norms = _ids(written, folder, "device_local_norm")
    assert len(finish) == STEPS and len(norms) == STEPS, (finish, norms)
    # One of each per step, in step order: each step's norm comes just before its finish marker.
    assert all(n < f for n, f in zip(norms, finish)) and all(f < n for f, n in zip(finish, norms[1:]))
    assert "write TensorDump files on every step" in log and "dump_local_norm_path=" in log


def test_the_capture_still_gives_exactly_the_selected_step(monitored_run):
    _, written, dump, _ = monitored_run
    graph_folders = {os.path.basename(os.path.dirname(p)) for p in written if "/celldump/" in p}
    assert graph_folders == {"step1"}, "the steps not selected ran the graph without capture ops"
    assert sorted(n for n in os.listdir(dump) if fmt.parse_step_dir_name(n) is not None) == ["step1"]
    raw = dump / fmt.RAW_ROOT / "rank0"
    assert sorted(os.listdir(raw)) == [fmt.MANIFEST_FILE], "the raw step was removed once processed"
    with open(dump / "step1" / "rank" / fmt.DUMP_JSON, encoding="utf-8") as handle:
        data = json.load(handle)["data"]
    assert any(".backward." in name for name in data) and len(data) > 50
