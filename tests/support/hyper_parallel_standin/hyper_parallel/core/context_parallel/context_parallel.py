"""Stand-in of ``hyper_parallel/core/context_parallel/context_parallel.py`` (several cards only)."""

from hyper_parallel._standin import needs_cards

ContextParallel = needs_cards("ContextParallel", "hyper_parallel/core/context_parallel/context_parallel.py")
