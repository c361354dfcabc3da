"""Stand-in of ``hyper_parallel/core/layout.py`` (Muon's sharded update only)."""

from hyper_parallel._standin import refused_function

_infer_slice_area_by_rank = refused_function("_infer_slice_area_by_rank", "hyper_parallel/core/layout.py")
