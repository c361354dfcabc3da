"""Stand-in of ``hyper_parallel/core/dtensor.py`` (2.1 imports it as a package)."""

from hyper_parallel._standin import DTensor

__all__ = ["DTensor"]
