"""PyNative statistics without a device synchronisation per tensor.

Captured tensors (forward values and gradients) are only queued while the step runs;
at the end of the step (or when the queue holds more than ``pending_limit_bytes``) the
reductions are launched for the whole batch, the device is synchronised once, and only
the resulting numbers are copied. On CPU the device memory is host memory, so the
reductions run in numpy there. A Parameter is reduced when it is captured (with what
was queued before it), since the optimizer changes it in place later in the step.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import mindspore as ms
from mindspore import Parameter, Tensor, ops

from mf_celldump.capture.backends.base import BackendContext, CaptureBackend, PyNativeFace
from mf_celldump.capture.backends.gradient_hooks import GradientHookCache, ParameterAliases
from mf_celldump.dtypes import mindspore_dtype_name, numpy_dtype_name
from mf_celldump.rawformat.keys import ProbeKey, kind_of_value
from mf_celldump.statistics import REDUCTIONS, StatValues, compute_statistics, crc32_hex, statistics_record


def _kind(tensor) -> str:
    name = numpy_dtype_name(str(tensor.dtype))
    if name == "bool":
        return "b"
    return "i" if name.startswith(("int", "uint")) else "f"


class DeviceStatsBackend(CaptureBackend):
    name = "device_stats"
    pending_limit_bytes = 256 * 1024 * 1024

    def __init__(self, context: BackendContext):
        super().__init__(context)
        self._pending: List[Tuple[ProbeKey, int, Tensor]] = []  # (key, seq, tensor) awaiting reduction
        self._pending_bytes = 0
        self._device: Optional[str] = None

    def setup(self, initial_step: int) -> None:
        self._device = ms.get_context("device_target")

    def queue(self, tensor, key: ProbeKey, mode: str = "out", parameter: bool = False) -> None:
        self._pending.append((key, self.context.runtime.next_seq(), tensor))
        self._pending_bytes += tensor.nbytes
        # A Parameter is reduced at once: the optimizer updates it in place later in the step.
        if self._pending_bytes > self.pending_limit_bytes or parameter or isinstance(tensor, Parameter):
            self.flush()

    def flush(self) -> None:
        """Reduce every queued tensor and write the records (one synchronisation)."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if not pending:
            return
        if self._device == "CPU":
            numbers = [self._host_statistics(tensor) for _, _, tensor in pending]
        else:
            launched = [self._launch_reductions(tensor) for _, _, tensor in pending]
            numbers = [self._fetch(tensor, stats) for (_, _, tensor), stats in zip(pending, launched)]
        sink = self.context.sink
        for (key, seq, tensor), stats in zip(pending, numbers):
            sink.statistics(key, mindspore_dtype_name(numpy_dtype_name(str(tensor.dtype))), tuple(tensor.shape),
                            stats, seq)

    def _host_statistics(self, tensor) -> dict:
        host = tensor.astype(ms.float32) if tensor.dtype == ms.bfloat16 else tensor
        return compute_statistics(host.asnumpy(), self.config.statistics)

    def _launch_reductions(self, tensor) -> Optional[Tensor]:
        """Queue max/min/mean/norm (and NaN/Inf counts) on the device; one small tensor, None if empty."""
        if tensor.size == 0:
            return None
        work = tensor if tensor.dtype in (ms.float32, ms.float64) else tensor.astype(ms.float32)
        reductions = {"max": work.max, "min": work.min, "mean": work.mean,
                      "norm": lambda: ops.sqrt((work * work).sum())}
        parts = [reductions[name]() for name in REDUCTIONS]
        parts.append(ops.isnan(work).sum().astype(work.dtype))
        parts.append(ops.isinf(work).sum().astype(work.dtype))
        return ops.stack(parts)

    def _fetch(self, tensor, launched) -> dict:
        values = StatValues()
        if launched is not None:
            numbers = launched.asnumpy().tolist()
            values = StatValues(*numbers[:4], nan_count=int(numbers[4]), inf_count=int(numbers[5]))
        if "md5" in self.config.statistics:
            host = tensor.astype(ms.float32) if tensor.dtype == ms.bfloat16 else tensor
            values.md5 = crc32_hex(host.asnumpy())
        return statistics_record(values, self.config.statistics, _kind(tensor))

    def pynative(self) -> PyNativeFace:
        return DeviceStatsPyNative(self)

    def finish_step(self) -> None:
        self.flush()


class DeviceStatsPyNative(PyNativeFace):
    def __init__(self, backend: DeviceStatsBackend):
        self.backend = backend
        self.forward_enabled = backend.config.captures_forward
        self.gradient_hooks = GradientHookCache(backend.context.runtime, backend.queue)
        self.aliases = ParameterAliases(backend.context.runtime)  # Parameters and our hooks' aliases of them, this step

    def forward(self, value, key: ProbeKey, mode: str):
        if not self.forward_enabled:
            return value
        if isinstance(value, Tensor):
            parameter = self.aliases.is_parameter(value)
            self.backend.queue(value, key, parameter=parameter)
            return value
        kind = kind_of_value(value)
        if kind is not None:
            self.backend.context.sink.value(key.with_kind(kind), value)
        return value

    def backward(self, tensor, key: ProbeKey, mode: str):
        hooked = self.gradient_hooks.apply(tensor, key)
        self.aliases.hooked(tensor, hooked)  # shares a Parameter's memory but is no Parameter
        return hooked

    def backward_inputs(self, tensors, keys, modes):
        return self.aliases.hooked_all(tensors, self.gradient_hooks.apply_many(tensors, keys, ("out",) * len(keys)))

    def no_gradient(self, key: ProbeKey, mode: str) -> None:
        if self.backend.context.runtime.active:
            self.backend.context.sink.value(key, None)
