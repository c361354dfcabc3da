"""Helpers of the test suite: networks, drivers run as subprocesses, dump builders and readers."""
