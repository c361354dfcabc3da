"""Stand-in of ``hyper_parallel/core/shard/sharding_plan.py`` (a tensor-parallel plan: several cards)."""

from hyper_parallel._standin import needs_cards

ShardingPlan = needs_cards("ShardingPlan", "hyper_parallel/core/shard/sharding_plan.py")
