"""Graph mode: a selected step runs a graph with capture ops, every other step a graph without them.

MindSpore keys a cell's compiled graph by its ``phase`` (``Cell.compile`` hands ``cell.phase``
to ``_CellGraphExecutor.compile``, whose key is the phase, the cell's creation time and id and
the arguments' key: ``_real_phase`` in ``mindspore/graph/api.py``, 2.9). So one cell can hold
two compiled graphs of the same cells and Parameters, told apart by the phase it is called with.

* The generated wrappers (``graph_wrapper``, the optimizer's in ``parameters``) start with
  ``if plain(): return original(...)``. ``plain`` is a ``constexpr``: it runs while MindSpore
  compiles, so the branch is folded and the graph holds either the original alone or the
  capture ops, never both.
* ``plain`` answers for the graph being compiled: the cell MindSpore compiles (the top cell,
  found in the frame of ``_CellGraphExecutor.compile`` on the Python stack; a training wrapper
  around the attached network, or Model's dataset-sink ``_DataWrapper``) is remembered as an
  entry, and the graph is captured when its phase carries ``MARK``.
* ``begin_step`` of a selected step appends ``MARK`` to every known entry's phase, ``end_step``
  puts the phases back: the selected step compiles (once) and runs the captured graph, the
  others the plain one, which was compiled (once) at the first unselected call. So the step to
  capture need not be known before training: any step can select it.
* An entry first met while a selected step runs (the first call of an entry nobody called
  before is a selected step) is compiled captured under its plain phase, so the step is
  captured; that graph is dropped from the cell's compile cache at ``end_step``, and the next
  unselected step compiles the plain graph again.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from mf_celldump.capture.runtime import CaptureRuntime

logger = logging.getLogger(__name__)

MARK = ".mf_celldump_capture"
_COMPILE_FILE = ("mindspore", "api.py")  # mindspore/graph/api.py (2.9), mindspore/common/api.py (older)


def compiling_cell():
    """The cell ``_CellGraphExecutor.compile`` compiles now (called from graph code being compiled), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "compile" and code.co_filename.endswith(_COMPILE_FILE[1]) \
                and _COMPILE_FILE[0] in code.co_filename and "obj" in frame.f_locals:
            return frame.f_locals["obj"]
        frame = frame.f_back
    return None


@dataclass
class GraphSwitch:
    """Which compiled graph the calls of one attached dump run; see the module docstring."""

    runtime: CaptureRuntime
    entries: Dict[int, object] = field(default_factory=dict)  # id -> the cells MindSpore compiled graphs for
    _marked: List[Tuple[object, str]] = field(default_factory=list)  # (entry, its phase before MARK)
    _stale: List[Tuple[object, str]] = field(default_factory=list)  # (entry, plain phase) compiled captured

    def add_entry(self, cell) -> None:
        self.entries.setdefault(id(cell), cell)

    def plain_function(self) -> Callable:
        """``plain(cell_id) -> bool``, a ``constexpr``: True when the graph being compiled has no capture."""
        from mindspore.ops.primitive import constexpr

        switch = self

        @constexpr
        def plain(cell_id):
            return not switch.compiles_captured()

        return plain

    def compiles_captured(self) -> bool:
        """Compile time: whether the graph being compiled carries the capture ops."""
        cell = compiling_cell()
        if cell is None:  # not found (another MindSpore): the step decides, as before the switch
            return self.runtime.active
        phase = getattr(cell, "phase", "")
        if id(cell) not in self.entries:
            self.add_entry(cell)
            logger.info("graph mode: %s runs the captured network; its selected steps run a graph with the "
                        "capture ops, the others one without", type(cell).__name__)
        if MARK in phase:
            captured = True
        elif self.runtime.active and not any(entry is cell for entry, _ in self._marked):
            captured = True  # met during a selected step: capture it, compile the plain graph afterwards
            if not any(entry is cell for entry, _ in self._stale):
                self._stale.append((cell, phase))
        else:
            captured = False
        return captured

    def select(self, captured: bool) -> None:
        """A step begins: the entries run the captured graph when ``captured``."""
        if not captured:
            return
        for cell in self.entries.values():
            phase = cell.phase
            if MARK not in phase:
                self._marked.append((cell, phase))
                cell.phase = phase + MARK

    def release(self) -> None:
        """The step ended: entries back to their plain phase; a plain-phase graph compiled captured is dropped."""
        marked, self._marked = self._marked, []
        for cell, phase in marked:
            if cell.phase == phase + MARK:  # MindSpore may have set another phase since (set_train)
                cell.phase = phase
        stale, self._stale = self._stale, []
        for cell, phase in stale:
            _forget_compiled(cell, phase)

    def close(self) -> None:
        self.release()
        self.entries.clear()


def _forget_compiled(cell, phase: str) -> Optional[str]:
    """Drop ``cell``'s compiled graphs of ``phase`` from its compile cache, so its next call compiles again."""
    cache = getattr(cell, "compile_cache", None)
    if not isinstance(cache, set):
        return None
    prefix = f"{phase}.{cell.create_time}.{id(cell)}."
    for real_phase in [p for p in cache if p.startswith(prefix)]:
        cache.discard(real_phase)
        logger.info("graph mode: %s's first graph was compiled during a selected step; the next unselected "
                    "step compiles it without capture ops", type(cell).__name__)
        return real_phase
    return None
