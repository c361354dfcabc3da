"""Stand-in of ``hyper_parallel/core/context_parallel/dsa_context_parallel.py`` (several cards only)."""

from hyper_parallel._standin import needs_cards

SOURCE = "hyper_parallel/core/context_parallel/dsa_context_parallel.py"

DSAIndexerContextParallel = needs_cards("DSAIndexerContextParallel", SOURCE)
DSAIndexerLossContextParallel = needs_cards("DSAIndexerLossContextParallel", SOURCE)
DSASequenceReplicateCache = needs_cards("DSASequenceReplicateCache", SOURCE)
DSASparseAttentionContextParallel = needs_cards("DSASparseAttentionContextParallel", SOURCE)
