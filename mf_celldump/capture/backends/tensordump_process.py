"""MindSpore's TensorDump state is one per process: how a capture lives beside other TensorDump users.

What MindSpore keeps for the whole process (repository mindspore-ai/mindspore; TDC
``mindspore/ccsrc/tools/tensor_dump/tensordump.cc``, AC
``mindspore/ccsrc/runtime/graph_scheduler/actor/actor_common.cc``, TDT
``mindspore/ccsrc/plugin/ascend/res_manager/mbuf_manager/tdt_manager.cc``):

* the data channel ``ms_tensor_dump`` that carries graph-mode TensorDump data to the host
  writer. TDT ``OpenTsd`` (called once, from ``AscendDeviceContext::Initialize``) creates
  it only when ``MsContext::backend_policy() == "ge"``, which the Ascend plugin sets when
  the device target is Ascend. Without it nothing is written.
* the step filter ``_tensordump_set_step`` (TDC ``SetDumpStep`` replaces ``valid_steps_``;
  ``GetTaskType``/``NeedDump`` check it for every TensorDump of the process). It has no
  per-file or per-op form.
* ``MS_KERNEL_LAUNCH_SKIP`` (AC ``IsSkippedLaunch``): read once into a static at the first
  kernel launch; the whole value is compared with the op type (or ``all``/``ALL``). It has
  no per-kernel form, and nothing changes it afterwards.

Other TensorDump users found in MindSpore 2.9 / MindFormers 1.9:

* MindFormers' training monitor: ``monitor_config.dump_path`` makes the trainer call
  ``set_auto_parallel_context(dump_local_norm_path=..., dump_local_norm=...,
  dump_device_local_norm=...)`` (``trainer/trainer.py``). ``MFTrainOneStepCell`` then dumps
  ``finish_step`` (and ``device_local_norm``) every step (``wrapper/wrapper.py``), MindSpore's
  gradient-communication bprop dumps ``local_norm__{param}`` under parallel
  (``ops/_grad_experimental/grad_comm_ops.py``), MindFormers' losses ``local_loss``; the
  ``TrainingStateMonitor`` callback (``core/callback/callback.py``) reads them, counting steps
  by the ``finish_step`` files.
* MindSpore's silent-data-corruption feature sampling (``tools/sdc_detect.py``): its
  TensorDumps pass the step filter (TDC ``GetTaskType`` checks their name first) but not a
  launch skip.

Big dumps: a graph-mode TensorDump sends its tensor to the host in one piece, and MindSpore
documents that large or frequent dumps make the kernel fail unless ``MS_DUMP_SLICE_SIZE`` and
``MS_DUMP_WAIT_TIME`` are set (``ops/operations/debug_ops.py`` TensorDump docstring, env var
list). They are read once per process into statics (``GetDumpSliceSize``/``GetDumpWaitTime``,
``include/utils/env_vars.h``), first when the device opens the channel
(``mbuf_receive_manager.cc`` MbufDataHandler: capacity one dataset when slicing) and when
graphs are compiled (``add_attr_to_dump.cc`` AddAttrToDump: ``slice_size`` = MB << 20,
``wait_time``, ``slice_sync`` on every TensorDump/Print/summary node). By then a capture is too
late to set them, and they change Print and the summary ops too, so they are advised, not set.
In slice mode the receiver waits up to ``MS_DUMP_WAIT_TIME`` - 1 s (0: ``op_timeout``) for the
host writer after each tensor and drops its queue if the writer is slower (MbufDataHandler
ReceiveOneDataset, "all items in dataset queue will be dropped").
"""

from __future__ import annotations

import logging
import os
from typing import List, MutableMapping

from mf_celldump.errors import BackendSetupError

logger = logging.getLogger(__name__)

