"""Stand-in of ``hyper_parallel/core/pipeline_parallel/comm_compute_overlap.py``."""

from hyper_parallel._standin import needs_cards

CommComputeOverlap = needs_cards("CommComputeOverlap", "hyper_parallel/core/pipeline_parallel/comm_compute_overlap.py")
