"""Stand-in of ``hyper_parallel/core/fully_shard``."""
