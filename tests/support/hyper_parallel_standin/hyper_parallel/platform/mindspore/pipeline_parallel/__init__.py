"""Stand-in of ``hyper_parallel/platform/mindspore/pipeline_parallel``."""
