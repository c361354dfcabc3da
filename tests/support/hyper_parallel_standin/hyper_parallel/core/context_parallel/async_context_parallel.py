"""Stand-in of ``hyper_parallel/core/context_parallel/async_context_parallel.py`` (several cards only)."""

from hyper_parallel._standin import needs_cards

SOURCE = "hyper_parallel/core/context_parallel/async_context_parallel.py"

AsyncContextParallel = needs_cards("AsyncContextParallel", SOURCE)
