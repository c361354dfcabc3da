"""The synthetic many-rank dumps of ``bench/ranks_synthetic.py`` (one generator for the benchmark and the tests)."""

from __future__ import annotations

import importlib.util
import os
import sys

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench",
                     "ranks_synthetic.py")
_spec = importlib.util.spec_from_file_location("ranks_synthetic", _PATH)
_module = sys.modules.setdefault("ranks_synthetic", importlib.util.module_from_spec(_spec))
if not hasattr(_module, "write_dump"):
    _spec.loader.exec_module(_module)

Fault = _module.Fault
write_dump = _module.write_dump
