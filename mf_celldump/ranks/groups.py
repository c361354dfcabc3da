"""Which ranks are data-parallel replicas of each other (hold the same shard of the model).

A specification, the same in the ``replica_groups`` configuration key and the ``--replicas``
option of ``mf-celldump ranks``:

* ``all`` (default): every rank holds the whole model (pure data parallelism);
* ``model_parallel=T[,pipeline_stages=P]``: Megatron's and MindSpore's rank order, the
  pipeline stage outermost and the tensor-parallel rank innermost:
  ``rank = stage * (world / P) + dp * T + t``; replicas share ``stage`` and ``t``;
* explicit groups: ``0,2;1,3`` or ``0-3;4-7`` (ranks not listed form no group).

Depends on nothing else of the package (the configuration validates with it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from mf_celldump.errors import ReplicaSpecError

GroupKey = Tuple[int, ...]
_PARALLEL_RE = re.compile(r"^(model_parallel|pipeline_stages)\s*=\s*([0-9]{1,6})$")
_RANK_RE = re.compile(r"^([0-9]{1,9})(?:\s*-\s*([0-9]{1,9}))?$")
SYNTAX = "'all', 'model_parallel=T[,pipeline_stages=P]', or groups of ranks like '0,2;1,3' or '0-3;4-7'"
MAX_LISTED = 1 << 20


@dataclass(frozen=True)
class ReplicaGroups:
    model_parallel: int = 1
    pipeline_stages: int = 1
    listed: Optional[Tuple[Tuple[int, ...], ...]] = None  # explicit groups

    @classmethod
    def parse(cls, text, key: str = "replica_groups") -> ReplicaGroups:
        if text is None or (isinstance(text, str) and text.strip().lower() in ("", "all")):
            return cls()
        if not isinstance(text, str):
            raise ReplicaSpecError(f"{key}: {text!r} is not a string; valid: {SYNTAX}")
        if "=" in text:
            return cls._parallel(text, key)
        return cls(listed=_listed(text, key))

    @classmethod
    def _parallel(cls, text: str, key: str) -> ReplicaGroups:
        sizes = {"model_parallel": 1, "pipeline_stages": 1}
        for part in text.split(","):
            match = _PARALLEL_RE.match(part.strip())
            if match is None or int(match.group(2)) < 1:
                raise ReplicaSpecError(f"{key}: {part.strip()!r} in {text!r} is not understood; valid: {SYNTAX}")
            sizes[match.group(1)] = int(match.group(2))
        return cls(sizes["model_parallel"], sizes["pipeline_stages"])

    def describe(self) -> str:
        if self.listed is not None:
            return ";".join(",".join(str(r) for r in group) for group in self.listed)
        if self.model_parallel == 1 and self.pipeline_stages == 1:
            return "all"
        return f"model_parallel={self.model_parallel},pipeline_stages={self.pipeline_stages}"

    def group_of(self, rank: int, world: int) -> Optional[GroupKey]:
        """The key shared by ``rank``'s replicas in a job of ``world`` ranks; None: in no group."""
        if self.listed is not None:
            for index, group in enumerate(self.listed):
                if rank in group:
                    return (index,)
            return None
        stage = 0 if self.pipeline_stages == 1 else rank // max(1, world // self.pipeline_stages)
        return (stage, rank % self.model_parallel)

    def label(self, key: GroupKey) -> str:
        """How a group is named in messages (empty for the one group of pure data parallelism)."""
        if self.listed is not None:
            return f"group {key[0]} (ranks {','.join(str(r) for r in self.listed[key[0]])})"
        parts = []
        if self.pipeline_stages > 1:
            parts.append(f"stage {key[0]}")
        if self.model_parallel > 1:
            parts.append(f"model-parallel rank {key[1]}")
        return ", ".join(parts)

    def check_world(self, world: int) -> Optional[str]:
        """Why this specification does not fit a job of ``world`` ranks, or None."""
        if self.listed is not None:
            return None
        if world % (self.model_parallel * self.pipeline_stages):
            return (f"{world} ranks are not a multiple of model_parallel={self.model_parallel} x "
                    f"pipeline_stages={self.pipeline_stages}")
        return None


def _listed(text: str, key: str) -> Tuple[Tuple[int, ...], ...]:
    groups = []
    owner: Dict[int, int] = {}
    total = 0
    for index, part in enumerate(p for p in text.split(";") if p.strip()):
        ranks = []
        for item in part.split(","):
            match = _RANK_RE.match(item.strip())
            if match is None:
                raise ReplicaSpecError(f"{key}: {item.strip()!r} in {text!r} is not a rank or a range; valid: {SYNTAX}")
            lo = int(match.group(1))
            hi = int(match.group(2) or lo)
            if hi < lo:
                raise ReplicaSpecError(f"{key}: range {item.strip()!r} is reversed")
            total += hi - lo + 1
            if total > MAX_LISTED:
                raise ReplicaSpecError(f"{key}: more than {MAX_LISTED} ranks listed")
            ranks.extend(range(lo, hi + 1))
        for rank in ranks:
            if owner.setdefault(rank, index) != index:
                raise ReplicaSpecError(f"{key}: rank {rank} is in two groups of {text!r}")
        groups.append(tuple(sorted(set(ranks))))
    if not groups:
        raise ReplicaSpecError(f"{key}: {text!r} lists no rank; valid: {SYNTAX}")
    return tuple(groups)
