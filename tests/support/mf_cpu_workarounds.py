"""Test-side helpers for MindFormers runs on CPU; also a driver script run in a subprocess.

    python tests/support/mf_cpu_workarounds.py [--precompile] [--fail-at-step K] -- <run_tiny_llama.py args>

The CPU workarounds themselves live in ``examples/cpu_workarounds.py`` (re-exported
here). What is added for tests only:

* ``--precompile``: compile the training graph in ``Model.build`` before ``Model.train``,
  as MindFormers does on Ascend for distributed graph runs that load a checkpoint
  (``compile_model`` -> ``model.build``). MindSpore's ``Model.build`` refuses non-Ascend
  targets, so its ``_init`` is replaced by one that compiles the first batch without
  data sink, which is all that matters here: the graph exists before ``on_train_begin``.
* ``--fail-at-step K``: a callback placed before ``CellDumpCallback`` raises at the end of
  global step K, after the network ran, so step K has raw data but never completes.

Runs go in subprocesses because MindSpore's execution mode and MindFormers' registries
are per-process, and ``import mindformers`` writes ``./output`` into the working directory.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from typing import List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")
RUNNER = os.path.join(EXAMPLES, "run_tiny_llama.py")
PYTHON = sys.executable


def run_driver(args: List[str], cwd: str, timeout: int = 600, env: Optional[dict] = None):
    """Run this file as a script in ``cwd``; returns the CompletedProcess (text output)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.run(
        [PYTHON, os.path.abspath(__file__), *args], cwd=cwd, env=full_env, timeout=timeout,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
    )


@contextlib.contextmanager
def precompile_before_train():
    """``Model.train`` first calls ``Model.build`` (which compiles on CPU too) while active."""
    from mindspore.train import Model

    saved = {name: Model.__dict__[name] for name in ("train", "_init")}
    original_train = saved["train"]

    def cpu_init(self, train_dataset=None, valid_dataset=None, sink_size=-1, epoch=1, sink_mode=True):
        helper, network = self._exec_preprocess(is_train=True, dataset=train_dataset,
                                                dataset_sink_mode=False, sink_size=sink_size)
        for inputs in helper:
            network.compile(*inputs)
            print("PRECOMPILED: training graph compiled in Model.build", flush=True)
            break
        train_dataset.reset()

    def train(self, epoch, train_dataset, *args, **kwargs):
        self.build(train_dataset=train_dataset, epoch=epoch, sink_mode=False)
        return original_train(self, epoch, train_dataset, *args, **kwargs)

    Model._init = cpu_init
    Model.train = train
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(Model, name, value)


def _register_fail_callback():
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
    from mindspore.train import Callback

    class FailAtStep(Callback):
        """Raises at the end of global step ``step`` (0-based), before later callbacks run."""

        def __init__(self, step: int = 0):
            super().__init__()
            self.step = step

        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num - 1 == self.step:
                raise RuntimeError(f"injected failure at step {self.step}")

    MindFormerRegister.register_cls(FailAtStep, module_type=MindFormerModuleType.CALLBACK)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--precompile", action="store_true")
    parser.add_argument("--fail-at-step", type=int, default=None)
    parser.add_argument("runner_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    # --verbose: the tests read MindFormers' and mf_celldump's log lines from the run's output
    runner_args = ["--verbose"] + [a for a in args.runner_args if a != "--"]
    sys.path.insert(0, EXAMPLES)
    import run_tiny_llama

    if args.fail_at_step is not None:
        _register_fail_callback()
        load_config = run_tiny_llama.load_config

        def load_config_with_failure(ns):
            config = load_config(ns)
            index = next(i for i, e in enumerate(config.callbacks) if e.get("type") == "CellDumpCallback")
            config.callbacks.insert(index, {"type": "FailAtStep", "step": args.fail_at_step})
            return config

        run_tiny_llama.load_config = load_config_with_failure
    with precompile_before_train() if args.precompile else contextlib.nullcontext():
        return run_tiny_llama.main(runner_args)


def __getattr__(name):
    # ``from mf_cpu_workarounds import CpuTrainOneStepCell`` without importing MindFormers early.
    if name == "CpuTrainOneStepCell":
        sys.path.insert(0, EXAMPLES)
        from cpu_workarounds import CpuTrainOneStepCell

        return CpuTrainOneStepCell
    raise AttributeError(name)


if __name__ == "__main__":
    sys.exit(main())
