"""Stand-in of ``hyper_parallel/core/pipeline_parallel`` (pipeline schedules: several cards)."""
