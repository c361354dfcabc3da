"""Layer mappings against real MindSpore networks, and the ``mapping`` command line."""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import textwrap

import pytest
from mindspore import nn

from mf_celldump.cli import mapping as mapping_cli
from mf_celldump.mapping import (
    ArgModes,
    check_mapping,
    log_mapping_warnings,
    modes_for_network,
    named_classes,
    parse_mapping_text,
    resolve_mapping,
    sample_networks,
)

# --- a small network whose class names match the bundled mcore_gpt file ----------------


class SelfAttention(nn.Cell):
    def __init__(self):
        super().__init__()
        self.linear_qkv = nn.Dense(8, 24)
        self.linear_proj = nn.Dense(8, 8)

    def construct(self, x):
        q, _, _ = self.linear_qkv(x).split(8, axis=-1)
        return self.linear_proj(q)


class MLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.linear_fc1 = nn.Dense(8, 16)
        self.linear_fc2 = nn.Dense(16, 8)

    def construct(self, x):
        return self.linear_fc2(self.linear_fc1(x))


class TransformerLayer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.input_layernorm = nn.LayerNorm((8,))
        self.self_attention = SelfAttention()
        self.pre_mlp_layernorm = nn.LayerNorm((8,))
        self.mlp = MLP()
        self.dropout = nn.Dropout(p=0.1)

    def construct(self, x):
        x = x + self.self_attention(self.input_layernorm(x))
        return x + self.dropout(self.mlp(self.pre_mlp_layernorm(x)))


