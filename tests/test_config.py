"""Validation of every configuration key, the YAML loader and the lightweight-import promise."""

from __future__ import annotations

import importlib.resources
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from mf_celldump.config import BACKENDS, DATA_MODES, DumpConfig
from mf_celldump.errors import ConfigError, MappingError
from mf_celldump.statistics import DEFAULT_STATISTICS, STATISTICS, TASKS
from mf_celldump.userinput import IndexSelection


def config_error(values, *fragments):
    """Build from ``values``; expect ConfigError whose message holds every fragment."""
    with pytest.raises(ConfigError) as info:
        DumpConfig.from_dict(values)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


# --------------------------------------------------------------------------- defaults / keys


def test_defaults():
    cfg = DumpConfig()
    assert DumpConfig.from_dict({}) == cfg
    assert DumpConfig.from_dict(None) == cfg
    assert cfg.dump_path is None
    assert cfg.task == "statistics"
    assert cfg.data_mode == "all"
    assert cfg.steps.selects_all and cfg.ranks.selects_all
    assert cfg.include == ("*",)
    assert cfg.exclude == () and cfg.exclude_classes == ()
    assert cfg.layer_mapping == ("auto",)
    assert cfg.statistics == DEFAULT_STATISTICS
    assert cfg.backend == "auto"
    assert cfg.process_on_train_end is True
    assert cfg.parameters is True and cfg.captures_weights and cfg.captures_weight_gradients
    assert cfg.process_timeout == 1800.0
    assert cfg.jobs is None
    assert cfg.captures_forward and cfg.captures_backward


def test_keys_are_the_dataclass_fields():
    assert DumpConfig.keys() == (
        "dump_path",
        "task",
        "data_mode",
        "steps",
        "ranks",
        "include",
        "exclude",
        "exclude_classes",
        "layer_mapping",
        "statistics",
        "backend",
        "parameters",
        "process_on_train_end",
        "process_timeout",
        "jobs",
        "rank_verdict",
        "rank_verdict_timeout",
        "rank_verdict_port",
        "replica_groups",
        "watch",
        "anomaly_captures",
        "anomaly_max_bytes",
    )


def test_config_is_frozen():
    cfg = DumpConfig()
    with pytest.raises(AttributeError):
        cfg.task = "tensor"  # type: ignore[misc]


@pytest.mark.parametrize(
    "typo, suggestion",
    [
        ("data_mod", "data_mode"),
        ("stpes", "steps"),
        ("rank", "ranks"),
        ("dumppath", "dump_path"),
        ("tsk", "task"),
        ("includes", "include"),
        ("exclude_class", "exclude_classes"),
        ("layermapping", "layer_mapping"),
        ("statistic", "statistics"),
        ("backends", "backend"),
        ("process_on_train", "process_on_train_end"),
        ("paramters", "parameters"),
        ("job", "jobs"),
    ],
)
def test_unknown_key_suggests_closest(typo, suggestion):
    message = config_error({typo: 1}, repr(typo), f"did you mean {suggestion!r}", "valid keys")
    known = DumpConfig.keys()
    assert all(key in message for key in known)


def test_unknown_key_without_close_match_lists_valid_keys():
    message = config_error({"zzzzzz": 1}, "unknown key 'zzzzzz'", "valid keys: dump_path")
    assert "did you mean" not in message


def test_unknown_key_error_names_the_source():
    with pytest.raises(ConfigError, match=r"^my.yaml: unknown key 'stpes'"):
        DumpConfig.from_dict({"stpes": 1}, source="my.yaml")


