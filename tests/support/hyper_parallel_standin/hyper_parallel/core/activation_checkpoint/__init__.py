"""Stand-in of ``hyper_parallel/core/activation_checkpoint`` (``activation_checkpoint.py``, ``swap.py``).

Only ``CheckpointPolicy`` is real here. The wrappers (``checkpoint_wrapper``: ``platform.ckpt_wrapper``,
which the master branch read leaves unimplemented for MindSpore) are refused: a test of recompute under
2.1 would need the 1.0 release's ``CheckpointWrapper``, which this stand-in does not claim to be.
"""

from hyper_parallel._standin import CheckpointPolicy, needs_cards, refused_function

checkpoint_wrapper = refused_function("checkpoint_wrapper",
                                      "hyper_parallel/core/activation_checkpoint/activation_checkpoint.py")
checkpoint_exclude_wrapper = refused_function("checkpoint_exclude_wrapper",
                                              "hyper_parallel/core/activation_checkpoint/activation_checkpoint.py")
swap_wrapper = refused_function("swap_wrapper", "hyper_parallel/core/activation_checkpoint/swap.py")
SwapManager = needs_cards("SwapManager", "hyper_parallel/core/activation_checkpoint/swap.py")

__all__ = ["CheckpointPolicy", "SwapManager", "checkpoint_exclude_wrapper", "checkpoint_wrapper", "swap_wrapper"]
