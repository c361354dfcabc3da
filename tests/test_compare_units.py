"""``mf-celldump compare`` and ``anomalies`` parts on small dumps written here in msprobe's layout."""

from __future__ import annotations

import json
import os
import tracemalloc

import numpy as np
import pytest

from mf_celldump import errors
from mf_celldump.analysis.compare import metrics, thresholds, transforms
from mf_celldump.analysis.compare.pairing import map_slot
from mf_celldump.cli import main as celldump_main
from mf_celldump.dtypes import canonical_dtype
from mf_celldump.layout import reader, stat_records
from mf_celldump.mapping.compare_rules import CompareRules, Split, parse_rules
from tests.support.compare_dumps import RNG, X, chain, tensor, write_dump

# --- reader -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("indent", [None, 1])
def test_reader_streams_both_layouts_across_tiny_chunks(tmp_path, monkeypatch, indent):
    folder = write_dump(str(tmp_path), chain(), indent=indent)
    with open(os.path.join(folder, "dump.json"), encoding="utf-8") as handle:
        expected = json.load(handle)
    monkeypatch.setattr(reader, "CHUNK", 7)  # every token crosses a refill
    dump = reader.DumpJson(os.path.join(folder, "dump.json"))
    assert dump.framework == "mindspore" and dump.task == "tensor"
    assert dict(dump.entries()) == expected["data"]


def test_reader_reads_keys_after_data_and_reports_bad_json(tmp_path):
    path = tmp_path / "dump.json"
    path.write_text('{"data": {"Cell.a.A.forward.0": {"output": []}}, "task": "statistics"}')
    dump = reader.DumpJson(str(path))
    assert list(dump.entries()) == [("Cell.a.A.forward.0", {"output": []})] and dump.task == "statistics"
    path.write_text('{"task": "tensor", "data": {"Cell.a.A.forward.0": {"output": [')
    with pytest.raises(reader.DumpError) as err:
        list(reader.DumpJson(str(path)).entries())
    assert str(path) in str(err.value) and "invalid JSON" in str(err.value)


def _peak_streaming(path, entries):
    record = tensor(np.ones(3), "x.npy")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write('{"task": "tensor", "level": "L0", "framework": "mindspore", "data": {\n')
        for i in range(entries):
            body = {"input_args": [record], "input_kwargs": {}, "output": [record]}
            handle.write(f'{"," if i else ""}"Cell.l{i}.Dense.forward.0": {json.dumps(body)}\n')
        handle.write("}}")
    tracemalloc.start()
    count = sum(1 for _ in reader.DumpJson(str(path)).entries())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert count == entries
    return peak, os.path.getsize(path)


def test_reader_memory_does_not_grow_with_the_file(tmp_path):
    small, _ = _peak_streaming(tmp_path / "small.json", 12000)
    large, size = _peak_streaming(tmp_path / "large.json", 30000)
    assert size > 10_000_000
    assert large < 1.2 * small + 200_000, (small, large)  # a few read chunks, whatever the file size
    assert large < size / 2


def test_find_rank_dumps_and_bad_paths(tmp_path):
    write_dump(str(tmp_path / "d"), chain(), rank="rank0", step=3)
    write_dump(str(tmp_path / "d"), chain(), rank="rank1", step=3)
    found = reader.find_rank_dumps(str(tmp_path / "d"))
    assert [(d.step, d.rank, d.label) for d in found] == [(3, 0, "step3/rank0"), (3, 1, "step3/rank1")]
    assert len(reader.find_rank_dumps(str(tmp_path / "d" / "step3"))) == 2
    with pytest.raises(reader.DumpError, match="no dump.json found"):
        reader.find_rank_dumps(str(tmp_path))


# --- transforms and metrics ---------------------------------------------------------------------------


