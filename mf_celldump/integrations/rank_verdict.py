"""The verdict across ranks at train end, with no shared file system: rank 0 logs one line per captured step.

Each rank's processing reduces every captured step to its rank summary (kilobytes, made by
the processing worker beside training, ``ranks.rank_summary``); the summary goes to rank 0's
store (``rank_exchange``) from a thread of its own as soon as it exists. When training
ends each rank posts which steps it summarised. Rank 0 waits for those posts at most
``rank_verdict_timeout`` seconds after its own processing finished, then checks the
replicas of each step (``ranks.replicas``) with whatever arrived and logs:

    mf_celldump: ranks: step 3: rank 2: first NaN at layers.2 (forward); rank 3 missing (no data ...)
    mf_celldump: ranks: step 0: clean (4 replicas)

Nothing here waits for a rank without a deadline, and nothing fails training: every
problem becomes a warning and the verdict is skipped.
"""

from __future__ import annotations

import json
import logging
import queue
import tempfile
import threading
import time
from typing import Dict, Iterable, List, Optional, Tuple

from mf_celldump.config import DumpConfig
from mf_celldump.errors import AttachError, ExchangeError, SummaryError
from mf_celldump.integrations import rank_exchange
from mf_celldump.ranks.rank_summary import from_bytes, from_json
from mf_celldump.ranks.replicas import CheckOptions, ReplicaChecks, step_line

logger = logging.getLogger(__name__)

POLL_S = 0.5
PUBLISH_JOIN_S = 2 * rank_exchange.CONNECT_TIMEOUT_S  # a rank's train end waits at most this for its posts


def world_size() -> int:
    """Ranks in the job: MindSpore's communication once initialised, else 1."""
    try:
        from mindspore.communication import get_group_size

        return int(get_group_size())
    except Exception:  # not initialised: MindSpore raises RuntimeError (type varies by version)
        return 1


class Keys:
    """Names in rank 0's store, one namespace per training run of the job."""

    def __init__(self, run_tag: int):
        self.prefix = f"mf_celldump/run{run_tag}"

    def summary(self, step: int, rank: int) -> str:
        return f"{self.prefix}/step{step}/rank{rank}"

    def final(self, rank: int) -> str:
        return f"{self.prefix}/final/rank{rank}"



