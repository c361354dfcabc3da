"""Training the capture net in graph mode with the emulated Ascend primitives, and reading what came out.

Shared by the Ascend graph-mode tests: one ``TrainingRun`` (what every trainer adapter
drives) over a few steps, with ``AscendPrimitives.from_mindspore`` returning the
emulator's primitives, and small readers of the processed output.
"""

from __future__ import annotations

import os
from typing import Callable, Optional

import pytest

from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives
from mf_celldump.config import DumpConfig
from mf_celldump.integrations.run import TrainingRun
from tests.support import capture_net as cn
from tests.support import formats as fmt
from tests.support.processed import read_output


def output_of(dump_path, step):
    """{(entry, io, index): leaf} and {file name: array} of a processed step."""
    return read_output(dump_path, step)


def step_folders(dump_path):
    return sorted(n for n in os.listdir(dump_path) if fmt.parse_step_dir_name(n) is not None)


def raw_step_folders(dump_path):
    rank_dir = os.path.join(dump_path, fmt.RAW_ROOT, "rank0")
    return sorted(n for n in os.listdir(rank_dir) if n.startswith("step")) if os.path.isdir(rank_dir) else []


def run_training(dump_path, config, emulator=None, steps=5, initial_step=0, wait_timeout=None, net_factory=None,
                 outer: Optional[Callable] = None):
    """Train the capture net (graph mode with an emulator, else PyNative) through a TrainingRun.

    ``outer(train_cell)`` may wrap the training cell in a cell of the test's (a trainer's own
    step cell); capture is attached to the training cell either way.
    """
    cn.set_mode("graph" if emulator is not None else "pynative")
    net = (net_factory or cn.make_net)()
    train = cn.train_one_step_cell(net)
    step_cell = train if outer is None else outer(train)
    x = cn.make_input()
    run = TrainingRun(DumpConfig.coerce(dict(config, dump_path=str(dump_path))), wait_timeout=wait_timeout)
    with pytest.MonkeyPatch.context() as patch:
        if emulator is not None:
            patch.setattr(AscendPrimitives, "from_mindspore", classmethod(lambda cls: emulator.primitives()))
        run.ensure_attached(train, initial_step=initial_step)
        for step in range(initial_step, initial_step + steps):
            run.begin_step(step)
            step_cell(x)
            run.end_step()
        summary = run.finish()
    return run, summary