def test_qkv_split_per_query_group_and_chunks():
    groups, heads, dim = 2, 4, 3
    q = RNG.standard_normal((5, heads * dim))
    k = RNG.standard_normal((5, groups * dim))
    v = RNG.standard_normal((5, groups * dim))
    per = heads // groups
    fused = np.concatenate(
        [
            np.concatenate(
                [
                    q.reshape(5, groups, per * dim)[:, g],
                    k.reshape(5, groups, dim)[:, g],
                    v.reshape(5, groups, dim)[:, g],
                ],
                axis=-1,
            )
            for g in range(groups)
        ],
        axis=-1,
    )
    rules = parse_rules((("split", "qkv:q"),))
    np.testing.assert_array_equal(transforms.to_target(fused, q.shape, rules, True, False, groups), q)
    for part, want in (("k", k), ("v", v)):
        got = transforms.to_target(
            fused, want.shape, parse_rules((("split", f"qkv:{part}"),)), True, False, groups
        )
        np.testing.assert_array_equal(got, want)
    with pytest.raises(errors.NotComparable, match="--qkv-groups"):
        transforms.to_target(fused, q.shape, rules, True, False, None)
    gate_up = np.concatenate([q, q * 2], axis=-1)
    silu = parse_rules((("split", "chunk:0/2"), ("act", "silu")))
    np.testing.assert_allclose(transforms.to_target(gate_up, q.shape, silu, True, True), q / (1 + np.exp(-q)))


def test_layout_swap_reshape_and_mismatch():
    sbh = RNG.standard_normal((16, 2, 8))
    rules = CompareRules(layout="sbh")
    np.testing.assert_array_equal(
        transforms.to_target(sbh, (2, 16, 8), rules, False, False), sbh.swapaxes(0, 1)
    )
    flat = transforms.to_target(sbh, (32, 8), rules, False, False)
    np.testing.assert_array_equal(flat, sbh.swapaxes(0, 1).reshape(32, 8))
    with pytest.raises(errors.NotComparable, match="shape"):
        transforms.to_target(sbh, (2, 16, 4), rules, False, False)
    assert transforms.describe(CompareRules(layout="sbh", split=Split("chunk", "1", 2)), True, True) == (
        "sbh->bsh, split chunk:1/2"
    )


def test_metrics_thresholds_and_overrides():
    table = thresholds.override(thresholds.DEFAULT_THRESHOLDS, "bfloat16.cosine=0.9")
    assert table["bfloat16"].cosine == 0.9 and table["float32"].cosine == 0.99999
    table = thresholds.override(table, "rel_err=0.5")
    assert all(t.rel_err == 0.5 for t in table.values())
    with pytest.raises(ValueError, match="KEY one of cosine, rel_err, stat_rel"):
        thresholds.override(table, "cos=1")
    assert canonical_dtype("torch.bfloat16") == "bfloat16" == canonical_dtype("BFloat16")
    limits = thresholds.thresholds_for("Float32", "torch.bfloat16", thresholds.DEFAULT_THRESHOLDS)
    assert limits == thresholds.DEFAULT_THRESHOLDS["bfloat16"]
    f32 = thresholds.DEFAULT_THRESHOLDS["float32"]
    same = metrics.tensor_metrics(X, X, f32, exact=False)
    assert same.cosine == 1.0 and same.rel_err == 0.0 and not same.diverged
    scaled = metrics.tensor_metrics(X * 1.01, X, f32, exact=False)
    assert scaled.cosine == pytest.approx(1.0) and scaled.diverged  # cosine misses a scale, rel_err does not
    nan = X.copy()
    nan[0, 0, 0] = np.nan
    assert metrics.tensor_metrics(nan, X, f32, exact=False).diverged
    assert not metrics.tensor_metrics(nan, nan, f32, exact=False).diverged
    stats = stat_records.record_stats
    assert metrics.stats_metrics(stats(tensor(X * 1.01)), stats(tensor(X)), X.size, f32, exact=False).diverged


def test_slot_rules():
    rules = parse_rules((("in", ("hidden_states", "_")), ("split", "qkv:q")))
    assert map_slot("input.0", "forward", rules) == ("kwarg.hidden_states", False, False, "")
    assert map_slot("input.1", "forward", rules)[3].startswith("not compared")
    assert map_slot("input.2", "forward", rules)[0] == "input.2"
    assert map_slot("output.0", "forward", rules) == ("output.0", True, True, "")
    assert map_slot("input.0", "backward", rules) == ("input.0", True, False, "")
    assert "baseline records no gradient" in map_slot("output.0", "backward", rules)[3]
    plain = parse_rules(())
    assert map_slot("output.1", "backward", plain) == ("output.1", False, False, "")
    assert "partial gradient" in map_slot("output.0", "backward", parse_rules((("split", "chunk:0/2"),)))[3]


