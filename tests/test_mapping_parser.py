"""Layer-mapping parser, data model and merge: pure Python, no MindSpore needed."""

from __future__ import annotations

import textwrap

import pytest

from mf_celldump.errors import ConfigError, MappingError
from mf_celldump.mapping import (
    TOP_LAYER,
    ArgModes,
    LayerMapping,
    bundled_classes,
    bundled_names,
    load_bundled,
    load_mapping_file,
    merge,
    parse_entry,
    parse_mapping_text,
    resolve_mapping,
)


def write(tmp_path, text, name="map.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


# --- entries ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("attention([in, in, _], [in])", ("attention", ("in", "in", "_"), ("in",))),
        (
            "fc([in,out,in,_,out], [out, in, in])",
            ("fc", ("in", "out", "in", "_", "out"), ("out", "in", "in")),
        ),
        ("  fc( [ in ,  _ ] ,[ out ] )  ", ("fc", ("in", "_"), ("out",))),
        ("fc([], [])", ("fc", (), ())),
        ("fc([], [in])", ("fc", (), ("in",))),
        ("fc([in])", ("fc", ("in",), ())),
        ("fc()", ("fc", (), ())),
        ("fc", ("fc", (), ())),
        ("decoder.final_layernorm([in], [out])", ("decoder.final_layernorm", ("in",), ("out",))),
    ],
)
def test_entry_forms(text, expected):
    modes = parse_entry(text)
    assert (modes.bench_name, modes.input_modes, modes.output_modes) == expected


def test_effective_modes_default_to_out():
    modes = parse_entry("x([in, _, out], [_, in])")
    assert [modes.input_mode(i) for i in range(5)] == ["in", "out", "out", "out", "out"]
    assert [modes.output_mode(i) for i in range(3)] == ["out", "in", "out"]
    empty = parse_entry("x()")
    assert empty.input_mode(0) == "out" and empty.output_mode(0) == "out"


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("fc([in], [out]", "missing ')'"),
        ("fc([in, [out])", "expected a mode"),
        ("fc([in], [out)", "missing ']' before ')'"),
        ("fc([in", "missing ']'"),
        ("fc([in], [out]) extra", "unexpected text 'extra' after the closing ')'"),
        ("fc([in], [out], [in])", "more than two mode lists"),
        ("fc(in, out)", "expected '[' to open a mode list"),
        ("fc x", "expected '('"),
        ("fc([in,], [out])", "expected a mode"),
        ("", "empty entry"),
    ],
)
def test_bad_entries(text, fragment):
    with pytest.raises(MappingError) as err:
        parse_entry(text)
    message = str(err.value)
    assert fragment in message
    assert repr(text) in message
    assert "benchName([input modes], [output modes])" in message


def test_unknown_mode_names_token_and_valid_ones():
    with pytest.raises(MappingError) as err:
        parse_entry("fc([IN], [out])")
    message = str(err.value)
    assert "unknown mode 'IN'" in message
    assert "did you mean 'in'" in message
    assert "valid modes: in, out, _" in message


def test_mapping_error_is_a_config_error():
    assert issubclass(MappingError, ConfigError)


# --- files -----------------------------------------------------------------------------

GOOD = """\
# a comment
Block:                          # class section
  norm: input_layernorm([in], [out])
  attention.wq: self_attention.linear_q([in, in, _, out], [out, in])
  mlp: mlp()                    # no modes
  "": block([in])               # the Block cell itself
Other:
  fc: fc
TopLayer:
  head.proj: output_layer([in], [])
Empty:
"""


