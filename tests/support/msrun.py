"""Starting real multi-rank jobs on this host: msrun on loopback, and a rank started by hand as another node.

msrun starts workers with a bare ``python`` (this interpreter's bin must come first on
PATH) and binds the scheduler to the master address. A second "node" is emulated by
starting one more worker with the environment msrun gives its workers
(``mindspore/parallel/cluster/process_entity/_api.py``: ``MS_WORKER_NUM``,
``MS_SCHED_HOST``/``MS_SCHED_PORT``, ``MS_ROLE=MS_WORKER``, ``MS_NODE_ID``, ``RANK_ID``):
msrun's own rule (one worker exits with an error, it kills the others it started) then
applies only to the ranks it started, as on a real cluster.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

MSRUN = shutil.which("msrun", path=os.path.dirname(sys.executable))


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


@dataclass
class Job:
    """What a finished job left: each rank's log text and the launchers' exit codes."""

    log_dir: str
    returncodes: Dict[str, Optional[int]] = field(default_factory=dict)
    output: str = ""

    def log(self, rank: int) -> str:
        for pattern in (f"worker_{rank}.log", f"node_worker_{rank}.log"):
            path = os.path.join(self.log_dir, pattern)
            if os.path.exists(path):
                return open_text(path)
        return ""

    def tails(self, size: int = 3000) -> str:
        return "".join(f"\n--- {os.path.basename(p)}\n" + open_text(p)[-size:]
                       for p in sorted(glob.glob(os.path.join(self.log_dir, "*.log"))))


def run_job(script: str, args: List[str], workers: int, log_dir: str, cwd: str, local_workers: Optional[int] = None,
            timeout: float = 900, done: Optional[Callable[[Job], bool]] = None) -> Job:
    """``msrun`` of ``script``: all ``workers`` here, or ``local_workers`` here and the rest started by hand
    (one process each, as further nodes would start them). ``done(job)``: stop waiting once it holds (the
    job is then stopped: e.g. when MindSpore would only wait out its node timeout for a rank that died)."""
    env = msrun_env()
    port = env["MASTER_PORT"]
    local = workers if local_workers is None else local_workers
    command = [MSRUN, f"--worker_num={workers}", f"--local_worker_num={local}", "--master_addr=127.0.0.1",
               f"--master_port={port}", f"--log_dir={log_dir}", "--join=True"]
    if local != workers:
        command.append("--node_rank=0")
    os.makedirs(log_dir, exist_ok=True)
    job = Job(log_dir)
    launcher_log = os.path.join(log_dir, "msrun.out")  # a file: polling must never leave a full pipe behind
    with open(launcher_log, "w", encoding="utf-8") as out:
        launcher = subprocess.Popen(command + [script] + args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    others = []
    for rank in range(local, workers):
        node_env = dict(env, MS_WORKER_NUM=str(workers), MS_SCHED_HOST="127.0.0.1", MS_SCHED_PORT=port,
                        MS_ROLE="MS_WORKER", MS_NODE_ID=str(rank), RANK_ID=str(rank), DEVICE_ID="0",
                        RANK_SIZE=str(workers))
        with open(os.path.join(log_dir, f"node_worker_{rank}.log"), "w", encoding="utf-8") as log:
            others.append((rank, subprocess.Popen([sys.executable, script] + args, cwd=cwd, env=node_env,
                                                  stdout=log, stderr=subprocess.STDOUT)))
    try:
        _wait(job, launcher, [p for _, p in others], timeout, done)
        job.returncodes["msrun"] = launcher.returncode
        for rank, proc in others:
            job.returncodes[f"rank{rank}"] = proc.wait(timeout=60)
    finally:
        _stop(launcher, [p for _, p in others])
    return job


def _wait(job: Job, launcher: subprocess.Popen, others: List[subprocess.Popen], timeout: float, done) -> None:
    deadline = time.monotonic() + timeout
    while launcher.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"msrun did not finish within {timeout:.0f} s")
        if done is not None and all(p.poll() is not None for p in others) and done(job):
            _stop(launcher, [])
            break
        time.sleep(1.0)
    job.output = open_text(os.path.join(job.log_dir, "msrun.out"))


def _stop(launcher: subprocess.Popen, others: List[subprocess.Popen]) -> None:
    """Whatever still runs after a timeout: msrun stops its own workers on SIGINT; ours are killed."""
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGINT)
        try:
            launcher.wait(30)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
    for proc in others:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