# --- the command --------------------------------------------------------------------------------------


def run_json(capsys, *argv):
    code = celldump_main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("parents_first", [True, False])
@pytest.mark.parametrize("task", ["tensor", "statistics"])
def test_first_divergence_is_the_innermost_cell_in_either_order(tmp_path, capsys, parents_first, task):
    write_dump(str(tmp_path / "a"), chain(1.0, parents_first), task=task)
    write_dump(str(tmp_path / "b"), chain(1.5, parents_first), task=task)
    code, result = run_json(
        capsys, "compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o", str(tmp_path / "o")
    )
    assert code == 1
    first = result["first_divergence"]
    assert first["name"] == "Cell.block.fc2.Dense.forward.0" and first["direction"] == "forward"
    assert [(p["name"], p["cell"], p["status"]) for p in first["parents"]] == [
        ("Cell.block.Block.forward.0", "block", "diverged")
    ]
    code, result = run_json(
        capsys, "compare", str(tmp_path / "a"), str(tmp_path / "a"), "-o", str(tmp_path / "p")
    )
    assert code == 0 and result["first_divergence"] is None
    assert os.path.isfile(result["csv"])


def test_bad_input_exits_2_with_a_message(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), chain())
    code = celldump_main(
        ["compare", str(tmp_path / "missing"), str(tmp_path / "a"), "-o", str(tmp_path / "o")]
    )
    assert code == 2 and "missing: no such file or folder" in capsys.readouterr().err
    code = celldump_main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--threshold", "x=1"])
    assert code == 2 and "--threshold 'x=1'" in capsys.readouterr().err
    write_dump(str(tmp_path / "b"), chain(), step=5)
    write_dump(str(tmp_path / "b"), chain(), step=6)
    code = celldump_main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--steps", "9"])
    assert code == 2 and "has a partner" in capsys.readouterr().err
    (tmp_path / "a" / "step0" / "rank" / "dump.json").write_text('{"data": {"Cell.x')
    code = celldump_main(
        ["compare", str(tmp_path / "a"), str(tmp_path / "b" / "step5"), "-o", str(tmp_path / "o")]
    )
    assert code == 2 and "invalid JSON" in capsys.readouterr().err


def test_anomalies_across_ranks_and_magnitudes(tmp_path, capsys):
    late, early = chain(), chain()
    late["Cell.block.fc2.Dense.forward.0"]["out"] = [np.full((2, 2), np.nan)]
    early["Cell.block.fc1.Dense.forward.0"]["out"] = [np.full((2, 2), np.inf)]
    write_dump(str(tmp_path / "d"), late, task="statistics", rank="rank0")
    write_dump(str(tmp_path / "d"), early, task="statistics", rank="rank1")
    code, result = run_json(capsys, "anomalies", str(tmp_path / "d"))
    assert code == 1
    (first,) = result["first"]
    assert first["rank"] == 1 and first["entry"] == "Cell.block.fc1.Dense.forward.0"
    assert first["slots"] == [{"slot": "output.0", "kind": "inf", "Max": float("inf"), "Min": float("inf")}]
    per_rank = {r["rank"]: r["first"]["entry"] for r in result["ranks"]}
    assert per_rank[0] == "Cell.block.fc2.Dense.forward.0"
    big = chain()
    big["Cell.block.fc2.Dense.forward.0"]["out"] = [np.full((2, 2), 1e6)]
    write_dump(str(tmp_path / "e"), big)
    assert celldump_main(["anomalies", str(tmp_path / "e")]) == 0
    assert "no NaN, Inf or out-of-range value found" in capsys.readouterr().out
    code, result = run_json(capsys, "anomalies", str(tmp_path / "e"), "--max-abs", "1e4")
    assert code == 1 and result["first"][0]["slots"][0]["kind"] == "large"
    assert celldump_main(["anomalies", str(tmp_path / "nothing")]) == 2


