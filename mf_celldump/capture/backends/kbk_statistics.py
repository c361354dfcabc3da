"""Ascend graph-mode statistics through MindSpore's kernel-by-kernel (KBK) statistics dump.

The graph carries the same TensorDump probes as the tensor task, flagged with
``td_flag`` so the statistics dump names each kernel by its file input (our stem);
MindSpore's dump, configured through ``MINDSPORE_DUMP_CONFIG``, writes statistics of
their inputs to ``statistic.csv`` while ``MS_KERNEL_LAUNCH_SKIP=TensorDump`` keeps the
kernels from writing tensors (and a step filter nobody reaches, in case it came too
late). The dump's iteration is pinned to the global step (``_set_init_iter``) and
moved by ``_dump_step(1)`` after each step's synchronisation, as msprobe 26.2 does, so
iteration folders are global steps. Proven on CPU by the emulation in
``tests/support/ascend_emulation.py``; sources (MindSpore repository): DJP
``mindspore/ccsrc/tools/data_dump/dump_json_parser.cc`` (``debug/data_dump/`` up to
2.7.0), AC ``mindspore/ccsrc/runtime/graph_scheduler/actor/actor_common.cc``, DU
``.../debugger/debugger_utils.cc``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import List, Optional

import mindspore as ms

from mf_celldump.capture.backends.ascend_primitives import UNREACHABLE_STEP, AscendPrimitives
from mf_celldump.capture.backends.base import PyNativeFace
from mf_celldump.capture.backends.compile_backend import compile_backend
from mf_celldump.capture.backends.kbk_settings import (
    check_dump_environment,
    check_dump_path,
    check_not_ge,
    device_statistics,
    iteration_setting,
    remember_dump_config,
)
from mf_celldump.capture.backends.tensordump import TensorDumpBackend
from mf_celldump.capture.backends.tensordump_process import LAUNCH_SKIP_ENV, foreign_users, note_launch_skip
from mf_celldump.errors import BackendModeError, BackendSetupError
from mf_celldump.rawformat.manifest import COMPLETION_STEP_DONE, NUMBERING_GLOBAL

logger = logging.getLogger(__name__)


def _refuse_beside(others: List[str]) -> None:
    """MS_KERNEL_LAUNCH_SKIP has no narrower form than an op type: skipping ours skips theirs."""
    if others:
        raise BackendSetupError(
            f"{' and '.join(others)} use TensorDump in this process. The statistics task must skip every TensorDump "
            "kernel of the process (MS_KERNEL_LAUNCH_SKIP=TensorDump: MindSpore has no narrower setting, and reads "
            "it once per process), which would silence them for good; without the skip MindSpore would move and "
            "write every captured tensor on every step. Turn them off for this run (MindFormers: "
            "monitor_config.dump_path empty), or use task: tensor")


class KbkStatisticsBackend(TensorDumpBackend):
    name = "kbk_statistics"
    stem_separator = "-"  # a kernel name in statistic.csv loses its dots up to MindSpore 2.7.0
    widens_low_precision = True  # statistics of bfloat16/float16 values computed in float32

    def __init__(self, context, primitives: Optional[AscendPrimitives] = None):
        super().__init__(context, primitives)
        self._saved_env = {}
        self.statistics: List[str] = []
        self.iteration = 0

    @property
    def writes_later(self) -> bool:
        # Rows are written in a blocking stream callback (DU LaunchDeviceStatCallback), so they are
        # on disk once the device is synchronised; msprobe 26.2 reads them right after
        # ms.runtime.synchronize() (process_statistics_step). Inferred from source, not measured.
        return False

    def manifest_fields(self) -> dict:
        return {"step_numbering": NUMBERING_GLOBAL, "graph_step_base": 0, "step_completion": COMPLETION_STEP_DONE,
                "statistics": tuple(self.statistics)}

    def _dump_config(self, initial_step: int, kbk_dir: str, categories: List[str]) -> dict:
        return {
            "common_dump_settings": {
                "op_debug_mode": 0,
                "dump_mode": 1,  # only the kernels listed
                "path": kbk_dir,
                "net_name": "Net",
                "iteration": iteration_setting(self.config.steps, initial_step),
                "saved_data": "statistic",
                "input_output": 1,  # inputs only: the tensor is TensorDump's input 1
                "kernels": ["TensorDump"],  # an op type (DJP ParseKernels: no '/' and no '-op')
                # Devices 8-15 would otherwise be disabled with only a warning (DJP JudgeDumpEnabled).
                "support_device": sorted(set(range(8)) | {int(ms.get_context("device_id") or 0)}),
                "statistic_category": categories,
            },
            "e2e_dump_settings": {"enable": False, "trans_flag": True, "stat_calc_mode": "device"},
        }

    def setup(self, initial_step: int) -> None:
        if ms.get_context("mode") != ms.GRAPH_MODE:
            raise BackendModeError("the kbk_statistics backend works in Ascend graph mode only; use device_stats")
        self.primitives = self._given or AscendPrimitives.from_mindspore()
        self.graph_mode = True
        environ = self.primitives.environ
        check_not_ge(compile_backend(self.context.networks, environ, self.primitives.soc_version))
        _refuse_beside(foreign_users())
        self.context.writer.set_aside_kbk()
        kbk_dir = os.path.abspath(self.context.writer.kbk_dir())
        check_dump_path(kbk_dir, self.context.writer.dump_path)
        check_dump_environment(environ)
        self.statistics, categories = device_statistics(self.config.statistics)
        dump_config = self._dump_config(initial_step, kbk_dir, categories)
        config_path = self.context.writer.kbk_config_path()
        remember_dump_config(environ, config_path, dump_config)
        self.context.writer.write_kbk_config(dump_config)
        for name, value in (("MINDSPORE_DUMP_CONFIG", config_path), (LAUNCH_SKIP_ENV, "TensorDump")):
            self._saved_env[name] = environ.get(name)
            environ[name] = value
        note_launch_skip(environ)
        try:  # parses the config now (DJP SetInitialIteration -> Parse): errors surface at attach
            self.primitives.set_init_iter(initial_step)
        except RuntimeError as err:
            raise BackendSetupError(f"MindSpore refused the statistics dump configuration {config_path}: {err}") \
                from None
        self.iteration = initial_step
        # MS_KERNEL_LAUNCH_SKIP is read once, at the first graph kernel launch of the process (AC
        # IsSkippedLaunch: a static): if a graph ran before attach, TensorDump kernels still run,
        # and this filter keeps them from writing files.
        self.primitives.tensordump_set_step([UNREACHABLE_STEP])
        self._mark_forward_primitives()
        logger.info("kernel-by-kernel statistics dump configured: %s", json.dumps(dump_config["common_dump_settings"]))

    def begin_step(self, step: int, captured: bool) -> bool:
        self._check_consecutive(step)
        if self.iteration != step:
            # SetInitialIteration re-pins the iteration (Parse() returns at once after the first call).
            logger.info("statistics dump iteration moved from %d to step %d", self.iteration, step)
            self.primitives.set_init_iter(step)
            self.iteration = step
        return False

    def end_step(self, step: int, captured: bool) -> None:
        # The iteration is read when a kernel is launched (DU GetTensorInfoCommFromCnode ->
        # GenerateDumpPath), so it moves only after every kernel of the step has run.
        self.primitives.synchronize()
        self.primitives.dump_step(1)
        self.iteration += 1

    def abort_step(self, step: int, captured: bool) -> None:
        """Nothing: the next ``begin_step`` re-pins the iteration."""

    def teardown(self) -> None:
        # MindSpore read both variables already and keeps them for the process (docs/capture.md,
        # "what MindSpore keeps once per process"); restoring them only keeps them from a child process.
        environ = self.primitives.environ if self.primitives is not None else os.environ
        for name, value in self._saved_env.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
        if self._saved_env:
            self.reopen_filter(())
        self._saved_env.clear()

    def pynative(self) -> PyNativeFace:
        raise BackendModeError("the kbk_statistics backend works in Ascend graph mode only; use device_stats")
