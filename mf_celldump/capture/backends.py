"""Capture backends: how one captured value reaches the raw tree.

Every backend offers the same two faces:

* ``pynative_forward(value, key, mode)`` / ``pynative_backward(tensor, key, mode)``:
  called from plain Python when the wrapped ``construct`` runs eagerly; the key
  carries the exact call index and the step is known.
* ``graph_probe(value, head, path, use_in_mode)``: a function MindSpore's graph
  compiler can parse (only primitives, ``constexpr`` helpers and closures over them),
  inserted into the graph once per captured value; it handles forward and backward
  capture of that value. Call indices are unknown at graph build time (``n x`` in the
  raw name) and inferred by processing; the step comes from the runtime when the op
  executes (host op) or from MindSpore's ``{step}`` path placeholder (TensorDump).

Which paths are verified here (CPU, MindSpore 2.9): ``host`` in PyNative and Graph
mode, ``tensordump`` and ``device_stats`` in PyNative. ``tensordump`` in Graph mode
and ``kbk_statistics`` need Ascend and are written from MindSpore's documentation.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops
from mindspore.ops.primitive import constexpr

from mf_celldump import naming
from mf_celldump.capture.runtime import CaptureRuntime
from mf_celldump.capture.writer import RawWriter
from mf_celldump.config import DumpConfig
from mf_celldump.dtypes import dtype_names, mindspore_dtype_name, numpy_dtype_name
from mf_celldump.statistics import STAT_KEYS, compute_statistics

logger = logging.getLogger(__name__)

# Dtype codes carried in host-op keys (0-d tensors reach a pyfunc as Python scalars,
# so the dtype cannot be read back from the value).
_DTYPE_NAMES = dtype_names()
_NO_DTYPE = -1


@dataclass(frozen=True)
class BackendChoice:
    name: str
    reason: str


def choose_backend(config: DumpConfig, device: str, graph_mode: bool) -> BackendChoice:
    """Pick the capture backend for this device and execution mode (or honour the config)."""
    if config.backend != "auto":
        return BackendChoice(config.backend, "set by the configuration key 'backend'")
    mode = "graph" if graph_mode else "PyNative"
    if config.task == "statistics":
        if graph_mode and device == "Ascend":
            return BackendChoice("kbk_statistics", "Ascend graph mode: kernel-by-kernel statistics dump")
        if graph_mode:
            return BackendChoice("host", f"{device} graph mode has no TensorDump kernel; statistics on host")
        return BackendChoice("device_stats", "PyNative: statistics reduced on the device, numbers moved")
    if graph_mode and device != "Ascend":
        return BackendChoice("host", f"{device} graph mode has no TensorDump kernel; host capture op")
    if device in ("Ascend", "CPU"):
        return BackendChoice("tensordump", f"TensorDump/DumpGradient work on {device} in {mode} mode")
    return BackendChoice("host", f"no TensorDump on {device}; host capture op")


class _BackendBase:
    name = "base"

    def __init__(self, config: DumpConfig, runtime: CaptureRuntime, writer: RawWriter):
        self.config = config
        self.runtime = runtime
        self.writer = writer

    def manifest_fields(self) -> dict:
        return {"step_numbering": "global", "graph_step_base": 0}

    def setup(self, initial_step: int) -> None:
        """Called once at attach, before any compile."""

    def teardown(self) -> None:
        """Called at detach."""

    def finish_step(self) -> None:
        """Called when a captured step ends, after the device has been synchronised."""

    def _value_record(self, key: naming.ProbeKey, value: Any) -> None:
        record = _record_head(key, self.runtime.next_seq())
        record["value"] = value
        self.writer.append_record(self.runtime.step, record)


def _record_head(key: naming.ProbeKey, seq: int) -> dict:
    return {
        "seq": seq,
        "cell": key.cell_id,
        "dir": key.direction,
        "slot": key.slot,
        "kind": key.vkind,
        "call": key.call,
        "path": list(key.path),
    }


def _python_value_kind(value: Any) -> Optional[str]:
    if value is None:
        return naming.VKIND_NONE
    if isinstance(value, (bool, np.bool_)):
        return naming.VKIND_BOOL
    if isinstance(value, (int, np.integer)):
        return naming.VKIND_INT
    if isinstance(value, (float, np.floating)):
        return naming.VKIND_FLOAT
    return None


# ---------------------------------------------------------------------------
# Host capture op: an identity pyfunc Custom op whose Python body writes the data.
# ---------------------------------------------------------------------------


class HostBackend(_BackendBase):
    """Identity ``ops.Custom`` pyfunc ops: Python runs when the op executes, in any mode.

    The op takes ``(x, key)`` where ``key`` is a small int32 tensor (dtype code + probe
    key codes), so one op instance serves every probe. Its ``bprop`` passes the
    incoming gradient through a second pyfunc op that records it. Their outputs feed the
    graph, so the compiler keeps them; only the op recording non-tensor values (whose
    output is unused) carries ``side_effect_io``. Execution is asynchronous in graph
    mode, so the session synchronises before marking a step complete.
    """

    name = "host"

    def __init__(self, config, runtime, writer):
        super().__init__(config, runtime, writer)
        forward_enabled = config.captures_forward
        backward_enabled = config.captures_backward

        def same_shape(x_shape, key_shape):
            return x_shape

        def same_dtype(x_dtype, key_dtype):
            return x_dtype

        def forward_body(x, key):
            if forward_enabled:
                self._emit(x, key, naming.FORWARD)
            return x

        def backward_body(dout, key):
            self._emit(dout, key, naming.BACKWARD)
            return dout

        grad_op = ops.Custom(backward_body, out_shape=same_shape, out_dtype=same_dtype, func_type="pyfunc")
        zeros_like = ops.zeros_like

        if backward_enabled:

            def bprop(x, key, out, dout):
                return (grad_op(dout, key), zeros_like(key))

        else:

            def bprop(x, key, out, dout):
                return (dout, zeros_like(key))

        probe_op = ops.Custom(
            forward_body, out_shape=same_shape, out_dtype=same_dtype, func_type="pyfunc", bprop=bprop
        )
        self._probe_op = probe_op
        # Non-tensor values: the op's output is unused, so only side_effect_io keeps it.
        value_op = ops.Custom(forward_body, out_shape=same_shape, out_dtype=same_dtype, func_type="pyfunc")
        value_op.add_prim_attr("side_effect_io", True)
        self._value_op = value_op

    # -- executed inside the capture op ------------------------------------------
    def _emit(self, data, key, direction: str) -> None:
        runtime = self.runtime
        if not runtime.active:
            return
        codes = np.asarray(key).reshape(-1).tolist()
        dtype_code, probe_codes = codes[0], codes[1:]
        pkey = naming.ProbeKey.from_codes(probe_codes, direction)
        if pkey.vkind != naming.VKIND_TENSOR:
            self._value_record(pkey, _scalar_value(data, pkey.vkind))
            return
        dtype = _DTYPE_NAMES[dtype_code] if 0 <= dtype_code < len(_DTYPE_NAMES) else None
        array = np.asarray(data)
        if dtype and dtype != "bfloat16" and array.dtype.name != dtype:
            array = array.astype(dtype)  # a 0-d tensor arrives as a Python scalar
        dtype = dtype or array.dtype.name
        seq = runtime.next_seq()
        if self.config.task == "tensor":
            self.writer.write_tensor(runtime.step, pkey, array, dtype, seq)
        else:
            record = _record_head(pkey, seq)
            record["dtype"] = mindspore_dtype_name(dtype)
            record["shape"] = list(array.shape)
            record["stats"] = compute_statistics(array, self.config.statistics)
            self.writer.append_record(runtime.step, record)

    # -- PyNative face ----------------------------------------------------------------
    def pynative_forward(self, value, key: naming.ProbeKey, mode: str):
        if isinstance(value, Tensor):
            return self._probe_op(value, Tensor(_dtype_code(value.dtype) + key.to_codes(), dtype=ms.int32))
        kind = _python_value_kind(value)
        if kind is not None and self.config.captures_forward:
            self._value_record(_with_kind(key, kind), _plain_python(value))
        return value

    def pynative_backward(self, tensor, key: naming.ProbeKey, mode: str):
        # The probe op's bprop records the gradient; pynative_forward inserted it already.
        return tensor

    # -- graph face ---------------------------------------------------------------------
    def graph_probe_function(self) -> Callable:
        probe_op, value_op = self._probe_op, self._value_op
        forward_enabled = self.config.captures_forward
        int32, int64, float32, bool_ = ms.int32, ms.int64, ms.float32, ms.bool_
        _graph_key_codes = _make_graph_key_codes()

        def graph_probe(value, head, path, use_in):
            if isinstance(value, Tensor):
                return probe_op(value, Tensor(_graph_key_codes(head, 0, path, value.dtype), int32))
            if forward_enabled:
                if value is None:
                    value_op(Tensor(0, int32), Tensor(_graph_key_codes(head, 4, path, None), int32))
                elif isinstance(value, bool):
                    value_op(Tensor(value, bool_), Tensor(_graph_key_codes(head, 3, path, None), int32))
                elif isinstance(value, int):
                    value_op(Tensor(value, int64), Tensor(_graph_key_codes(head, 1, path, None), int32))
                elif isinstance(value, float):
                    value_op(Tensor(value, float32), Tensor(_graph_key_codes(head, 2, path, None), int32))
            return value

        return graph_probe


def _scalar_value(data, vkind: str):
    if vkind == naming.VKIND_NONE:
        return None
    value = np.asarray(data).reshape(-1)[0].item()
    if vkind == naming.VKIND_BOOL:
        return bool(value)
    if vkind == naming.VKIND_INT:
        return int(value)
    return float(value)


def _plain_python(value):
    if isinstance(value, np.generic):
        return value.item()
    return value


def _with_kind(key: naming.ProbeKey, kind: str) -> naming.ProbeKey:
    return naming.ProbeKey(key.cell_id, key.direction, key.slot, kind, key.path, key.call)


def _dtype_code(ms_dtype) -> Tuple[int]:
    name = _numpy_name_of(ms_dtype)
    return (_DTYPE_NAMES.index(name) if name in _DTYPE_NAMES else _NO_DTYPE,)


def _numpy_name_of(ms_dtype) -> str:
    """``mindspore.float32`` -> ``float32`` (MindSpore prints dtypes as ``Float32``)."""
    return numpy_dtype_name(str(ms_dtype))






def _make_graph_key_codes():
    @constexpr
    def graph_key_codes(head, vkind_code, path, ms_dtype):
        # Runs in Python at graph compile time: everything here is a constant.
        dtype = _dtype_code(ms_dtype) if ms_dtype is not None else (_NO_DTYPE,)
        return dtype + (head[0], head[1], vkind_code, naming.UNKNOWN_CALL) + tuple(path)

    return graph_key_codes


# ---------------------------------------------------------------------------
# MindSpore TensorDump / DumpGradient
# ---------------------------------------------------------------------------


class TensorDumpBackend(_BackendBase):
    """``ops.TensorDump`` for forward values and ``ops.DumpGradient`` for gradients.

    PyNative (verified on CPU): the file path holds the step folder and the exact call
    index; TensorDump appends ``_{dtype}_{id}.npy`` (``_in_...`` in "in" mode) and
    writes synchronously on CPU. Graph mode (Ascend only, from MindSpore's docs): the
    path holds MindSpore's ``{step}`` placeholder, so step folders follow the graph's
    own step counter; the manifest records the global step at attach as
    ``graph_step_base`` and step selection goes through TensorDump's step filter.
    """

    name = "tensordump"
    stem_separator = "."

    def __init__(self, config, runtime, writer):
        super().__init__(config, runtime, writer)
        self._dump_out = ops.TensorDump()
        self._dump_in = ops.TensorDump("in")
        self._grad = ops.DumpGradient()
        self._graph_step_base = 0
        # PyNative gradients: DumpGradient builds a new InsertGradientOf per call, which
        # costs ~1.5 ms on CPU; a cached hook per probe that calls TensorDump does the same.
        self._gradient_hooks = GradientHookCache(runtime, self._dump_gradient)

    def manifest_fields(self) -> dict:
        return {"step_numbering": "global", "graph_step_base": self._graph_step_base}

    def _path(self, key: naming.ProbeKey) -> str:
        stem = naming.raw_stem(key, self.stem_separator)
        return os.path.join(self.writer.step_dir(self.runtime.step), stem)

    def pynative_forward(self, value, key: naming.ProbeKey, mode: str):
        if not self.config.captures_forward:
            return value
        op = self._dump_in if mode == "in" else self._dump_out
        if isinstance(value, Tensor):
            op(self._path(key), value)
            return value
        kind = _python_value_kind(value)
        if kind is not None:
            # Non-tensor values travel as scalar tensors so they share TensorDump's order.
            scalar = 0 if value is None else _plain_python(value)
            op(self._path(_with_kind(key, kind)), Tensor(scalar))
        return value

    def pynative_backward(self, tensor, key: naming.ProbeKey, mode: str):
        return self._gradient_hooks.apply(tensor, key, mode)

    def _dump_gradient(self, gradient, key: naming.ProbeKey, mode: str) -> None:
        (self._dump_in if mode == "in" else self._dump_out)(self._path(key), gradient)

    def graph_probe_function(self) -> Callable:
        dump_out, dump_in, grad = self._dump_out, self._dump_in, self._grad
        depend = ops.depend
        forward_enabled = self.config.captures_forward
        backward_enabled = self.config.captures_backward
        prefix = os.path.join(self.writer.rank_dir, "{step}") + os.sep
        sep = self.stem_separator
        graph_path = _make_graph_path()

        def graph_probe(value, head, path, use_in):
            if isinstance(value, Tensor):
                if backward_enabled:
                    value = grad(graph_path(prefix, head, "b", path, sep), value, "in" if use_in else "out")
                if forward_enabled:
                    name = graph_path(prefix, head, "f", path, sep)
                    if use_in:
                        value = depend(value, dump_in(name, value))
                    else:
                        value = depend(value, dump_out(name, value))
            return value

        return graph_probe

    def setup(self, initial_step: int) -> None:
        if ms.get_context("mode") != ms.GRAPH_MODE:
            return
        # Graph mode: folders follow the graph step counter, which starts at 0 in every
        # process; record where the global count stands, and pass the step filter.
        self._graph_step_base = initial_step
        steps = self.config.steps
        if not steps.selects_all:
            try:
                from mindspore._c_expression import _tensordump_set_step  # private API, guarded
            except ImportError:
                logger.warning("this MindSpore has no TensorDump step filter; every step will be dumped")
            else:
                graph_steps = sorted(s - initial_step for s in steps.values if s >= initial_step)
                _tensordump_set_step(graph_steps)


def _make_graph_path():
    @constexpr
    def graph_path(prefix, head, direction_letter, path, sep):
        # Compile-time: builds the TensorDump file path from constants.
        key = naming.ProbeKey(
            cell_id=head[0],
            direction=naming.FORWARD if direction_letter == "f" else naming.BACKWARD,
            slot=naming.CODE_SLOTS[head[1]],
            vkind=naming.VKIND_TENSOR,
            path=tuple(path),
            call=None,
        )
        return prefix + naming.raw_stem(key, sep)

    return graph_path


class KbkStatisticsBackend(TensorDumpBackend):
    """Ascend graph-mode statistics through MindSpore's kernel-by-kernel dump.

    The graph carries TensorDump ops as markers; MindSpore's dump (configured through
    ``MINDSPORE_DUMP_CONFIG``) writes statistics of their inputs to ``statistic.csv``
    files and ``MS_KERNEL_LAUNCH_SKIP=TensorDump`` keeps the ops from writing tensors.
    Written from MindSpore's documentation; not runnable on CPU.
    """

    name = "kbk_statistics"
    stem_separator = "-"
    _STAT_NAMES = {"max": "max", "min": "min", "mean": "avg", "norm": "l2norm", "md5": "md5"}

    def __init__(self, config, runtime, writer):
        super().__init__(config, runtime, writer)
        self._saved_env = {}

    def manifest_fields(self) -> dict:
        return {"step_numbering": "graph", "graph_step_base": self._graph_step_base}

    def setup(self, initial_step: int) -> None:
        self._graph_step_base = initial_step
        from mf_celldump.fsutil import atomic_write_json, ensure_dir, safe_join

        kbk_dir = ensure_dir(safe_join(self.writer.rank_dir, "kbk"))
        steps = self.config.steps
        iteration = "all" if steps.selects_all else "|".join(
            str(s - initial_step) for s in sorted(steps.values) if s >= initial_step
        )
        categories = [self._STAT_NAMES[s] for s in self.config.statistics if s in self._STAT_NAMES]
        dump_config = {
            "common_dump_settings": {
                "op_debug_mode": 0,
                "dump_mode": 1,
                "path": kbk_dir,
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
        config_path = safe_join(self.writer.rank_dir, "kbk_dump_config.json")
        atomic_write_json(config_path, dump_config, indent=2)
        for name, value in (("MINDSPORE_DUMP_CONFIG", config_path), ("MS_KERNEL_LAUNCH_SKIP", "TensorDump")):
            self._saved_env[name] = os.environ.get(name)
            os.environ[name] = value
        settings = json.dumps(dump_config["common_dump_settings"])
        logger.info("kernel-by-kernel statistics dump configured: %s", settings)

    def teardown(self) -> None:
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()

    def pynative_forward(self, value, key, mode):
        raise RuntimeError("the kbk_statistics backend works in Ascend graph mode only; use device_stats")

    pynative_backward = pynative_forward


# ---------------------------------------------------------------------------
# Statistics on the device (PyNative)
# ---------------------------------------------------------------------------


class DeviceStatsBackend(_BackendBase):
    """PyNative statistics without a device synchronisation per tensor.

    Captured tensors (forward values and gradients) are only queued while the step
    runs; at the end of the step (or when the queue holds more than
    ``pending_limit_bytes``) the reductions are launched for the whole batch, the
    device is synchronised once, and only the resulting numbers are copied. On CPU
    the device memory is host memory, so the reductions run in numpy there.
    Gradients are reached through one cached ``ops.InsertGradientOf`` per probe: building
    a new one per call costs milliseconds (MindSpore parses the closure).
    """

    name = "device_stats"
    pending_limit_bytes = 256 * 1024 * 1024

    def __init__(self, config, runtime, writer):
        super().__init__(config, runtime, writer)
        self._ops = ops
        self._reductions = [name for name in config.statistics if name in STAT_KEYS]
        self._pending = []  # (record head, tensor) waiting for the batched reduction
        self._pending_bytes = 0
        self._gradient_hooks = GradientHookCache(runtime, self._queue)
        self._device = None

    def setup(self, initial_step: int) -> None:
        self._device = ms.get_context("device_target")

    def _queue(self, tensor, key: naming.ProbeKey, mode: str = "out") -> None:
        self._pending.append((_record_head(key, self.runtime.next_seq()), tensor))
        self._pending_bytes += tensor.nbytes
        if self._pending_bytes > self.pending_limit_bytes:
            self.flush()

    def flush(self) -> None:
        """Reduce every queued tensor and write the records (one synchronisation)."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if not pending:
            return
        if self._device == "CPU":
            numbers = [self._host_statistics(tensor) for _, tensor in pending]
        else:
            launched = [self._launch_reductions(tensor) for _, tensor in pending]
            numbers = [self._fetch(tensor, stats) for (_, tensor), stats in zip(pending, launched)]
        step = self.runtime.step
        for (head, tensor), stats in zip(pending, numbers):
            head["dtype"] = str(tensor.dtype)
            head["shape"] = list(tensor.shape)
            head["stats"] = stats
            self.writer.append_record(step, head)

    def _host_statistics(self, tensor) -> dict:
        host = tensor.astype(ms.float32) if tensor.dtype == ms.bfloat16 else tensor
        return compute_statistics(host.asnumpy(), self.config.statistics)

    def _launch_reductions(self, tensor):
        """Queue the reductions on the device; returns a small tensor (or None if empty)."""
        if tensor.size == 0:
            return None
        ops = self._ops
        work = tensor if tensor.dtype in (ms.float32, ms.float64) else tensor.astype(ms.float32)
        parts = []
        for name in self._reductions:
            if name == "max":
                parts.append(work.max())
            elif name == "min":
                parts.append(work.min())
            elif name == "mean":
                parts.append(work.mean())
            else:
                parts.append(ops.sqrt((work * work).sum()))
        for name, test in (("nan_count", ops.isnan), ("inf_count", ops.isinf)):
            if name in self.config.statistics:
                parts.append(test(work).sum().astype(work.dtype))
        return ops.stack(parts) if parts else None

    def _fetch(self, tensor, launched) -> dict:
        numbers = launched.asnumpy().tolist() if launched is not None else []
        stats = {}
        for name, number in zip(self._reductions, numbers):
            stats[STAT_KEYS[name]] = number
        tail = numbers[len(self._reductions):]
        for name in ("nan_count", "inf_count"):
            if name in self.config.statistics and tail:
                stats[name] = int(tail.pop(0))
        if tensor.dtype == ms.bool_:
            for name in ("Max", "Min"):
                if name in stats:
                    stats[name] = bool(stats[name])
        elif "int" in str(tensor.dtype).lower():
            for name in ("Max", "Min"):
                if name in stats:
                    stats[name] = int(stats[name])
        if "md5" in self.config.statistics:
            from mf_celldump.statistics import crc32_hex

            host = tensor.astype(ms.float32) if tensor.dtype == ms.bfloat16 else tensor
            stats["md5"] = crc32_hex(host.asnumpy())
        return stats

    def pynative_forward(self, value, key: naming.ProbeKey, mode: str):
        if not self.config.captures_forward:
            return value
        if isinstance(value, Tensor):
            self._queue(value, key)
            return value
        kind = _python_value_kind(value)
        if kind is not None:
            self._value_record(_with_kind(key, kind), _plain_python(value))
        return value

    def pynative_backward(self, tensor, key: naming.ProbeKey, mode: str):
        return self._gradient_hooks.apply(tensor, key)

    def finish_step(self) -> None:
        self.flush()

    def graph_probe_function(self) -> Callable:
        raise RuntimeError("the device_stats backend works in PyNative mode only; use host or kbk_statistics")


class GradientHookCache:
    """One ``ops.InsertGradientOf`` per probe key, built once and reused every step.

    The hook hands the gradient to ``sink(gradient, key, mode)`` while a captured step runs.
    """

    def __init__(self, runtime: CaptureRuntime, sink: Callable):
        self._runtime = runtime
        self._sink = sink
        self._hooks = {}

    def apply(self, tensor, key: naming.ProbeKey, mode: str = "out"):
        hook = self._hooks.get(key)
        if hook is None:
            runtime, sink = self._runtime, self._sink

            def on_gradient(gradient):
                if runtime.active:
                    sink(gradient, key, mode)
                return gradient

            hook = self._hooks[key] = ops.InsertGradientOf(on_gradient)
        return hook(tensor)


BACKENDS = {
    HostBackend.name: HostBackend,
    TensorDumpBackend.name: TensorDumpBackend,
    KbkStatisticsBackend.name: KbkStatisticsBackend,
    DeviceStatsBackend.name: DeviceStatsBackend,
}


def create_backend(name: str, config: DumpConfig, runtime: CaptureRuntime, writer: RawWriter):
    return BACKENDS[name](config, runtime, writer)
