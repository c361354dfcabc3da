"""Stand-in of ``hyper_parallel/core/fully_shard/api.py``: ``HSDPModule`` (no single-card model is one),
``MixedPrecisionPolicy``; ``fully_shard`` needs several cards."""

from hyper_parallel._standin import HSDPModule, MixedPrecisionPolicy, refused_function

fully_shard = refused_function("fully_shard", "hyper_parallel/core/fully_shard/api.py")

__all__ = ["HSDPModule", "MixedPrecisionPolicy", "fully_shard"]
