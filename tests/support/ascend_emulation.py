"""A faithful CPU emulation of what MindSpore does on Ascend in graph mode for TensorDump,
DumpGradient and the kernel-by-kernel (KBK) statistics dump; also a driver script.

Only the Ascend primitives are stood in for. ``AscendEmulator.primitives()`` returns an
``mf_celldump`` ``AscendPrimitives`` whose TensorDump / DumpGradient are graph-parsable
functions built on identity ``ops.Custom`` pyfunc host ops (real CPU graph kernels), and
whose eager calls (``_run_op`` TensorDump, ``_tensordump_set_step``, ``synchronize``,
``_set_init_iter``, ``_dump_step``) act on an emulated device: two step counters, the
step filter, a FIFO channel drained by one writer thread that names and writes the
``.npy`` files, and the statistics dump's config parser, iteration counter and
``statistic.csv`` writer. The backends, graph wrapper, MindSpore's compiler and autodiff,
and processing all run for real.

Each rule cites the MindSpore file and function it comes from (repository
mindspore-ai/mindspore; tags v2.5.0/v2.6.0, branches r2.7.rc1 and master of July 2025,
later files from the search index):

  TDC   mindspore/ccsrc/tools/tensor_dump/tensordump.cc (TensorDumpManager); up to 2.7.0
        mindspore/ccsrc/debug/dump/tensordump_control.cc
  TDU   mindspore/ccsrc/tools/tensor_dump/tensordump_utils.cc (MbufTensorDumpCallback,
        SaveTensor2NPY); earlier plugin/res_manager/ascend/mbuf_manager/tensordump_utils.cc
  MBUF  mindspore/ccsrc/plugin/res_manager/ascend/mbuf_manager/mbuf_receive_manager.cc (plugin/ascend/
        res_manager/mbuf_manager/ on master)
  FS    mindspore/core/utils/system/file_system.cc
  PPP   mindspore/ccsrc/frontend/parallel/parallel_postprocessor.cc (DecorateDumpPathIfDumpOps)
  PTD   mindspore/ccsrc/frontend/parallel/graph_util/parallel_tensordump.cc
  SP    mindspore/ccsrc/frontend/parallel/step_parallel.cc
  DBG   mindspore/python/mindspore/ops/operations/debug_ops.py
  DBGF  mindspore/python/mindspore/ops/function/debug_func.py
  GDO   mindspore/python/mindspore/ops/_grad_experimental/grad_debug_ops.py
  DJP   mindspore/ccsrc/tools/data_dump/dump_json_parser.cc (debug/data_dump/ up to 2.7.0)
  DA    mindspore/ccsrc/runtime/graph_scheduler/actor/debug_actor.cc
  AC    mindspore/ccsrc/runtime/graph_scheduler/actor/actor_common.cc
  KA    mindspore/ccsrc/runtime/graph_scheduler/actor/kernel_actor.cc
  DU    mindspore/ccsrc/debug/debugger/debugger_utils.cc (tools/data_dump/debugger/ later)
  DMU   mindspore/ccsrc/debug/data_dump/dump_utils.cc
  UH    mindspore/ccsrc/debug/utils.h
  CSV   mindspore/ccsrc/include/backend/debug/common/csv_writer.h
  TDT   mindspore/ccsrc/plugin/ascend/res_manager/mbuf_manager/tdt_manager.cc (OpenTsd)
  ASC   mindspore/ccsrc/plugin/ascend/ascend_device_context.cc (context init, Initialize -> OpenTsd)
  EV    the source of mindspore/ccsrc/include/utils/env_vars.h (GetDumpSliceSize, GetDumpWaitTime)
  AAD   mindspore/ccsrc/backend/common/pass/other/add_attr_to_dump.cc (AddAttrToDump::Process)

Limits (see docs/capture.md and docs/ascend-emulation.md): neither the redistribution nor a
forward AllReduce exists on one CPU, so the parallel pass's per-consumer dumps (PTD at
v2.9.0: copies for every parallel-care consumer, on its input after any Cast; users outside
them lose an ``'out'`` gradient hook, an ``'in'`` one stays on the producer side) are reproduced
for the consumers a test declares (``RedistributedValue``), and its re-pointing of ``'out'``
dumps to the partial sum before a forward AllReduce for the op a test declares
(``ForwardCommunication``); TensorDump in control flow is refused by counting dumps against
the compiled top graph (``ControlFlowCheck``); the number format of
statistic values and whether an input-slot-0 row exists are not settled from source
(here: ``repr`` of a float32, no slot-0 row); sink mode with sink_size > 1 is not
emulated. Files are written in the order the host ops ran (MindSpore's channel is FIFO,
MBUF); ``shuffle=True`` permutes the data between two eager markers to prove nothing
else depends on it.

As a script it runs examples/run_tiny_llama.py with the emulated primitives:

    python tests/support/ascend_emulation.py [--parallel] [--latency S] [--slow-every N] \\
        [--report FILE] [--user-tensordump] -- <run_tiny_llama.py arguments>
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import queue
import random
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops
from mindspore.ops.primitive import constexpr

from mf_celldump.capture.backends.ascend_primitives import AscendPrimitives

logger = logging.getLogger(__name__)

# TDC GetTaskType: `constexpr std::string_view step_flag{"<tensordump-update-step>"}`.
UPDATE_STEP_FLAG = "<tensordump-update-step>"
# TDC header: `kCallFromCXX = 0` (graph kernels, the device channel), `kCallFromPython = 1`.
CALL_FROM_CXX, CALL_FROM_PYTHON = 0, 1
# DJP kDeviceStatisticCategory / kHostStatisticCategory (the valid names).
DEVICE_STATISTICS = ("max", "min", "avg", "l2norm")
HOST_STATISTICS = ("max", "min", "avg", "count", "negative zero count", "positive zero count", "nan count",
                   "negative inf count", "positive inf count", "zero count", "md5", "l2norm")
# UH csvHeaderComm and header_map.
CSV_HEADER = "Op Type,Op Name,Task ID,Stream ID,Timestamp,IO,Slot,Data Size,Data Type,Shape"
CSV_COLUMNS = {"max": "Max Value", "min": "Min Value", "avg": "Avg Value", "count": "Count",
               "negative zero count": "Negative Zero Count", "positive zero count": "Positive Zero Count",
               "nan count": "NaN Count", "negative inf count": "Negative Inf Count",
               "positive inf count": "Positive Inf Count", "zero count": "Zero Count", "l2norm": "L2Norm Value",
               "md5": "MD5"}


class EmulatedMindSporeError(RuntimeError):
    """What MindSpore raises for the same input (MS_LOG(EXCEPTION) reaches Python as RuntimeError)."""


@dataclass
class _Launch:
    """One TensorDump node of a compiled graph: what its CNode carries."""

    name: str  # the file input, after the parallel pass
    dtype: str  # MindSpore's dtype name, e.g. "Float32"
    attrs: Dict[str, Any]  # td_flag, side_effect_io, ...
    scope: str  # fullname_with_scope


@dataclass
class _Item:
    """One dataset on the ms_tensor_dump channel."""

    name: str
    array: Optional[np.ndarray]
    dtype: str
    mode: int = CALL_FROM_CXX
    eager: bool = False  # launched with _run_op (a barrier for ``shuffle``)


@dataclass
class _Kbk:
    """DumpJsonParser state that decides statistic.csv (DJP)."""

    path: str
    net_name: str
    iteration: str
    input_output: int
    kernels: List[str]
    categories: List[str]
    enabled: bool
    user_step: bool = False  # DJP SetInitialIteration: dump_user_step_flag_ = true
    cur_iter: int = 0
    cur_user_iter: int = 0

    def iteration_now(self) -> int:
        # DJP cur_dump_iter(): `dump_user_step_flag_ ? cur_user_dump_iter_ : cur_dump_iter_`
        return self.cur_user_iter if self.user_step else self.cur_iter


@dataclass
class DeviceSettings:
    """What the Ascend device side of the process is, for the emulated channel and context.

    ``backend_policy``: ``MsContext::backend_policy()``; the Ascend plugin's context init sets "ge"
    whenever the device target is Ascend (ASC MSCONTEXT_REGISTER_INIT_FUNC). ``soc_version``:
    ``MsContext::ascend_soc_version()`` ("ascend910" is 910A: jit_level defaults to O2 there).
    ``mbuf_limit_bytes``: the largest dataset the device can put on the channel in one piece
    (CANN's OutfeedEnqueueOpV2 allocates device memory for it; not a MindSpore constant, so
    a parameter here; None: no limit). ``op_timeout_s``: ``op_debug.execute_timeout`` (900 s).
    """

    backend_policy: str = "ge"
    soc_version: str = "ascend910b"
    mbuf_limit_bytes: Optional[int] = None
    op_timeout_s: int = 900


class TdtChannel:
    """The ms_tensor_dump channel as TDT OpenTsd opens it and MBUF/EV size it (device side).

    * TDT OpenTsd: the channel's MbufDataHandler is created only when ``backend_policy() ==
      "ge"``; otherwise a TensorDump kernel's data has no receiver and nothing is written (what
      CANN's kernel then does is not in MindSpore's sources: here the data is dropped).
    * EV GetDumpSliceSize / GetDumpWaitTime: ``MS_DUMP_SLICE_SIZE`` (MB, 0..2048) and
      ``MS_DUMP_WAIT_TIME`` (s, 0..600) are read once per process (static locals); a value that is
      not an integer in range is ignored with a warning. MindSpore reads the slice size first when
      the channel is created (MBUF MbufDataHandler: capacity 2, i.e. one dataset, when slicing),
      here at construction.
    * Without slicing a tensor travels as one dataset: larger than ``mbuf_limit_bytes`` the kernel
      fails (MindSpore's TensorDump docstring: "operator execution fails" for large tensors; the
      CANN acltdtGetSliceInfoFromItem page: the device memory for the data cannot be allocated).
      With slicing (AAD AddAttrToDump sets slice_size = MB << 20, wait_time, slice_sync) it
      travels in slices of at most that size, which the receiver joins (MBUF ProcessSliceTensor).
    """

    MAX_SLICE_MB, MAX_WAIT_S = 2048, 600

    def __init__(self, environ: Dict[str, str], device: DeviceSettings):
        self.device = device
        self.open = device.backend_policy == "ge"
        self.slice_bytes = _env_int(environ, "MS_DUMP_SLICE_SIZE", self.MAX_SLICE_MB) << 20
        self.wait_s = _env_int(environ, "MS_DUMP_WAIT_TIME", self.MAX_WAIT_S)
        self.slices_sent: List[int] = []  # per sliced tensor: how many slices it took

    def host_wait_s(self) -> float:
        # MBUF ReceiveOneDataset: 0 or more than op_timeout -> op_timeout; then one second less than the device.
        wait = self.wait_s if 0 < self.wait_s <= self.device.op_timeout_s else self.device.op_timeout_s
        return float(wait - 1 if wait > 1 else wait)

    def accepts(self, nbytes: int) -> bool:
        """Whether the kernel's data goes on the channel; raises where the kernel fails."""
        if not self.open:
            return False
        limit = self.device.mbuf_limit_bytes
        piece = min(nbytes, self.slice_bytes) if self.slice_bytes else nbytes
        if limit is not None and piece > limit:
            raise EmulatedMindSporeError(
                f"OutfeedEnqueueOpV2 (TensorDump) failed: {piece} bytes in one dataset exceed the {limit} bytes the "
                f"device can allocate for it (MS_DUMP_SLICE_SIZE={self.slice_bytes >> 20} MB)")
        if self.slice_bytes and nbytes > self.slice_bytes:
            self.slices_sent.append(-(-nbytes // self.slice_bytes))
        return True


def _env_int(environ: Dict[str, str], name: str, maximum: int) -> int:
    # EV GetEnvIntValue: std::stoi; out of [0, maximum] or not a number -> warning, default 0.
    text = environ.get(name, "")
    if not text:
        return 0
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= maximum:
        logger.warning("Ignore environment variable %s's invalid value %s, valid value should be in range [0, %d].",
                       name, text, maximum)
        return 0
    return value


class AscendEmulator:
    """The emulated NPU side of one process (see the module docstring).

    ``latency``: seconds before the writer picks up each item (files appear after the step
    and after ``synchronize``); ``slow_every``/``slow_seconds``: every n-th file is written
    header first, then after a pause its data, in place; ``parallel``: the graph is
    (semi-)auto parallel, so the parallel pass renames 'in' dumps; ``csv_op_name_style``:
    "raw" (MindSpore > 2.7.0) or "replaced" (<= 2.7.0).
    """

    def __init__(self, rank: int = 0, device_id: int = 0, parallel: bool = False, latency: float = 0.0,
                 slow_every: int = 0, slow_seconds: float = 0.0, shuffle: bool = False, seed: int = 0,
                 csv_op_name_style: str = "raw", environ: Optional[Dict[str, str]] = None,
                 device: Optional[DeviceSettings] = None):
        self.rank, self.device_id, self.parallel = rank, device_id, parallel
        self.device = device or DeviceSettings()
        self.latency, self.slow_every, self.slow_seconds = latency, slow_every, slow_seconds
        self.shuffle, self.csv_op_name_style = shuffle, csv_op_name_style
        self.environ: Dict[str, str] = {} if environ is None else environ
        self._rng = random.Random(seed)
        # TDC: `std::array<size_t, 2> step_ = {0, 0}; std::set<size_t> valid_steps_; std::atomic<size_t> id_;`
        self.step = [0, 0]
        self.valid_steps: set = set()
        self._next_id = 0
        self._exec_lock = threading.Lock()  # TDC Exec: `std::lock_guard<std::mutex> lock(mtx_)`
        self._launches: List[_Launch] = []
        self._launch_index: Dict[tuple, int] = {}
        self._lock = threading.Lock()
        self._channel: queue.Queue = queue.Queue()
        self._held: List[_Item] = []  # shuffle: data items since the last eager marker
        self._pending = 0
        self._idle = threading.Condition()
        self._running = threading.Event()
        self._running.set()
        self.written_files: List[str] = []
        self.dropped: List[str] = []  # items MindSpore's receiver dropped (slice mode, host too slow)
        self._launch_skip: Optional[str] = None
        self._kbk: Optional[_Kbk] = None
        self._kbk_parsed = False
        self.tdt = TdtChannel(self.environ, self.device)  # device init: OpenTsd
        # MBUF MbufDataHandler: `thread_process_ = std::thread(&MbufDataHandler::ProcessData, this)`:
        # ONE thread pops the FIFO dataset queue and calls the handler for each dataset in turn.
        self._writer = threading.Thread(target=self._process_data, name="emulated-tensordump-writer", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ the seam
    def primitives(self) -> AscendPrimitives:
        return AscendPrimitives(
            dump_out=self.tensordump("out"), dump_in=self.tensordump("in"), dump_gradient=self.dump_gradient(),
            run_op_tensordump=self.run_op_tensordump, tensordump_python=self.tensordump_python,
            tensordump_set_step=self.tensordump_set_step, synchronize=self.synchronize,
            set_init_iter=self.set_init_iter, dump_step=self.dump_step,
            make_marker_tensor=lambda: Tensor([0.0], ms.float32), environ=self.environ,
            backend_policy=lambda: self.device.backend_policy, soc_version=lambda: self.device.soc_version,
            auto_parallel_context=self.auto_parallel_context)

    # ------------------------------------------------------------------ graph stand-ins
    def tensordump(self, input_output: str = "out") -> Callable:
        """``ops.TensorDump(input_output)``: a graph-parsable ``td(file, x)`` with ``add_prim_attr``."""
        # DBG TensorDump.__init__ (2.7-2.10): input_output in ['in', 'out']; side_effect_io True.
        if input_output not in ("in", "out"):
            raise ValueError(f"The 'input_output' argument should be one of ['in', 'out'], but got: {input_output}")
        attrs = {"side_effect_io": True, "channel_name": "ms_tensor_dump", "input_output": input_output}
        register = self._registrar(attrs, "Default")
        host_op = _host_op(self._launch_forward)
        host_op.add_prim_attr("side_effect_io", True)
        ControlFlowCheck.of(self).note_forward_dump_op(host_op)
        is_bf16, cast, int32, stop_gradient = _is_bf16_helper(), ops.cast, ms.int32, ops.stop_gradient

        def tensordump(file, x):
            code = register(file, x.dtype, input_output)
            if is_bf16(x.dtype):
                # A pyfunc takes no bfloat16; TDU stores bf16 as float32 anyway. No gradient flows into a
                # TensorDump (GDO bprop_tensor_dump: zeros): without stop_gradient the cast's zero gradient
                # would be summed with the value's own in a bfloat16 AddN, which has no CPU kernel.
                x = cast(stop_gradient(x), ms.float32)
            return host_op(x, Tensor(code, int32))

        def add_prim_attr(key, value):  # Primitive.add_prim_attr: seen by graphs compiled afterwards
            attrs[key] = value
            # side_effect_io: a node with it is kept even when its output is unused; recompute: the recompute
            # pass leaves a node whose primitive says False in the forward pass (not cloned into backward)
            if key in ("side_effect_io", "recompute"):
                host_op.add_prim_attr(key, value)

        tensordump.add_prim_attr = add_prim_attr
        tensordump.attrs = attrs
        return tensordump

    def dump_gradient(self) -> Callable:
        """``ops.DumpGradient()``: ``dg(path, x, 'in'|'out')`` returns x; its bprop dumps the gradient."""
        # GDO get_bprop_dump_gradient: `td = P.TensorDump(); td.add_prim_attr("side_effect_io", False);
        # td.add_prim_attr("td_flag", True)`: mode 'out', flagged, whatever DumpGradient's mode.
        register = self._registrar({"side_effect_io": False, "td_flag": True, "input_output": "out"},
                                   "Gradients/Default", check_mode=True)
        dout_op = _host_op(self._launch_forward)
        zeros_like = ops.zeros_like

        def bprop(x, code, out, dout):
            return dout_op(dout, code), zeros_like(code)

        identity = _host_op(_identity, bprop=bprop)
        is_bf16, cast, int32 = _is_bf16_helper(), ops.cast, ms.int32

        def dump_gradient(path, x, input_output):
            code = register(path, x.dtype, input_output)
            if is_bf16(x.dtype):
                return cast(identity(cast(x, ms.float32), Tensor(code, int32)), ms.bfloat16)
            return identity(x, Tensor(code, int32))

        def add_prim_attr(key, value):  # DumpGradient's own node is the identity (its bprop's TensorDump is not)
            if key == "recompute":
                identity.add_prim_attr(key, value)

        dump_gradient.add_prim_attr = add_prim_attr
        return dump_gradient

    # ------------------------------------------------------------------ eager stand-ins
    def run_op_tensordump(self, file: str, tensor) -> None:
        """``_run_op(ops.TensorDump(), "TensorDump", (file, t))``: a device kernel, so the channel (kCallFromCXX).

        On CPU the real call fails in kernel selection ("Unsupported op [TensorDump] on CPU"),
        which is how it is known to take the kernel path.
        """
        self._send(_Item(file, _host_array(tensor), _dtype_name(tensor), eager=True))

    def tensordump_python(self, file: str, tensor) -> None:
        """``ops.tensordump(file, t)`` eagerly: DCP `_tensordump_exec` -> Exec(..., kCallFromPython), synchronous.

        From 2.7.1 TDC ExecTask calls ProcessFileName(tensor_name, data_type) without the mode, so
        the filter is checked on the python counter (GetTaskType) and on the graph counter, and
        {step} is the graph counter; 2.7.0 used the python counter for both (measured on CPU with
        2.7.0, 2.7.1, 2.7.2 and 2.9.0; test_the_emulated_python_path_tensordump_follows_the_installed_mindspore).
        """
        with self._exec_lock:
            self._exec(_Item(file, _host_array(tensor), _dtype_name(tensor), CALL_FROM_PYTHON), python_path=True)

    def tensordump_set_step(self, steps: Sequence[int]) -> None:
        """``_tensordump_set_step``: DCP -> TDC SetDumpStep, `valid_steps_` replaced (process-wide)."""
        self.valid_steps = {int(s) for s in steps}

    def synchronize(self) -> None:
        """``ms.runtime.synchronize()``: the device streams are done, so every host op of the graph has
        run and queued its item; the writer thread is NOT waited for (stream.py: "Synchronize all
        streams on current device")."""
        try:
            from mindspore.graph.api import _pynative_executor
        except ImportError:  # MindSpore < 2.9
            from mindspore.common.api import _pynative_executor
        _pynative_executor.sync()
        ControlFlowCheck.of(self).new_run()

    def set_init_iter(self, value: int = 0) -> None:
        """``_set_init_iter``: DJP SetInitialIteration `Parse(); dump_user_step_flag_ = true;
        cur_dump_iter_ = cur_user_dump_iter_ = initial_dump_iter_ = v`."""
        self._parse_dump_config()
        if self._kbk is not None:
            self._kbk.user_step = True
            self._kbk.cur_iter = self._kbk.cur_user_iter = int(value)

    def dump_step(self, step: int = 1) -> None:
        """``_dump_step``: DJP UpdateUserDumpStep: warns unless pinned, then `cur_user_dump_iter_ += step`."""
        if self._kbk is None or not self._kbk.user_step:
            logger.warning("Costomized step function has not enabled, step update does not work!")
        if self._kbk is not None:
            self._kbk.cur_user_iter += int(step)

    def auto_parallel_context(self, key: str) -> Any:
        """``mindspore.get_auto_parallel_context(key)`` of the emulated job: ``parallel`` means
        semi_auto_parallel; ``parallel_context`` (a test sets it) adds pipeline settings."""
        values = {"parallel_mode": "semi_auto_parallel" if self.parallel else "stand_alone", "pipeline_stages": 1,
                  "pipeline_interleave": False, "pipeline_scheduler": "1f1b"}
        values.update(getattr(self, "parallel_context", {}))
        if key not in values:
            raise ValueError(f"Get context keyword {key} is not recognized!")
        return values[key]

    # ------------------------------------------------------------------ test controls (no MindSpore twin)
    def pause(self) -> None:
        """Hold the writer thread (a slow host): queued items wait until ``resume``."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def drain(self, timeout: float = 60.0) -> None:
        """Wait until every queued item is written."""
        self._flush_held()
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{self._pending} items still queued after {timeout} s")
                self._idle.wait(left)

    def close(self) -> None:
        ControlFlowCheck.of(self).stop()
        self.resume()
        self._channel.put(None)
        self._writer.join(timeout=60)

    # ------------------------------------------------------------------ compile time
    def _registrar(self, attrs: Dict[str, Any], scope: str, check_mode: bool = False):
        emulator = self

        @constexpr
        def register(file, dtype, mode):
            # Runs with the node's constant inputs, once per compiled node.
            if check_mode and mode not in ("in", "out"):
                # PTD GetDumpHookInputOutputAttr: only 'in' or 'out'
                raise ValueError(f"For DumpGradient, the 3rd input only supports 'in' or 'out', but got: {mode}")
            name = file
            if emulator.parallel and mode == "in":
                # PPP DecorateDumpPathIfDumpOps rewrites the file of 'in' TensorDump and 'in' DumpGradient
                # nodes (PTD GetInModeSuffixedDumpPath: erase from rfind(".npy"), append "_in.npy"); it runs
                # only in (semi-)auto parallel graphs (SP StepParallel returns early otherwise).
                cut = name.rfind(".npy")
                name = (name[:cut] if cut != -1 else name) + "_in.npy"
            return emulator._add_launch(name, str(dtype), attrs, scope)

        return register

    def _add_launch(self, name: str, dtype: str, attrs: Dict[str, Any], scope: str) -> int:
        with self._lock:
            key = (name, dtype, id(attrs))
            if key not in self._launch_index:
                self._launch_index[key] = len(self._launches)
                self._launches.append(_Launch(name, dtype, attrs, f"{scope}/TensorDump-op{len(self._launches)}"))
            return self._launch_index[key]

    # ------------------------------------------------------------------ kernel launch
    def _launch_forward(self, x, code):
        ControlFlowCheck.of(self).on_launch(int(np.asarray(code)))
        launch = self._launches[int(np.asarray(code))]
        if any(value.deletes(launch) for value in getattr(self, "redistributed", ())):
            return x  # PTD HandleDumpAfterRedistributionNode replaced this node by its input
        comm = next((c for c in getattr(self, "forward_comms", ()) if c.repoints(launch)), None)
        if comm is not None and comm.partial is not None:
            self._launch(launch, comm.partial)  # PTD MakeOutModeDumpBeforeFwdComm: input 2 is the partial sum
            return x
        return self._launch(launch, x)

    def _launch(self, launch: _Launch, x):
        # The kernel copies the tensor into the channel; a pyfunc sees a view of a buffer MindSpore
        # reuses once the op returns, so copy now. A 0-d tensor arrives as a Python scalar.
        array = np.array(x, copy=True)
        if launch.dtype != "BFloat16":
            array = array.astype(_NUMPY_NAMES.get(launch.dtype, array.dtype.name), copy=False)
        if not self._is_skipped_launch("TensorDump"):
            # KA: LaunchKernel(context, IsSkippedLaunch(...)) -- a skipped kernel sends nothing.
            self._send(_Item(launch.name, array, launch.dtype))
        self._kbk_post_launch(launch, array)  # KA PostLaunchKernel -> debug actor, skipped or not
        return x

    def _is_skipped_launch(self, op_type: str) -> bool:
        # AC IsSkippedLaunch: `static std::string launch_skipped = common::GetEnv(kLaunchSkippedEnv);` read
        # at the first kernel launch of the process; whole-value match with the op type, or all/ALL.
        if self._launch_skip is None:
            self._launch_skip = self.environ.get("MS_KERNEL_LAUNCH_SKIP", "")
        return bool(self._launch_skip) and (self._launch_skip in ("all", "ALL") or self._launch_skip == op_type)

    # ------------------------------------------------------------------ the device channel (TdtChannel)
    def _send(self, item: _Item) -> None:
        """A TensorDump kernel (OutfeedEnqueueOpV2) puts its tensor on the ms_tensor_dump channel."""
        if not self.tdt.accepts(0 if item.array is None else item.array.nbytes):
            return
        self._enqueue(item)
        if self.tdt.slice_bytes:
            self._wait_for_sync()

    def _wait_for_sync(self) -> None:
        # MBUF ReceiveOneDataset, slice mode (kWaitForSync): after a whole tensor the receiver waits up to
        # wait_time - 1 s for the process thread to write it; on timeout "all items in dataset queue will be
        # dropped". The device kernel waits for the receiver meanwhile (channel capacity 1, second-stage wait).
        deadline = time.monotonic() + self.tdt.host_wait_s()
        with self._idle:
            while self._pending and time.monotonic() < deadline:
                self._idle.wait(max(deadline - time.monotonic(), 0.0))
            if not self._pending:
                return
        dropped = self._drop_queued()
        logger.warning("Channel ms_tensor_dump wait data sync to output dev timeout, %d items in dataset queue "
                       "will be dropped", dropped)

    def _drop_queued(self) -> int:
        dropped = 0
        while True:
            try:
                item = self._channel.get_nowait()
            except queue.Empty:
                break
            if item is None:  # close(): keep the writer's stop signal
                self._channel.put(None)
                break
            dropped += 1
            self.dropped.append(item.name)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
        return dropped

    # ------------------------------------------------------------------ channel and writer thread
    def _enqueue(self, item: _Item) -> None:
        with self._idle:
            self._pending += 1
        if not self.shuffle:
            self._channel.put(item)
            return
        with self._lock:
            if not item.eager:
                self._held.append(item)
                return
            held, self._held = self._held, []
        self._rng.shuffle(held)
        for queued in held + [item]:
            self._channel.put(queued)

    def _flush_held(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        self._rng.shuffle(held)
        for queued in held:
            self._channel.put(queued)

    def _process_data(self) -> None:
        # MBUF ProcessData: one dataset after the other, on this one thread.
        while True:
            item = self._channel.get()
            if item is None:
                return
            self._running.wait()
            if self.latency:
                time.sleep(self.latency)
            try:
                with self._exec_lock:
                    self._exec(item, python_path=False)
            except Exception:  # the real thread logs MS_LOG(ERROR) and goes on
                logger.exception("emulated TensorDump write failed")
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _exec(self, item: _Item, python_path: bool) -> None:
        # TDC GetTaskType: the update flag moves a counter (TDC UpdateStep `step_.at(mode) += 1`) and
        # writes nothing; an item whose step is filtered out is skipped; anything else is saved.
        if item.name == UPDATE_STEP_FLAG:
            self.step[item.mode] += 1
            return
        if not self._need_dump(item.mode):
            return
        if python_path and not self._need_dump(CALL_FROM_CXX):
            logger.error("For 'TensorDump' ops, open  file failed, the args of 'file' is invalid.")
            return
        path = self._array_name(item.name, item.dtype)
        if path:
            self._save_npy(path, item.array, item.dtype)

    def _need_dump(self, mode: int) -> bool:
        # TDC NeedDump: `return valid_steps_.empty() || valid_steps_.find(step) != valid_steps_.end();`
        return not self.valid_steps or self.step[mode] in self.valid_steps

    def _array_name(self, tensor_path: str, data_type: str) -> str:
        # TDC TensorNameToArrayName: {step} -> step<graph counter> (the item's mode is the default
        # kCallFromCXX for channel items, and from 2.7.1 for the python path too); {rank} -> rank<R>;
        # dtype lower-cased; a trailing ".npy" stripped; "{file}_{dtype}_{id}.npy" with the id of a
        # process-wide counter taken here, for written files only (FetchAddID).
        tensor_path = tensor_path.replace("{step}", f"step{self.step[CALL_FROM_CXX]}")
        tensor_path = tensor_path.replace("{rank}", f"rank{self.rank}")
        parent, _, file_name = tensor_path.rpartition("/")
        if not file_name:
            logger.error("For 'TensorDump' ops, failed to extract file name from the arg of 'file', file is %s",
                         tensor_path)
            return ""
        _create_dirs(parent or ".")
        if file_name.endswith(".npy"):
            file_name = file_name[:-4]
        name_id, self._next_id = self._next_id, self._next_id + 1
        return f"{parent}/{file_name}_{data_type.lower()}_{name_id}.npy"

    def _save_npy(self, file_name: str, array: np.ndarray, dtype: str) -> None:
        # TDU SaveTensor2NPY: bf16 saved as a float32 copy; ChangeFileMode(S_IWUSR); fstream(out | trunc);
        # header; data; close; ChangeFileMode(S_IRUSR): in place under the final name, not atomic, 0400.
        data = np.ascontiguousarray(array, dtype=np.float32 if dtype == "BFloat16" else array.dtype)
        buffer = io.BytesIO()
        np.lib.format.write_array_header_1_0(buffer, np.lib.format.header_data_from_array_1_0(data))
        slow = self.slow_every and len(self.written_files) % self.slow_every == self.slow_every - 1
        with open(file_name, "wb") as out:
            out.write(buffer.getvalue())
            if slow:
                out.flush()
                time.sleep(self.slow_seconds * (0.5 + self._rng.random()))
            out.write(data.tobytes())
        os.chmod(file_name, 0o400)
        self.written_files.append(file_name)

    # ------------------------------------------------------------------ KBK statistics dump
    def _parse_dump_config(self) -> None:
        """DJP Parse(): once per process (`already_parsed_`), and only once MINDSPORE_DUMP_CONFIG is set."""
        if self._kbk_parsed:
            return
        config_path = self.environ.get("MINDSPORE_DUMP_CONFIG", "")
        if not config_path:
            return  # DJP IsDumpEnabled() is false: returns WITHOUT setting already_parsed_
        with open(config_path, encoding="utf-8") as handle:
            self._kbk = _parse_kbk_config(json.load(handle), self.device_id)
        self._kbk_parsed = True

    def _kbk_post_launch(self, launch: _Launch, array: np.ndarray) -> None:
        """DA DebugPostLaunch -> AscendKbkDump -> DU DumpDataViaCallback, rows written at once
        (stat_calc_mode device: DU LaunchDeviceStatCallback with a blocking stream callback)."""
        self._parse_dump_config()
        kbk = self._kbk
        if kbk is None or not kbk.enabled or not _is_dump_iter(kbk.iteration, kbk.iteration_now()):
            return
        if not _kernel_selected(kbk.kernels, launch.scope):
            return
        op_name = launch.scope
        if launch.attrs.get("td_flag"):
            # DA AscendKbkDump: `new_scope_name = input_str + kNameSeparator + scope_name`, kNameSeparator "|".
            op_name = f"{launch.name}|{op_name}"
        if self.csv_op_name_style == "replaced":
            # Up to 2.7.0, DU GetTensorInfoCommFromCnode -> DMU GetFileKernelName: "/", "\\", ".", " " -> "_".
            for old in ("/", "\\", ".", " "):
                op_name = op_name.replace(old, "_")
        # DMU GenerateDumpPath: {path}/rank_{rank}/{net_name}/{graph_id}/{iteration}/; DU Write2File: statistic.csv
        folder = os.path.join(kbk.path, f"rank_{self.rank}", kbk.net_name, "0", str(kbk.iteration_now()))
        rows = []
        if kbk.input_output in (0, 1):  # input slot 1 is the tensor (slot 0, the file name, gets no row here)
            rows.append(("input", 1))
        if kbk.input_output in (0, 2):
            rows.append(("output", 0))
        with self._lock:
            _append_rows(folder, op_name, rows, array, launch.dtype, kbk.categories)


# ---------------------------------------------------------------------------------------------------
# TensorDump inside control flow
# ---------------------------------------------------------------------------------------------------
class ControlFlowCheck:
    """MindSpore documents TensorDump as unsupported inside control flow (DBGF ``tensordump``: "The operator of
    tensordump doesn't support in control flow"; what the device then does is not documented). The emulation
    refuses it when such a dump runs: after each compile while the emulator is in use, the forward TensorDump
    nodes of the optimized top graph are counted (``get_optimize_graph_proto``, anf_ir, by the stand-in's
    ``fn_id``); a dump in a sub-graph (a loop body, a branch of an ``if`` on a tensor, a cell reused without
    inlining) is not among them. Within one graph run (from the start of a graph's run, or a device
    synchronisation, to the next) the
    forward dumps registered by compiled graphs can run only as often as the top graphs hold them; one more
    must come from a sub-graph, and the launch raises. Nodes the compiler pruned never run, so they cannot
    trip it (ascend-emulation.md)."""

    def __init__(self, emulator: AscendEmulator):
        self.emulator = emulator
        self.forward_fn_ids: set = set()
        self.compiled_codes: set = set()
        self.top_nodes = 0
        self.executed = 0
        self._original = None
        self._original_run = None

    @classmethod
    def of(cls, emulator: AscendEmulator) -> ControlFlowCheck:
        check = emulator.__dict__.get("_control_flow_check")
        if check is None:
            check = emulator.__dict__["_control_flow_check"] = cls(emulator)
            check.start()
        return check

    def note_forward_dump_op(self, op) -> None:
        self.forward_fn_ids.add(id(op.func))  # the Custom op's fn_id attribute in the graph proto

    def start(self) -> None:
        executor_class = _graph_executor_class()
        original, check = executor_class.compile, self

        def compile_and_count(executor, obj, *args, **kwargs):
            before = len(check.emulator._launches)
            result = original(executor, obj, *args, **kwargs)
            new = [code for code in range(before, len(check.emulator._launches))
                   if check.emulator._launches[code].scope.startswith("Default/")]  # forward dumps
            if new:
                check.compiled_codes.update(new)
                check.top_nodes += check.count_top_nodes(executor, obj)
                check.executed = 0
            return result

        original_run = executor_class.run

        def run_counted(executor, obj, *args, **kwargs):
            check.new_run()  # CPU graph runs are synchronous: the previous run's dumps have all run
            return original_run(executor, obj, *args, **kwargs)

        self._original, self._original_run = original, original_run
        executor_class.compile = compile_and_count
        executor_class.run = run_counted

    def stop(self) -> None:
        if self._original is not None:
            _graph_executor_class().compile = self._original
            _graph_executor_class().run = self._original_run
            self._original = self._original_run = None

    def count_top_nodes(self, executor, obj) -> int:
        try:
            from mindspore.train import anf_ir_pb2

            proto = executor.get_optimize_graph_proto(obj)
        except (ImportError, AttributeError, RuntimeError) as err:  # another MindSpore: the check stands down
            logger.warning("TensorDump control-flow check off: the optimized graph cannot be read (%s)", err)
            self.compiled_codes.clear()
            return 0
        model = anf_ir_pb2.ModelProto()
        model.ParseFromString(proto or b"")
        found = 0
        for node in model.graph.node:
            attrs = {a.name: a.value for a in node.attribute}
            if node.op_type == "Custom" and "fn_id" in attrs and attrs["fn_id"].int_val in self.forward_fn_ids:
                found += 1
        return found

    def new_run(self) -> None:
        self.executed = 0

    def on_launch(self, code: int) -> None:
        if code not in self.compiled_codes:  # registered eagerly (PyNative), or the check stood down
            return
        self.executed += 1
        if self.executed > self.top_nodes:
            raise EmulatedMindSporeError(
                f"a TensorDump ran {self.executed} times in one graph run, but the compiled top graphs hold "
                f"{self.top_nodes}: it runs inside control flow (a loop body or a branch on a tensor condition); "
                "the operator of tensordump doesn't support in control flow")


def _graph_executor_class():
    try:
        from mindspore.graph.api import _CellGraphExecutor
    except ImportError:  # MindSpore < 2.9
        from mindspore.common.api import _CellGraphExecutor
    return _CellGraphExecutor


# ---------------------------------------------------------------------------------------------------
# the parallel pass's per-consumer dumps
# ---------------------------------------------------------------------------------------------------
class RedistributedValue:
    """A probed value and its consumers, and what MindSpore's parallel pass does to its dumps (PTD, v2.9.0).

    ``ParallelProcessor::StepRedistribution`` (SP's parallel processor) hands every parallel-care consumer
    of the value (``RedistributionNextNode``) to ``RedistributionParallelTensorDumpHandler``, whether or not
    ``Redistribution`` inserted an operator for it (it only logs "No Redistribution Operators Insert").
    ``HandleDumpAfterRedistributionNode`` walks back from each consumer's input through the redistribution
    ops, then Depend, InsertGradientOf, Cast, Reshape and DumpGradient (``CollectNodePathBetween``), takes the
    ``'in'`` TensorDumps hanging off that path and its ``'out'`` DumpGradients, and for each consumer puts a
    clone of each on the consumer's input (``MakeOutModeDumpBwdHookAfterRedistribution``,
    ``InsertNewTensorDump``: same file input, the consumer's scope, ``side_effect_hidden``), attached to
    ``last_insert_redistribution_op`` = the consumer's input itself. Then it deletes the originals everywhere
    (``fg_manager->Replace(dump, parent)``, ``Replace(hook, prenode)``). Hence:

    * every consumer gets a copy, also one in the producer's layout (layout ``"same"``: no redistribution);
    * a copy holds the value as the consumer takes it, after any Cast on the path (a capture's cast back
      from its float32 copy): its dtype is the consumer's input dtype, whatever the file name says;
    * a user outside the handler's consumers (layout ``"outside"``, e.g. the graph's return) gets no copy,
      and the original ``'out'`` hook is gone for it too: its gradient contribution is dumped nowhere;
    * an ``'in'`` DumpGradient on the path is neither cloned nor deleted (``CollectBwdDumpHookAlongPath``
      keeps ``'out'`` hooks only): it stays on the producer side, after autodiff has summed the
      gradients of every user, consumers and outside users alike;
    * copies of one shard shape may cover different regions (layouts ``"half"`` and ``"upper"``: the
      lower and upper half of the last axis); nothing in the files tells them apart.

    The redistribution itself does not exist on one CPU. The test's network calls ``consumer(i)`` on the
    probed value where consumer i takes it (``"half"``/``"upper"`` keep half of its last axis, this rank's
    shard of a split layout; their backward pads with zeros, as a redistribution's backward returns the
    gradient to the producer's layout). Which dumps the walk finds is decided by MindSpore from the graph;
    here the test names the probe (``bind``, after attach: the stems of its forward and gradient files,
    tests/support/formats.raw_stem), and only a forward ``'in'`` dump and an ``'out'`` gradient hook of those
    stems are taken (the modes the pass moves).
    """

    LAYOUTS = ("same", "half", "upper", "outside")

    def __init__(self, emulator: AscendEmulator, layouts: Sequence[str]):
        unknown = [layout for layout in layouts if layout not in self.LAYOUTS]
        if unknown:
            raise ValueError(f"unknown consumer layouts {unknown}; known: {self.LAYOUTS}")
        self.emulator, self.layouts = emulator, tuple(layouts)
        self.stems: Optional[tuple] = None
        self._clones: Dict[tuple, _Launch] = {}
        emulator.redistributed = list(getattr(emulator, "redistributed", [])) + [self]

    def bind(self, forward_stem: str, gradient_stem: str) -> None:
        self.stems = (forward_stem.replace("-", "."), gradient_stem.replace("-", "."))

    def _matches(self, launch: _Launch, direction: int) -> bool:
        """Forward: the value's 'in' TensorDump (PPP named it ``_in.npy``); backward: its 'out' DumpGradient.

        The launch of a DumpGradient carries its inner TensorDump's attributes (always 'out', GDO), not the
        hook's mode; PPP ``DecorateDumpPathIfDumpOps`` has appended ``_in.npy`` to the file of every 'in'
        DumpGradient, so a gradient launch named exactly the bound stem is an 'out' hook, the only kind
        PTD ``CollectBwdDumpHookAlongPath`` collects (``GetDumpHookInputOutputAttr(node) != OUT_MODE``:
        skipped). An 'in' hook is left where it is and dumps the whole gradient."""
        if self.stems is None:
            return False
        name = os.path.basename(launch.name).replace("-", ".")
        if direction == 0:
            return launch.attrs.get("input_output") == "in" and name == self.stems[0] + "_in.npy"
        return launch.scope.startswith("Gradients/") and name == self.stems[1]

    def deletes(self, launch: _Launch) -> bool:
        return self._matches(launch, 0) or self._matches(launch, 1)

    def consumer(self, index: int) -> Callable:
        """Graph-parsable ``redistribute(x)`` for consumer ``index``: its layout, then the pass's new dumps."""
        layout = self.layouts[index]
        if layout == "outside":
            def untouched(x):  # not a parallel-care consumer: no copy, and its gradient passes undumped
                return x
            return untouched
        value, code = self, index

        def forward_body(x, low):
            value._dump(code, 0, x, low)
            return x

        def backward_body(dout, low):
            value._dump(code, 1, dout, low)
            return dout

        record_gradient = _host_op(backward_body)

        def bprop(x, low, out, dout):
            return record_gradient(dout, low), ops.zeros_like(low)

        hook, int32, cast, is_bf16 = _host_op(forward_body, bprop=bprop), ms.int32, ops.cast, _is_bf16_helper()
        width = {"half": (0, 2), "upper": (1, 2)}.get(layout)

        def take(x):
            if width is None:
                return x
            size = x.shape[-1] // width[1]
            return x[..., width[0] * size:(width[0] + 1) * size]

        def redistribute(x):
            x = take(x)
            if is_bf16(x.dtype):  # a pyfunc takes no bfloat16: the host op sees a float32 copy
                return cast(hook(cast(x, ms.float32), Tensor(1, int32)), ms.bfloat16)
            return hook(x, Tensor(0, int32))

        return redistribute

    def _dump(self, consumer: int, direction: int, x, low) -> None:
        originals = [launch for launch in self.emulator._launches if self._matches(launch, direction)]
        if not originals:
            return  # nothing dumped this value in that direction
        original = originals[0]
        clone = self._clones.get((consumer, direction))
        if clone is None:
            attrs = dict(original.attrs, side_effect_hidden=True)
            scope = f"Default/consumer{consumer}/TensorDump-op{len(self.emulator._launches)}"
            if direction:
                scope = "Gradients/" + scope
            # InsertNewTensorDump: the clone's input is the consumer's input, so its dtype is the consumer's
            # (BFloat16 after a capture's cast back), whatever dtype the original was registered with.
            dtype = "BFloat16" if int(np.asarray(low)) else original.dtype
            clone = self._clones[(consumer, direction)] = _Launch(original.name, dtype, attrs, scope)
        self.emulator._launch(clone, x)


class ForwardCommunication:
    """An op whose output MindSpore completes with a forward AllReduce (e.g. a row-parallel MatMul), and
    what the parallel pass does to an ``'out'`` TensorDump of that output (PTD, v2.9.0).

    SP ``InserForwardCommunicationForSingleOutput`` builds a ``FwdCommunicationParallelTensorDumpHandler``,
    whose ``CollectDumpNodes`` -> ``CollectDumpNodesRecursively`` gathers the TensorDumps among the op's
    users and, recursively, the users of Depend, InsertGradientOf, DumpGradient and Reshape (NOT Cast);
    after the communication replaces the op, ``MakeOutModeDumpBeforeFwdComm`` sets input 2 of every
    ``'out'`` one of them back to the op's own output: the value before the AllReduce, this rank's
    partial sum. A dump behind a Cast (a capture's float32 copy of a bfloat16 value) is not reached and
    keeps the reduced value. ``MakeInModeBwdHookBeforeFwdComm`` likewise moves every ``'in'`` DumpGradient
    it gathered to between the op and the communication; not modelled: the stand-in's backward passes the
    gradient through unchanged, so a hook before it and one after it dump the same values.

    On one CPU there is no other rank: ``allreduce`` stands in for the sum over ``ranks`` ranks holding the
    same partial (the output is ``ranks`` times it). The test names the dump (``bind``: its forward stem);
    whether the walk reaches it is decided here from the stem: a widened stem (``-w{dtype}``, the only
    Cast a capture puts between a value and its dump) is not reached, any other is.
    """

    def __init__(self, emulator: AscendEmulator, ranks: int = 2):
        self.emulator, self.ranks = emulator, ranks
        self.stem: Optional[str] = None
        self.partial: Optional[np.ndarray] = None
        emulator.forward_comms = list(getattr(emulator, "forward_comms", [])) + [self]

    def bind(self, forward_stem: str) -> None:
        self.stem = forward_stem.replace("-", ".")

    def allreduce(self) -> Callable:
        comm, ranks = self, self.ranks

        def body(x, unused):
            comm.partial = np.array(x, copy=True)
            return x * ranks

        def bprop(x, unused, out, dout):  # the sum's gradient w.r.t. this rank's partial
            return dout, ops.zeros_like(unused)

        op, int32 = ops.Custom(body, out_shape=_same_shape, out_dtype=_same_dtype, func_type="pyfunc",
                               bprop=bprop), ms.int32
        cast, is_bf16 = ops.cast, _is_bf16_helper()

        def allreduce(x):
            if is_bf16(x.dtype):  # a pyfunc takes no bfloat16 (exact: the sum of equal bfloat16 partials)
                return cast(op(cast(x, ms.float32), Tensor(0, int32)), ms.bfloat16)
            return op(x, Tensor(0, int32))

        return allreduce

    def repoints(self, launch: _Launch) -> bool:
        if self.stem is None or launch.attrs.get("input_output") != "out" or launch.scope.startswith("Gradients/"):
            return False
        name = os.path.basename(launch.name).replace("-", ".")
        return name == self.stem


# ---------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------
_NUMPY_NAMES = {"Float16": "float16", "Float32": "float32", "Float64": "float64", "Int8": "int8",
                "Int16": "int16", "Int32": "int32", "Int64": "int64", "UInt8": "uint8", "Bool": "bool"}


def _identity(x, code):
    return x


def _same_shape(x_shape, code_shape):
    return x_shape


def _same_dtype(x_dtype, code_dtype):
    return x_dtype


def _host_op(body: Callable, bprop: Optional[Callable] = None):
    """The stand-in kernel: an identity pyfunc ``(x, code) -> x`` running ``body`` on the host."""
    if bprop is None:
        zeros_like = ops.zeros_like

        def bprop(x, code, out, dout):  # GDO bprop_tensor_dump: no gradient flows through a TensorDump
            return zeros_like(x), zeros_like(code)

    return ops.Custom(body, out_shape=_same_shape, out_dtype=_same_dtype, func_type="pyfunc", bprop=bprop)


def _is_bf16_helper():
    @constexpr
    def is_bf16(dtype):
        return str(dtype) == "BFloat16"

    return is_bf16


def _host_array(tensor) -> np.ndarray:
    if isinstance(tensor, Tensor):
        return (tensor.astype(ms.float32) if tensor.dtype == ms.bfloat16 else tensor).asnumpy()
    return np.asarray(tensor)


def _dtype_name(tensor) -> str:
    return str(tensor.dtype) if isinstance(tensor, Tensor) else "Float32"


def _create_dirs(path: str) -> None:
    # FS CreateDir: `DEFAULT_MKDIR_MODE = 0700`, each missing level (FileUtils::CreateNotExistDirs).
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        sub = "/".join(parts[:i])
        if sub and not os.path.isdir(sub):
            try:
                os.mkdir(sub, 0o700)
            except FileExistsError:
                pass


def _is_dump_iter(iteration: str, value: int) -> bool:
    # DJP IsDumpIter / IsIterInRange: "all", or '|'-separated items, each N or N-M.
    if iteration == "all":
        return True
    for item in iteration.split("|"):
        low, dash, high = item.partition("-")
        if dash and low.isdigit() and high.isdigit() and int(low) <= value <= int(high):
            return True
        if not dash and item.isdigit() and int(item) == value:
            return True
    return False


def _kernel_selected(kernels: List[str], scope: str) -> bool:
    # DJP ParseKernels: an entry without '/' and without "-op" is an op type; else a full name.
    for kernel in kernels:
        if "/" not in kernel and "-op" not in kernel:
            if kernel == "TensorDump":
                return True
        elif kernel == scope:
            return True
    return False


def _parse_common(common: Dict[str, Any]) -> None:
    for key in ("dump_mode", "net_name", "iteration", "input_output", "kernels", "support_device"):
        if key not in common:  # DJP ParseCommonDumpSetting -> CheckJsonKeyExist
            raise EmulatedMindSporeError(f"Check dump json failed, {key} not found")
    iteration = common["iteration"]
    # DJP ParseIteration
    if not isinstance(iteration, str) or not iteration or (
            iteration != "all" and not all(c.isdigit() or c in "-|" for c in iteration)):
        raise EmulatedMindSporeError(f"iteration only supports digits, {{'-', '|'}}, or just \"all\" but got: "
                                     f"{iteration}")
    path = common.get("path", "")
    # DJP ParseDumpPath (isalpha/isdigit on ASCII)
    if not path or not all(c.isascii() and (c.isalnum() or c in "-_/") for c in path):
        raise EmulatedMindSporeError(f"Dump path only support alphabets, digit or {{'-', '_', '/'}}, but got:{path}")
    if not path.startswith("/"):
        raise EmulatedMindSporeError("Dump path only support absolute path and should start with '/'")
    if common["input_output"] not in (0, 1, 2):  # DJP ParseInputOutput
        raise EmulatedMindSporeError("Dump Json Parse Failed. input_output should be 0, 1, 2")
    if common.get("saved_data", "tensor") not in ("statistic", "tensor", "full"):  # DJP ParseSavedData
        raise EmulatedMindSporeError("Dump Json parse failed, saved_data only supports statistic, tensor, or full")


def _parse_kbk_config(config: Dict[str, Any], device_id: int) -> _Kbk:
    common = config.get("common_dump_settings")
    if common is None:
        raise EmulatedMindSporeError("Check dump json failed, common_dump_settings not found")
    _parse_common(common)
    e2e = config.get("e2e_dump_settings")
    stat_mode = (e2e or {}).get("stat_calc_mode", "host")  # DJP ParseStatCalcMode (default host)
    categories = list(common.get("statistic_category", ["max", "min", "l2norm"]))  # kDefaultStatisticCategory
    unknown = [c for c in categories if c not in HOST_STATISTICS]
    if unknown:  # DJP ParseStatisticCategory: unknown names raise
        raise EmulatedMindSporeError(f"The following statistic_category is invalid:{', '.join(unknown)}, ")
    allowed = DEVICE_STATISTICS if stat_mode == "device" else HOST_STATISTICS
    dropped = [c for c in categories if c not in allowed]
    if dropped:  # ... valid names the device cannot compute: a warning, and they are dropped
        logger.warning("The following statistic_category only support to be compute on host:%s", dropped)
    enabled = e2e is not None and common.get("saved_data", "tensor") in ("statistic", "full")
    if device_id not in set(common["support_device"]):  # DJP JudgeDumpEnabled: disabled with a warning
        logger.warning("Dump is not enabled. device_id:%d not support", device_id)
        enabled = False
    return _Kbk(path=common["path"], net_name=common["net_name"], iteration=common["iteration"],
                input_output=common["input_output"], kernels=[str(k) for k in common["kernels"]],
                categories=[c for c in categories if c in allowed], enabled=enabled)


def _statistic(name: str, data: np.ndarray) -> str:
    flat = data.astype(np.float64).reshape(-1)
    values = {"max": flat.max, "min": flat.min, "avg": flat.mean, "l2norm": lambda: np.sqrt(flat @ flat)}
    if name not in values:
        return "null"  # DU Write2File: a category without a result is written as "null"
    # The number format of Tensor::DataToString is not settled from source: repr of a float32.
    return repr(float(np.float32(values[name]())))


def _round_to(value: float, dtype: str) -> float:
    """``value`` rounded to nearest-even in a 16-bit float dtype (bfloat16: the top half of a float32)."""
    if dtype == "Float16":
        return float(np.float16(value))
    if dtype != "BFloat16":
        return value
    bits = np.array([value], np.float32).view(np.uint32)
    if np.isfinite(value):
        bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return float(bits.view(np.float32)[0])


def _device_statistic(name: str, data: np.ndarray, dtype: str) -> str:
    """A statistic as the device kernel gives it: its result tensor is allocated in the INPUT's dtype
    (statistic_kernel.cc: GetOutputDeviceAddress(input->dtype_id())), so a bfloat16/float16 input's
    max/min/mean/norm come back rounded to that dtype (the accumulation itself is not settled from
    source; here float64, so only the result's rounding is modelled)."""
    text = _statistic(name, data)
    if text == "null" or dtype not in ("BFloat16", "Float16"):
        return text
    return repr(float(np.float32(_round_to(float(text), dtype))))


def _append_rows(folder: str, op_name: str, rows, array: np.ndarray, dtype: str, categories: List[str]) -> None:
    """DU Write2File + CSV WriteToCsv: the header once (no trailing comma), each value followed by ','."""
    if array.size == 0:
        return  # DU Write2File: "Dump tensor size is 0 ... Skip it"
    _create_dirs(folder)
    path = os.path.join(folder, "statistic.csv")
    first = not os.path.exists(path)
    with open(path, "a", encoding="utf-8") as out:
        if first:
            out.write(",".join([CSV_HEADER] + [CSV_COLUMNS[c] for c in categories]) + "\n")
        for io_name, slot in rows:
            nbytes = array.size * (2 if dtype in ("BFloat16", "Float16") else array.itemsize)
            shape = '"(' + ",".join(str(d) for d in array.shape) + ')"'  # DU ShapeToString
            # Task ID 0; a timestamp per tensor (Common::GetTimeStamp()); TypeIdToString(type, true): lower case.
            values = ["TensorDump", op_name, "0", "0", str(time.time_ns() // 1000), io_name, str(slot),
                      str(nbytes), dtype.lower(), shape] + [_device_statistic(c, array, dtype) for c in categories]
            out.write("".join(v + "," for v in values) + "\n")


# ---------------------------------------------------------------------------------------------------
# driver: examples/run_tiny_llama.py with the emulated primitives
# ---------------------------------------------------------------------------------------------------
def _install(emulator: AscendEmulator) -> None:
    """Every ``AscendPrimitives.from_mindspore()`` of this process returns the emulator's primitives."""
    AscendPrimitives.from_mindspore = classmethod(lambda cls: emulator.primitives())


def _install_user_tensordump(emulator: AscendEmulator) -> None:
    """``P.TensorDump()`` of other code in the process (MindFormers' ``MFTrainOneStepCell`` dumps its training
    monitor's ``finish_step`` and ``device_local_norm`` with it) builds the emulator's TensorDump stand-in."""
    from mindspore.ops import operations

    operations.TensorDump = lambda input_output="out": emulator.tensordump(input_output)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parallel", action="store_true", help="emulate a (semi-)auto parallel graph's naming")
    parser.add_argument("--latency", type=float, default=0.002)
    parser.add_argument("--slow-every", type=int, default=7)
    parser.add_argument("--slow-seconds", type=float, default=0.02)
    parser.add_argument("--report", help="write the emulator's written files and counters here (JSON)")
    parser.add_argument("--user-tensordump", action="store_true",
                        help="other code's P.TensorDump() (MindFormers' training monitor) uses the emulation too")
    parser.add_argument("runner_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    # What MindSpore reads from the process environment (EV, AC), and this worker's rank under msrun.
    environ = {k: os.environ[k] for k in ("MS_DUMP_SLICE_SIZE", "MS_DUMP_WAIT_TIME", "MS_KERNEL_LAUNCH_SKIP")
               if k in os.environ}
    emulator = AscendEmulator(rank=int(os.environ.get("RANK_ID", "0")), parallel=args.parallel, latency=args.latency,
                              slow_every=args.slow_every, slow_seconds=args.slow_seconds, environ=environ)
    _install(emulator)
    if args.user_tensordump:
        _install_user_tensordump(emulator)
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
    sys.path.insert(0, examples)
    import run_tiny_llama

    try:
        return run_tiny_llama.main([a for a in args.runner_args if a != "--"])
    finally:
        emulator.drain()
        if args.report:
            with open(args.report, "w", encoding="utf-8") as handle:
                json.dump({"written": emulator.written_files, "graph_step": emulator.step[CALL_FROM_CXX]}, handle)
        emulator.close()


if __name__ == "__main__":
    sys.exit(main())
