"""Stand-in of ``hyper_parallel/core/fully_shard/utils.py`` (offload policies)."""

from hyper_parallel._standin import CPUOffloadPolicy, OffloadPolicy

__all__ = ["CPUOffloadPolicy", "OffloadPolicy"]
