"""What a newcomer meets in the first hour: short messages, the README's promises, the main job."""

from __future__ import annotations

import glob
import importlib.metadata
import io
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import yaml

from mf_celldump.config import DumpConfig
from mf_celldump.errors import ConfigError
from mf_celldump.processing.driver import process_dump
from tests.support import formats as fmt
from tests.support.hostile_dumps import REPO, A, F, build_dump, limited_python, run_cli
from tests.support.mcore_cpu_patches import load_example

README = os.path.join(REPO, "README.md")


def _read(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read()


# -- messages stay short whatever the value ----------------------------------------------

def _alias_bomb(key: str, depth: int = 10) -> str:
    """A YAML config whose ``key`` is nested anchors ``depth`` deep: 10**depth items when expanded."""
    lines = ["_anchors:", "  - &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    for level in range(1, depth + 1):
        lines.append(f"  - &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    lines.append(f"{key}: *a{depth}")
    return "\n".join(lines) + "\n"


BOMB_KEYS = ("steps", "ranks", "include", "exclude", "exclude_classes", "statistics", "layer_mapping", "task",
             "data_mode", "backend", "dump_path", "jobs", "process_on_train_end")


def test_alias_bomb_in_any_key_is_a_short_message_within_300_mb(tmp_path):
    paths = []
    for key in BOMB_KEYS:
        path = tmp_path / f"{key}.yaml"
        text = _alias_bomb(key).replace("_anchors:", "type: CellDumpCallback\n_anchors:")
        path.write_text(text.replace("_anchors", "anchors_" + key))
        paths.append(str(path))
    code = textwrap.dedent(f"""
        import sys, yaml; sys.path.insert(0, {REPO!r})
        from mf_celldump.config import DumpConfig
        from mf_celldump.errors import ConfigError
        for path in {paths!r}:
            with open(path) as handle:
                data = yaml.safe_load(handle)
            data = {{k: v for k, v in data.items() if not k.startswith("anchors_")}}
            try:
                DumpConfig.from_dict(data, source=path)
                print("ACCEPTED", path)
            except ConfigError as err:
                print("LEN", len(str(err).replace(path, "")), str(err)[:60])
    """)
    proc = limited_python(code, limit_mb=300, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lengths = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("LEN")]
    assert len(lengths) == len(BOMB_KEYS) and max(lengths) < 400, proc.stdout


def test_alias_bomb_through_from_yaml_names_the_key(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb("steps").replace("_anchors", "stepz_anchors"))
    with pytest.raises(ConfigError) as err:
        DumpConfig.from_yaml(str(path))
    message = str(err.value)
    assert "unknown key 'stepz_anchors'" in message and len(message.replace(str(path), "")) < 400
    path.write_text(_alias_bomb("steps", depth=1).replace("_anchors:\n", "").replace("  - &a0", "x: &a0")
                    .replace("  - &a1", "y: &a1"))
    with pytest.raises(ConfigError, match="unknown key 'x'"):
        DumpConfig.from_yaml(str(path))


# -- seven modes for a three-argument cell -----------------------------------------------

def test_surplus_modes_are_named():
    from mindspore import nn

    from mf_celldump.capture.construct import surplus_mode_warnings
    from mf_celldump.mapping import modes_for_network
    from mf_celldump.mapping.parser import parse_mapping_text

    class Attention(nn.Cell):
        def construct(self, x, freqs_cis, mask):
            return x

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.attention = Attention()
            self.free = FreeArgs()

        def construct(self, x):
            return self.attention(x, x, x)

    class FreeArgs(nn.Cell):
        def construct(self, *inputs):
            return inputs[0]

    mapping = parse_mapping_text(textwrap.dedent("""
        Block:
          attention: self_attention([in, _, in, out, in, _, _], [out])
          free: free([in, in, in, in, in, in, in, in], [out])
    """), source="my_mapping.yaml")
    net = Block()
    modes = modes_for_network(mapping, net.cells_and_names())
    warnings = surplus_mode_warnings(modes, net.cells_and_names())
    assert warnings == [
        "my_mapping.yaml:3: attention (Attention) takes 3 input(s) (x, freqs_cis, mask) but the entry "
        "self_attention([in, _, in, out, in, _, _], [out]) gives 7 input modes; surplus, ignored: "
        "#3 out, #4 in, #5 _, #6 _"]


def test_a_mapping_entry_of_a_million_modes_is_warned_in_one_short_line():
    from mindspore import nn

    from mf_celldump.capture.construct import surplus_mode_warnings
    from mf_celldump.mapping import modes_for_network
    from mf_celldump.mapping.parser import parse_mapping_text

    class Head(nn.Cell):
        def construct(self, x):
            return x

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.head = Head()

    modes = ", ".join(["in"] * 1_000_000)
    mapping = parse_mapping_text(f"Net:\n  head: output_layer([{modes}], [out])\n", source="big.yaml")
    net = Net()
    (warning,) = surplus_mode_warnings(modes_for_network(mapping, net.cells_and_names()), net.cells_and_names())
    assert len(warning) < 1000, len(warning)
    assert warning.startswith("big.yaml:2: head (Head) takes 1 input(s) (x) but the entry output_layer([in, in")
    assert "gives 1000000 input modes; surplus, ignored: #1 in, #2 in" in warning and "and 999987 more" in warning


def test_an_error_names_the_callback_once_and_stays_bounded():
    """MindFormers' registry re-raises as type(e)(f"{name}: {e}") in front of a message naming the
    class already; and no message grows with the value it quotes."""
    from mf_celldump.errors import MAX_MESSAGE_CHARS, AttachError

    doubled = ConfigError("CellDumpCallback: CellDumpCallback: unknown key 'dump_pth'")
    assert str(doubled) == "CellDumpCallback: unknown key 'dump_pth'"
    assert str(ConfigError("steps: steps: 3")) == "steps: steps: 3"  # a key, not a class name: kept
    huge = AttachError("x" * 3_000_000)
    assert len(str(huge)) <= MAX_MESSAGE_CHARS and "characters left out" in str(huge)
    assert str(AttachError(str(huge))) == str(huge)  # bounding twice (a pickled copy) changes nothing


# -- where run_mindformer.py comes from --------------------------------------------------

def test_readme_says_run_mindformer_py_is_not_in_the_pip_package():
    files = importlib.metadata.files("mindformers") or []
    assert not any(str(f).endswith("run_mindformer.py") for f in files), "pip package has it now: update README"
    text = _read(README)
    assert "`pip install mindformers` does not install it" in text
    version = importlib.metadata.version("mindformers")
    assert f"--branch v{version}" in text and f"for mindformers {version}" in text


# -- the msprobe command without PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION --------------------

def test_msprobe_command_runs_without_the_protobuf_variable(tmp_path):
    """constraints.txt pins protobuf 3.20.3, with which the plain `msprobe` script works."""
    assert "protobuf==3.20.3" in _read(os.path.join(REPO, "constraints.txt"))
    msprobe = os.path.join(os.path.dirname(sys.executable), "msprobe")
    if not os.path.exists(msprobe):
        pytest.skip("msprobe is not installed next to this Python")
    for name in ("a", "b"):
        build_dump(str(tmp_path / name), steps=1)
        assert process_dump(str(tmp_path / name), jobs=1).ok
    env = {k: v for k, v in os.environ.items() if k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"}
    proc = subprocess.run([msprobe, "compare", "-tp", str(tmp_path / "a" / "step0"), "-gp",
                           str(tmp_path / "b" / "step0"), "-o", str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert glob.glob(str(tmp_path / "out" / "compare_result_*.csv"))
    readme = _read(README)
    assert "TypeError: Descriptors cannot be created directly." in readme and "the GIL is released" in readme


# -- every count says what it counts -------------------------------------------------------

def test_counts_say_what_they_count(tmp_path, caplog):
    builder = build_dump(str(tmp_path / "dump"), steps=1)
    writer = builder.step(0)
    writer.seq = 5000
    writer.value_file(0, F, A, (2,), fmt.KIND_NONE, None, call=0)
    writer.value_file(0, F, A, (3,), fmt.KIND_INT, 7, call=0)
    with caplog.at_level(logging.INFO, logger="mf_celldump.processing.driver"):
        report = process_dump(builder.dump_path, jobs=1)
    tensors = report.processed[0].tensor_files
    assert report.processed[0].value_files == 2 and report.files == tensors + 2
    leaves, values = _dump_json_leaves(os.path.join(builder.dump_path, report.processed[0].output))
    assert (leaves, values) == (report.tensors, report.values) and values >= 2
    assert (f"30 entries (cell calls) holding {leaves} tensors and {values} non-tensor values; {tensors + 2} raw "
            f"files read ({tensors} tensor files, 2 value files)") in report.summary(), report.summary()
    assert (f"step 0 rank 0: processed: 30 entries (cell calls) holding {leaves} tensors and {values} non-tensor "
            f"values; {tensors + 2} raw files read ({tensors} tensor files, 2 value files), 1 capture read from "
            "records.jsonl or statistic.csv") in caplog.text


def test_counts_of_one_and_weight_gradient_entries_are_named_as_such(tmp_path):
    """One non-tensor value is "1 non-tensor value"; weight-gradient entries are not called cell calls."""
    builder = build_dump(str(tmp_path / "dump"), steps=1)
    writer = builder.step(0)
    writer.seq = 5000
    writer.value_file(0, F, A, (2,), fmt.KIND_INT, 7, call=0)
    for cell in (3, 4):
        writer.tensor(cell, fmt.BACKWARD, "g", (0,), np.ones((2, 2), np.float32))
    report = process_dump(builder.dump_path, jobs=1)
    tensors = report.processed[0].tensor_files
    assert report.processed[0].weight_grad_entries == 2
    leaves, values = _dump_json_leaves(os.path.join(builder.dump_path, report.processed[0].output))
    assert (leaves, values) == (report.tensors, report.values)
    assert (f"32 entries (30 cell calls, 2 weight-gradient entries) holding {leaves} tensors and {values} non-tensor "
            f"values; {tensors + 1} raw files read ({tensors} tensor files, 1 value file)") in report.summary(), \
        report.summary()



def _dump_json_leaves(folder):
    """(tensor leaves, other leaves) of a folder's dump.json, as the main job's summary counts them."""
    return load_example("run_tiny_llama")._folder_counts(folder)[1:]


# -- register-path --yaml prints the entry to add ------------------------------------------

def test_register_path_yaml_is_one_entry_for_an_existing_list():
    proc = run_cli("register-path", "--yaml")
    assert proc.returncode == 0 and "callbacks:" not in proc.stdout.replace("`callbacks:`", "")
    user_config = "callbacks:\n  - type: MFLossMonitor\n  - type: CheckpointMonitor\n    prefix: llama\n"
    merged = yaml.safe_load(user_config + proc.stdout)
    assert [c["type"] for c in merged["callbacks"]] == ["MFLossMonitor", "CheckpointMonitor", "CellDumpCallback"]
    assert merged["callbacks"][2]["auto_register"] == "celldump_callback.CellDumpCallback"
    assert "--register_path " + run_cli("register-path").stdout.strip() in proc.stdout


# -- the main job -------------------------------------------------------------------

def test_modules_cache_is_ignored_and_kept_out_of_the_checkout(monkeypatch, tmp_path):
    assert {"modules/", "compare_out/"} <= set(_read(os.path.join(REPO, ".gitignore")).split())  # README's folders
    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        import run_tiny_llama
    finally:
        sys.path.remove(os.path.join(REPO, "examples"))
    for name in ("OM_MODULES_CACHE", "LOCAL_DEFAULT_PATH"):
        # setenv first so that monkeypatch restores the variable (delenv of an unset one records
        # nothing, and keep_caches_in's value would leak into the later subprocess tests)
        monkeypatch.setenv(name, "unused")
        monkeypatch.delenv(name)
    run_tiny_llama.keep_caches_in(str(tmp_path))
    assert os.environ["OM_MODULES_CACHE"] == str(tmp_path / "modules")
    assert os.environ["LOCAL_DEFAULT_PATH"] == str(tmp_path)


@pytest.mark.slow
def test_main_job_prints_progress_and_the_dump_keeps_the_rest_in_a_log(tmp_path):
    """The README's main job, in an empty working folder: a few lines here, MindFormers' in the log."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", "run_tiny_llama.py"), "--output-dir",
                           str(out)], cwd=str(tmp_path), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) <= 15 and proc.stderr == "", proc.stdout + proc.stderr
    assert [line.split(":")[0] for line in lines if line.startswith("step ")] == ["step 0", "step 1", "step 2"]
    assert f"dump: {out / 'celldump'}" in lines
    # 68 cell calls + 21 parameters_grad entries; 173 inputs/outputs (the attention masks' and the loss's
    # input gradients included) + 21 weights + 21 weight gradients
    assert any(line.startswith("  step2/rank: 89 entries") and "215 tensors" in line for line in lines), lines
    log = _read(str(out / "run_tiny_llama.log"))
    assert "Init Config" in log and "step 2 rank 0: processed" in log
    assert sorted(os.listdir(tmp_path)) == ["out"], "nothing (output/, modules/) in the working folder"
    assert (out / "modules").is_dir()
    # It ends with how to make a second run that differs and compare the two dumps (every step), by
    # commands that run as printed in a shell whose PATH lacks the venv (README's command set it for
    # itself only); msprobe's only where it is installed.
    dump = out / "celldump"
    python = sys.executable
    mf_celldump = os.path.join(os.path.dirname(python), "mf-celldump")
    other = f"{out}-seed1"
    script = os.path.join(REPO, "examples", "run_tiny_llama.py")
    assert lines[-4:] == [
        "compare two runs, every step: make a second one that differs (another seed: other initial weights), "
        "then compare the two dumps:",
        f"  {python} {script} --output-dir {other} --set seed=1",
        f"  {mf_celldump} compare {other}/celldump {dump} -o compare_out",
        f"  (or msprobe's, one step at a time: msprobe compare -tp <other run's dump>/step0 -gp {dump}/step0 -o "
        "compare_out)"], lines
    shell_env = dict(os.environ, PATH="/usr/bin:/bin")
    # The same command again: refused before it trains, naming the flag the user gave; nothing changed.
    before = sorted(p for p in glob.glob(str(dump / "**"), recursive=True))
    again = subprocess.run([python, script, "--output-dir", str(out)], cwd=str(tmp_path), capture_output=True,
                           text=True, timeout=900)
    assert again.returncode == 1 and "training FAILED: DumpInUseError" in again.stdout, again.stdout[-3000:]
    assert "give another --output-dir (or --dump dump_path=DIR)" in again.stdout
    assert f"Set dump_path (unset: the dump goes to <output_dir>/celldump) or output_dir (here {out})" in again.stdout
    assert sorted(p for p in glob.glob(str(dump / "**"), recursive=True)) == before
    second = subprocess.run(lines[-3].strip(), shell=True, cwd=str(tmp_path), env=shell_env, capture_output=True,
                            text=True, timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    compared = subprocess.run(lines[-2].strip(), shell=True, cwd=str(tmp_path), env=shell_env, capture_output=True,
                              text=True, timeout=900)
    assert compared.returncode == 1, compared.stdout[-3000:] + compared.stderr[-3000:]
    assert "FIRST DIVERGENCE (forward, step 0 rank 0)" in compared.stdout
    assert all(f"step {n} rank 0 (step{n}/rank)" in compared.stdout for n in range(3)), compared.stdout
    assert (tmp_path / "compare_out" / "report.html").is_file()


def test_python_m_mf_celldump_is_the_command():
    proc = subprocess.run([sys.executable, "-m", "mf_celldump", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("mf-celldump "), proc.stdout + proc.stderr


def test_without_processing_the_example_points_at_raw_data_not_at_missing_folders(tmp_path, monkeypatch):
    """`process_on_train_end: false`: the step lines say the step is raw, and the closing hint says how to
    make the step folders instead of naming ones that do not exist; with processing it names one that does.
    The hint's command is mf-celldump's own; msprobe's only where msprobe is on the PATH."""
    from mindspore import Tensor
    from mindspore.train.callback import RunContext, _InternalCallbackParam

    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        import console
        import run_tiny_llama
    finally:
        sys.path.remove(os.path.join(REPO, "examples"))
    dump = str(tmp_path / "celldump")
    build_dump(dump, steps=3)
    out = io.StringIO()
    shown = console.Console(out)
    params = _InternalCallbackParam()
    params.cur_step_num, params.initial_step, params.net_outputs = 1, 0, Tensor(1.5)
    console.step_progress_callback(shown, 3, dump, None, processed=False).on_train_step_end(RunContext(params))
    run_tiny_llama._closing(shown, dump, None, None)
    text = out.getvalue()
    assert "step 0: loss 1.5000" in text and "captured into celldump/_raw/ (raw" in text, text
    assert "step0" not in text.replace("_raw/rank0/step0", ""), text
    tool = run_tiny_llama.celldump_command()
    assert f"{tool} process {dump}" in text and f"{tool} compare <other run's dump> {dump}" in text, text
    shutil.rmtree(os.path.join(dump, fmt.RAW_ROOT, "rank0", "step0"))
    assert process_dump(dump, jobs=1).ok
    assert shutil.which("msprobe"), "the test environment installs msprobe"
    out.seek(0)
    out.truncate(0)
    run_tiny_llama._closing(shown, dump, None, None)
    assert f"msprobe compare -tp <other run's dump>/step1 -gp {dump}/step1" in out.getvalue()
    last = out.getvalue().splitlines()[-2]
    assert last == f"compare two runs (every step): {tool} compare <other run's dump> {dump} -o compare_out"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # msprobe not installed: no hint at it
    out.seek(0)
    out.truncate(0)
    run_tiny_llama._closing(shown, dump, None, None)
    assert out.getvalue().splitlines()[-1] == last and "msprobe" not in out.getvalue(), out.getvalue()


def _example_modules():
    sys.path.insert(0, os.path.join(REPO, "examples"))
    try:
        import console
        import run_tiny_llama
    finally:
        sys.path.remove(os.path.join(REPO, "examples"))
    return console, run_tiny_llama


def _progress_to(console, shown, dump, selected, last_step):
    """The example's step lines for steps 0..last_step, as its progress callback prints them."""
    from mindspore import Tensor
    from mindspore.train.callback import RunContext, _InternalCallbackParam

    progress = console.step_progress_callback(shown, last_step + 1, dump, selected)
    for step in range(last_step + 1):
        params = _InternalCallbackParam()
        params.cur_step_num, params.initial_step, params.net_outputs = step + 1, 0, Tensor(1.5)
        progress.on_train_step_end(RunContext(params))
    return progress


def test_steps_the_run_never_reached_are_named_last_without_a_process_hint(tmp_path):
    """`--dump steps=5` on a 3-step run: the end line names step 5 and the last step reached; nothing
    suggests `process`, which cannot make a step that never ran. With a step captured as well, the
    compare hint stays and the unreached steps still close."""
    console, run_tiny_llama = _example_modules()
    from mf_celldump.config import IndexSelection

    dump = str(tmp_path / "celldump")
    out = io.StringIO()
    shown = console.Console(out)
    selected = IndexSelection.parse("5", "steps")
    progress = _progress_to(console, shown, dump, selected, 2)
    note = run_tiny_llama.ending_note(selected, progress, dump)
    run_tiny_llama._closing(shown, dump, None, None, note)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "selected step 5 never reached: the run ended after step 2 (more --steps or --epochs reach it)"
    assert "mf-celldump process" not in out.getvalue() and "not captured" in lines[0], lines
    build_dump(dump, steps=2)
    assert process_dump(dump, jobs=1).ok
    selected = IndexSelection.parse("0-1,5-20", "steps")
    assert run_tiny_llama.ending_note(selected, progress, dump) == (
        "selected steps 5,6,7,8,9,... never reached: the run ended after step 2 (more --steps or --epochs reach "
        "them)")
    out.seek(0)
    out.truncate(0)
    run_tiny_llama._closing(shown, dump, None, None, run_tiny_llama.ending_note(selected, progress, dump))
    assert "compare two runs" in out.getvalue() and out.getvalue().splitlines()[-1].startswith("selected steps 5,")
    every = run_tiny_llama.ending_note(None, progress, dump)
    assert every is None and run_tiny_llama.ending_note(IndexSelection.parse("0-2", "steps"), progress, dump) is None


@pytest.mark.parametrize("mode", ["pynative", "graph"])
def test_the_run_summary_names_selected_steps_it_never_reached(tmp_path, mode):
    """A run of steps 0-2 with steps "1,5-6" selected: its summary says 5 and 6 never came, after step 2."""
    import mindspore as ms
    from mindspore import nn

    from mf_celldump.integrations.run import TrainingRun

    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    try:
        net = nn.Dense(4, 2)
        train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.1))
        run = TrainingRun(DumpConfig.coerce({"dump_path": str(tmp_path / "d"), "steps": "1,5-6",
                                             "layer_mapping": None}))
        run.ensure_attached(train)
        for step in range(3):
            run.begin_step(step)
            train(ms.Tensor(np.ones((2, 4), np.float32)), ms.Tensor(np.zeros((2, 2), np.float32)))
            run.end_step()
        summary = run.finish()
    finally:
        ms.set_context(mode=before)
    assert summary.processed_steps == [1], summary.text()
    assert "selected steps 5,6 never reached: the run ended after step 2" in summary.notes, summary.text()


def test_with_steps_anomaly_the_lines_say_watched_and_the_end_says_no_rule_fired(tmp_path):
    console, run_tiny_llama = _example_modules()
    from mf_celldump.config import DumpConfig

    dump = str(tmp_path / "celldump")
    out = io.StringIO()
    shown = console.Console(out)
    selected = DumpConfig.from_dict({"steps": "anomaly", "watch": True}).steps
    progress = _progress_to(console, shown, dump, selected, 1)
    run_tiny_llama._closing(shown, dump, None, None, run_tiny_llama.ending_note(selected, progress, dump))
    lines = out.getvalue().splitlines()
    assert lines[0] == "step 0: loss 1.5000, 0.0 s, watched (a step is captured when a watch rule fires)", lines
    assert lines[-1] == "steps=anomaly: no watch rule fired, so no step was captured (the rules: docs/watch.md)"
    assert "mf-celldump process" not in out.getvalue()


def test_a_refused_rerun_names_the_flag_that_moves_the_dump():
    """With dump_path in the entry another --output-dir would not move the dump: the line names --dump."""
    _, run_tiny_llama = _example_modules()
    assert "give another --output-dir (or --dump dump_path=DIR)" in run_tiny_llama._rerun_refused("/x", False)
    named = run_tiny_llama._rerun_refused("/x", True)
    assert "give another --dump dump_path=DIR, or delete" in named and "--output-dir" not in named


def test_the_second_run_keeps_the_arguments_but_its_folders_and_seed():
    _, run_tiny_llama = _example_modules()
    argv = ["--mode", "graph", "--dump", "steps=1", "--output-dir=/o", "--set", "seed=3", "--dump", "dump_path=/d"]
    second = run_tiny_llama.second_run_arguments(argv, "/o", 3, "/d")
    assert second == ["--mode", "graph", "--dump", "steps=1", "--output-dir", "/o-seed4", "--set", "seed=4",
                      "--dump", "dump_path=/d-seed4"]
    assert run_tiny_llama._dump_path_of_arguments(second) == "/d-seed4"
    plain = run_tiny_llama.second_run_arguments(["--output-dir", "out"], "/abs/out", 0, None)
    assert plain == ["--output-dir", "/abs/out-seed1", "--set", "seed=1"]
    assert run_tiny_llama._dump_path_of_arguments(plain) == "/abs/out-seed1/celldump"


def _readme_dump_values():
    """Every key=value a CellDumpCallback entry of README's YAML blocks shows, and each `steps` form of its
    configuration table, as `--dump` arguments (with the watch where `steps: anomaly` needs it)."""
    text = _read(README)
    values = []
    for block in text.split("```yaml")[1:]:
        lines = block.split("```")[0].splitlines()
        for i, line in enumerate(lines):
            if line.split("#")[0].strip() == "- type: CellDumpCallback":
                indent = len(line) - len(line.lstrip())
                entry = [line]
                for rest in lines[i + 1:]:
                    if len(rest) - len(rest.lstrip()) <= indent:
                        break
                    entry.append(rest)
                (loaded,) = yaml.safe_load(textwrap.dedent("\n".join(entry)))
                values.append([f"{k}={v}" for k, v in loaded.items() if k not in ("type", "auto_register")])
    row = next(line for line in text.splitlines() if line.startswith("| `steps` |"))
    assert "`anomaly` (with `watch`)" in row and '`"0,5-7"`' in row and '`[0, "5-7"]`' in row
    values += [["steps=all"], ["steps=3"], ["steps=0,5-7"], ['steps=[0, "5-7"]'], ["steps=anomaly", "watch=true"]]
    # and every literal `--dump KEY=VALUE` the READMEs, docs/ and the example's own help show
    shown = [README, os.path.join(REPO, "examples", "README.md"), os.path.join(REPO, "examples", "run_tiny_llama.py"),
             *glob.glob(os.path.join(REPO, "docs", "*.md"))]
    for path in shown:
        for found in re.findall(r"--dump ([a-z_]+=[^\s`)]+)", _read(path)):
            values.append([found])
    return values


def test_every_dump_value_the_readme_shows_is_taken_by_the_example():
    """Each through the example's own config path (its `--dump` flags, the steps it selects), no training."""
    _, run_tiny_llama = _example_modules()
    shown = _readme_dump_values()
    assert ["steps=anomaly", "watch=True"] in shown, shown  # README's "Catch the step that goes wrong"
    assert ["task=tensor"] in shown and ["rank_verdict=true"] in shown, shown  # the example's help, its README
    for dumps in shown:
        argv = [item for value in dumps for item in ("--dump", value)]
        config = run_tiny_llama.load_config(run_tiny_llama.parse_args(argv))
        selected = run_tiny_llama._selected_steps(config)
        steps = dict(v.split("=", 1) for v in dumps).get("steps")  # else the example YAML's own (0-2)
        assert (selected is None) == (steps == "all"), (dumps, selected)
        if steps == "anomaly":
            assert selected.on_anomaly


@pytest.mark.slow
def test_main_job_with_steps_anomaly_and_the_watch_trains_to_the_end(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "examples", "run_tiny_llama.py"), "--output-dir",
                           str(out), "--dump", "steps=anomaly", "--dump", "watch=true"], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and "FAILED" not in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("step ")] == ["step 0", "step 1", "step 2"]
    assert lines[-1] == "steps=anomaly: no watch rule fired, so no step was captured (the rules: docs/watch.md)"
    assert "watch: no rule fired" in _read(str(out / "run_tiny_llama.log"))


def test_readme_names_every_compare_exit_code_and_what_needs_matplotlib():
    from mf_celldump.cli.conventions import ExitCode

    text = " ".join(_read(README).split())
    assert f"{int(ExitCode.COMMON_FACTOR)} every difference is one common factor" in text
    assert "exit 0 within thresholds, 1 diverged, 2 bad input" in text
    assert "Only the PNG plots" in text
    assert "`report.html` (its chart drawn by the page itself) are written without it" in text


def test_examples_readme_and_main_readme_describe_the_quiet_main_job():
    assert "run_tiny_llama.log" in _read(README)
    assert "--verbose" in _read(os.path.join(REPO, "examples", "README.md"))
