"""Input that used to end in a traceback is a clear error (exit 2 on the command line), and
input that used to pass without a word gets a warning or an error, as docs/robustness.md says.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np
import pytest

import mf_celldump
from mf_celldump.config import DumpConfig
from mf_celldump.errors import ConfigError, MappingError
from mf_celldump.processing.driver import process_dump
from tests.support import capture_net as cn
from tests.support import formats as fmt
from tests.support.hostile_dumps import build_dump, edit_manifest, lie_about_shape, run_cli

DEEP = 100_000


def _write(path, data):
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(path, mode) as handle:
        handle.write(data)
    return str(path)


# -- configuration ---------------------------------------------------------------------------

CONFIG_FILES = {
    "a flow list nested 100,000 deep": "steps: " + "[" * DEEP + "]" * DEEP + "\n",
    "a flow mapping nested 100,000 deep": "steps: " + "{a: " * DEEP + "1" + "}" * DEEP + "\n",
    "binary": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe",
    "latin-1 text": "task: t\xe9nsor\n".encode("latin-1"),
    "a NUL byte": "task: tensor\x00\n",
}


@pytest.mark.parametrize("kind", sorted(CONFIG_FILES))
def test_a_config_file_that_is_no_yaml_text_is_a_config_error(tmp_path, kind):
    path = _write(tmp_path / "config.yaml", CONFIG_FILES[kind])
    with pytest.raises(ConfigError) as raised:
        DumpConfig.from_yaml(path)
    assert path in str(raised.value) and len(str(raised.value)) < 400, raised.value


def test_a_key_given_twice_in_a_config_file_is_an_error_naming_both_lines(tmp_path):
    path = _write(tmp_path / "config.yaml", "task: tensor\nsteps: 0\ntask: statistics\n")
    with pytest.raises(ConfigError, match=r"config.yaml:3: key 'task' given twice \(first at line 1\)"):
        DumpConfig.from_yaml(path)


@pytest.mark.parametrize("values, words", [
    ({"process_timeout": 10**400}, "process_timeout: invalid value"),
    ({"process_timeout": 1e300}, "at most 31536000"),
    ({"dump_path": "dump\0here"}, "without NUL bytes"),
    ({"backend": "device_stats", "task": "tensor"}, "writes no tensor file"),
])
def test_config_values_that_went_through_are_config_errors(values, words):
    with pytest.raises(ConfigError, match=words):
        DumpConfig.from_dict(values)


# -- layer mappings nested 50,000 deep ------------------------------------------------------

MAPPINGS = {
    "flow list": "LlamaModel:\n  x: " + "[" * 50_000 + "]" * 50_000 + "\n",
    "flow map": "LlamaModel: " + "{a: " * 50_000 + "b" + "}" * 50_000 + "\n",
}


@pytest.mark.parametrize("kind", sorted(MAPPINGS))
def test_a_mapping_nested_50000_deep_is_a_clear_error_at_attach_and_on_the_command_line(tmp_path, kind):
    path = _write(tmp_path / "deep.yaml", MAPPINGS[kind])
    cn.set_mode("pynative")
    with pytest.raises(MappingError, match="deep.yaml:[12]: "):
        mf_celldump.attach(cn.make_net(), {"dump_path": str(tmp_path / "d"), "layer_mapping": [path]})
    proc = run_cli("mapping", "check", path)
    assert proc.returncode == 1 and "deep.yaml:" in proc.stdout  # mapping check: an invalid file is a finding
    proc = run_cli("mapping", "show", path)
    assert proc.returncode == 2 and "deep.yaml:" in proc.stderr
    build_dump(str(tmp_path / "a"), steps=1)
    process_dump(str(tmp_path / "a"), jobs=1)
    proc = run_cli("compare", str(tmp_path / "a"), str(tmp_path / "a"), "--mapping", path, "-o", str(tmp_path / "o"))
    assert proc.returncode == 2 and "deep.yaml:" in proc.stderr, proc.stderr


# -- compare and anomalies -----------------------------------------------------------------

def test_compare_with_a_tensor_header_claiming_a_trillion_elements_names_the_file(tmp_path):
    for name in ("a", "b"):
        build_dump(str(tmp_path / name), steps=1)
        assert process_dump(str(tmp_path / name), jobs=1).ok
    data_dir = tmp_path / "b" / "step0" / "rank" / fmt.TENSOR_DIR
    lying = str(data_dir / sorted(os.listdir(data_dir))[0])
    lie_about_shape(lying, "(1000000000000,)")
    proc = run_cli("compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o", str(tmp_path / "o"))
    assert "MemoryError" not in proc.stdout + proc.stderr
    assert f"{lying}: its header declares 4000000000000 data bytes" in proc.stdout, proc.stdout
    assert "1 on statistics" in proc.stdout and "install torch" not in proc.stdout  # falls back, says why


GARBAGE = [b"\x89PNG\r\n\x1a\n\xff\xfe garbage",
           b'{"data": {"Cell.a.A.forward.0": ' + b"[" * DEEP + b"]" * DEEP + b"}}"]


@pytest.mark.parametrize("content", GARBAGE, ids=["binary", "nested 100,000 deep"])
def test_anomalies_on_a_garbage_dump_json_is_bad_input(tmp_path, content):
    folder = tmp_path / "d" / "step0" / "rank"
    folder.mkdir(parents=True)
    _write(folder / fmt.DUMP_JSON, content)
    proc = run_cli("anomalies", str(tmp_path / "d"))
    assert proc.returncode == 2 and str(folder / fmt.DUMP_JSON) in proc.stderr, proc.stderr


# -- what used to pass without a word --------------------------------------------------------

def test_include_matching_no_cell_and_exclude_classes_removing_every_cell_are_warned(tmp_path, caplog):
    cn.set_mode("pynative")
    net = cn.make_net()
    with caplog.at_level(logging.WARNING, logger="mf_celldump"):
        mf_celldump.attach(net, {"dump_path": str(tmp_path / "a"), "include": ["layers.*", "layerz.*"]}).detach()
    assert "include pattern 'layerz.*' matches no cell of Net" in caplog.text
    assert "no cell of Net is captured" not in caplog.text
    caplog.clear()
    every_class = sorted({type(cell).__name__ for name, cell in net.cells_and_names() if name})
    with caplog.at_level(logging.WARNING, logger="mf_celldump"):
        mf_celldump.attach(net, {"dump_path": str(tmp_path / "b"), "exclude_classes": every_class}).detach()
    assert "no cell of Net is captured" in caplog.text and "nothing will be dumped" in caplog.text


def _save(builder, name, array):
    np.save(os.path.join(builder.rank_dir, "step0", name), array)


def test_raw_dtype_disagreeing_with_its_name_or_unknown_is_warned_and_the_data_dtype_given(tmp_path):
    builder = build_dump(str(tmp_path / "dump"), steps=1)
    _save(builder, "c0.f.a.t.n0.p5_float32_900.npy", np.arange(4, dtype=np.int64))
    _save(builder, "c0.f.a.t.n0.p6_quaternion8_901.npy", np.ones(4, np.float16))
    _save(builder, "c0.f.a.t.n0.p7_bfloat16_902.npy", np.ones(4, np.float32))  # how bfloat16 is stored
    report = process_dump(builder.dump_path, jobs=1)
    warnings = report.outcomes[0].warnings
    assert any("p5_float32_900.npy: its name says dtype float32, its data is int64" in w for w in warnings), warnings
    assert any("p6_quaternion8_901.npy: its name says no dtype capture writes, its data is float16" in w
               for w in warnings), warnings
    assert not any("p7_bfloat16" in w for w in warnings)
    with open(os.path.join(builder.dump_path, "step0", "rank", fmt.DUMP_JSON), encoding="utf-8") as handle:
        inputs = json.load(handle)["data"]["Cell.model.LlamaModel.forward.0"]["input_args"]
    assert [inputs[i]["dtype"] for i in (5, 6, 7)] == ["Int64", "Float16", "BFloat16"]


def test_a_forged_call_index_is_warned(tmp_path):
    builder = build_dump(str(tmp_path / "dump"), steps=1)
    _save(builder, "c0.f.a.t.n999999999.p0_float32_900.npy", np.ones(4, np.float32))
    report = process_dump(builder.dump_path, jobs=1)
    assert any("Cell.model.LlamaModel.forward.999999999: call number 999999999, but the step holds 2 call(s)" in w
               for w in report.outcomes[0].warnings), report.outcomes[0].warnings


def _second_rank(dump, rank=1):
    """A healthy distributed rank beside the one a test breaks: the dump as a whole goes on."""
    builder = build_dump(str(dump) + "-r", steps=1)
    edit_manifest(builder.rank_dir, rank=rank, distributed=True)
    shutil.move(builder.rank_dir, os.path.join(dump, fmt.RAW_ROOT, f"rank{rank}"))


@pytest.mark.parametrize("change, words", [
    ({"rank": 3}, "is the manifest of rank 3, not of the rank its folder names"),
    ({"distributed": "yes"}, "key 'distributed' has invalid value 'yes'; valid: true or false"),
    ("empty cell name", "cell 0 has an empty name"),
])
def test_manifest_fields_that_disagree_or_are_not_capture_values_are_errors(tmp_path, change, words):
    dump = str(tmp_path / "dump")
    builder = build_dump(dump, steps=1)
    if change == "empty cell name":
        manifest = edit_manifest(builder.rank_dir)
        manifest["cells"][0]["name"] = ""
        edit_manifest(builder.rank_dir, cells=manifest["cells"])
    else:
        edit_manifest(builder.rank_dir, **change)
    _second_rank(dump)
    report = process_dump(dump, jobs=1)
    assert [o.rank for o in report.processed] == [1]
    assert any(words in p for p in report.problems), report.problems
    assert os.listdir(os.path.join(builder.rank_dir, "step0")), "the raw data is kept"


def test_a_step_folder_whose_global_step_would_be_negative_is_not_processed(tmp_path):
    """graph numbering with graph_step_base -5: folder step3 would be global step -2; step7 is step 2."""
    dump = str(tmp_path / "dump")
    builder = build_dump(dump, steps=1)
    edit_manifest(builder.rank_dir, step_numbering="graph", graph_step_base=-5)
    os.rename(os.path.join(builder.rank_dir, "step0"), os.path.join(builder.rank_dir, "step3"))
    shutil.copytree(os.path.join(builder.rank_dir, "step3"), os.path.join(builder.rank_dir, "step7"))
    with open(os.path.join(builder.rank_dir, "step7", fmt.STEP_DONE_FILE), "w", encoding="utf-8") as handle:
        json.dump({"step": 2, "complete": True}, handle)
    report = process_dump(dump, jobs=1)
    assert [o.step for o in report.processed] == [2]
    assert any("step3: with graph_step_base -5" in p and "global step -2" in p for p in report.problems)
    assert os.listdir(os.path.join(builder.rank_dir, "step3"))
