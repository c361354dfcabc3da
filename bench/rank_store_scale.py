"""How rank 0's verdict store behaves with many ranks: N client processes on loopback, one store.

    python bench/rank_store_scale.py --clients 64 --per-process 16 --steps 4 --summary-bytes 4096

Each client process (``--per-process`` ranks in threads, each with its own connection)
imports MindSpore first, then all are released together (as ranks reach
attach together): each opens its one client (``StoreClient``: one registration), posts
``--steps`` summaries and its final list (``set`` + ``add`` each, as ``Publisher`` does) and
keeps its connection until every client is done. Rank 0's reader then reads every key
(``add(key, 0)`` + ``get``, as the verdict does). Printed as JSON: registration and post times
(median, max), the reader's time, the store process's connections (open sockets at the
peak), bytes its connections received and sent (``ss``'s TCP counters) and CPU seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tcp_bytes(port: int) -> dict:
    """Bytes the store's side of each established connection received and sent (``ss``'s TCP counters)."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"], capture_output=True,
                         text=True, check=False).stdout
    totals = {"connections": 0, "received": 0, "sent": 0}
    for word in out.split():
        if word.startswith("bytes_received:"):
            totals["received"] += int(word.split(":")[1])
            totals["connections"] += 1
        elif word.startswith("bytes_acked:"):
            totals["sent"] += int(word.split(":")[1])
    return totals


def _sockets(pid: int) -> int:
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:")
        except OSError:
            pass
    return count


def _one_rank(ip: str, port: int, rank: int, steps: int, payload: bytes, out: list) -> None:
    from mf_celldump.integrations.rank_exchange import StoreClient

    store = StoreClient((ip, port), timeout_s=60)
    started = time.monotonic()
    store.connect()
    registered = time.monotonic()
    posts = []
    for step in range(steps + 1):
        key = f"bench/step{step}/rank{rank}" if step < steps else f"bench/final/rank{rank}"
        before = time.monotonic()
        store.set(key, payload if step < steps else b'{"steps": [0]}')
        store.add(key + "#", 1)
        posts.append(time.monotonic() - before)
    out.append(({"register_s": registered - started, "posts_s": posts}, store))


def client(argv) -> int:
    """``count`` ranks (threads): ready; on 'go' each registers and posts; connections held till 'exit'."""
    ip, port, first, count, steps, size = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4]), int(argv[5])
    import mindspore.mint.distributed  # noqa: F401  -- imported before the release, as a rank has it at attach

    payload = os.urandom(size)
    print("ready", flush=True)
    sys.stdin.readline()
    done: list = []
    threads = [threading.Thread(target=_one_rank, args=(ip, port, first + j, steps, payload, done))
               for j in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps([result for result, _ in done]), flush=True)
    sys.stdin.readline()
    for _, store in done:
        store.close()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--summary-bytes", type=int, default=4096)
    parser.add_argument("--per-process", type=int, default=1, help="ranks (client connections) per process")
    args = parser.parse_args(argv)
    import mindspore.mint.distributed  # noqa: F401  -- the reader's time is its calls, not this import

    from mf_celldump.integrations.rank_exchange import StoreClient, StoreServer

    ranks = args.clients * args.per_process
    server = StoreServer.start(ranks + 1, None, timeout_s=60)
    ip, port = server.address
    pid = server.process.pid
    env = dict(os.environ, GLOG_v="3")
    procs = [subprocess.Popen([sys.executable, __file__, "client", ip, str(port), str(1 + i * args.per_process),
                               str(args.per_process), str(args.steps), str(args.summary_bytes)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for i in range(args.clients)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    cpu0 = _cpu_s(pid)
    released = time.monotonic()
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [r for proc in procs for r in json.loads(proc.stdout.readline())]
    all_posted = time.monotonic() - released
    peak_sockets = _sockets(pid)
    posted_bytes = _tcp_bytes(port)
    reader = StoreClient((ip, port), timeout_s=60)
    before = time.monotonic()
    for rank in range(1, ranks + 1):
        for step in range(args.steps):
            key = f"bench/step{step}/rank{rank}"
            assert reader.add(key + "#", 0) == 1 and len(reader.get(key)) == args.summary_bytes
    read_s = time.monotonic() - before
    read_bytes = _tcp_bytes(port)
    cpu1 = _cpu_s(pid)
    for proc in procs:
        proc.stdin.write("exit\n")
        proc.stdin.close()
        proc.wait(60)
    reader.close()
    server.close()
    registers = [r["register_s"] for r in results]
    posts = [p for r in results for p in r["posts_s"]]
    print(json.dumps({
        "processes": args.clients, "ranks": ranks, "steps": args.steps, "summary_bytes": args.summary_bytes,
        "register_s": {"median": statistics.median(registers), "max": max(registers)},
        "post_s": {"median": statistics.median(posts), "max": max(posts)},
        "all_registered_and_posted_s": all_posted, "reader_s": read_s,
        "store_sockets_at_peak": peak_sockets,
        "store_tcp_after_posts": posted_bytes, "store_tcp_after_reader": read_bytes,
        "store_cpu_s": cpu1 - cpu0,
    }, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        sys.exit(client(sys.argv[2:]))
    sys.exit(main())
