"""Which graph backend MindSpore will compile the network with: its own kernel-by-kernel one or GE.

The kernel-by-kernel statistics dump exists only in MindSpore's own backend (``ms_backend``,
jit_level O0/O1); under GE (graph sink) MindSpore only warns and the statistics never come.
MindSpore picks GE in more ways than ``jit_level: O2``. Read from its sources (repository
mindspore-ai/mindspore, master of 2025 and the MindSpore 2.9 binaries' strings; MSC =
``mindspore/core/utils/ms_context.cc``):

1. A cell's own ``JitConfig`` (``Cell.set_jit_config``; ``nn/cell.py``): ``backend="GE"``
   picks GE outright, ``backend="ms_backend"`` the kernel-by-kernel one
   (``backend_manager.cc`` GetBackendType: a named backend wins); ``JitConfig(jit_level="O2")``
   fills in ``backend="GE"`` (``graph/jit_config.py``). Training wrappers copy the inner
   network's config (``Cell._get_attr_from_cell``), so the model's counts as well.
2. The global ``set_context(jit_config={"jit_level": ...})`` (MSC GetJitLevel, when the cell
   sets none). Its only keys are jit_level and infer_boost (``context.py`` set_jit_config).
3. Neither set: O2 on Ascend 910A (SoC version ``ascend910``), O0 elsewhere (MSC GetJitLevel).
4. A rank-table launch forces O2 whatever was set: device Ascend, ``RANK_TABLE_FILE`` or
   ``MINDSPORE_HCCL_CONFIG_PATH`` set, and no dynamic cluster (neither ``MS_ROLE`` nor
   ``MS_SCHED_HOST``, which msrun sets; ``utils/ms_utils.h`` UseDynamicCluster). MindSpore logs
   "Set jit level to O2 for rank table startup method." (MSC GetJitLevel).
5. ``MsContext::IsKByKExecutorMode``: jit_level O2 or a GE jit backend -> graph sink (GE).

A training step compiled through ``@mindspore.jit(backend="GE")`` (or ``data_sink`` with an O2
``JitConfig``) also selects GE; nothing visible at attach tells, so it is named in the message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional

GE, MS_BACKEND = "GE", "ms_backend"
RANK_TABLE_VARIABLES = ("RANK_TABLE_FILE", "MINDSPORE_HCCL_CONFIG_PATH")
DYNAMIC_CLUSTER_VARIABLES = ("MS_ROLE", "MS_SCHED_HOST")


@dataclass(frozen=True)
class CompileBackend:
    """The backend MindSpore will use and the setting that decided it (for messages)."""

    name: str
    reason: str

    @property
    def is_ge(self) -> bool:
        return self.name == GE


def _cell_choice(cells: Iterable[Any]) -> Optional[CompileBackend]:
    for cell in cells:
        config = getattr(cell, "jit_config_dict", None) or {}
        where = f"{type(cell).__name__}.set_jit_config(JitConfig(...))"
        backend, level = config.get("backend") or "", config.get("jit_level") or ""
        if backend in (GE, MS_BACKEND):
            return CompileBackend(backend, f"{where} sets backend={backend!r}")
        if level:
            return CompileBackend(GE if level == "O2" else MS_BACKEND, f"{where} sets jit_level={level!r}")
    return None


def _global_level() -> str:
    import mindspore as ms

    for read in (lambda: ms.context.get_jit_config().get("jit_level"), lambda: ms.get_context("jit_level")):
        try:
            level = read()
        except (AttributeError, ValueError, RuntimeError, TypeError):
            continue
        if level:
            return str(level)
    return ""


def _rank_table_launch(environ: Mapping[str, str]) -> str:
    """The variable of a rank-table launch (MindSpore then forces O2), or ''."""
    if any(environ.get(name) for name in DYNAMIC_CLUSTER_VARIABLES):
        return ""
    return next((name for name in RANK_TABLE_VARIABLES if environ.get(name)), "")


def compile_backend(cells: Iterable[Any], environ: Mapping[str, str],
                    soc_version: Callable[[], str]) -> CompileBackend:
    """The backend an Ascend graph-mode compile of ``cells`` (outermost first) will use."""
    choice = _cell_choice(cells)
    if choice is None:
        level = _global_level()
        if level:
            choice = CompileBackend(GE if level == "O2" else MS_BACKEND,
                                    f"set_context(jit_config={{'jit_level': {level!r}}})")
        else:
            soc = soc_version() or "unknown"
            choice = CompileBackend(GE if soc == "ascend910" else MS_BACKEND,
                                    f"no jit_level set: MindSpore's default on SoC {soc!r}")
    variable = _rank_table_launch(environ)
    if variable and not choice.is_ge and "backend=" not in choice.reason:
        return CompileBackend(GE, f"{variable} is set without msrun's MS_ROLE (a rank-table launch), for which "
                                  "MindSpore forces jit_level O2")
    return choice
