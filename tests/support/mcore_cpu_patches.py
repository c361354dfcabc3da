"""The CPU patches for MindFormers' mcore models, for tests: one copy, in ``examples/mcore_cpu_patches.py``.

The example runner (``examples/run_tiny_llama.py --model qwen3|deepseek3``) needs them as
much as the tests do, so they live beside it; each patch there says which CPU limitation
of MindSpore / MindFormers it works around. This module loads that file (under its own
module name, so the runner's ``import mcore_cpu_patches`` finds the same module object),
and other example modules the tests share with the benchmarks (``load_example``).
"""

from __future__ import annotations

import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")


def load_example(name: str):
    """The module ``examples/{name}.py``, imported once per process under its own name."""
    path = os.path.join(EXAMPLES, f"{name}.py")
    module = sys.modules.get(name)
    if module is None or os.path.abspath(getattr(module, "__file__", "")) != path:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return module


def load():
    """The ``examples/mcore_cpu_patches.py`` module."""
    return load_example("mcore_cpu_patches")


def apply(mode: str) -> None:
    """Apply the patches for ``mode`` ("pynative" or "graph"); idempotent (see the examples file)."""
    load().apply(mode)
