"""Cells under recompute: refused at attach, because their recomputed forward would be captured again.

``Cell.recompute()`` (what MindFormers' ``recompute_config: {recompute: true}`` calls on every decoder
layer, ``LayerSetting.set_recompute``) makes MindSpore run the cell's forward a second time during
the backward pass. Our capture ops sit inside that forward, so they run again: in graph mode the
recompute pass clones them with the rest of the cell, in PyNative the cell's construct (and the
wrapped constructs of its sub-cells) is called again by the recompute function. The dump would then
hold a second forward call per cell and file the gradients under it (bench/recompute_check.py
measured it), so attach refuses such a selection rather than write a wrong dump.

How a cell is known to be under recompute (``mindspore/nn/cell.py``, 2.9): ``Cell.recompute`` sets
``_recompute_cell`` on the cell it is called on, and ``Cell._recompute`` sets
``_has_config_recompute`` on that cell and on every cell below it.
"""

from __future__ import annotations

import logging
from typing import List, Optional, Sequence

logger = logging.getLogger(__name__)

_SHOWN = 3  # cell names quoted in the message


def _recomputed_roots(model) -> List[str]:
    """Names of the cells ``recompute()`` was called on (``_recompute_cell`` set), outermost first."""
    return [name or type(model).__name__ for name, cell in model.cells_and_names()
            if getattr(cell, "_recompute_cell", None) is not None]


def _under_recompute(cell) -> bool:
    """True when MindSpore would run ``cell``'s forward again in the backward pass."""
    return bool(getattr(cell, "_has_config_recompute", False)) or getattr(cell, "_recompute_cell", None) is not None


def recompute_problem(model, cells: Sequence, graph_mode: bool) -> Optional[str]:
    """The refusal for selected ``cells`` (``SelectedCell``) that run under recompute, or None."""
    hit = [selected.name for selected in cells if _under_recompute(selected.cell)]
    if not hit:
        return None
    roots = _recomputed_roots(model)
    mode = "graph mode" if graph_mode else "PyNative"
    how = ("the recompute pass clones the cell's capture ops into the backward pass" if graph_mode
           else "Cell.recompute runs the cell's construct again during backward")
    shown = ", ".join(repr(name) for name in hit[:_SHOWN]) + (f" and {len(hit) - _SHOWN} more" if len(hit) > _SHOWN
                                                              else "")
    set_on = ", ".join(repr(name) for name in roots[:_SHOWN]) + (", ..." if len(roots) > _SHOWN else "")
    return (f"{len(hit)} selected cells run under recompute ({shown}; recompute() was called on "
            f"{set_on or 'a cell above them'}): in {mode} {how}, so the dump would record a second forward call "
            f"per cell and file its gradients under it. Turn recompute off for the dumped run (MindFormers: "
            f"recompute_config: {{recompute: false}}; or do not call cell.recompute()), or leave these cells out "
            f"of the selection with exclude")
