"""Ascend graph-mode statistics through MindSpore's kernel-by-kernel (KBK) statistics dump.

The graph carries TensorDump ops as markers; MindSpore's dump (configured through
``MINDSPORE_DUMP_CONFIG``) writes statistics of their inputs to ``statistic.csv`` files
and ``MS_KERNEL_LAUNCH_SKIP=TensorDump`` keeps the ops from writing tensors. Written
from MindSpore's documentation; not runnable on CPU.
"""

from __future__ import annotations

import json
import logging
import os

from mf_celldump.capture.backends.base import BackendModeError, PyNativeFace
from mf_celldump.capture.backends.tensordump import TensorDumpBackend
from mf_celldump.rawformat.manifest import NUMBERING_GRAPH

logger = logging.getLogger(__name__)

# Our statistics names -> MindSpore's statistic_category names.
_CATEGORIES = {"max": "max", "min": "min", "mean": "avg", "norm": "l2norm"}


class KbkStatisticsBackend(TensorDumpBackend):
    name = "kbk_statistics"
    stem_separator = "-"  # kernel names in statistic.csv keep no dots

    def __init__(self, context, primitives=None):
        super().__init__(context, primitives)
        self._saved_env = {}

    def manifest_fields(self) -> dict:
        return {"step_numbering": NUMBERING_GRAPH, "graph_step_base": self.graph_step_base}

    def _dump_config(self, initial_step: int) -> dict:
        steps = self.config.steps
        iteration = "all" if steps.selects_all else "|".join(
            str(s - initial_step) for s in steps.from_value(initial_step, 100_000))
        categories = [_CATEGORIES[s] for s in self.config.statistics if s in _CATEGORIES]
        return {
            "common_dump_settings": {
                "op_debug_mode": 0,
                "dump_mode": 1,
                "path": self.context.writer.kbk_dir(),
                "net_name": "Net",
                "iteration": iteration,
                "saved_data": "statistic",
                "input_output": 1,
                "kernels": ["TensorDump"],
                "support_device": [0, 1, 2, 3, 4, 5, 6, 7],
                "statistic_category": categories,
            },
            "e2e_dump_settings": {"enable": False, "trans_flag": True, "stat_calc_mode": "device"},
        }

    def setup(self, initial_step: int) -> None:
        self.graph_mode = True
        self.graph_step_base = initial_step
        dump_config = self._dump_config(initial_step)
        config_path = self.context.writer.write_kbk_config(dump_config)
        for name, value in (("MINDSPORE_DUMP_CONFIG", config_path), ("MS_KERNEL_LAUNCH_SKIP", "TensorDump")):
            self._saved_env[name] = os.environ.get(name)
            os.environ[name] = value
        logger.info("kernel-by-kernel statistics dump configured: %s",
                    json.dumps(dump_config["common_dump_settings"]))

    def teardown(self) -> None:
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()

    def pynative(self) -> PyNativeFace:
        raise BackendModeError("the kbk_statistics backend works in Ascend graph mode only; use device_stats")
