"""Capture: wrap every selected cell's ``construct`` so its inputs, outputs and gradients
reach the raw tree while training runs.

``session.attach`` is the entry point; ``selection`` picks and names cells,
``construct`` maps arguments to slots and installs and restores the capturing construct
that ``pynative_wrapper``/``graph_wrapper`` build, ``backends/`` turn a captured value
into raw data through ``runtime.RawSink``, ``runtime`` also holds the step counters.
"""
