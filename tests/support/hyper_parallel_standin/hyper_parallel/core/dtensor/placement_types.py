"""Stand-in of ``hyper_parallel/core/placement_types.py``."""

from hyper_parallel._standin import Partial, Placement, Replicate, Shard

__all__ = ["Partial", "Placement", "Replicate", "Shard"]