class ToyModel(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([TransformerLayer(), TransformerLayer()])
        self.head = nn.Dense(8, 4)

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def write(tmp_path, text, name="user.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def toy_cells():
    return named_classes(ToyModel().cells_and_names())


@pytest.fixture(scope="module")
def tiny_llama():
    """MindFormers' LLaMA with two tiny layers, built once (in a temporary working directory)."""
    return sample_networks.build_model("tiny-llama")


@pytest.fixture(scope="module")
def llama_cells(tiny_llama):
    return named_classes(tiny_llama.cells_and_names())


# --- resolution and modes on the toy network -------------------------------------------


def test_auto_picks_mcore_for_toy_network_and_user_file_wins(tmp_path, toy_cells):
    user = write(
        tmp_path,
        """\
        MLP:
          linear_fc2: my_fc2([out], [in])
        ToyModel:
          head: output_layer([in])
        TopLayer:
          layers.1.mlp.linear_fc1: special_fc1([in, in])
        """,
    )
    classes = {cls for _, cls in toy_cells}
    mapping = resolve_mapping(("auto", user), classes)
    assert mapping.sources == ("bundled/mcore_gpt.yaml", user)

    modes = modes_for_network(mapping, toy_cells)
    # bundled entries by class and relative child name
    assert modes["layers.0.self_attention"].bench_name == "self_attention"
    assert modes["layers.0.self_attention"].input_mode(0) == "in"
    assert modes["layers.1.self_attention.linear_qkv"].input_modes == ("in",)
    assert modes["layers.0.mlp.linear_fc1"].bundled
    # user class entry over the bundled one, user class absent from bundled files
    assert modes["layers.0.mlp.linear_fc2"] == ArgModes("my_fc2", ("out",), ("in",))
    assert modes["layers.1.mlp.linear_fc2"].output_mode(0) == "in"
    assert modes["head"] == ArgModes("output_layer", ("in",), ())
    # TopLayer wins for its one cell only
    assert modes["layers.1.mlp.linear_fc1"].bench_name == "special_fc1"
    assert modes["layers.0.mlp.linear_fc1"].bench_name == "linear_fc1"
    # cells without an entry are absent (default mode out)
    assert "layers.0.dropout" not in modes and "layers" not in modes

    # the same with (name, cell) pairs straight from MindSpore
    assert modes_for_network(mapping, ToyModel().cells_and_names()).keys() == modes.keys()

    report = check_mapping(mapping, toy_cells)
    assert not report.has_problems
    assert {item.class_name for item in report.absent_classes} >= {"GPTModel", "MLASelfAttention"}
    uncovered = {(item.class_name, item.child) for item in report.uncovered}
    assert ("TransformerLayer", "dropout") in uncovered
    assert not any(child == "layers" for _, child in uncovered)  # containers are not reported
    bundled_variants = {(item.section, item.key) for item in report.bundled_unmatched}
    # the bundled TopLayer names assume MindFormers' `model` root (TrainingQwen3ForCausalLM ...)
    top_layer = {("TopLayer", f"model.{child}") for child in
                 ("embedding", "rotary_pos_emb", "decoder", "mtp", "output_layer")}
    assert bundled_variants == {
        ("SelfAttention", "q_layernorm"),
        ("SelfAttention", "k_layernorm"),
        ("SelfAttention", "core_attention"),
    } | top_layer


def test_nearest_mapped_ancestor_wins_then_top_layer():
    cells = [("", "Outer"), ("inner", "Inner"), ("inner.fc", "Dense")]
    assert modes_for_network(resolve_mapping(()), cells) == {}
    mapping = parse_mapping_text(
        "Outer:\n  inner.fc: from_outer([in])\n  inner: inner()\n"
        "Inner:\n  fc: from_inner([out])\n  '': self_entry()\n"
    )
    modes = modes_for_network(mapping, cells)
    assert modes["inner.fc"].bench_name == "from_inner"
    assert modes["inner"].bench_name == "self_entry"  # nearer: the Inner cell itself
    with_top = parse_mapping_text("Inner:\n  fc: from_inner()\nTopLayer:\n  inner.fc: top()\n  '': root()\n")
    modes = modes_for_network(with_top, cells)
    assert modes["inner.fc"].bench_name == "top" and modes[""].bench_name == "root"


def test_wrong_user_file_reports_nearest_names(tmp_path, toy_cells):
    user = write(
        tmp_path,
        """\
        TransformerLayer:
          self_atention: self_attention([in])
        TopLayer:
          layers.0.mlp.linear_fc3: x()
        """,
    )
    report = check_mapping(resolve_mapping((user,), set()), toy_cells)
    assert report.has_problems
    found = {(item.section, item.key): item.suggestions for item in report.problems}
    assert found[("TransformerLayer", "self_atention")][0] == "self_attention"
    assert "layers.0.mlp.linear_fc1" in found[("TopLayer", "layers.0.mlp.linear_fc3")]
    text = report.format()
    assert (
        f"{user}:2: TransformerLayer: child 'self_atention' matches no cell (nearest: self_attention" in text
    )
    assert "PROBLEMS, entries that match no cell (2):" in text


def test_log_mapping_warnings(tmp_path, toy_cells, caplog):
    user = write(tmp_path, "MLP:\n  linear_fc9: x()\n")
    report = check_mapping(resolve_mapping(("auto", user), {"MLP"}), toy_cells)
    log = logging.getLogger("test_mapping")
    with caplog.at_level(logging.INFO, logger="test_mapping"):
        log_mapping_warnings(report, log)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "linear_fc9" in warnings[0] and "linear_fc1" in warnings[0]
    assert any("1 problem" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


# --- the MindFormers tiny LLaMA --------------------------------------------------------


def test_bundled_llama_matches_tiny_llama(llama_cells):
    classes = {cls for _, cls in llama_cells}
    mapping = resolve_mapping(("auto",), classes)
    assert mapping.sources == ("bundled/llama.yaml",)
    report = check_mapping(mapping, llama_cells)
    assert not report.has_problems
    # only the documented variant keys (qkv_concat / ffn_concat configurations) match nothing
    assert {(u.section, u.key) for u in report.unmatched} == {
        ("LLamaAttention", "w_qkv"),
        ("LlamaFeedForward", "w_gate_hidden"),
    }
    assert report.absent_classes == []

    modes = modes_for_network(mapping, llama_cells)
    for layer in (0, 1):
        prefix = f"model.layers.{layer}"
        assert modes[f"{prefix}.attention"].input_modes[0] == "in"
        assert modes[f"{prefix}.attention.wq"].bench_name == "linear_qkv"
        assert modes[f"{prefix}.attention.wq"].compare_rules.split.part == "q"
        assert modes[f"{prefix}.attention.wo"].bench_name == "linear_proj"
        assert modes[f"{prefix}.feed_forward.w2"].bench_name == "linear_fc2"
        assert modes[f"{prefix}.attention_norm"].bench_name == "input_layernorm"
    assert modes["lm_head"].bench_name == "output_layer"
    assert modes["model.norm_out"].bench_name == "decoder.final_layernorm"
    assert modes["model.tok_embeddings"].bench_name == "embedding.word_embeddings"
    assert modes["model"].bench_name == "decoder"  # TopLayer: msprobe never sees the root class
    uncovered = {(u.class_name, u.child) for u in report.uncovered}
    assert ("LLamaAttention", "apply_rotary_emb") in uncovered


def test_wrong_user_file_against_tiny_llama(tmp_path, llama_cells):
    user = write(
        tmp_path,
        """\
        LLamaAttention:
          w_q: linear_q([in], [out])      # real name: wq
        LLamaDecodeLayer:
          feedforward: mlp([in])          # real name: feed_forward
        TopLayer:
          model.layer.0.attention: x()    # real name: model.layers.0.attention
        """,
    )
    mapping = resolve_mapping(("llama", user), {cls for _, cls in llama_cells})
    report = check_mapping(mapping, llama_cells)
    assert report.has_problems
    found = {(p.section, p.key): p for p in report.problems}
    assert set(found) == {
        ("LLamaAttention", "w_q"),
        ("LLamaDecodeLayer", "feedforward"),
        ("TopLayer", "model.layer.0.attention"),
    }
    assert "wq" in found[("LLamaAttention", "w_q")].suggestions
    assert found[("LLamaDecodeLayer", "feedforward")].suggestions[0] == "feed_forward"
    assert found[("TopLayer", "model.layer.0.attention")].suggestions[0] == "model.layers.0.attention"
    assert found[("LLamaAttention", "w_q")].entry.line == 2


# --- command line ----------------------------------------------------------------------


def run_cli(argv):
    parser = argparse.ArgumentParser(prog="mf-celldump")
    mapping_cli.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_list_and_show(capsys, tmp_path):
    assert run_cli(["mapping", "list"]) == 0
    out = capsys.readouterr().out
    assert "llama: " in out and "LLamaAttention" in out and "mcore_gpt: " in out

    assert run_cli(["mapping", "show", "llama"]) == 0
    out = capsys.readouterr().out
    assert "wq -> linear_qkv  inputs: in  outputs: out  [bundled/llama.yaml:" in out

    user = write(tmp_path, "TopLayer:\n  a.b: x()\n")
    assert run_cli(["mapping", "show", user]) == 0
    assert "a.b -> x  inputs: -  outputs: -" in capsys.readouterr().out
    assert run_cli(["mapping", "show", str(tmp_path / "missing.yaml")]) == 2


def test_a_folder_named_like_a_bundled_mapping_does_not_shadow_it(capsys, tmp_path, monkeypatch):
    (tmp_path / "llama").mkdir()
    monkeypatch.chdir(tmp_path)
    assert run_cli(["mapping", "show", "llama"]) == 0
    assert "[bundled/llama.yaml:" in capsys.readouterr().out
    assert run_cli(["mapping", "check", "llama"]) == 0
    assert "ok: llama" in capsys.readouterr().out
    (tmp_path / "other").mkdir()
    assert run_cli(["mapping", "show", "other"]) == 2
    assert "'other' is neither a bundled mapping (llama, mcore_gpt) nor a mapping file (a folder)" in \
        capsys.readouterr().err


def test_cli_check_syntax_only(capsys, tmp_path):
    good = write(tmp_path, "A:\n  b: c([in])\n", "good.yaml")
    bad = write(tmp_path, "A:\n  b: c([in]\n", "bad.yaml")
    assert run_cli(["mapping", "check", good, "llama"]) == 0
    assert "ok: " in capsys.readouterr().out
    assert run_cli(["mapping", "check", good, bad]) == 1
    out = capsys.readouterr().out
    assert f"{bad}:2: A: 'b': bad entry 'c([in]'" in out
    assert run_cli(["mapping", "check", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_cli_check_against_model(capsys, tmp_path, tiny_llama):
    assert run_cli(["mapping", "check", "auto", "--model", "tiny-llama"]) == 0
    out = capsys.readouterr().out
    assert "0 problems" in out and "w_qkv" in out

    wrong = write(tmp_path, "LLamaAttention:\n  w_q: q()\n")
    assert run_cli(["mapping", "check", "llama", wrong, "--model", "tiny-llama"]) == 1
    out = capsys.readouterr().out
    assert "child 'w_q' matches no cell (nearest: wq" in out

    spec = f"{__name__}:ToyModel"
    assert run_cli(["mapping", "check", "auto", "--model", spec]) == 0
    assert "bundled/mcore_gpt.yaml" in capsys.readouterr().out
    assert run_cli(["mapping", "check", "auto", "--model", "no_such_module_xyz:make"]) == 2
    assert "cannot import" in capsys.readouterr().err
    assert run_cli(["mapping", "check", "auto", "--model", "nocolon"]) == 2


def test_a_misspelt_class_in_a_users_file_is_a_problem_with_a_did_you_mean(capsys, tmp_path, tiny_llama):
    """`LLamaAtention:` for `LLamaAttention:` matches no cell at all: exit 1, the right name on the same
    line. The bundled file's classes of other variants stay fine, and without --model the check says
    that names were not checked."""
    typo = write(tmp_path, "LLamaAtention:\n  wq: linear_q([in], [out])\n", "my_mapping.yaml")
    assert run_cli(["mapping", "check", "auto", typo, "--model", "tiny-llama"]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.strip().startswith("LLamaAtention"))
    assert f"from {typo}" in line and "(did you mean 'LLamaAttention'?)" in line, out
    assert "PROBLEMS, class sections of your files whose class no cell has (1):" in out and "1 problem" in out
    assert run_cli(["mapping", "check", "auto", "--model", "tiny-llama"]) == 0  # bundled absent classes: fine
    assert "0 problems" in capsys.readouterr().out
    assert run_cli(["mapping", "check", typo]) == 0
    assert "class and cell names not checked; add --model NAME, or --target DUMP" in capsys.readouterr().out


def test_a_class_a_dump_lacks_is_no_problem_against_its_cells(tmp_path, toy_cells):
    """--target takes a dump's cells, which lack the cells it excluded: an absent class stays informational."""
    user = write(tmp_path, "SelfAtention:\n  linear_qkv: q([in])\n")
    mapping = resolve_mapping((user,), {cls for _, cls in toy_cells})
    assert check_mapping(mapping, toy_cells).has_problems
    from_dump = check_mapping(mapping, toy_cells, whole_network=False)
    assert not from_dump.has_problems and "a dump lacks the cells it excluded" in from_dump.format()


def test_a_misspelt_class_gets_one_warning_at_attach(tmp_path, caplog):
    import mf_celldump

    user = write(tmp_path, "SelfAtention:\n  linear_qkv: q([in])\n")
    with caplog.at_level(logging.WARNING, logger="mf_celldump"):
        dump = mf_celldump.attach(ToyModel(), {"layer_mapping": [user], "dump_path": str(tmp_path / "d")})
        dump.detach()
    warned = [r.getMessage() for r in caplog.records if "SelfAtention" in r.getMessage()]
    assert len(warned) == 1 and "did you mean 'SelfAttention'?" in warned[0], warned


@pytest.mark.parametrize(
    "command",
    [["mf_celldump", "mapping"], ["mf_celldump.cli.mapping"]],
    ids=["mf-celldump", "standalone"],
)
def test_cli_as_subprocess(tmp_path, command):
    bad = write(tmp_path, "A:\n  b: c([sideways])\n", "bad.yaml")
    good = write(tmp_path, "A:\n  b: c([in])\n", "good.yaml")
    run = [sys.executable, "-m", *command, "check"]
    result = subprocess.run([*run, bad], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "bad.yaml:2: A: 'b': bad entry 'c([sideways])'" in result.stdout
    assert "unknown mode 'sideways'" in result.stdout
    result = subprocess.run([*run, good], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    result = subprocess.run([*run, "nope.yaml"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 2 and "not found: nope.yaml" in result.stderr


def test_check_against_a_model_keeps_the_libraries_output_out_unless_verbose(tmp_path):
    """Building the model makes MindSpore and MindFormers log dozens of lines (some from C++): the user sees
    only mf-celldump's own; `-v` shows theirs after the build."""
    worktree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [worktree, os.environ.get("PYTHONPATH")])))
    run = [sys.executable, "-m", "mf_celldump"]
    quiet = subprocess.run([*run, "mapping", "check", "auto", "--model", "tiny-llama"], capture_output=True,
                           text=True, cwd=tmp_path, env=env, timeout=300)
    assert quiet.returncode == 0 and "0 problems" in quiet.stdout, quiet.stderr[-2000:]
    assert quiet.stdout.startswith("layer mapping from: bundled/llama.yaml"), quiet.stdout[:2000]
    assert [line for line in quiet.stderr.splitlines() if not line.startswith("INFO mf_celldump.")] == [], \
        quiet.stderr[-3000:]
    verbose = subprocess.run([*run, "-v", "mapping", "check", "auto", "--model", "tiny-llama"],
                             capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert verbose.returncode == 0 and verbose.stdout == quiet.stdout
    assert "mindformers" in verbose.stderr and "model built" in verbose.stderr, verbose.stderr[-3000:]
    assert not list(tmp_path.iterdir())


def _mindformers_has(relative_path: str) -> bool:
    """Whether the installed MindFormers ships a file, without importing it (import writes ./output)."""
    import importlib.util

    spec = importlib.util.find_spec("mindformers")
    return spec is not None and spec.origin is not None and os.path.isfile(
        os.path.join(os.path.dirname(spec.origin), relative_path))


# MindFormers 1.6.0 has no mcore Qwen3 training model (and a tiny DeepSeek-V3 build crashes there).
@pytest.mark.skipif(not _mindformers_has(os.path.join("models", "qwen3", "modeling_qwen3_train.py")),
                    reason="this MindFormers has no mindformers.models.qwen3.modeling_qwen3_train (1.6.0 lacks it)")
def test_bundled_mcore_matches_real_mcore_models(tmp_path):
    """tiny Qwen3 and DeepSeek-V3 (mcore) need a process each: they switch MindFormers to use_legacy=False."""
    procs = {
        model: subprocess.Popen(
            [sys.executable, "-m", "mf_celldump.cli.mapping", "check", "auto", "--model", model],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for model in ("tiny-qwen3", "tiny-deepseek3")
    }
    reports = {}
    for model, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{model}: {err[-2000:]}\n{out[-2000:]}"
        reports[model] = out[out.index("layer mapping from: bundled/mcore_gpt.yaml") :]
    qwen3, deepseek3 = reports["tiny-qwen3"], reports["tiny-deepseek3"]
    assert "0 problems" in qwen3 and "0 problems" in deepseek3
    # Qwen3 has no MTP; everything else it builds is matched
    bundled_unmatched = [line for line in qwen3.splitlines() if "matches no cell" in line]
    assert len(bundled_unmatched) == 2 and "GPTModel: child 'mtp'" in bundled_unmatched[0]
    assert "TopLayer: cell 'model.mtp'" in bundled_unmatched[1]
    assert "matches no cell" not in deepseek3  # MLA, MoE, shared experts and MTP all match
    assert not list(tmp_path.iterdir())  # MindFormers' ./output went to a temporary directory


# --- a bundled file gets the same verdict by name and by path ------------


def test_bundled_file_by_name_or_path_same_verdict(capsys, tiny_llama, monkeypatch):
    monkeypatch.setattr(mapping_cli, "build_model", lambda spec: tiny_llama)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outputs = []
    for spec in ("llama", os.path.join(repo, "layer_mapping", "llama.yaml")):
        code = run_cli(["mapping", "check", spec, "--model", "tiny-llama"])
        outputs.append((code, capsys.readouterr().out))
    assert outputs[0] == outputs[1]
    assert outputs[0][0] == 0 and "0 problems" in outputs[0][1]
    assert "tiny-llama" in sample_networks.BUILTIN_MODELS
    assert "layer mapping from: bundled/llama.yaml\n" in outputs[1][1]


def test_check_prints_msprobe_baseline_names(capsys, tiny_llama, monkeypatch):
    monkeypatch.setattr(mapping_cli, "build_model", lambda spec: tiny_llama)
    assert run_cli(["mapping", "check", "llama", "--model", "tiny-llama"]) == 0
    out = capsys.readouterr().out
    assert "model.layers.1.attention.wo (Linear) -> decoder.layers.1.self_attention.linear_proj" in out
    assert "model.tok_embeddings (LlamaEmbedding) -> embedding.word_embeddings" in out
    assert "lm_head (Linear) -> output_layer" in out
    assert "loss (CrossEntropyLoss) -> loss  [name kept]" in out