def test_tensor_files_must_be_plain_files_inside_the_dump(tmp_path, capsys):
    from mf_celldump.analysis.compare import tensors

    folder = write_dump(str(tmp_path / "a"), chain())
    data_dir = os.path.join(folder, "dump_tensor_data")
    outside = tmp_path / "outside.npy"
    np.save(outside, np.zeros(3))
    with pytest.raises(errors.TensorFileError, match="not a plain file name"):
        tensors.data_path(data_dir, {"data_name": "../outside.npy"})
    os.symlink(outside, os.path.join(data_dir, "link.npy"))
    with pytest.raises(errors.TensorFileError, match="symlink"):
        tensors.load(tensors.data_path(data_dir, {"data_name": "link.npy"}))
    os.mkdir(os.path.join(data_dir, "folder.npy"))
    with pytest.raises(errors.TensorFileError, match="not a regular file"):
        tensors.load(os.path.join(data_dir, "folder.npy"))
    with pytest.raises(errors.TensorFileError, match="missing"):
        tensors.load(os.path.join(data_dir, "absent.npy"))
    np.save(os.path.join(data_dir, "strings.npy"), np.array(["abc"]))
    with pytest.raises(errors.TensorFileError, match="not numbers"):
        tensors.load(os.path.join(data_dir, "strings.npy"))
    # in a comparison, a file that cannot be read leaves the pair to its statistics, with the reason
    name = "Cell.block.fc1.Dense.forward.0.output.0.npy"
    os.remove(os.path.join(data_dir, name))
    code, result = run_json(
        capsys, "compare", str(tmp_path / "a"), str(tmp_path / "a"), "-o", str(tmp_path / "o")
    )
    assert code == 0 and result["units"][0]["skipped"] == 0
    (fallback,) = result["coverage"]["statistics_fallback"]
    assert fallback["count"] == 1 and name in fallback["reason"]


def test_steps_and_ranks_pair_by_number_and_select(tmp_path, capsys):
    for step in (0, 1):
        for rank in ("rank0", "rank1"):
            write_dump(str(tmp_path / "base"), chain(), step=step, rank=rank)
            bad = step == 1 and rank == "rank1"
            write_dump(str(tmp_path / "run"), chain(1.5 if bad else 1.0), step=step, rank=rank)
    out = str(tmp_path / "o")
    code, result = run_json(capsys, "compare", str(tmp_path / "run"), str(tmp_path / "base"), "-o", out)
    assert code == 1 and len(result["units"]) == 4
    first = result["first_divergence"]
    assert (first["step"], first["rank"], first["folder"], first["cell"]) == (1, 1, "step1/rank1", "block.fc2")
    code, result = run_json(
        capsys, "compare", str(tmp_path / "run"), str(tmp_path / "base"), "-o", out, "--steps", "0"
    )
    assert code == 0 and [u["step"] for u in result["units"]] == [0, 0]
    code, result = run_json(
        capsys, "compare", str(tmp_path / "run"), str(tmp_path / "base"), "-o", out, "--ranks", "0"
    )
    assert code == 0 and {u["rank"] for u in result["units"]} == {0}


def test_nothing_paired_is_bad_input_not_success(tmp_path, capsys):
    write_dump(str(tmp_path / "a"), chain())
    renamed = {name.replace("Cell.block.", "Cell.other."): body for name, body in chain().items()}
    write_dump(str(tmp_path / "b"), renamed)
    code = celldump_main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(tmp_path / "o")])
    captured = capsys.readouterr()
    assert code == 2 and "NOTHING COMPARED" in captured.out
    assert "no baseline cell at the mapped name" in captured.out and "mapping check" in captured.err
    # with a mapping that renames block -> other, everything pairs
    (tmp_path / "m.yaml").write_text("TopLayer:\n  block: other\n")
    code = celldump_main(
        [
            "compare",
            str(tmp_path / "a"),
            str(tmp_path / "b"),
            "-o",
            str(tmp_path / "o"),
            "--mapping",
            str(tmp_path / "m.yaml"),
        ]
    )
    assert code == 0 and "no divergence: all 6 compared pairs" in capsys.readouterr().out


def test_anomalies_read_msprobe_parameters(tmp_path, capsys):
    folder = write_dump(str(tmp_path / "d"), chain())
    path = os.path.join(folder, "dump.json")
    with open(path, encoding="utf-8") as handle:
        doc = json.load(handle)
    doc["data"]["Cell.block.fc2.Dense.forward.0"]["parameters"] = {"weight": tensor(np.full(3, np.nan))}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(doc, handle)
    code, result = run_json(capsys, "anomalies", str(tmp_path / "d"))
    (first,) = result["first"]
    assert code == 1 and first["entry"] == "Cell.block.fc2.Dense.forward.0"
    assert first["slots"][0]["slot"] == "param.weight" and first["note"] == "one of its own weights is bad"


