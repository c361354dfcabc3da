"""Stand-in of ``hyper_parallel/core/context_parallel/async_dsa_context_parallel.py`` (several cards only)."""

from hyper_parallel._standin import needs_cards

SOURCE = "hyper_parallel/core/context_parallel/async_dsa_context_parallel.py"

AsyncDSAIndexerContextParallel = needs_cards("AsyncDSAIndexerContextParallel", SOURCE)
AsyncDSAIndexerLossContextParallel = needs_cards("AsyncDSAIndexerLossContextParallel", SOURCE)
AsyncDSASparseAttentionContextParallel = needs_cards("AsyncDSASparseAttentionContextParallel", SOURCE)
