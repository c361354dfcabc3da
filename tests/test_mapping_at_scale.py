"""A huge layer-mapping file costs bounded time and memory at attach, and its warnings are a summary.

Each attach runs in a child Python under an address-space limit (MindSpore itself needs
about 1 GiB of address space here); a file of 400,000 entries is refused at once with a
message, and one of 60,000 entries for another model attaches with ten warning lines and
a count, not a line per entry.
"""

from __future__ import annotations

import textwrap

from tests.support.hostile_dumps import REPO, limited_python

ATTACH = textwrap.dedent("""
    import logging, sys, time
    sys.path.insert(0, {repo!r})
    logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(message)s")
    import mf_celldump
    from tests.support import capture_net as cn
    cn.set_mode("pynative")
    start = time.monotonic()
    try:
        dump = mf_celldump.attach(cn.make_net(), {{"dump_path": {dump!r}, "layer_mapping": [{mapping!r}]}})
    except mf_celldump.MappingError as err:
        print("REFUSED", err)
    else:
        print("ATTACHED", len(dump.cells))
        dump.detach()
    print("SECONDS", round(time.monotonic() - start, 1))
""")


def _mapping(path, entries):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("TopLayer:\n")
        for index in range(entries):
            handle.write(f"  model.layers.{index}.attention.wq: linear_q{index}([in], [out])\n")
    return str(path)


def _attach(tmp_path, mapping):
    code = ATTACH.format(repo=REPO, dump=str(tmp_path / "dump"), mapping=mapping)
    proc = limited_python(code, limit_mb=1536, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_a_mapping_of_400000_entries_is_refused_at_once_within_the_memory_limit(tmp_path):
    proc = _attach(tmp_path, _mapping(tmp_path / "huge.yaml", 400_000))
    assert "REFUSED" in proc.stdout and "huge.yaml:" in proc.stdout and "more than 100000 entries" in proc.stdout
    print(proc.stdout.splitlines()[-1])  # the time it took, for the record (not asserted: the machine is shared)


def test_a_mapping_of_60000_entries_for_another_model_gives_a_summary_not_a_line_each(tmp_path):
    proc = _attach(tmp_path, _mapping(tmp_path / "other_model.yaml", 60_000))
    assert "ATTACHED" in proc.stdout, proc.stdout[-2000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("LOG WARNING")]
    assert len(lines) == 11, lines[:20]
    assert "... and 59990 more entries that match no cell (60000 in all)" in lines[-1]
    assert len(proc.stdout + proc.stderr) < 20_000
