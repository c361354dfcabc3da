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

Rank 0 serves the store; the other ranks learn its address once, when capture attaches
(every rank is there, before training): one AllGather of five int32 (IPv4 address and
port). A rank that cannot serve sends port 0 and the verdict is off everywhere.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import timedelta
from typing import Optional, Tuple

from mf_celldump.errors import ExchangeError

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0  # a client's connect (and get) timeout: bounds every call to a gone rank 0


def reachable_ip() -> str:
    """This host's IPv4 address on the interface that reaches msrun's scheduler (loopback when it is local)."""
    host, port = os.environ.get("MS_SCHED_HOST"), os.environ.get("MS_SCHED_PORT")
    if host:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, int(port) if port and port.isdigit() else 9))  # UDP: no packet is sent
            return probe.getsockname()[0]
    return socket.gethostbyname(socket.gethostname())


def _free_port(ip: str) -> int:
    with socket.socket() as sock:
        sock.bind((ip, 0))
        return sock.getsockname()[1]


def serve(world: int, timeout_s: float) -> Tuple[object, str, int]:
    """Rank 0: a TCPStore server on a free port of this host; returns (store, ip, port)."""
    from mindspore.mint.distributed import TCPStore

    ip = reachable_ip()
    last = None
    for _ in range(3):  # another process may take the port between the probe and the bind
        port = _free_port(ip)
        try:
            store = TCPStore(ip, port, world_size=world, is_master=True, wait_for_workers=False,
                             timeout=timedelta(seconds=timeout_s))
            return store, ip, port
        except RuntimeError as err:
            last = err
    raise ExchangeError(f"cannot serve a TCPStore on {ip}: {str(last).splitlines()[0] if last else ''}")


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


class Client:
    """One short connection to rank 0's store (``with Client(address) as store: ...``)."""

    def __init__(self, address: Tuple[str, int], timeout_s: float = CONNECT_TIMEOUT_S):
        self.address = address
        self.timeout_s = timeout_s
        self.store = None

    def __enter__(self):
        from mindspore.mint.distributed import TCPStore

        try:
            self.store = TCPStore(self.address[0], self.address[1], is_master=False,
                                  timeout=timedelta(seconds=self.timeout_s))
        except RuntimeError as err:
            raise ExchangeError(f"rank 0's store at {self.address[0]}:{self.address[1]} is unreachable: "
                                f"{str(err).splitlines()[0]}") from None
        return self.store

    def __exit__(self, *exc) -> bool:
        self.store = None  # the client node is finalised with the object
        return False
