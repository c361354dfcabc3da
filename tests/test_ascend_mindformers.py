"""The tiny MindFormers LLaMA in graph mode with emulated Ascend primitives: examples/ascend/acceptance.sh.

The acceptance script NPU owners run first is run here against the emulation of
tests/support/ascend_emulation.py (``--emulate``): five real MindFormers trainings (PyNative
reference, graph tensor task, graph statistics task, a run resumed at global step 5
and a resumed run whose steps are all in the past), each invariant printed PASS/FAIL.
The emulated graph is (semi-)auto parallel, so the bundled mapping's 'in' dumps carry
MindSpore's ``_in`` suffix and the gradient pairing is visible in the file names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support import formats as fmt

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "examples", "ascend", "acceptance.sh")


@pytest.fixture(scope="module")
def acceptance(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("acceptance") / "work"
    proc = subprocess.run(["bash", SCRIPT, "--emulate", "--workdir", str(workdir)], cwd=REPO, text=True,
                          env=dict(os.environ, PYTHON=sys.executable), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=1800, check=False)
    return proc, workdir


def _report(workdir, name):
    with open(workdir / f"{name}.emulator.json", encoding="utf-8") as handle:
        return json.load(handle)


def test_every_invariant_passes(acceptance):
    proc, _ = acceptance
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout[-5000:]
    assert not [line for line in lines if line.startswith("FAIL")]
    assert len([line for line in lines if line.startswith("PASS")]) >= 20
    for text in ("tensor run: exactly step1, step3 step folders", "equal to the PyNative run's", "0 gradients missing",
                 "statistics run: step1 has", "resumed run: exactly step6, step8", "past run: steps 1,3"):
        assert any(line.startswith("PASS") and text in line for line in lines), text


def test_mindspore_wrote_only_the_selected_steps(acceptance):
    _, workdir = acceptance
    folders = {os.path.basename(os.path.dirname(p)) for p in _report(workdir, "tensor")["written"]}
    assert folders == {"step1", "step3"}
    assert _report(workdir, "statistics")["written"] == []  # MS_KERNEL_LAUNCH_SKIP=TensorDump
    # Resumed at global step 5 in a new process: graph counter 1 and 3 hold steps 6 and 8.
    assert {os.path.basename(os.path.dirname(p)) for p in _report(workdir, "resumed")["written"]} == {
        "step1", "step3"}
    assert _report(workdir, "past")["written"] == []


def test_bundled_mapping_in_modes_pair_with_the_opposite_gradient_hook(acceptance):
    _, workdir = acceptance
    parsed_names = [fmt.parse_raw_tensor_name(os.path.basename(p)) for p in _report(workdir, "tensor")["written"]]
    parsed_names = [p for p in parsed_names if p is not None and p.key.kind == fmt.KIND_TENSOR]  # not the nulls
    # A backward input's path is its rank among the call's top-level tensor arguments (msprobe's numbering).
    tensor_args = {}
    for parsed in parsed_names:
        key = parsed.key
        if key.direction == fmt.FORWARD and key.slot == "a" and len(key.path) == 1:
            tensor_args.setdefault(key.cell_id, set()).add(key.path)
    modes = {}
    for parsed in parsed_names:
        key = parsed.key
        path = key.path
        if key.direction == fmt.BACKWARD and key.slot == "a" and len(path) == 1:
            path = sorted(tensor_args[key.cell_id])[path[0]]
        modes[(key.direction, key.cell_id, key.slot, path)] = parsed.in_mode
    forward_in = [k for k, v in modes.items() if k[0] == fmt.FORWARD and v]
    assert len(forward_in) >= 10, "the bundled LLaMA mapping's 'in' modes reach the TensorDump files"
    pairs = [(v, modes[(fmt.BACKWARD,) + k[1:]]) for k, v in modes.items()
             if k[0] == fmt.FORWARD and (fmt.BACKWARD,) + k[1:] in modes]
    assert pairs and all(forward != backward for forward, backward in pairs)