def test_parse_file(tmp_path):
    path = write(tmp_path, GOOD)
    mapping = load_mapping_file(path)
    assert set(mapping.classes) == {"Block", "Other", "Empty"}
    block = mapping.classes["Block"]
    assert block["attention.wq"] == ArgModes(
        "self_attention.linear_q", ("in", "in", "_", "out"), ("out", "in")
    )
    assert block["attention.wq"].line == 4 and block["attention.wq"].source == path
    assert block["mlp"] == ArgModes("mlp", (), ())
    assert block[""].input_modes == ("in",)
    assert mapping.classes["Other"]["fc"].bench_name == "fc"
    assert mapping.classes["Empty"] == {}
    assert mapping.top_layer == {"head.proj": ArgModes("output_layer", ("in",), ())}
    assert mapping.sources == (path,)
    assert mapping.entry_count() == 6
    assert mapping.to_dict()[TOP_LAYER] == {"head.proj": "output_layer([in], [])"}
    assert mapping.bench_names()["Block"]["attention.wq"] == "self_attention.linear_q"


def test_integer_child_keys_are_names(tmp_path):
    mapping = parse_mapping_text("SequentialCell:\n  0: first([in])\n")
    assert list(mapping.classes["SequentialCell"]) == ["0"]


def test_empty_file_is_an_empty_mapping(tmp_path):
    mapping = load_mapping_file(write(tmp_path, "# nothing yet\n"))
    assert mapping.entry_count() == 0 and mapping.classes == {}


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.yaml")
    with pytest.raises(MappingError, match=r"layer mapping file not found: .*nope\.yaml"):
        load_mapping_file(path)


def test_yaml_syntax_error_has_line(tmp_path):
    path = write(tmp_path, "Block:\n  norm: a([in], [out])\n  mlp: [unclosed\n  x: y\n")
    with pytest.raises(MappingError) as err:
        load_mapping_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}:")
    assert "YAML syntax error" in message
    line = int(message[len(path) + 1 :].split(":", 1)[0])
    assert line in (3, 4)


def test_bad_entry_reports_line_key_and_text(tmp_path):
    path = write(tmp_path, "Block:\n  norm: a([in], [out])\n  mlp: mlp([in], [out]\n")
    with pytest.raises(MappingError) as err:
        load_mapping_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}:3: Block: 'mlp': bad entry 'mlp([in], [out]'")
    assert "missing ')'" in message


def test_junk_after_paren_in_file(tmp_path):
    path = write(tmp_path, "Block:\n  mlp: mlp([in], [out]) junk\n")
    with pytest.raises(MappingError, match=r":2: Block: 'mlp': bad entry .*unexpected text 'junk'"):
        load_mapping_file(path)


