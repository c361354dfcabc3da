"""Stand-in of ``hyper_parallel/core/shard``."""