def _edit_dump(folder, change):
    path = os.path.join(folder, "dump.json")
    with open(path, encoding="utf-8") as handle:
        doc = json.load(handle)
    change(doc["data"])
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(doc, handle)


def test_anomalies_read_weight_gradients(tmp_path, capsys):
    """A nan_count of 3 on a bias gradient (a parameters_grad entry) is found, as on a forward output."""
    folder = write_dump(str(tmp_path / "d"), chain())
    grad = dict(tensor(np.ones(3)), nan_count=3)

    def add_gradient(data):
        data["Cell.block.fc2.Dense.parameters_grad.0"] = {"bias": [grad]}

    _edit_dump(folder, add_gradient)
    code, result = run_json(capsys, "anomalies", str(tmp_path / "d"))
    (first,) = result["first"]
    assert code == 1 and first["entry"] == "Cell.block.fc2.Dense.parameters_grad.0", result
    assert first["direction"] == "backward" and first["slots"][0]["slot"] == "param_grad.bias"
    assert first["slots"][0]["nan_count"] == 3 and first["note"] == "the gradient of one of its own weights is bad"


def test_anomalies_say_which_records_they_could_not_judge(tmp_path, capsys):
    """A Max of "NaN?" and a shape of 10^12 x 10^12 elements are named, not passed over in silence."""
    folder = write_dump(str(tmp_path / "d"), chain())

    def spoil(data):
        data["Cell.block.fc1.Dense.forward.0"]["output"][0]["Max"] = "NaN?"
        data["Cell.block.fc2.Dense.forward.0"]["output"][0]["shape"] = [10 ** 12, "x"]

    _edit_dump(folder, spoil)
    assert celldump_main(["anomalies", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "2 tensor record(s) not judged, their statistics unreadable: Cell.block.fc1.Dense.forward.0 output.0: " \
           "Max 'NaN?' is not a number; Cell.block.fc2.Dense.forward.0 output.0: shape [1000000000000, 'x'] is " \
           "not a list of whole numbers" in out, out
    assert out.splitlines()[-1] == ("no NaN, Inf or out-of-range value found in the records judged; 2 record(s) "
                                    "could not be judged (above)")
    code, result = run_json(capsys, "anomalies", str(tmp_path / "d"))
    assert result["ranks"][0]["unjudged"] == 2


def test_pairs_table_keeps_missing_values_empty_integers_whole_and_floats_exact(tmp_path):
    """compare_pairs.csv without pandas: its columns in the store's order, the rows in execution order, a
    missing value an empty field, step/rank/pos as integers, every float as repr writes it (read back
    equal), text with commas or quotes quoted as the csv module does."""
    import csv

    from mf_celldump.analysis.compare.report import layer_table, write_csv
    from mf_celldump.analysis.compare.store import PAIR_COLUMNS, Store

    store = Store(str(tmp_path / "pairs.db"))
    rows = [dict(step=0, rank=0, folder="rank0", pos=pos, kind="activation", direction=direction, entry=f"e{pos}",
                 cell=cell, layer=layer, slot="output.0", status=status, cosine=cosine, rel_err=rel_err,
                 reason=reason, score=score)
            for pos, direction, cell, layer, status, cosine, rel_err, reason, score in [
                (3, "backward", "model.layers.0.attention", "model.layers.0", "ok", 0.1 + 0.2, 1e-17, None, 1),
                (1, "forward", "model.layers.1.attention", "model.layers.1", "diverged", 0.5, float("inf"),
                 'shape [2, 3] vs "[3, 2]"', 2.0),
                (0, "forward", "model.layers.0.attention", "model.layers.0", "ok", None, 0.0, None, None),
                (2, "backward", "model.embed", "model.embed", "skipped", None, None, "no baseline", None)]]
    store.add_pairs(rows)
    write_csv(store, str(tmp_path / "pairs.csv"))
    text = (tmp_path / "pairs.csv").read_text()
    lines = text.split("\n")
    assert lines[0] == ",".join(PAIR_COLUMNS) and lines[-1] == "" and "\r" not in text
    table = list(csv.DictReader(lines))
    assert [(r["direction"], r["pos"]) for r in table] == [("forward", "0"), ("forward", "1"), ("backward", "2"),
                                                           ("backward", "3")]
    assert table[0]["cosine"] == "" and table[0]["step"] == "0" and table[0]["rel_err"] == "0.0"
    assert table[1]["rel_err"] == "inf" and table[1]["reason"] == 'shape [2, 3] vs "[3, 2]"'
    assert table[3]["cosine"] == repr(0.1 + 0.2) and float(table[3]["rel_err"]) == 1e-17
    assert table[3]["score"] == "1.0"  # a real column holds floats, whole or not
    layers = layer_table(store, 0, 0)
    assert [(r.layer, r.direction, r.depth) for r in layers] == [
        ("model.layers.0", "forward", 0), ("model.layers.0", "backward", 0), ("model.layers.1", "forward", 1)]
    assert layers[0].cosine is None and layers[1].cosine == 0.1 + 0.2 and layers[2].diverged == 1
    store.close()


def _layered(scale):
    """Two decoder layers, so that the depth plot has something to draw."""
    return {"Cell.model.layers.0.fc.Dense.forward.0": {"in": [X], "out": [X * 2]},
            "Cell.model.layers.1.fc.Dense.forward.0": {"in": [X * 2], "out": [X * 4 * scale]}}


def test_without_matplotlib_compare_writes_the_rest_and_names_the_extra(tmp_path, capsys):
    """Installed without the compare extra (and without pandas): the verdict, exit status, CSV and HTML
    report are the same; instead of the plot one line names what to install."""
    import subprocess
    import sys

    write_dump(str(tmp_path / "a"), _layered(1.0))
    write_dump(str(tmp_path / "b"), _layered(1.5))
    assert celldump_main(["compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o", str(tmp_path / "with")]) == 1
    assert "plot:     " in capsys.readouterr().out and (tmp_path / "with" / "compare_depth.png").is_file()
    hidden = ("import sys; sys.modules['matplotlib'] = sys.modules['pandas'] = None; "
              "from mf_celldump.cli import main; sys.exit(main(sys.argv[1:]))")
    worktree = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", hidden, "compare", str(tmp_path / "b"), str(tmp_path / "a"), "-o",
                           str(tmp_path / "without")], capture_output=True, text=True, timeout=300, cwd=worktree,
                          env=dict(os.environ, PYTHONPATH=worktree))
    assert proc.returncode == 1, proc.stderr
    assert 'no plot: the depth plot needs matplotlib: pip install "mf_celldump[compare]"' in proc.stdout.splitlines()
    assert "Traceback" not in proc.stderr and "FIRST DIVERGENCE" in proc.stdout
    assert sorted(os.listdir(tmp_path / "without")) == ["compare_pairs.csv", "report.html"]
    assert (tmp_path / "without" / "compare_pairs.csv").read_text() == \
        (tmp_path / "with" / "compare_pairs.csv").read_text()


