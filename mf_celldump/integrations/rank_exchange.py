"""The ranks' step summaries reach rank 0 through a key-value store rank 0 serves: MindSpore's TCPStore.

Why this way (MindSpore 2.9, read in ``mindspore/mint/distributed/distributed.py`` and
``ccsrc/cluster/rpc/tcp_store.cc``, ``cluster/topology/meta_server_node.cc``, and run under msrun):

* A collective (AllGather of the summaries) waits for every rank: one rank missing or
  late at train end hangs the others. Nothing here runs a collective at train end.
* ``TCPStore(host, port, is_master=False)`` pointed at msrun's own scheduler works for
  set/get, but each client registers with the scheduler as a node (role ``MS_CLIENT``)
  that never sends a heartbeat and is never unregistered (deleting the store does not):
  ``MS_NODE_TIMEOUT`` (30 s) later the scheduler declares it timed out and MindSpore stops
  the whole job. So the store must not be the scheduler.
* ``TCPStore(host, port, is_master=True)`` starts a meta server of its own with the
  heartbeat check disabled (``server_node_->disable_heartbeat()``): clients may come and go.
  ``get`` of a missing key waits the store's timeout and raises; ``add(key, 0)`` answers at
  once (it creates the counter at 0), so presence is checked with counters and nothing waits
  on a rank that is missing.
* Every client construction registers a node with the meta server, which logs a WARNING
  per registration (``MetaServerNode::ProcessRegister``) and keeps the node in its table.
  So each process opens one client for the whole run (``StoreClient``), and the meta
  server runs in a child process of rank 0 with MindSpore's C++ log at ERROR
  (``GLOG_v=3``): rank 0's own log gets no line per registration. The child ends when
  rank 0 closes its stdin, or exits, and ``LINGER_S`` more: a client finalised after its store
  is gone blocks its whole process for minutes (measured), so the store outlives every client.
* MindSpore 2.7's ``TCPStore`` ignores host and port (the store is msrun's scheduler, no
  ``add``): ``store_problem`` says so and the verdict is refused at attach.

Rank 0 serves the store; the other ranks learn its address once, when capture attaches
(every rank is there, before training): one AllGather of five int32 (IPv4 address and
port). A rank 0 that cannot serve sends port 0 and every rank refuses the verdict.

The port is ``rank_verdict_port`` when configured, else a free port outside HCCL's host
ports (``HCCL_IF_BASE_PORT``, default 60000, and the 32 above it: CANN's environment
variable reference).
"""

from __future__ import annotations

import base64
import inspect
import logging
import os
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional, Tuple

from mf_celldump.errors import ExchangeError

logger = logging.getLogger(__name__)

# A client's connect (and call) timeout: bounds every call to a slow or gone rank 0. Kept short because a
# TCPStore call holds the Python GIL while it waits: it pauses every thread of the rank, training included.
CONNECT_TIMEOUT_S = 10.0
SERVER_START_S = 120.0  # the child imports MindSpore (2-5 s alone; longer on a loaded host)
# How long the store goes on serving after rank 0 closed it (or exited). A TCPStore client that is
# finalised after its store is gone blocks for minutes, holding the GIL (measured), and stops the
# rank's heartbeat to msrun's scheduler too, which then stops the job: every rank finalises its client
# right after its last post, and the store outlives rank 0's verdict by this much for those still at it.
LINGER_S = 60.0
HCCL_BASE_PORT_ENV = "HCCL_IF_BASE_PORT"
HCCL_DEFAULT_BASE_PORT = 60000
HCCL_PORT_COUNT = 32  # CANN 8.x/9.x: 32 ports from the base (earlier releases: 16)
# Environment the store's child must not inherit: it is no msrun worker and joins no cluster.
CLUSTER_VARIABLES = ("MS_ROLE", "MS_SCHED_HOST", "MS_SCHED_PORT", "MS_WORKER_NUM", "MS_NODE_ID",
                     "MS_LOCAL_WORKER", "MS_CLUSTER_RECOVERY")


