"""Property-based fuzz targets (Hypothesis) for everything that reads other people's files.

Each target is run by ``tests/test_fuzz.py`` in a child process whose address space is
capped (RLIMIT_AS), and states one property: any input gives a result or one of our own
errors, never another exception, and never "out of memory". The raw-tree target also
checks that nothing outside the dump changed and that no FIFO outside was opened (that
would block; an alarm turns it into a failure). ``python -m tests.support.fuzz_targets NAME``
runs one target here; it prints how many examples it tried.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import string
import sys
import tempfile

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mf_celldump.errors import ConfigError, MappingError, ProcessingError

EXAMPLES = {"raw_tree": 200, "records": 400, "npy": 400, "kbk_csv": 250, "config": 600, "config_yaml": 300,
            "mapping": 600}
COUNTS = dict.fromkeys(EXAMPLES, 0)


def _settings(name):
    scale = float(os.environ.get("FUZZ_SCALE", "1"))
    return settings(max_examples=max(1, int(EXAMPLES[name] * scale)), deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


@contextlib.contextmanager
def _alarm(seconds=20):
    def expire(signum, frame):
        raise TimeoutError("blocked: a FIFO outside the dump was opened?")

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)


def _no_memory_trouble(texts):
    for text in texts:
        assert "out of memory" not in text, text


# -- values ---------------------------------------------------------------------------------------

big_ints = st.one_of(st.integers(0, 12), st.integers(-5, 10**6), st.integers(10**15, 10**40))
json_values = st.recursive(
    st.none() | st.booleans() | big_ints | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
dtypes = st.sampled_from(["float32", "float16", "bfloat16", "int64", "int8", "uint8", "bool", "float64", "x1",
                          "complex64", "U3", ""])


@st.composite
def raw_names(draw):
    """Raw tensor file names: well-formed, out of range, or near misses."""
    path = draw(st.lists(big_ints.map(abs), min_size=1, max_size=40))
    parts = [f"c{abs(draw(big_ints))}", draw(st.sampled_from("fbx")), draw(st.sampled_from("akoz")),
             draw(st.sampled_from("tifbnq")), "n" + draw(st.sampled_from(["x", str(abs(draw(big_ints)))])),
             "p" + ".".join(str(p) for p in path)]
    mode = draw(st.sampled_from(["", "_in"]))
    return ".".join(parts) + f"{mode}_{draw(dtypes) or 'float32'}_{abs(draw(big_ints))}.npy"


file_names = st.one_of(
    raw_names(), st.just("records.jsonl"), st.just("_step_done.json"),
    st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=24).filter(
        lambda n: n not in (".", "..")),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789_", min_size=8, max_size=8).map(lambda s: ".tmp-" + s),
)


@st.composite
def npy_bytes(draw):
    """A .npy file: valid, or with a lying header, a truncated body, junk after, or odd dtypes."""
    dtype = draw(st.sampled_from(["<f4", "<f2", "<i8", "|b1", ">f8", "<u2", "<c8", "<U3", "|V4", "<M8[D]", "|O"]))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    header = {"descr": dtype, "fortran_order": draw(st.booleans()), "shape": shape}
    if draw(st.booleans()):
        header["shape"] = tuple(draw(st.lists(big_ints.map(abs), max_size=4)))
    text = repr(header).encode("latin1")
    text += b" " * ((64 - (len(text) + 11) % 64) % 64) + b"\n"
    version = draw(st.sampled_from([b"\x01\x00", b"\x02\x00", b"\x03\x00", b"\x09\x09"]))
    size = len(text).to_bytes(4 if version.startswith(b"\x02") else 2, "little")
    count = int(np.prod(shape)) if shape else 1
    itemsize = {"<f4": 4, "<f2": 2, "<i8": 8, "|b1": 1, ">f8": 8, "<u2": 2, "<c8": 8, "<U3": 12, "|V4": 4,
                "<M8[D]": 8, "|O": 8}[dtype]
    body = draw(st.binary(min_size=count * itemsize, max_size=count * itemsize))
    data = b"\x93NUMPY" + version + size + text + body
    cut = draw(st.sampled_from(["none", "truncate", "append", "garbage"]))
    if cut == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif cut == "append":
        data += draw(st.binary(min_size=1, max_size=64))
    elif cut == "garbage":
        data = draw(st.binary(max_size=300))
    return data


@st.composite
def record_lines(draw):
    """records.jsonl content: plausible records with wrong fields, random JSON, deep nesting, raw bytes."""
    good = {"seq": draw(big_ints), "cell": draw(big_ints), "dir": draw(st.sampled_from(["forward", "backward", "x"])),
            "slot": draw(st.sampled_from(["a", "k", "o", 1])), "kind": draw(st.sampled_from(["t", "i", "f", "b", "n"])),
            "call": draw(st.none() | big_ints), "path": draw(st.lists(big_ints, max_size=40) | json_values),
            "dtype": draw(st.text(max_size=40) | json_values), "shape": draw(st.lists(big_ints, max_size=70)),
            "stats": draw(st.dictionaries(st.text(max_size=8), json_values, max_size=20)),
            "value": draw(json_values)}
    keys = draw(st.lists(st.sampled_from(sorted(good)), unique=True))
    lines = [json.dumps({k: good[k] for k in keys}).encode()]
    lines += draw(st.lists(st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=80),
                                     st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)), max_size=4))
    order = draw(st.permutations(lines))
    return b"\n".join(order) + draw(st.sampled_from([b"\n", b"", b"\n\n"]))


# -- the raw tree ------------------------------------------------------------------------------------

def _manifest(draw):
    if draw(st.integers(0, 5)) == 0:
        return draw(st.binary(max_size=200))
    names = st.one_of(st.sampled_from(["model", "model.layers.0", "", "../x", "a/b", "..", "x" * 300, "é.ü"]),
                      st.text(max_size=12))
    cells = [{"id": i, "name": draw(names), "class": draw(st.sampled_from(["C", "Linear", ""])),
              "params": draw(st.lists(st.sampled_from(["x", "mask", "a/b"]), max_size=3))}
             for i in range(draw(st.integers(0, 3)))]
    manifest = {"format": draw(st.sampled_from(["mf_celldump-raw/3", "mf_celldump-raw/3", "other"])),
                "task": draw(st.sampled_from(["tensor", "statistics", "x"])), "rank": draw(st.integers(0, 2)),
                "distributed": draw(st.booleans()), "cells": cells,
                "step_numbering": draw(st.sampled_from(["global", "graph", "x"])),
                "graph_step_base": draw(st.sampled_from([0, 3, -1]))}
    return json.dumps(manifest).encode()


@st.composite
def raw_trees(draw):
    """A list of (relative path, kind, content) making a dump folder."""
    items = []
    for rank in draw(st.lists(st.integers(0, 2), min_size=1, max_size=2, unique=True)):
        base = f"_raw/rank{rank}"
        items.append((f"{base}/manifest.json", "file", _manifest(draw)))
        for step in draw(st.lists(st.integers(0, 3), max_size=2, unique=True)):
            for name in draw(st.lists(file_names, max_size=6, unique=True)):
                kind = draw(st.sampled_from(["file", "file", "file", "symlink", "fifo", "dir", "hardlink"]))
                content = draw(npy_bytes() if name.endswith(".npy") else record_lines() if name == "records.jsonl"
                               else st.binary(max_size=100))
                items.append((f"{base}/step{step}/{name}", kind, content))
        for name in draw(st.lists(st.sampled_from(["_processed", ".processing.lock", "_processed/step0.json",
                                                   "_processed/.tmp-abcdefgh", ".step1.removing/x.npy", "kbk"]),
                                  max_size=2, unique=True)):
            items.append((f"{base}/{name}", draw(st.sampled_from(["file", "symlink", "dir"])), b"{}"))
    for name in draw(st.lists(st.sampled_from(["step0", "step0/rank", "step1/.rank.partial"]), max_size=1)):
        items.append((name, draw(st.sampled_from(["symlink", "dir"])), b""))
    return items


def _materialize(root, outside, items):
    for rel, kind, content in items:
        path = os.path.join(root, rel)
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.lexists(path):
                continue
            if kind == "file":
                with open(path, "wb") as handle:
                    handle.write(content)
            elif kind == "symlink":
                os.symlink(os.path.join(outside, "fifo" if len(content) % 2 else "dir"), path)
            elif kind == "hardlink":
                os.link(os.path.join(outside, "secret"), path)
            elif kind == "fifo":
                os.mkfifo(path)
            else:
                os.makedirs(path, exist_ok=True)


def _outside(folder):
    os.makedirs(os.path.join(folder, "dir"))
    with open(os.path.join(folder, "secret"), "wb") as handle:
        handle.write(b"secret")
    os.chmod(os.path.join(folder, "secret"), 0o600)
    os.mkfifo(os.path.join(folder, "fifo"))


def _snapshot(folder):
    out = {}
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            info = os.lstat(os.path.join(base, name))
            out[os.path.join(base, name)] = (info.st_mode, info.st_nlink, info.st_size, info.st_mtime_ns)
    return out


@_settings("raw_tree")
@given(raw_trees(), st.booleans())
def raw_tree(items, remove_raw):
    """The scanner, records reader, npy reader and the whole processing on a random dump folder."""
    from mf_celldump.processing.driver import process_dump

    COUNTS["raw_tree"] += 1
    work = tempfile.mkdtemp(prefix="fuzz-tree-")
    try:
        outside, dump = os.path.join(work, "outside"), os.path.join(work, "dump")
        _outside(outside)
        _materialize(dump, outside, items)
        before = _snapshot(outside)
        for _ in range(2):  # a second run over what the first left
            with _alarm():
                try:
                    report = process_dump(dump, jobs=1, remove_raw=remove_raw)
                    _no_memory_trouble(report.all_problems)
                except ProcessingError as err:
                    _no_memory_trouble([str(err)])
        assert _snapshot(outside) == before
    finally:
        shutil.rmtree(work, ignore_errors=True)


@_settings("records")
@given(st.one_of(record_lines(), st.binary(max_size=3000)))
def records(data):
    from mf_celldump.rawformat.records import RecordsRead, read_records

    COUNTS["records"] += 1
    result = read_records(data, "records.jsonl", 0)
    assert isinstance(result, RecordsRead)
    lines = data.count(b"\n") + 1
    assert len(result.captures) + len(result.problems) + len(result.warnings) <= lines
    assert all(len(p) < 600 for p in result.problems)


@_settings("npy")
@given(npy_bytes(), st.sampled_from(["t", "i", "f", "b", "n"]))
def npy(data, kind):
    """One raw file through the per-file task (statistics, or a value), as workers run it."""
    from mf_celldump.processing.file_tasks import FAILED, OK, FileTask, Folders, run_one

    COUNTS["npy"] += 1
    work = tempfile.mkdtemp(prefix="fuzz-npy-")
    try:
        with open(os.path.join(work, "x.npy"), "wb") as handle:
            handle.write(data)
        os.makedirs(os.path.join(work, "out"))
        result = run_one(FileTask(0, "x.npy", "y.npy", kind),
                         ("max", "min", "mean", "norm", "md5", "nan_count", "inf_count"),
                         Folders(work, os.path.join(work, "out")))
        assert result[1] in (OK, FAILED)
        if result[1] == FAILED:
            _no_memory_trouble([result[2]])
    finally:
        shutil.rmtree(work, ignore_errors=True)


@st.composite
def csv_texts(draw):
    from mf_celldump.rawformat.kbk_csv import REQUIRED_COLUMNS

    columns = list(REQUIRED_COLUMNS) + ["Max Value", "Min Value", "Avg Value", "L2Norm Value", "NaN Count",
                                        "Negative Inf Count", "Positive Inf Count", "Timestamp", "Task ID"]
    header = draw(st.permutations(columns))[: draw(st.integers(0, len(columns)))]
    cell = st.one_of(st.sampled_from(["input", "output", "TensorDump|c0-f-a-t-nx-p0", "c1-b-o-i-n2-p0-1",
                                      "inf", "nan", "(2,3)", "(" + "9" * 30 + ")", "float32", "1e400", "-0"]),
                     st.text(max_size=20))
    rows = draw(st.lists(st.lists(cell, min_size=len(header), max_size=len(header) + 2), max_size=8))
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue() + draw(st.sampled_from(["", "\x00", "\"unclosed"]))


@_settings("kbk_csv")
@given(csv_texts())
def kbk_csv(text):
    from mf_celldump.rawformat.kbk_csv import KbkRead, read_statistic_csvs

    COUNTS["kbk_csv"] += 1
    work = tempfile.mkdtemp(prefix="fuzz-csv-")
    try:
        path = os.path.join(work, "statistic.csv")
        with open(path, "w", encoding="utf-8", errors="surrogatepass", newline="") as handle:
            handle.write(text)
        result = read_statistic_csvs([path], ("max", "min", "mean", "norm", "nan_count", "inf_count"), 0)
        assert isinstance(result, KbkRead)
    finally:
        shutil.rmtree(work, ignore_errors=True)


CONFIG_KEYS = ("dump_path", "task", "data_mode", "steps", "ranks", "include", "exclude", "exclude_classes",
               "layer_mapping", "statistics", "backend", "process_on_train_end", "jobs")
config_values = st.one_of(json_values, st.sampled_from(["all", "0-5", "5-2", "0,2,4-9", "1" * 20, " 3 - 4 ", "-1",
                                                        "tensor", "statistics", "auto", "none", "", "max"]))


@_settings("config")
@given(st.dictionaries(st.one_of(st.sampled_from(CONFIG_KEYS), st.text(max_size=10)), config_values, max_size=6))
def config(values):
    from mf_celldump.config import DumpConfig

    COUNTS["config"] += 1
    try:
        built = DumpConfig.from_dict(values)
    except ConfigError as err:
        assert len(str(err)) < 1000, str(err)[:200]
        return
    assert isinstance(built, DumpConfig)
    built.to_dict()


yaml_fragments = st.sampled_from(["steps: ", "ranks: ", "task: ", "a: &a [1, 2]\n", "*a", "[*a, *a]", "{", "}",
                                  "[", "]", "\n", "  ", "- ", ": ", "!!python/object:os.system ", "0-3", "'x'",
                                  "\"\\u0000\"", "? [1]\n", "layer_mapping: ", "&b ", "*b", "%YAML 1.1\n", "---\n",
                                  "type: CellDumpCallback\n", "include: ['*']\n"])


@_settings("config_yaml")
@given(st.lists(yaml_fragments | st.text(max_size=8), max_size=25).map("".join))
def config_yaml(text):
    from mf_celldump.config import DumpConfig

    COUNTS["config_yaml"] += 1
    work = tempfile.mkdtemp(prefix="fuzz-yaml-")
    try:
        path = os.path.join(work, "c.yaml")
        with open(path, "w", encoding="utf-8", errors="surrogatepass") as handle:
            handle.write(text)
        try:
            DumpConfig.from_yaml(path)
        except ConfigError as err:
            assert len(str(err)) < 2000, str(err)[:200]
    finally:
        shutil.rmtree(work, ignore_errors=True)


mapping_fragments = st.sampled_from(["LLamaDecodeLayer:\n", "TopLayer:\n", "  attention: ", "  model.norm: ",
                                     "self_attention", "([in, _, out], [out])", "(", ")", "[", "]", "in", "out", "_",
                                     ", ", "\n", ": ", "&a ", "*a", "- ", "{", "}", "'", "\"", "#", "!!binary ",
                                     "  ''", "? ", "x" * 50, "  ", "\t"])


@_settings("mapping")
@given(st.one_of(st.lists(mapping_fragments | st.text(max_size=6), max_size=30).map("".join), st.text(max_size=200)))
def mapping(text):
    """The layer-mapping parser (mf_celldump/mapping/parser.py), read-only here."""
    from mf_celldump.mapping.modes import LayerMapping
    from mf_celldump.mapping.parser import parse_entry, parse_mapping_text

    COUNTS["mapping"] += 1
    try:
        assert isinstance(parse_mapping_text(text, source="fuzz.yaml"), LayerMapping)
    except MappingError as err:
        assert len(str(err)) < 2000, str(err)[:200]
    try:
        parse_entry(text)
    except MappingError:
        pass


TARGETS = {"raw_tree": raw_tree, "records": records, "npy": npy, "kbk_csv": kbk_csv, "config": config,
           "config_yaml": config_yaml, "mapping": mapping}


def main(name: str) -> int:
    TARGETS[name]()
    print(f"EXAMPLES {name} {COUNTS[name]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
