"""Stand-in of ``hyper_parallel/custom_ops``."""
