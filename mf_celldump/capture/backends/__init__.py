"""Capture backends, one module each, behind the interface of ``base``; chosen per device and mode.

| backend | module | faces |
|---|---|---|
| ``host`` | host.py | PyNative, graph (any device that runs pyfunc ops) |
| ``tensordump`` | tensordump.py | PyNative (CPU, Ascend), graph (Ascend) |
| ``kbk_statistics`` | kbk_statistics.py | graph (Ascend) |
| ``device_stats`` | device_stats.py | PyNative |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Type

from mf_celldump.capture.backends.base import (
    BackendContext,
    CaptureBackend,
    GraphFace,
    PyNativeFace,
)
from mf_celldump.config import DumpConfig

__all__ = [
    "BackendChoice",
    "BackendContext",
    "CaptureBackend",
    "GraphFace",
    "PyNativeFace",
    "backend_classes",
    "choose_backend",
    "create_backend",
]


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


def backend_classes() -> Dict[str, Type[CaptureBackend]]:
    """Name -> class; imported here, on use, because each backend imports MindSpore."""
    from mf_celldump.capture.backends.device_stats import DeviceStatsBackend
    from mf_celldump.capture.backends.host import HostBackend
    from mf_celldump.capture.backends.kbk_statistics import KbkStatisticsBackend
    from mf_celldump.capture.backends.tensordump import TensorDumpBackend

    classes = (HostBackend, TensorDumpBackend, KbkStatisticsBackend, DeviceStatsBackend)
    return {cls.name: cls for cls in classes}


def create_backend(name: str, context: BackendContext) -> CaptureBackend:
    return backend_classes()[name](context)