def store_problem() -> Optional[str]:
    """Why this MindSpore's TCPStore cannot be a store of rank 0's own (None: it can), read from its interface."""
    try:
        import mindspore
        from mindspore.mint.distributed import TCPStore
    except ImportError as err:
        return f"mindspore.mint.distributed.TCPStore cannot be imported ({err})"
    version = getattr(mindspore, "__version__", "?")
    if not callable(getattr(TCPStore, "add", None)):
        return f"MindSpore {version}'s TCPStore has no 'add' (presence counters need it)"
    try:
        params = inspect.signature(TCPStore.__init__).parameters
    except (TypeError, ValueError):
        return f"MindSpore {version}'s TCPStore constructor cannot be inspected"
    for name in ("host_name", "port", "is_master"):
        if name not in params:
            return f"MindSpore {version}'s TCPStore takes no '{name}'"
    if params["port"].default is None:  # 2.7: "all parameters ... are not supported"; the store is msrun's
        return (f"MindSpore {version}'s TCPStore ignores host and port (its store is msrun's scheduler, which "
                f"stops the job when a client never sends a heartbeat); MindSpore 2.9 serves a store of its own")
    return None


def hccl_ports() -> range:
    """The host ports HCCL takes from ``HCCL_IF_BASE_PORT`` (default 60000) on this host."""
    text = os.environ.get(HCCL_BASE_PORT_ENV, "")
    base = int(text) if text.strip().isdigit() else HCCL_DEFAULT_BASE_PORT
    return range(base, base + HCCL_PORT_COUNT)


def reachable_ip() -> str:
    """This host's IPv4 address on the interface that reaches msrun's scheduler (loopback when it is local)."""
    host, port = os.environ.get("MS_SCHED_HOST"), os.environ.get("MS_SCHED_PORT")
    if host:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port) if port and port.isdigit() else 9))  # UDP: no packet is sent
            return probe.getsockname()[0]
    return socket.gethostbyname(socket.gethostname())


def free_port(ip: str, avoid: range) -> int:
    """A port the kernel says is free on ``ip``, outside ``avoid`` (HCCL's)."""
    for _ in range(64):
        with socket.socket() as sock:
            sock.bind((ip, 0))
            port = sock.getsockname()[1]
        if port not in avoid:
            return port
    raise ExchangeError(f"no free port on {ip} outside {avoid.start}-{avoid.stop - 1} (HCCL's); "
                        f"set rank_verdict_port")


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _serve_here(ip: str, port: int, world: int, timeout_s: float):
    """In the child: serve the store on ``port`` (0: a free one outside HCCL's range); returns (store, port)."""
    problem = store_problem()
    if problem:
        raise ExchangeError(problem)
    from mindspore.mint.distributed import TCPStore

    last: Optional[BaseException] = None
    for _ in range(1 if port else 3):  # another process may take a free port between the probe and the bind
        chosen = port or free_port(ip, hccl_ports())
        try:
            store = TCPStore(ip, chosen, world_size=world, is_master=True, wait_for_workers=False,
                             timeout=timedelta(seconds=timeout_s))
        except RuntimeError as err:
            last = err
            continue
        try:
            socket.create_connection((ip, chosen), timeout=timeout_s).close()
        except OSError as err:
            raise ExchangeError(f"the TCPStore does not listen on {ip}:{chosen} ({err})") from None
        return store, chosen
    raise ExchangeError(f"cannot serve a TCPStore on {ip}:{port or 'a free port'}: {_one_line(last)}")


def _child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARIABLES}
    env["GLOG_v"] = "3"  # MindSpore's C++ log: errors only (no line per registration)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                          if p])
    return env


@dataclass
class StoreServer:
    """Rank 0's store, served by a child process that lives as long as this object (or this process)."""

    process: subprocess.Popen
    address: Tuple[str, int]

    @classmethod
    def start(cls, world: int, port: Optional[int], timeout_s: float = CONNECT_TIMEOUT_S,
              start_s: float = SERVER_START_S, linger_s: float = LINGER_S) -> StoreServer:
        ip = reachable_ip()
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, "serve", ip, str(port or 0), str(world), str(timeout_s), str(linger_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_child_env(), text=True)
        line = _read_line(process, start_s)
        if line.startswith("ready "):
            return cls(process, (ip, int(line.split()[1])))
        _stop(process, 5.0)
        reason = line[len("error "):] if line.startswith("error ") else (line or "it exited without a word")
        raise ExchangeError(f"cannot serve the store on {ip}: {reason}")

    def fetch(self, key: str, timeout_s: float = CONNECT_TIMEOUT_S) -> Optional[bytes]:
        """The value posted under ``key`` (None: not posted), read by the store's own process: rank 0 needs no
        client of its own, and waits on a pipe (the GIL released), never inside a TCPStore call."""
        self.process.stdin.write(f"fetch {key}\n")
        self.process.stdin.flush()
        line = _read_line(self.process, timeout_s)
        if line == "none":
            return None
        if line.startswith("value "):
            return base64.b64decode(line[len("value "):])
        raise ExchangeError(f"rank 0's store: reading {key}: {line or 'no answer'}")

    def close(self, wait_s: float = 0.0) -> None:
        """Tell the child to stop serving (after its linger); ``wait_s``: wait that long for it to exit."""
        _stop(self.process, wait_s)


