"""Stand-in of ``hyper_parallel/core/context_parallel`` (context parallel: several cards)."""
