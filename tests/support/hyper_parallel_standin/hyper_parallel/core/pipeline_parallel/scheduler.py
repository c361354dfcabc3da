"""Stand-in of ``hyper_parallel/core/pipeline_parallel/scheduler.py``."""

from hyper_parallel._standin import MetaStepType

__all__ = ["MetaStepType"]
