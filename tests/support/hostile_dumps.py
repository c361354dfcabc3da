"""Shared pieces of the tests of hostile input: dumps, an outside area to guard, the CLI.

The outside area holds what a hostile dump would point at: a private file (mode 0600),
a FIFO (opening it for reading blocks until a writer comes, so a test that follows a
link to it for reading hangs; ``alarm`` turns that into a failure), and a folder with a
file in it. ``snapshot`` records every detail a write, chmod, link or delete would
change.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from typing import Dict, Tuple

import numpy as np

from tests.support import formats as fmt
from tests.support.rawdump_builder import RawDumpBuilder, llama_net, write_llama_step

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
F, A = fmt.FORWARD, fmt.SLOT_ARG


def build_dump(dump: str, steps: int = 2, layers: int = 1, task: str = "tensor") -> RawDumpBuilder:
    """A small LLaMA-like raw dump: tensor files, one records.jsonl line and a done marker per step."""
    builder = RawDumpBuilder(dump, task=task)
    net = llama_net(builder, layers)
    builder.write_manifest()
    for step in range(steps):
        rng = np.random.default_rng(step)
        writer = builder.step(step)
        write_llama_step(net, writer, lambda *_, rng=rng: rng.standard_normal((2, 4)).astype(np.float32),
                         explicit_calls=False)
        writer.record(net.root, F, A, (1,), kind=fmt.KIND_INT, value=step)
        writer.done(step)
    return builder


def capture_two_steps(dump: str) -> str:
    """Two steps of tests/support/capture_net.py captured with ``attach`` (real MindSpore, PyNative, CPU,
    tensor task) into ``dump``, kept raw."""
    import mf_celldump
    from tests.support import capture_net as cn

    cn.set_mode("pynative")
    train = cn.train_one_step_cell(cn.make_net())
    handle = mf_celldump.attach(train, {"dump_path": dump, "task": "tensor", "steps": "0-1"})
    for step in range(2):
        with handle.step(step):
            train(cn.make_input())
    handle.detach()
    return dump


def edit_manifest(rank_dir: str, **changes) -> dict:
    """Rewrite a rank's manifest.json with ``changes``; returns the new content."""
    path = os.path.join(rank_dir, fmt.MANIFEST_FILE)
    with open(path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    manifest.update(changes)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle)
    return manifest


def lie_about_shape(path: str, shape_text: str) -> None:
    """Rewrite the shape in a ``.npy`` header (the data stays as it is), e.g. to ``(1000000000000,)``."""
    with open(path, "rb") as handle:
        data = handle.read()
    start = data.index(b"'shape': (")
    end = data.index(b")", start) + 1
    header_len = int.from_bytes(data[8:10], "little")
    new = data[:start] + f"'shape': {shape_text}".encode() + data[end:]
    new = new[:8] + (header_len + len(new) - len(data)).to_bytes(2, "little") + new[10:]
    with open(path, "wb") as handle:
        handle.write(new)


def make_outside(folder: str) -> Dict[str, str]:
    """The guarded area: {'file': 0600 file, 'fifo': FIFO, 'dir': folder with a file, 'missing': absent path}."""
    os.makedirs(os.path.join(folder, "dir"))
    paths = {"file": os.path.join(folder, "secret.npy"), "fifo": os.path.join(folder, "fifo"),
             "dir": os.path.join(folder, "dir"), "missing": os.path.join(folder, "new")}
    np.save(paths["file"], np.arange(3, dtype=np.float32))
    os.chmod(paths["file"], 0o600)
    os.mkfifo(paths["fifo"], 0o600)
    with open(os.path.join(paths["dir"], "step99.json"), "w", encoding="utf-8") as handle:
        handle.write('{"keep": true}')
    return paths


def snapshot(folder: str) -> Dict[str, Tuple]:
    """Relative path -> (type and mode, links, size, mtime, content) of everything under ``folder``."""
    out = {}
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(base, name)
            info = os.lstat(path)
            content = b""
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as handle:
                    content = handle.read()
            out[os.path.relpath(path, folder)] = (info.st_mode, info.st_nlink, info.st_size, info.st_mtime_ns,
                                                  content)
    return out


@contextlib.contextmanager
def alarm(seconds: int = 60):
    """Fail instead of hanging forever (e.g. on a FIFO opened for reading through a link)."""

    def expire(signum, frame):
        raise TimeoutError(f"no answer in {seconds} s: something blocked (a FIFO followed through a link?)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(*args: str, timeout: int = 120, **kwargs) -> subprocess.CompletedProcess:
    """``mf-celldump ARGS`` in a child process; no traceback may reach the user."""
    proc = subprocess.run([sys.executable, "-m", "mf_celldump", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, **kwargs)
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    return proc


def raw_files(step_dir: str):
    return sorted(n for n in os.listdir(step_dir) if n.endswith(".npy"))


def limited_python(code: str, limit_mb: int = 512, timeout: int = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run ``code`` in a child Python whose address space is capped (RLIMIT_AS) at ``limit_mb`` MiB.

    An unbounded allocation there ends in MemoryError (or the child dies), so a test can
    tell "memory bounded whatever the input" from "needs memory in proportion to a lie".
    """
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))

    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=cap, env=env, **kwargs)
