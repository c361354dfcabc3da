"""Stand-in of ``hyper_parallel/platform/mindspore``."""