# --- the noise bound's rules, on records as a dump holds them --------------------------------------------


def _rec(dtype, shape, norm, top=1.0, bottom=-1.0):
    return {"type": "mindspore.Tensor", "dtype": dtype, "shape": shape, "Max": top, "Min": bottom, "Mean": 0.1,
            "Norm": norm}


def test_each_cell_kind_has_the_reduction_it_computes():
    from mf_celldump.analysis.compare import noise

    ids = _rec("Int32", [2, 16], 7000.0, 127, 1)
    embedding = {"input_args": [ids], "output": [_rec("Float32", [2, 16, 64], 2.0)],
                 "parameters": {"weight": _rec("Float32", [128, 64], 5.0)}}
    linear = {"input_args": [_rec("Float32", [2, 16, 64], 30.0)], "output": [_rec("Float32", [2, 16, 96], 9.0)],
              "parameters": {"weight": _rec("Float32", [96, 64], 4.0)}}
    norm = {"input_args": [_rec("Float32", [2, 16, 64], 30.0)], "output": [_rec("Float32", [2, 16, 64], 32.0)],
            "parameters": {"weight": _rec("Float32", [64], 8.0)}}
    act = {"input_args": [_rec("Float32", [2, 16, 96], 9.0)], "output": [_rec("Float32", [2, 16, 96], 5.0)]}
    kinds = {name: noise.cell_reductions(cls, body) for name, cls, body in (
        ("m.embed", "Embedding", embedding), ("m.layers.0.mlp.up", "Linear", linear),
        ("m.layers.0.norm", "RMSNorm", norm), ("m.layers.0.mlp.act", "SiLU", act))}
    assert [(r.kind, r.forward, r.backward, r.tokens) for r in kinds.values()] == [
        ("lookup", 1.0, 1.0, 32.0), ("matmul", 64.0, 96.0, 32.0), ("norm", 64.0, 64.0, 32.0),
        ("elementwise", 1.0, 1.0, 1.0)]
    kinds.update({"m": noise.Reductions(), "m.layers.0": noise.Reductions(), "m.layers.0.mlp": noise.Reductions()})
    composed = noise.compose(kinds)
    assert composed["m.layers.0.mlp"].forward == pytest.approx((8 + 1) ** 2)  # up and act, the leaves inside
    assert composed["m.layers.0"].forward == pytest.approx((8 + 1 + 8) ** 2)
    assert composed["m"].forward == pytest.approx((1 + 8 + 1 + 8) ** 2) and composed["m.embed"].kind == "lookup"