def test_non_mapping_values_rejected():
    for bad in (["task", "tensor"], "task=tensor", 3):
        with pytest.raises(ConfigError, match="expected a mapping"):
            DumpConfig.from_dict(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- task / data_mode / backend


@pytest.mark.parametrize("task", TASKS)
def test_task_good(task):
    assert DumpConfig.from_dict({"task": task}).task == task


@pytest.mark.parametrize(
    "bad, hint",
    [
        ("tensors", "tensor"),
        ("statistic", "statistics"),
        ("Tensor", "tensor"),
        ("xyz", None),
        (1, None),
        (None, None),
    ],
)
def test_task_bad(bad, hint):
    message = config_error({"task": bad}, "task", repr(bad), "valid: tensor, statistics")
    if hint:
        assert f"did you mean {hint!r}" in message
    else:
        assert "did you mean" not in message


@pytest.mark.parametrize("mode", DATA_MODES)
def test_data_mode_good(mode):
    cfg = DumpConfig.from_dict({"data_mode": mode})
    assert cfg.data_mode == mode
    assert cfg.captures_forward == (mode in ("forward", "all"))
    assert cfg.captures_backward == (mode in ("backward", "all"))


@pytest.mark.parametrize(
    "bad, hint", [("forwrd", "forward"), ("backwards", "backward"), ("both", None), (0, None)]
)
def test_data_mode_bad(bad, hint):
    message = config_error({"data_mode": bad}, "data_mode", repr(bad), "valid: forward, backward, all")
    if hint:
        assert f"did you mean {hint!r}" in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_good(backend):
    assert DumpConfig.from_dict({"backend": backend}).backend == backend


@pytest.mark.parametrize(
    "bad, hint",
    [("tensor_dump", "tensordump"), ("hots", "host"), ("device_stat", "device_stats"), ("npu", None)],
)
def test_backend_bad(bad, hint):
    message = config_error({"backend": bad}, "backend", repr(bad), "valid: " + ", ".join(BACKENDS))
    if hint:
        assert f"did you mean {hint!r}" in message


# --------------------------------------------------------------------------- steps / ranks


@pytest.mark.parametrize("key", ["steps", "ranks"])
@pytest.mark.parametrize(
    "spec, expected",
    [
        ("all", None),
        ("ALL", None),
        (" all ", None),
        (None, None),
        (3, {3}),
        (0, {0}),
        ("3", {3}),
        ("0,5-7", {0, 5, 6, 7}),
        (" 0 , 5 - 7 ", {0, 5, 6, 7}),
        ([0, "5-7"], {0, 5, 6, 7}),
        ((1, 2), {1, 2}),
        ({4}, {4}),
        (["2", 2, "1-2"], {1, 2}),
        ("4-4", {4}),
    ],
)
def test_index_spec_good(key, spec, expected):
    sel = getattr(DumpConfig.from_dict({key: spec}), key)
    assert isinstance(sel, IndexSelection)
    if expected is None:
        assert sel.selects_all
        assert sel.describe() == "all"
        assert 12345 in sel
    else:
        assert sel.values == frozenset(expected)
        assert IndexSelection.parse(sel.describe(), key) == sel  # describe() reads back
        for v in expected:
            assert v in sel
        assert 999 not in sel


@pytest.mark.parametrize("key", ["steps", "ranks"])
def test_index_spec_reversed_range(key):
    config_error({key: "7-5"}, key, "'7-5'", "reversed", "'5-7'")
    config_error({key: [1, "9-2"]}, key, "'9-2'", "reversed", "'2-9'")


@pytest.mark.parametrize("key", ["steps", "ranks"])
@pytest.mark.parametrize("bad", [-1, [0, -3], "-1", "1,-2"])
def test_index_spec_negative(key, bad):
    config_error({key: bad}, key, "non-negative")


@pytest.mark.parametrize("key", ["steps", "ranks"])
@pytest.mark.parametrize("bad", [True, False, [1, True]])
def test_index_spec_bool(key, bad):
    # A YAML `steps: yes` must not silently become step 1.
    config_error({key: bad}, key, "True" if bad is not False else "False", "valid:")


@pytest.mark.parametrize("key", ["steps", "ranks"])
@pytest.mark.parametrize(
    "bad, shown",
    [
        ("abc", "'abc'"),
        ("1-", "'1-'"),
        ("1..3", "'1..3'"),
        ("1;2", "'1;2'"),
        ("1,,2", "''"),
        ("", "''"),
        ("²", "'²'"),
        (1.5, "1.5"),
        ({"a": 1}, "{'a': 1}"),
        ([None], "None"),
        ([[1]], "[1]"),
    ],
)
def test_index_spec_garbage(key, bad, shown):
    config_error({key: bad}, key, shown, "valid:")


@pytest.mark.parametrize("key", ["steps", "ranks"])
@pytest.mark.parametrize("bad", [[], (), set()])
def test_index_spec_empty(key, bad):
    config_error({key: bad}, key, "selects nothing", "'all'")


def test_index_selection_parse_directly():
    assert IndexSelection.parse("1-3", "steps") == IndexSelection.of({1, 2, 3})
    assert IndexSelection() == IndexSelection.parse("all", "steps")
    with pytest.raises(ConfigError, match="^custom_key"):
        IndexSelection.parse("x", "custom_key")


# ------------------------------------------------------------------ include / exclude / exclude_classes


@pytest.mark.parametrize("key", ["include", "exclude", "exclude_classes"])
def test_pattern_lists_good(key):
    assert getattr(DumpConfig.from_dict({key: "model.layers.0.*"}), key) == ("model.layers.0.*",)
    assert getattr(DumpConfig.from_dict({key: ["a*", "b"]}), key) == ("a*", "b")
    assert getattr(DumpConfig.from_dict({key: ("a",)}), key) == ("a",)


@pytest.mark.parametrize("key", ["exclude", "exclude_classes"])
def test_exclude_lists_may_be_empty_or_none(key):
    assert getattr(DumpConfig.from_dict({key: []}), key) == ()
    assert getattr(DumpConfig.from_dict({key: None}), key) == ()


def test_include_empty_is_an_error():
    config_error({"include": []}, "include", "selects no cell", "['*']")
    config_error({"include": None}, "include", "selects no cell")


@pytest.mark.parametrize("key", ["include", "exclude", "exclude_classes"])
@pytest.mark.parametrize("bad", ["", [""], [1], ["a", None], 3, {"a": 1}, True])
def test_pattern_lists_bad(key, bad):
    config_error({key: bad}, key, repr(bad), "a string or a list of non-empty strings")


# --------------------------------------------------------------------------- layer_mapping


@pytest.mark.parametrize(
    "value, expected",
    [
        ("auto", ("auto",)),
        ("mappings/llama.yaml", ("mappings/llama.yaml",)),
        (["auto", "extra.yaml"], ("auto", "extra.yaml")),
        (None, ()),
        ("none", ()),
        ("None", ()),
        (" NONE ", ()),
        (False, ()),
        ([], ()),
        (Path("a/b.yaml"), ("a/b.yaml".replace("/", os.sep),)),
        ([Path("x.yaml"), "auto"], ("x.yaml", "auto")),
    ],
)
def test_layer_mapping_good(value, expected):
    assert DumpConfig.from_dict({"layer_mapping": value}).layer_mapping == expected


@pytest.mark.parametrize("bad", ["", [""], 3, True, [1], {"a": "b"}])
def test_layer_mapping_bad(bad):
    config_error({"layer_mapping": bad}, "layer_mapping", repr(bad), "valid:")


# --------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("item", STATISTICS)
def test_statistics_each_item(item):
    assert DumpConfig.from_dict({"statistics": [item]}).statistics == (item,)
    assert DumpConfig.from_dict({"statistics": item}).statistics == (item,)


def test_statistics_extended_set():
    cfg = DumpConfig.from_dict({"statistics": ["max", "md5", "nan_count", "inf_count"]})
    assert cfg.statistics == ("max", "md5", "nan_count", "inf_count")


def test_statistics_dedupe_keeps_order():
    cfg = DumpConfig.from_dict({"statistics": ["norm", "max", "norm", "max", "min"]})
    assert cfg.statistics == ("norm", "max", "min")


def test_statistics_empty_list():
    config_error({"statistics": []}, "statistics", "empty", ", ".join(STATISTICS))


@pytest.mark.parametrize(
    "bad, shown, hint",
    [
        (["maxx"], "'maxx'", "max"),
        (["max", "nan_cnt"], "'nan_cnt'", "nan_count"),
        ("inf_counts", "'inf_counts'", "inf_count"),
        (["md4"], "'md4'", "md5"),
        (["std"], "'std'", None),
        ([1], "1", None),
        ([None], "None", None),
        (3, "3", None),
        ({"max": 1}, "{'max': 1}", None),
    ],
)
def test_statistics_bad(bad, shown, hint):
    message = config_error({"statistics": bad}, "statistics", shown, ", ".join(STATISTICS))
    if hint:
        assert f"did you mean {hint!r}" in message


def test_statistics_none_is_an_error():
    config_error({"statistics": None}, "statistics", "None")


# --------------------------------------------------------------------------- process_on_train_end / jobs


@pytest.mark.parametrize("flag", [True, False])
def test_process_on_train_end_good(flag):
    assert DumpConfig.from_dict({"process_on_train_end": flag}).process_on_train_end is flag


@pytest.mark.parametrize("bad", ["true", "yes", 1, 0, None])
def test_process_on_train_end_bad(bad):
    config_error({"process_on_train_end": bad}, "process_on_train_end", repr(bad), "true or false")


@pytest.mark.parametrize("flag", [True, False])
def test_parameters_good(flag):
    cfg = DumpConfig.from_dict({"parameters": flag})
    assert cfg.parameters is flag and cfg.captures_weights is flag and cfg.captures_weight_gradients is flag


@pytest.mark.parametrize("bad", ["false", "no", 0, None])
def test_parameters_bad(bad):
    config_error({"parameters": bad}, "parameters", repr(bad), "true or false")


@pytest.mark.parametrize("data_mode, weights, grads", [("forward", True, False), ("backward", False, True)])
def test_parameters_follow_data_mode(data_mode, weights, grads):
    cfg = DumpConfig.from_dict({"data_mode": data_mode})
    assert (cfg.captures_weights, cfg.captures_weight_gradients) == (weights, grads)


@pytest.mark.parametrize("timeout", [0.5, 1, 3600])
def test_process_timeout_good(timeout):
    assert DumpConfig.from_dict({"process_timeout": timeout}).process_timeout == float(timeout)


@pytest.mark.parametrize("bad", [0, -1, "10", True, None, float("inf"), float("nan")])
def test_process_timeout_bad(bad):
    config_error({"process_timeout": bad}, "process_timeout", "a number of seconds > 0")


@pytest.mark.parametrize("jobs", [1, 2, 64])
def test_jobs_good(jobs):
    assert DumpConfig.from_dict({"jobs": jobs}).jobs == jobs


def test_jobs_none_means_default():
    assert DumpConfig.from_dict({"jobs": None}).jobs is None


@pytest.mark.parametrize("bad", [0, -1, 2.0, "4", True, False, [2]])
def test_jobs_bad(bad):
    config_error({"jobs": bad}, "jobs", repr(bad), "positive integer")


# --------------------------------------------------------------------------- dump_path


def test_dump_path_explicit(tmp_dump_dir):
    cfg = DumpConfig.from_dict({"dump_path": str(tmp_dump_dir)})
    assert cfg.dump_path == str(tmp_dump_dir)
    assert cfg.resolved_dump_path() == str(tmp_dump_dir)
    # an explicit dump_path wins over output_dir and the environment
    assert cfg.resolved_dump_path(output_dir="/elsewhere") == str(tmp_dump_dir)


def test_dump_path_pathlike(tmp_dump_dir):
    cfg = DumpConfig.from_dict({"dump_path": tmp_dump_dir})
    assert cfg.dump_path == str(tmp_dump_dir)
    assert isinstance(cfg.dump_path, str)


def test_dump_path_relative_and_user(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert DumpConfig(dump_path="rel/dir").resolved_dump_path() == os.path.join(str(tmp_path), "rel", "dir")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert DumpConfig(dump_path="~/d").resolved_dump_path() == os.path.join(str(tmp_path), "d")


def test_dump_path_none_is_default():
    assert DumpConfig.from_dict({"dump_path": None}).dump_path is None


@pytest.mark.parametrize("bad", ["", "   ", 3, True, ["a"]])
def test_dump_path_bad(bad):
    config_error({"dump_path": bad}, "dump_path", repr(bad), "non-empty directory path")


def test_resolved_dump_path_default_output_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_DEFAULT_PATH", raising=False)
    monkeypatch.chdir(tmp_path)
    assert DumpConfig().resolved_dump_path() == os.path.join(str(tmp_path), "output", "celldump")
    out = tmp_path / "run1"
    assert DumpConfig().resolved_dump_path(str(out)) == os.path.join(str(out), "celldump")


def test_resolved_dump_path_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_DEFAULT_PATH", str(tmp_path / "mfout"))
    assert DumpConfig().resolved_dump_path() == os.path.join(str(tmp_path), "mfout", "celldump")
    # an explicit output_dir wins over the environment
    assert DumpConfig().resolved_dump_path(str(tmp_path / "o")) == os.path.join(
        str(tmp_path), "o", "celldump"
    )


# --------------------------------------------------------------------------- from_yaml


def write(path: Path, text: str) -> str:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def test_from_yaml_good(tmp_path):
    path = write(
        tmp_path / "dump.yaml",
        """\
        dump_path: /tmp/somewhere
        task: tensor
        data_mode: forward
        steps: "0,5-7"
        ranks: [0, 1]
        include: ["model.layers.*"]
        exclude: ["*.dropout"]
        exclude_classes: [Dropout]
        layer_mapping: none
        statistics: [max, min, md5]
        backend: host
        process_on_train_end: false
        jobs: 2
        """,
    )
    cfg = DumpConfig.from_yaml(path)
    assert cfg == DumpConfig(
        dump_path="/tmp/somewhere",
        task="tensor",
        data_mode="forward",
        steps=IndexSelection.of({0, 5, 6, 7}),
        ranks=IndexSelection.of({0, 1}),
        include=("model.layers.*",),
        exclude=("*.dropout",),
        exclude_classes=("Dropout",),
        layer_mapping=(),
        statistics=("max", "min", "md5"),
        backend="host",
        process_on_train_end=False,
        jobs=2,
    )


def test_from_yaml_callback_entry(tmp_path):
    path = write(
        tmp_path / "cb.yaml",
        """\
        type: CellDumpCallback
        auto_register: true
        steps: 3
        statistics: [norm]
        """,
    )
    cfg = DumpConfig.from_yaml(path)
    assert cfg.steps.values == frozenset({3})
    assert cfg.statistics == ("norm",)


def test_from_yaml_empty_file_gives_defaults(tmp_path):
    assert DumpConfig.from_yaml(write(tmp_path / "empty.yaml", "")) == DumpConfig()


def test_from_yaml_error_names_the_file(tmp_path):
    path = write(tmp_path / "typo.yaml", "stpes: 3\n")
    with pytest.raises(ConfigError) as info:
        DumpConfig.from_yaml(path)
    assert path in str(info.value)
    assert "did you mean 'steps'" in str(info.value)


def test_from_yaml_bad_value(tmp_path):
    path = write(tmp_path / "bad.yaml", "task: tensors\n")
    with pytest.raises(ConfigError, match="did you mean 'tensor'"):
        DumpConfig.from_yaml(path)


def test_from_yaml_missing_file(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not found") as info:
        DumpConfig.from_yaml(missing)
    assert missing in str(info.value)


def test_from_yaml_directory(tmp_path):
    with pytest.raises(ConfigError) as info:
        DumpConfig.from_yaml(str(tmp_path))
    assert str(tmp_path) in str(info.value)


def test_from_yaml_syntax_error(tmp_path):
    path = write(tmp_path / "broken.yaml", "task: [tensor\nsteps: 1\n")
    with pytest.raises(ConfigError, match="YAML syntax error") as info:
        DumpConfig.from_yaml(path)
    assert path in str(info.value)


@pytest.mark.parametrize(
    "text, kind", [("- task: tensor\n", "list"), ("just a string\n", "str"), ("3\n", "int")]
)
def test_from_yaml_non_mapping(tmp_path, text, kind):
    path = write(tmp_path / "list.yaml", text)
    with pytest.raises(ConfigError, match="expected a mapping") as info:
        DumpConfig.from_yaml(path)
    assert path in str(info.value)
    assert kind in str(info.value)


def test_from_yaml_alias_inside_the_list_it_names_is_an_error_naming_file_and_line(tmp_path):
    path = write(tmp_path / "loop.yaml", "task: tensor\nsteps: &a\n  - 0\n  - *a\n")
    with pytest.raises(ConfigError) as info:
        DumpConfig.from_yaml(path)
    assert str(info.value).startswith(f"{path}:4: alias *a refers to the collection anchored at line 2")


def test_from_yaml_alias_to_a_finished_list_is_its_value(tmp_path):
    path = write(tmp_path / "reuse.yaml", "steps: &a [1]\nranks: *a\n")
    cfg = DumpConfig.from_yaml(path)
    assert cfg.steps.values == cfg.ranks.values == frozenset({1})


def test_attach_with_a_layer_mapping_holding_an_alias_loop_names_the_file_and_line(tmp_path):
    from mf_celldump import attach
    from tests.support import capture_net as cn

    path = write(tmp_path / "loop.yaml", "Net: &a {fc1: x, loop: *a}\n")
    cn.set_mode("pynative")
    with pytest.raises(MappingError) as info:
        attach(cn.make_net(), {"dump_path": str(tmp_path / "d"), "layer_mapping": [path]})
    assert str(info.value).startswith(f"{path}:1: alias *a refers to the collection anchored at line 1")


# --------------------------------------------------------------------------- coerce / to_dict


def test_coerce():
    cfg = DumpConfig(task="tensor")
    assert DumpConfig.coerce(cfg) is cfg
    assert DumpConfig.coerce({"task": "tensor"}) == cfg
    assert DumpConfig.coerce(None) == DumpConfig()
    assert DumpConfig.coerce({}) == DumpConfig()


@pytest.mark.parametrize("bad", ["task: tensor", 3, ["task"], object()])
def test_coerce_bad_type(bad):
    with pytest.raises(ConfigError, match="must be a DumpConfig or a dict"):
        DumpConfig.coerce(bad)  # type: ignore[arg-type]


def test_coerce_validates_dicts():
    with pytest.raises(ConfigError, match="did you mean 'data_mode'"):
        DumpConfig.coerce({"data_mod": "all"})


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "dump_path": "/tmp/x",
            "task": "tensor",
            "data_mode": "backward",
            "steps": "0,5-7",
            "ranks": [1, 3],
            "include": ["a.*"],
            "exclude": ["b"],
            "exclude_classes": ["Dropout"],
            "layer_mapping": None,
            "statistics": ["md5", "inf_count", "nan_count"],
            "backend": "host",
            "process_on_train_end": False,
            "jobs": 3,
        },
        {"layer_mapping": ["auto", "x.yaml"], "steps": 4},
    ],
)
def test_to_dict_round_trip(values):
    cfg = DumpConfig.from_dict(values)
    data = cfg.to_dict()
    assert set(data) == set(DumpConfig.keys())
    # plain data only: survives a YAML round trip too
    assert yaml.safe_load(yaml.safe_dump(data)) == data
    assert DumpConfig.from_dict(data) == cfg
    assert DumpConfig.from_dict(yaml.safe_load(yaml.safe_dump(data))) == cfg


def test_to_dict_shape():
    data = DumpConfig.from_dict({"steps": "1-2", "statistics": ["max"]}).to_dict()
    assert data["steps"] == "1-2"
    assert data["ranks"] == "all"
    assert data["statistics"] == ["max"]
    assert data["include"] == ["*"]
    assert data["jobs"] is None


# --------------------------------------------------------------------------- packaging


def test_import_does_not_load_mindspore_or_mindformers():
    code = (
        "import sys, mf_celldump, mf_celldump.config\n"
        "roots = ('mindspore', 'mindformers', 'msprobe')\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in roots)\n"
        "print(heavy)\n"
        "assert not heavy, heavy\n"
    )
    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "[]"


def test_bundled_layer_mapping_package():
    root = importlib.resources.files("mf_celldump.layer_mapping")
    assert root.is_dir()
    for entry in root.iterdir():
        if entry.name.endswith((".yaml", ".yml")):
            data = yaml.safe_load(entry.read_text(encoding="utf-8"))
            assert data is not None, f"{entry.name} is empty"
