"""Stand-in of ``hyper_parallel/core/distributed_checkpoint`` (layouts of sharded checkpoints)."""

from hyper_parallel._standin import refused_function

get_current_layout = refused_function("get_current_layout", "hyper_parallel/core/distributed_checkpoint")
get_global_layout = refused_function("get_global_layout", "hyper_parallel/core/distributed_checkpoint")