class Publisher:
    """Posts (key, value) pairs to rank 0's store from a thread, through this rank's one client (a child process).

    The client starts as soon as the thread does (at attach), so rank 0's store sees one
    registration per rank and run, and a rank that cannot reach it says so before training.
    """

    def __init__(self, address: Tuple[str, int], timeout_s: float = rank_exchange.CONNECT_TIMEOUT_S):
        self.address = address
        self.timeout_s = timeout_s
        self.broken: Optional[str] = None
        self.poster: Optional[rank_exchange.StorePoster] = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="mf_celldump-rank-verdict", daemon=True)
        self._thread.start()

    def post(self, key: str, value: bytes) -> None:
        self._queue.put((key, value))

    def close(self, timeout: float) -> bool:
        """Post what is queued (waiting at most ``timeout``); False when that did not finish."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        self._guarded(self._connect)
        while True:
            item = self._queue.get()
            if item is None:
                if self.poster is not None:
                    self.poster.close()
                return
            if not self.broken:
                self._guarded(lambda pair=item: self.poster.post(*pair))

    def _connect(self) -> None:
        self.poster = rank_exchange.StorePoster.start(self.address, self.timeout_s)

    def _guarded(self, action) -> None:
        try:
            action()
        except Exception as err:  # noqa: BLE001  -- never let this thread take training down
            self.broken = str(err).splitlines()[0] if str(err) else type(err).__name__
            logger.warning("mf_celldump: ranks: cannot post to rank 0's store (%s); this rank's summaries "
                           "will be missing from the verdict", self.broken)


class RankVerdict:
    """One training run's cross-rank verdict, on one rank."""

    def __init__(self, config: DumpConfig, rank: int, world: int, run_tag: int):
        self.config, self.rank, self.world = config, rank, world
        self.keys = Keys(run_tag)
        self.address: Optional[Tuple[str, int]] = None
        self._server: Optional[rank_exchange.StoreServer] = None  # rank 0's store
        self._publisher: Optional[Publisher] = None
        self._own: Dict[int, bytes] = {}  # rank 0: its own summaries, by step
        self._lock = threading.Lock()

    @staticmethod
    def wanted(config: DumpConfig) -> bool:
        """The verdict was asked for and can mean something: several ranks that process their steps."""
        return config.rank_verdict and config.process_on_train_end and world_size() > 1

    @staticmethod
    def problem(config: DumpConfig) -> Optional[str]:
        """Why this MindSpore or the configured port cannot serve the verdict (None: they can)."""
        problem = rank_exchange.store_problem()
        if problem:
            return (f"rank_verdict: true needs a key-value store served by rank 0, but {problem}. Set "
                    f"rank_verdict: false (the default) and check the ranks after the run with "
                    f"`mf-celldump ranks DUMP`, or use MindSpore 2.9 or later")
        port, hccl = config.rank_verdict_port, rank_exchange.hccl_ports()
        if port is not None and port in hccl:
            return (f"rank_verdict_port: {port} is among HCCL's host ports {hccl.start}-{hccl.stop - 1} "
                    f"({rank_exchange.HCCL_BASE_PORT_ENV}); choose a port outside them, or 'auto'")
        return None

    @staticmethod
    def check(config: DumpConfig) -> None:
        """Refuse (``AttachError``) a verdict asked for that this MindSpore or this port cannot serve.

        Every rank runs the same check on the same installation before attaching, so all refuse together
        and none waits in the address exchange for a rank that refused.
        """
        if RankVerdict.wanted(config):
            problem = RankVerdict.problem(config)
            if problem:
                raise AttachError(problem)

    @classmethod
    def start(cls, config: DumpConfig, rank: int, run_tag: int) -> Optional[RankVerdict]:
        """Set the exchange up (every rank calls this at attach, together); None when off.

        ``AttachError`` on every rank when rank 0 could not serve the store (rank 0's says why).
        """
        if not cls.wanted(config):
            return None
        cls.check(config)
        world = world_size()
        problem = config.replica_groups.check_world(world)
        if problem:
            logger.warning("mf_celldump: ranks: replica_groups %s: %s; no verdict across ranks",
                           config.replica_groups.describe(), problem)
        verdict = cls(config, rank, world, run_tag)
        verdict._setup()
        return verdict

    def _setup(self) -> None:
        served, reason = None, "see rank 0's log"
        if self.rank == 0:
            try:
                self._server = rank_exchange.StoreServer.start(self.world, self.config.rank_verdict_port)
                served = self._server.address
            except ExchangeError as err:  # the other ranks still need port 0 from us
                reason = str(err)
        try:
            self.address = rank_exchange.share_address(self.rank, served)
        except Exception as err:  # noqa: BLE001
            self.close()
            raise AttachError(f"rank_verdict: the store address could not be shared across ranks "
                              f"({type(err).__name__}: {err}); set rank_verdict: false") from None
        if self.address is None:
            self.close()
            raise AttachError(f"rank_verdict: rank 0 could not serve the verdict's store ({reason}); set "
                              f"rank_verdict_port to a free port that the other nodes may reach, or rank_verdict: "
                              f"false")
        if self.rank != 0:
            self._publisher = Publisher(self.address)
        logger.info("mf_celldump: ranks: step summaries go to rank 0's store at %s:%d", *self.address)

    def close(self) -> None:
        """Stop rank 0's store (its child process); nothing on the other ranks."""
        server, self._server = self._server, None
        if server is not None:
            server.close()

    # -- during training (the processing reply thread) ------------------------------------
    def on_summary(self, data: dict) -> None:
        summary = from_json(data, "step summary")
        payload = summary.to_bytes()
        if self.rank == 0:
            with self._lock:
                self._own[summary.step] = payload
        elif self._publisher is not None:
            self._publisher.post(self.keys.summary(summary.step, self.rank), payload)

    # -- train end ---------------------------------------------------------------------------
    def finish(self, captured_steps: Iterable[int], failed: bool = False) -> List[str]:
        """Post this rank's step list (ranks > 0) or collect and log the verdict (rank 0); the lines logged."""
        try:
            if self.rank != 0:
                self._post_final(captured_steps)
                return []
            if failed:
                return []
            return self._collect(captured_steps)
        except Exception as err:  # noqa: BLE001  -- a verdict problem never fails training
            logger.warning("mf_celldump: ranks: the verdict across ranks failed: %s: %s", type(err).__name__, err)
            return []
        finally:
            self.close()

    def _post_final(self, captured_steps: Iterable[int]) -> None:
        publisher = self._publisher
        if publisher is None:
            return
        publisher.post(self.keys.final(self.rank), json.dumps({"steps": sorted(captured_steps)}).encode("utf-8"))
        if not publisher.close(PUBLISH_JOIN_S):
            logger.warning("mf_celldump: ranks: posting to rank 0's store did not finish within %.0f s",
                           PUBLISH_JOIN_S)

    def _expected(self) -> List[int]:
        return [r for r in range(1, self.world) if r in self.config.ranks]

    def _collect(self, captured_steps: Iterable[int]) -> List[str]:
        return self._check_all(self._server, captured_steps)  # read by the store's own process

    def _check_all(self, store: rank_exchange.StoreServer, captured_steps: Iterable[int]) -> List[str]:
        finals = self._wait_finals(store, self._expected())
        steps = set(captured_steps) | set(self._own)
        for posted in finals.values():
            steps.update(posted)
        expected = ([0] if 0 in self.config.ranks else []) + self._expected()
        lines = []
        with tempfile.TemporaryDirectory(prefix=".mf_celldump-ranks-") as spill:
            checks = ReplicaChecks(self.config.replica_groups, CheckOptions(), self.world, spill)
            for step in sorted(steps):
                for rank in expected:
                    payload = self._own.get(step) if rank == 0 else self._fetch(store, self.keys.summary(step, rank))
                    if payload is None:
                        continue
                    try:
                        checks.add(from_bytes(payload, f"rank {rank} step {step}"))
                    except SummaryError as err:
                        logger.warning("mf_celldump: ranks: %s; counted as missing", err)
            results, missing = checks.finish(expected, sorted(steps))
            for result in results:
                line = "mf_celldump: ranks: " + step_line(result, missing.get((result.step, result.group), ()),
                                                         checks.labels.get(result.group))
                clean = result.clean and not missing.get((result.step, result.group))
                logger.log(logging.INFO if clean else logging.WARNING, "%s", line)
                lines.append(line)
        gone = [r for r in self._expected() if r not in finals]
        if gone:
            logger.warning("mf_celldump: ranks: %s did not report the end of training within %.0f s "
                           "(rank_verdict_timeout): gone or late", ", ".join(f"rank {r}" for r in gone),
                           self.config.rank_verdict_timeout)
        return lines

    def _wait_finals(self, store, pending: List[int]) -> Dict[int, List[int]]:
        finals: Dict[int, List[int]] = {}
        deadline = time.monotonic() + self.config.rank_verdict_timeout
        while True:
            for rank in [r for r in pending if r not in finals]:
                payload = self._fetch(store, self.keys.final(rank))
                if payload is not None:
                    finals[rank] = _steps_of(payload)
            if len(finals) == len(pending) or time.monotonic() >= deadline:
                return finals
            time.sleep(POLL_S)

    @staticmethod
    def _fetch(store: rank_exchange.StoreServer, key: str) -> Optional[bytes]:
        return store.fetch(key)


def _steps_of(payload: bytes) -> List[int]:
    try:
        steps = json.loads(payload).get("steps")
    except (ValueError, AttributeError):
        return []
    return [s for s in steps if isinstance(s, int)] if isinstance(steps, list) else []

