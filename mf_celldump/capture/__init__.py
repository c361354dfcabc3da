"""Capture: wrap every selected cell's ``construct`` so its inputs, outputs and gradients
reach the raw tree while training runs.

``session.attach`` is the entry point; ``selection`` picks and names cells,
``signature`` maps arguments to slots, ``pynative_wrapper``/``graph_wrapper`` build the
capturing construct, ``construct_patch`` installs and restores it, ``backends/`` turn a
captured value into raw data through ``sink``, ``runtime`` holds the step counters.
"""