def test_unknown_mode_in_file(tmp_path):
    path = write(tmp_path, "TopLayer:\n  a.b: x([in, both])\n")
    with pytest.raises(MappingError) as err:
        load_mapping_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}:2: TopLayer: 'a.b': bad entry 'x([in, both])'")
    assert "unknown mode 'both'" in message and "valid modes: in, out, _" in message


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("Block:\n  mlp: [in, out]\n", ":2: Block: 'mlp': bad entry '[in, out]': expected a string"),
        ("Block:\n  mlp: 5\n", ":2: Block: 'mlp': bad entry '5': expected a string"),
        ("Block:\n  mlp:\n", ":2: Block: 'mlp': missing entry; expected"),
        ("Block: [a, b]\n", ":1: section 'Block' must be a mapping"),
        ("- a\n- b\n", ":1: the top level must be a mapping"),
        ("Block:\n  mlp: a()\nBlock:\n  x: b()\n", ":3: duplicate class section 'Block' (first at line 1)"),
        ("Block:\n  mlp: a()\n  mlp: b()\n", ":3: duplicate key in section 'Block': 'mlp' (first at line 2)"),
        ("Block:\n  [a]: b()\n", ":2: expected a cell name as key"),
    ],
)
def test_structure_errors(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(MappingError) as err:
        load_mapping_file(path)
    assert fragment in str(err.value)
    assert str(err.value).startswith(path)


@pytest.mark.parametrize(
    "text, line, anchored",
    [
        ("Net: &a {fc1: x, loop: *a}\n", 1, 1),
        ("Net: &a\n  fc1: x\n  loop: *a\n", 3, 1),
        ("Net:\n  fc1: &b [x, [y, *b]]\n", 2, 2),
        ("Net: &n\n  a:\n    b:\n      - *n\n", 4, 1),
    ],
)
def test_an_alias_inside_the_collection_it_names_is_an_error_naming_file_and_line(tmp_path, text, line, anchored):
    path = write(tmp_path, text)
    with pytest.raises(MappingError) as err:
        load_mapping_file(path)
    assert str(err.value).startswith(f"{path}:{line}: alias *")
    assert f"refers to the collection anchored at line {anchored}, which holds it" in str(err.value)


def test_an_alias_to_a_finished_section_reuses_it(tmp_path):
    mapping = load_mapping_file(write(tmp_path, "Block: &b\n  mlp: mlp([in], [out])\nOther: *b\n"))
    assert mapping.classes["Block"]["mlp"].bench_name == mapping.classes["Other"]["mlp"].bench_name == "mlp"


# --- merge and resolution --------------------------------------------------------------


def test_merge_override_wins_per_class_child_and_top_layer():
    base = parse_mapping_text(
        "A:\n  x: bx([in])\n  y: by([in])\nB:\n  z: bz()\nTopLayer:\n  n1: t1()\n  n2: t2()\n", source="base"
    )
    over = parse_mapping_text("A:\n  y: oy([out])\nC:\n  w: cw()\nTopLayer:\n  n2: o2()\n", source="over")
    merged = merge(base, over)
    assert merged.classes["A"]["x"].bench_name == "bx"
    assert merged.classes["A"]["y"] == ArgModes("oy", ("out",), ())
    assert merged.classes["A"]["y"].source == "over"
    assert merged.classes["B"]["z"].bench_name == "bz"
    assert merged.classes["C"]["w"].bench_name == "cw"
    assert {k: v.bench_name for k, v in merged.top_layer.items()} == {"n1": "t1", "n2": "o2"}
    assert merged.sources == ("base", "over")
    # inputs are left alone
    assert base.classes["A"]["y"].bench_name == "by"
    assert merge(base, None) is base
    assert merge(LayerMapping(), base).classes == base.classes


def test_bundled_files_parse_and_are_marked():
    assert set(bundled_names()) >= {"llama", "mcore_gpt"}
    for name in bundled_names():
        mapping = load_bundled(name)
        assert mapping.entry_count() > 0
        assert all(m.bundled for entries in mapping.classes.values() for m in entries.values())
    assert {"LLamaDecodeLayer", "LLamaAttention", "LlamaFeedForward"} <= bundled_classes(
        "llama"
    )
    assert {
        "GPTModel",
        "TransformerLayer",
        "SelfAttention",
        "MLASelfAttention",
        "MoELayer",
    } <= bundled_classes("mcore_gpt")


def test_resolve_explicit_names_user_files_and_auto(tmp_path):
    user = write(tmp_path, "LLamaAttention:\n  wq: my_q([out], [in])\nMine:\n  a: b()\n")
    mapping = resolve_mapping((user, "llama"))  # user listed first still wins over bundled
    assert mapping.classes["LLamaAttention"]["wq"] == ArgModes("my_q", ("out",), ("in",))
    assert mapping.classes["LLamaAttention"]["wo"].bundled
    assert mapping.sources[0] == "bundled/llama.yaml" and mapping.sources[-1] == user

    auto = resolve_mapping(("auto",), {"TransformerLayer", "Dense"})
    assert "TransformerLayer" in auto.classes and "LLamaAttention" not in auto.classes
    assert resolve_mapping(("auto",), {"Dense"}).entry_count() == 0
    assert resolve_mapping((), {"TransformerLayer"}).entry_count() == 0
    # the same bundled file through auto and by name is loaded once
    assert resolve_mapping(("auto", "llama"), {"LlamaModel"}).sources == ("bundled/llama.yaml",)


def test_resolve_unknown_name_lists_bundled(tmp_path):
    with pytest.raises(MappingError) as err:
        resolve_mapping(("lama",), set())
    message = str(err.value)
    assert "'lama' is neither a bundled mapping nor an existing file" in message
    assert "llama" in message and "mcore_gpt" in message and "a file path must exist" in message


# --- compare rules after the mode lists, and msprobe's own name resolution ------------------

from mf_celldump.mapping.baseline_names import MsprobeView, resolve_cells  # noqa: E402


def test_rules_parse_and_format_round_trip():
    entry = parse_entry("linear_qkv([in], [out], layout=sbh, split=qkv:k, in=[hidden_states, _])")
    assert entry.bench_name == "linear_qkv" and entry.input_modes == ("in",)
    rules = entry.compare_rules
    assert rules.seq_first and rules.split.kind == "qkv" and rules.split.part == "k"
    assert rules.baseline_input(0) == "hidden_states" and rules.baseline_input(1) is None
    assert rules.baseline_input(2) == "2"
    assert parse_entry(entry.format()) == entry
    chunk = parse_entry("linear_fc1([in], [out], split=chunk:1/2, act=silu)").compare_rules
    assert (chunk.split.kind, chunk.split.part, chunk.split.count, chunk.act) == ("chunk", "1", 2, "silu")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("x([in], layout=bhs)", "layout='bhs': expected one of bsh, sbh"),
        ("x(layout=sbh, [in])", "mode lists must come before"),
        ("x([in], colour=red)", "unknown rule 'colour'"),
        ("x([in], split=chunk:2/2)", "chunk:I/N with I < N"),
        ("x([in], split=)", "has no value"),
        ("x ([in])", "space between the name 'x' and '('; msprobe compare would read 'x '"),
    ],
)
def test_bad_rules(text, fragment):
    with pytest.raises(ConfigError) as err:
        parse_entry(text, source="m.yaml", line=3)
    assert "m.yaml:3:" in str(err.value) and fragment in str(err.value)


