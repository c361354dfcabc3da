"""Drive msprobe's own cell/module-level dumpers (level L0) on CPU, for baselines and parity tests.

* :func:`dump_torch_step`: msprobe's PyTorch ``PrecisionDebugger`` around one training step.
* :func:`dump_mindspore_step`: msprobe's MindSpore ``PrecisionDebugger`` (PyNative) around
  one step, with the CPU remedy for its norm statistic (see :func:`cpu_norm_remedy`).

Both write msprobe's layout under ``out`` (``step0/<rank folder>/dump.json`` ...) and, when
one rank folder was written, give it a stable name (``rank`` by default): without
initialised communication msprobe names it ``proc{pid}``, and ``msprobe compare`` refuses
two runs whose rank folders differ. Call them in a process of their own per dump:
msprobe's debugger is a process-wide singleton. In a process that uses MindSpore, import
``mindspore`` before this module touches msprobe (protobuf's "Descriptors cannot be
created directly" otherwise).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Callable, Iterator, List, Optional

TASKS = ("tensor", "statistics")


def msprobe_config(out: str, task: str, level: str = "L0", data_mode: Optional[List[str]] = None) -> dict:
    """msprobe's config.json content for one dump of all ranks and steps."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    scope = {"scope": [], "list": [], "data_mode": data_mode or ["all"]}
    return {
        "task": task,
        "dump_path": os.path.abspath(out),
        "rank": [],
        "step": [],
        "level": level,
        "async_dump": False,
        "tensor": dict(scope),
        "statistics": dict(scope, summary_mode="statistics"),
    }


@contextlib.contextmanager
def _config_file(config: dict) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="msprobe_cfg_") as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        yield path


def name_rank_folder(out: str, rank_folder: str = "rank") -> None:
    """Rename the single rank folder of each step in ``out`` (``proc123``, ``rank0``) to ``rank_folder``."""
    for step in sorted(os.listdir(out)):
        step_dir = os.path.join(out, step)
        if not (step.startswith("step") and os.path.isdir(step_dir)):
            continue
        folders = [d for d in os.listdir(step_dir) if os.path.isdir(os.path.join(step_dir, d))]
        if len(folders) == 1 and folders[0] != rank_folder:
            old = os.path.join(step_dir, folders[0])
            new = os.path.join(step_dir, rank_folder)
            os.rename(old, new)
            _fix_data_dir(new)


def _fix_data_dir(rank_dir: str) -> None:
    """Point ``dump_data_dir`` at the renamed folder (msprobe reads it for tensor data)."""
    path = os.path.join(rank_dir, "dump.json")
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    if data.get("dump_data_dir"):
        data["dump_data_dir"] = os.path.join(rank_dir, "dump_tensor_data")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1)


def dump_torch_step(
    model,
    run_step: Callable[[], float],
    out: str,
    task: str = "tensor",
    level: str = "L0",
    rank_folder: str = "rank",
) -> float:
    """One step of a torch ``model`` under msprobe's PyTorch dumper; returns what ``run_step`` returns."""
    from msprobe.pytorch import PrecisionDebugger

    with _config_file(msprobe_config(out, task, level)) as config_path:
        debugger = PrecisionDebugger(config_path=config_path)
        debugger.start(model=model)
        result = run_step()
        debugger.stop()
        debugger.step()
    name_rank_folder(out, rank_folder)
    return result


class _CpuNorm:
    """Proxy of ``mindspore.mint`` whose ``norm`` works on CPU; everything else is mint's own."""

    def __init__(self, mint):
        self._mint = mint

    def __getattr__(self, name):
        return getattr(self._mint, name)

    def norm(self, x, *args, **kwargs):
        mint = self._mint
        return mint.sqrt(mint.sum(mint.square(x.astype("float32"))))


def cpu_norm_remedy() -> None:
    """msprobe's MindSpore statistics call ``mint.norm``, which has no CPU kernel in MindSpore 2.9
    ("The kernel LinalgVectorNorm unregistered"): replace the ``mint`` global of its data
    processor by a proxy computing the same 2-norm. Installed files stay untouched."""
    from mindspore import mint
    from msprobe.core.dump.data_dump.data_processor import mindspore_processor

    if not isinstance(mindspore_processor.mint, _CpuNorm):
        mindspore_processor.mint = _CpuNorm(mint)


def dump_mindspore_step(
    net,
    run_step: Callable[[], float],
    out: str,
    task: str = "tensor",
    level: str = "L0",
    rank_folder: str = "rank",
) -> float:
    """One PyNative step of the MindSpore cell ``net`` under msprobe's MindSpore dumper."""
    import mindspore  # noqa: F401  (before msprobe)

    cpu_norm_remedy()
    from mindspore.common.api import _pynative_executor
    from msprobe.mindspore import PrecisionDebugger

    with _config_file(msprobe_config(out, task, level)) as config_path:
        debugger = PrecisionDebugger(config_path=config_path)
        debugger.start(model=net)
        result = run_step()
        _pynative_executor.sync()
        debugger.stop()
        debugger.step()
    name_rank_folder(out, rank_folder)
    return result
