"""The watch across ranks: at each step end every rank learns what fired on every rank, so all act together.

Why: a rule may fire on one rank only (its local loss turned NaN). If that rank alone reran the step,
or stopped training, the others would wait forever in their next collective: a tensor- or
pipeline-parallel exchange inside the rerun, or the gradient reduction of the step it skipped. So in
a distributed run each rank, after checking its own rules, adds one row to a table every rank
receives, and every rank takes its decisions from that same table at the same step.

The table is one ``AllGather`` over the world group of a few float32 per rank (``ROW``): the rules
that fired on the rank (bits in the order of ``watch.RULES``), the first firing's value, whether the
rank's training wrapper skipped the update (its overflow flag) and whether the rank has what a rerun
needs. A collective rather than rank 0's store (``rank_exchange``): every rank calls it at the same
point of every step anyway, it returns the same table on every rank with no polling, and the store
is reached through a child process and a pipe, and polled. Its cost per mode is in
``docs/watch.md`` ("Cost": 0.3-0.6 ms in graph mode on loopback). A primitive called outside a
compiled graph runs as a single op in either mode (``Primitive.__call__`` -> ``_run_op``,
``mindspore/ops/primitive.py``, 2.9; ``rank_exchange.share_address`` relies on the same), and MindSpore's
CPU collectives under msrun run it (``tests/test_watch_ranks.py``).

Two more gathers happen only at a firing: whether each rank may still write a capture
(``anomaly_max_bytes``), and after a rerun whether it ran and whether the fault came back. Their
calls depend only on what the first table said, so every rank makes them together.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import List, Sequence

import numpy as np

from mf_celldump.watch import RULES, Firing

logger = logging.getLogger(__name__)

ROW = ("rules", "value", "skipped", "rerunnable")  # one rank's row of the step's table, as float32


def rule_bits(fired: Sequence[Firing]) -> int:
    """The rules of ``fired`` as bits (bit i: ``RULES[i]``); exact in a float32 (5 bits)."""
    bits = 0
    for firing in fired:
        bits |= 1 << RULES.index(firing.rule)
    return bits


def step_row(fired: Sequence[Firing], skipped: bool, rerunnable: bool) -> List[float]:
    """This rank's row: its rules, the value of its first firing (1 for the overflow flag), and two flags."""
    value = 0.0
    if fired:
        first = fired[0].value
        value = float(first) if isinstance(first, (int, float)) else 0.0
    return [float(rule_bits(fired)), value, float(skipped), float(rerunnable)]


def firings_of(step: int, table: np.ndarray) -> List[Firing]:
    """Every rank's firings in a gathered table, rank by rank, each rank's in the order of ``RULES``."""
    found = []
    for rank, row in enumerate(table):
        bits = int(row[0])
        rules = [rule for index, rule in enumerate(RULES) if bits & (1 << index)]
        for position, rule in enumerate(rules):
            value = float(row[1]) if position == 0 else None  # only the first firing's value travels
            found.append(Firing(step, rank, rule, True if rule == "overflow" and value else value))
    return found


def ranks_text(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


@dataclass(frozen=True)
class RerunAgreement:
    """Whether every rank reruns the firing step (``together``), and if not, why (naming the ranks)."""

    together: bool
    skipped: bool  # every rank's wrapper skipped the update
    why_not: str = ""


def rerun_agreement(table: np.ndarray) -> RerunAgreement:
    """The rerun happens on every rank or on none: every wrapper skipped the update and every rank can rerun."""
    applied = [rank for rank, row in enumerate(table) if not row[2]]
    if applied:
        return RerunAgreement(False, False, f"the update was applied on {ranks_text(applied)}, so its weights are "
                                            "gone")
    unable = [rank for rank, row in enumerate(table) if not row[3]]
    if unable:
        return RerunAgreement(False, True, f"its update was skipped, but {ranks_text(unable)} gave no batch or "
                                           "loss scale to rerun with (dataset sink mode, or a wrapper without "
                                           "scale_sense)")
    return RerunAgreement(True, True)


class RankTable:
    """One ``AllGather`` of a few float32 per rank over the world group, reused for the whole run.

    Every rank must call ``gather`` the same number of times with rows of the same length: the callers
    (``watching.StepWatch``) make each call depend only on tables already gathered.
    """

    def __init__(self, rank: int, world: int):
        from mindspore import ops

        self.rank, self.world = rank, world
        self._gather = ops.AllGather()  # the world group

    def gather(self, row: Sequence[float]) -> np.ndarray:
        """Every rank's ``row``, as a (world, len(row)) float32 array in rank order."""
        from mindspore import Tensor

        values = np.asarray(row, dtype=np.float32)
        return self._gather(Tensor(values)).asnumpy().reshape(self.world, len(values))
