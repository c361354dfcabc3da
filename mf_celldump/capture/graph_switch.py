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
  entry. An entry's first graph of a phase is compiled for the step that meets it: captured in
  a selected step, plain otherwise.
* From then on ``begin_step`` gives each entry the phase of the graph the step needs: its own
  phase when that graph is the one compiled first, else the phase with a mark (``MARK`` for the
  captured graph, ``PLAIN_MARK`` for the plain one), compiled once at the first step that needs
  it. ``end_step`` puts the phases back. So a run compiles at most two graphs per entry and
  phase, and the step to capture need not be known before training: any step can select it.

Two facts of MindSpore that shape what an attach costs (``_CellGraphExecutor.compile``,
``mindspore/graph/api.py`` 2.9 and ``mindspore/common/api.py`` 2.7): the key of a compiled graph
also holds ``_hook_version()``, a process-wide counter that ``Parameter.register_hook`` and every
hook handle's ``remove`` increase. Capturing weight gradients registers parameter hooks at
attach and removes them at detach, so every graph compiled before attach is compiled again at
its next call (a network MindSpore compiled before attach is therefore captured all the same),
and so is every graph after detach.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Set, Tuple

from mf_celldump.capture.runtime import CaptureRuntime

logger = logging.getLogger(__name__)

MARK = ".mf_celldump_capture"
PLAIN_MARK = ".mf_celldump_plain"
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


def finds_compiling_cell() -> bool:
    """Whether this MindSpore compiles cells where ``compiling_cell`` looks (checked once, at attach).

    Where it does not, the first graph compiled for a phase serves every later step, captured
    or not; the step filter then keeps unselected steps out of the dump.
    """
    try:
        from mindspore.graph.api import _CellGraphExecutor  # 2.9 on; mindspore.common.api warns there
    except ImportError:
        try:
            from mindspore.common.api import _CellGraphExecutor
        except ImportError:
            return False
    code = getattr(getattr(_CellGraphExecutor, "compile", None), "__code__", None)
    return code is not None and "obj" in code.co_varnames[:code.co_argcount]


@dataclass
class GraphSwitch:
    """Which compiled graph the calls of one attached dump run; see the module docstring."""

    runtime: CaptureRuntime
    entries: Dict[int, object] = field(default_factory=dict)  # id -> the cells MindSpore compiled graphs for
    _captured_first: Dict[int, Set[str]] = field(default_factory=dict)  # id -> phases compiled captured first
    _marked: List[Tuple[object, str, str]] = field(default_factory=list)  # (entry, its phase, the mark added)

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
        if cell is None:  # not found (another MindSpore): the step decides
            return self.runtime.active
        phase = getattr(cell, "phase", "")
        if id(cell) not in self.entries:
            self.add_entry(cell)
            logger.info("graph mode: %s runs the captured network; its selected steps run a graph with the "
                        "capture ops, the others one without", type(cell).__name__)
        if phase.endswith(MARK):
            return True
        if phase.endswith(PLAIN_MARK):
            return False
        if self.runtime.active:  # the phase's first graph, met in a selected step
            self._captured_first.setdefault(id(cell), set()).add(phase)
            return True
        return False

    def select(self, captured: bool) -> None:
        """A step begins: each entry gets the phase of its captured graph (``captured``) or its plain one."""
        for cell in self.entries.values():
            phase = getattr(cell, "phase", "")
            if phase.endswith((MARK, PLAIN_MARK)):
                continue
            first_captured = phase in self._captured_first.get(id(cell), ())
            if captured == first_captured:
                continue
            mark = MARK if captured else PLAIN_MARK
            self._marked.append((cell, phase, mark))
            cell.phase = phase + mark

    def release(self) -> None:
        """The step ended: entries back to their own phase."""
        marked, self._marked = self._marked, []
        for cell, phase, mark in marked:
            if cell.phase == phase + mark:  # MindSpore may have set another phase since (set_train)
                cell.phase = phase

    def close(self) -> None:
        self.release()
        self.entries.clear()
