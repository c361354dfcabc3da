"""Stand-in of ``hyper_parallel/core/redistribute_infer.py`` (Muon's sharded update only)."""

from hyper_parallel._standin import needs_cards

DevMat = needs_cards("DevMat", "hyper_parallel/core/redistribute_infer.py")
RedistributionOperatorInfer = needs_cards("RedistributionOperatorInfer", "hyper_parallel/core/redistribute_infer.py")