def test_token_ids_never_set_the_magnitude_and_a_received_value_keeps_its_producers_bound():
    from mf_celldump.analysis.compare import noise

    ids = _rec("Int32", [2, 16], 7000.0, 127, 1)  # RMS about 219: as large as token ids get
    looked_up = _rec("Float32", [2, 16, 64], 2.0, 0.5, -0.5)
    mask = _rec("Float32", [2, 1, 16, 16], 150000.0, 0.0, -10000.0)
    embedding = {"input_args": [ids], "output": [looked_up], "parameters": {"weight": _rec("Float32", [128, 64], 5.0)}}
    norm = {"input_args": [dict(looked_up), mask], "output": [_rec("Float32", [2, 16, 64], 32.0)],
            "parameters": {"weight": _rec("Float32", [64], 8.0)}}
    tracker = noise.Tracker()
    tracker.see("m.embed", "Embedding", "forward", 0, 2, embedding)
    tracker.see("m.layers.0.norm", "RMSNorm", "forward", 0, 3, norm)
    cells = tracker.finish()

    def bound_of(cell, body, slot, record, depth):
        scale, at = noise.slot_scale("forward", slot, body, record, record, cells[cell], cells, depth)
        return noise.bound(("float32", "float32"), at, scale)

    produced = bound_of("m.embed", embedding, "output.0", looked_up, 2)
    received = bound_of("m.layers.0.norm", norm, "input.0", norm["input_args"][0], 3)
    assert produced == received  # one tensor, one bound
    assert produced == pytest.approx(4 * 2 ** 0.5 * 2 * 2.0 ** -24 * 5.0 / (128 * 64) ** 0.5)  # the table's RMS
    norm_out = bound_of("m.layers.0.norm", norm, "output.0", norm["output"][0], 3)
    assert norm_out < 1e-5  # neither the mask's -10000 nor the ids' magnitude widen it


def test_a_tensor_pair_whose_statistics_differ_beyond_their_bound_diverges():
    from mf_celldump.analysis.compare import measure

    result = metrics.PairMetrics(rel_err=9e-4, max_abs_err=1e-3)
    limits = thresholds.DEFAULT_THRESHOLDS["float32"]
    ours = {"Max": 1.002, "Min": 0.999, "Mean": 1.0, "Norm": 8.0}
    theirs = {"Max": 1.0, "Min": 0.999, "Mean": 1.0, "Norm": 8.0}
    measure._judge_statistics_too(result, ours, theirs, 64, limits, 1e-6)
    assert result.diverged and "statistics differ beyond their bound" in result.note
    quiet = metrics.PairMetrics(rel_err=9e-4, max_abs_err=1e-3)
    measure._judge_statistics_too(quiet, ours, theirs, 64, limits, 1e-2)  # within the bound: rounding
    assert not quiet.diverged
