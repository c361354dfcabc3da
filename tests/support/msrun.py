"""Running a real msrun job on loopback from a test: a free port and the environment its workers need."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
from typing import List


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def msrun_env() -> dict:
    env = dict(os.environ)
    # msrun starts workers with a bare `python`: this interpreter's bin goes first.
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["MASTER_PORT"] = str(free_port())
    # msprobe imports MindSpore's generated protobuf modules after its own; the pure-Python
    # protobuf runtime accepts that order (the C++ one fails with "Descriptors cannot be created").
    env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
    return env


def msrun_available() -> bool:
    return shutil.which("msrun", path=os.path.dirname(sys.executable)) is not None


def open_text(path) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def run_two_ranks(script: str, args: List[str], log_dir: str, cwd: str, timeout: int = 900):
    """``msrun`` with 2 local workers running ``script args``; (CompletedProcess, tails of the worker logs)."""
    env = msrun_env()
    command = ["msrun", "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
               f"--master_port={env['MASTER_PORT']}", f"--log_dir={log_dir}", "--join=True", script, *args]
    proc = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    logs = "".join(open_text(p)[-3000:] for p in sorted(glob.glob(os.path.join(log_dir, "worker_*.log"))))
    return proc, logs
