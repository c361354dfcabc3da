"""Stand-in of ``hyper_parallel/platform/mindspore/autograd_compat`` (see ``hyper_parallel/_autograd.py``)."""

from hyper_parallel import _autograd


def enable_mindspore_backward_compat() -> None:
    _autograd.enable()