SLICE_SIZE_ENV, WAIT_TIME_ENV = "MS_DUMP_SLICE_SIZE", "MS_DUMP_WAIT_TIME"
ADVISED_SLICE_MB, ADVISED_WAIT_S = 256, 600
LAUNCH_SKIP_ENV = "MS_KERNEL_LAUNCH_SKIP"
SKIPPING_VALUES = ("TensorDump", "all", "ALL")  # AC IsSkippedLaunch: these skip TensorDump kernels
# Set (tagged with the process id) when a statistics capture of this process set MS_KERNEL_LAUNCH_SKIP.
LAUNCH_SKIP_SET_ENV = "MF_CELLDUMP_LAUNCH_SKIP_SET"


def check_channel(backend_policy: str) -> None:
    """Refuse graph-mode TensorDump capture when MindSpore opened no TensorDump channel (TDT OpenTsd)."""
    if backend_policy != "ge":
        raise BackendSetupError(
            f"MindSpore's backend policy is {backend_policy!r}: it opens the TensorDump data channel only under "
            "'ge' (tdt_manager.cc OpenTsd), which it sets itself when the device target is Ascend, so graph-mode "
            "TensorDump would write nothing. Run on Ascend (set_context(device_target='Ascend') before the first "
            "graph), do not change the backend policy, or use backend: host")


def foreign_users() -> List[str]:
    """Other TensorDump users of this process that are known from their settings (descriptions)."""
    import mindspore as ms

    found = []
    try:
        path = ms.get_auto_parallel_context("dump_local_norm_path")
    except (ValueError, RuntimeError, TypeError):
        path = ""
    if path:
        found.append(f"MindFormers' training monitor / MindSpore's local-norm dump (dump_local_norm_path={path!r}, "
                     "from monitor_config.dump_path)")
    try:
        from mindspore.tools.sdc_detect import _sdc_detector

        if _sdc_detector.need_sample():
            found.append("MindSpore's silent-data-corruption feature sampling")
    except (ImportError, AttributeError, RuntimeError):
        pass
    return found


def note_launch_skip(environ: MutableMapping[str, str]) -> None:
    """Remember that this process set ``MS_KERNEL_LAUNCH_SKIP`` (MindSpore may have read it for good)."""
    environ[LAUNCH_SKIP_SET_ENV] = str(os.getpid())


def check_tensordump_can_write(environ: MutableMapping[str, str]) -> None:
    """Refuse a tensor capture in a process whose TensorDump kernels MindSpore may skip for good."""
    skip = environ.get(LAUNCH_SKIP_ENV, "")
    if environ.get(LAUNCH_SKIP_SET_ENV) == str(os.getpid()):
        raise BackendSetupError(
            "a statistics capture earlier in this process set MS_KERNEL_LAUNCH_SKIP=TensorDump; MindSpore reads it "
            "once, at the first kernel launch of the process (actor_common.cc IsSkippedLaunch), and skips every "
            "TensorDump kernel from then on, so this tensor capture would write nothing. Run it in a new process")
    if skip in SKIPPING_VALUES:
        raise BackendSetupError(
            f"{LAUNCH_SKIP_ENV}={skip} makes MindSpore skip every TensorDump kernel of this process (read once, at "
            "the first kernel launch), so a tensor capture would write nothing. Unset it and start a new process")


def advise_slicing(environ: MutableMapping[str, str]) -> None:
    """Say how to keep big or frequent graph-mode dumps from failing, when MindSpore was not told."""
    if environ.get(SLICE_SIZE_ENV, "").strip() not in ("", "0"):
        return
    logger.warning(
        "%s is not set: graph-mode TensorDump then moves each captured tensor to the host in one piece, and "
        "MindSpore documents that large or frequent dumps make it fail. Before the process starts, export "
        "%s=%d (MB per slice, 1-2048) and %s=%d (seconds MindSpore waits for the host writer, 0-600, at most "
        "op_timeout; if the writer is slower MindSpore drops what is queued). MindSpore reads both once, when the "
        "device starts", SLICE_SIZE_ENV, SLICE_SIZE_ENV, ADVISED_SLICE_MB, WAIT_TIME_ENV, ADVISED_WAIT_S)