def _resolve(text, cells):
    mapping = parse_mapping_text(textwrap.dedent(text), source="m.yaml")
    return {r.cell: r.baseline for r in resolve_cells(mapping, cells)}


def test_msprobe_resolution_walks_from_top_layer():
    cells = [("", "Root"), ("model", "Inner"), ("model.layers", "CellList"), ("model.layers.0", "Block"),
             ("model.layers.0.fc", "Dense"), ("model.norm", "Norm"), ("head", "Dense")]
    names = _resolve(
        """\
        Root:                 # the root class is never in a dump: ignored by msprobe
          head: never_used
        TopLayer:
          model: decoder
          model.layers: decoder.layers
          head: output_layer
        layers:               # a CellList has no entries: its node type is its own name
          "0": first
        Block:
          fc: linear
        """,
        cells,
    )
    assert names == {
        "model": "decoder", "model.layers.0": "decoder.layers.first",
        "model.layers.0.fc": "decoder.layers.first.linear",
        "model.norm": "decoder.norm",
        "head": "output_layer",
    }


def test_msprobe_resolution_longest_key_first_and_cell_section_is_top_layer():
    cells = [("a", "A"), ("a.b", "B"), ("a.b.c", "C"), ("a.d", "D")]
    names = _resolve(
        """\
        Cell:
          a: x
          a.b.c: deep
        """,
        cells,
    )
    # "a.b.c" (3 parts) is tried before "a" for a.b.c; a.b and a.d only match "a"
    assert names == {"a": "x", "a.b": "x.b", "a.b.c": "deep", "a.d": "x.d"}
    view = MsprobeView(parse_mapping_text("A:\n  '': self_only([in], layout=sbh)\n", source="m"))
    assert view.self_entries["A"].compare_rules.seq_first