@dataclass
class StorePoster:
    """A rank's one client of rank 0's store, in a child process of the rank (one registration per run).

    The rank waits on a pipe, never inside a TCPStore call: such a call holds the GIL while it waits
    (it would pause training), and finalising a client can block for minutes (the child just exits).
    """

    process: subprocess.Popen
    address: Tuple[str, int]
    timeout_s: float = CONNECT_TIMEOUT_S

    @classmethod
    def start(cls, address: Tuple[str, int], timeout_s: float = CONNECT_TIMEOUT_S,
              start_s: float = SERVER_START_S) -> StorePoster:
        process = subprocess.Popen([sys.executable, "-m", __name__, "post", address[0], str(address[1]),
                                    str(timeout_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env=_child_env(), text=True)
        line = _read_line(process, start_s + timeout_s)
        if line != "ready":
            _stop(process, 5.0)
            raise ExchangeError(line[len("error "):] if line.startswith("error ") else
                                f"rank 0's store at {address[0]}:{address[1]}: no client ({line or 'it exited'})")
        logger.info("mf_celldump: ranks: registered with rank 0's store at %s:%d", *address)
        return cls(process, address, timeout_s)

    def post(self, key: str, value: bytes) -> None:
        self.process.stdin.write(f"post {key} {base64.b64encode(value).decode('ascii')}\n")
        self.process.stdin.flush()
        line = _read_line(self.process, self.timeout_s + 5.0)
        if line != "ok":
            raise ExchangeError(f"rank 0's store at {self.address[0]}:{self.address[1]}: posting {key}: "
                                f"{line[len('error '):] if line.startswith('error ') else line or 'no answer'}")

    def close(self) -> None:
        _stop(self.process, 0.0)


def _read_line(process: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], min(1.0, max(0.0, deadline - time.monotonic())))
        if ready:
            return process.stdout.readline().strip()
        if process.poll() is not None:
            return ""
    return f"error it did not start within {timeout_s:.0f} s"


def _stop(process: subprocess.Popen, wait_s: float = 5.0) -> None:
    """Close the child's pipes (it stops after its linger); with ``wait_s``, wait for it (killed after that)."""
    for stream in (process.stdin, process.stdout):
        try:
            stream.close()
        except OSError:
            pass
    if wait_s <= 0:
        return
    try:
        process.wait(wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def share_address(rank: int, address: Optional[Tuple[str, int]]) -> Optional[Tuple[str, int]]:
    """Every rank calls this once, together: rank 0's store address for all (None: no store)."""
    import numpy as np
    from mindspore import Tensor, ops

    payload = np.zeros(5, dtype=np.int32)
    if rank == 0 and address is not None:
        try:
            payload[:4] = [int(part) for part in socket.inet_aton(address[0])]
            payload[4] = address[1]
        except OSError:  # not an IPv4 address: no store
            payload[:] = 0
    gathered = ops.AllGather()(Tensor(payload)).asnumpy().reshape(-1, 5)
    ip_parts, port = gathered[0, :4], int(gathered[0, 4])
    if port == 0:
        return None
    return ".".join(str(int(p)) for p in ip_parts), port


class StoreClient:
    """A client of rank 0's store in this process (one registration with its meta server), for measurements
    (``bench/rank_store_scale.py``): the verdict's clients live in child processes (``StorePoster``).

    Use it from one thread. Each call holds the GIL while it waits (MindSpore's binding does
    not release it), for at most ``timeout_s``. A client whose call failed is never finalised
    (``abandoned``): finalising a client whose store is gone blocks for minutes.
    """

    def __init__(self, address: Tuple[str, int], timeout_s: float = CONNECT_TIMEOUT_S):
        self.address = address
        self.timeout_s = timeout_s
        self.registrations = 0
        self.abandoned = None  # the client of a failed call, kept from finalisation
        self._store = None

    def connect(self) -> None:
        from mindspore.mint.distributed import TCPStore

        try:
            self._store = TCPStore(self.address[0], self.address[1], is_master=False,
                                   timeout=timedelta(seconds=self.timeout_s))
        except RuntimeError as err:
            raise ExchangeError(f"rank 0's store at {self.address[0]}:{self.address[1]} is unreachable: "
                                f"{_one_line(err)}") from None
        self.registrations += 1
        logger.info("mf_celldump: ranks: registered with rank 0's store at %s:%d", *self.address)

    def _call(self, name: str, *args):
        if self._store is None:
            if self.abandoned is not None:
                raise ExchangeError(f"rank 0's store at {self.address[0]}:{self.address[1]} failed a call before")
            self.connect()
        try:
            return getattr(self._store, name)(*args)
        except RuntimeError as err:
            self.abandoned, self._store = self._store, None
            raise ExchangeError(f"rank 0's store at {self.address[0]}:{self.address[1]}: {name} failed: "
                                f"{_one_line(err)}") from None

    def set(self, key: str, value: bytes) -> None:
        self._call("set", key, value)

    def add(self, key: str, amount: int) -> int:
        return int(self._call("add", key, amount))

    def get(self, key: str) -> bytes:
        return bytes(self._call("get", key))

    def close(self) -> None:
        """Finalise the client (its node leaves the store): call it while the store serves."""
        self._store = None


def _raise_open_file_limit() -> None:
    """One socket per rank: lift this process's soft limit on open files to the hard one (often 1,024 < ranks)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass  # the store then serves as many ranks as the soft limit allows; the others are missing


def _serve_main(argv) -> int:
    """``... serve IP PORT WORLD TIMEOUT_S LINGER_S``: serve; answer ``fetch KEY`` lines on stdin; at EOF linger."""
    ip, port, world, timeout_s, linger_s = argv[0], int(argv[1]), int(argv[2]), float(argv[3]), float(argv[4])
    _raise_open_file_limit()
    try:
        store, port = _serve_here(ip, port, world, timeout_s)
    except Exception as err:  # noqa: BLE001  -- reported to rank 0 in one line
        print(f"error {_one_line(err)}", flush=True)
        return 1
    print(f"ready {port}", flush=True)
    for line in sys.stdin:  # EOF: rank 0 closed the pipe or is gone
        key = line.strip().partition(" ")[2]
        try:
            there = store.add(key + "#", 0) > 0
            reply = f"value {base64.b64encode(bytes(store.get(key))).decode('ascii')}" if there else "none"
        except RuntimeError as err:
            reply = f"error {_one_line(err)}"
        print(reply, flush=True)
    time.sleep(linger_s)
    os._exit(0)  # our own child: no finalisation of the store at interpreter exit


def _post_main(argv) -> int:
    """``... post IP PORT TIMEOUT_S``: one client; each ``post KEY BASE64`` line on stdin is ``set`` + its counter.

    At EOF the client is left to the process's end (``os._exit``): a client finalised after its store
    is gone blocks for minutes, and nothing needs it finalised.
    """
    ip, port, timeout_s = argv[0], int(argv[1]), float(argv[2])
    from mindspore.mint.distributed import TCPStore

    try:
        store = TCPStore(ip, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    except RuntimeError as err:
        print(f"error rank 0's store at {ip}:{port} is unreachable: {_one_line(err)}", flush=True)
        os._exit(1)
    print("ready", flush=True)
    for line in sys.stdin:
        _, key, value = line.split(" ", 2)
        try:
            store.set(key, base64.b64decode(value))
            store.add(key + "#", 1)
            print("ok", flush=True)
        except RuntimeError as err:
            print(f"error {_one_line(err)}", flush=True)
    os._exit(0)


if __name__ == "__main__":
    _MODES = {"serve": _serve_main, "post": _post_main}
    sys.exit(_MODES[sys.argv[1]](sys.argv[2:]))
