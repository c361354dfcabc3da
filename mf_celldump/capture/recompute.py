"""Cells under recompute: captured once per call where the backend allows it, else refused at attach.

``Cell.recompute()`` (what MindFormers' ``recompute_config: {recompute: true}`` calls on every decoder
layer, ``LayerSetting.set_recompute``) makes MindSpore run the cell's forward a second time during
the backward pass. Our capture ops sit inside that forward, so unless they are kept out they run
again: an extra forward call per cell and its gradients filed under it (bench/recompute_check.py).

- Graph mode: the recompute pass clones the recomputed cell's forward nodes into the backward pass;
  a primitive's own ``recompute`` attribute wins over its cell's (``Cell.recompute`` docstring,
  ``mindspore/nn/cell.py``, 2.9), so a backend that marks its capture ops ``recompute(False)``
  (``CaptureBackend.graph_recompute_safe``: host, tensordump, kbk_statistics) records each call once.
- PyNative: ``_RecomputeCell.bprop`` (``mindspore/common/recompute.py``, 2.9) runs the cell under
  ``GradOperation`` again during backward, calling the wrapped constructs of its sub-cells a second
  time; nothing marks that second run for us, so attach refuses.

How a cell is known to be under recompute (``mindspore/nn/cell.py``, 2.9): ``Cell.recompute`` sets
``_recompute_cell`` on the cell it is called on, and ``Cell._recompute`` sets
``_has_config_recompute`` on that cell and on every cell below it.

MindFormers 2.x's PyNative trainer recomputes through hyper_parallel's ``CheckpointWrapper`` instead:
it replaces ``layers[i]``, holds the layer as ``_ckpt_wrapped_module`` (a child in the 1.0 release,
hidden from ``cells_and_names`` in newer sources) and runs it with ``mindspore.recompute(...,
use_reentrant=False, early_stop=...)``. Its forward then runs again in the backward pass, and with
``early_stop`` (select recompute) and cell hooks inside, MindSpore 2.10's autograd failed at step 0
(``Stack input_args_info_stack_ is empty``). Found by what it holds; every selected cell in it is
refused at attach, in both modes, so training never starts into that crash.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

from mf_celldump.capture.backends import backend_classes

_SHOWN = 3  # cell names quoted in the message


def _recomputed_roots(model) -> List[str]:
    """Names of the cells ``recompute()`` was called on (``_recompute_cell`` set), outermost first."""
    return [name or type(model).__name__ for name, cell in model.cells_and_names()
            if getattr(cell, "_recompute_cell", None) is not None]


def under_recompute(cell) -> bool:
    """True when MindSpore would run ``cell``'s forward again in the backward pass."""
    return bool(getattr(cell, "_has_config_recompute", False)) or getattr(cell, "_recompute_cell", None) is not None


def _quoted(names: Sequence[str]) -> str:
    shown = ", ".join(repr(name) for name in names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


WRAPPED_CHILD = "_ckpt_wrapped_module"  # what hyper_parallel's CheckpointWrapper holds the wrapped cell as


def _checkpoint_wrappers(model) -> List[str]:
    """Names of the cells that hold another cell as ``_ckpt_wrapped_module`` (hyper_parallel's CheckpointWrapper)."""
    from mindspore import nn

    return [name for name, cell in model.cells_and_names()
            if isinstance(getattr(cell, WRAPPED_CHILD, None), nn.Cell)]


def checkpoint_wrapper_problem(model, cells: Sequence) -> Optional[str]:
    """The refusal for selected cells inside a hyper_parallel ``CheckpointWrapper``, or None."""
    wrappers = _checkpoint_wrappers(model)
    if not wrappers:
        return None
    hit = [s.name for s in cells if any(s.name == w or s.name.startswith(w + ".") or not w for w in wrappers)]
    if not hit:
        return None
    return (f"{len(hit)} selected cells run inside hyper_parallel's CheckpointWrapper ({_quoted(hit)}; wrappers: "
            f"{_quoted([w or type(model).__name__ for w in wrappers])}): it runs them through mindspore.recompute, "
            "so their forward runs again during backward (a second forward call per cell, gradients filed under "
            "it), and with select recompute (early_stop) MindSpore's autograd fails with capture hooks inside "
            "('Stack input_args_info_stack_ is empty'). Turn recompute off for the dumped run (MindFormers 2.x: "
            "recompute: {mode: None}), or leave these cells out of the selection with exclude")


def recompute_problem(model, cells: Sequence, graph_mode: bool, backend: str) -> Optional[str]:
    """The refusal for selected ``cells`` (``SelectedCell``) that run under recompute, or None when there
    are none or the ``backend`` keeps its graph-mode capture ops out of the recomputed forward."""
    wrapped = checkpoint_wrapper_problem(model, cells)
    if wrapped:
        return wrapped
    hit = [selected.name for selected in cells if under_recompute(selected.cell)]
    if not hit or (graph_mode and backend_classes()[backend].graph_recompute_safe):
        return None
    if graph_mode:
        how = (f"the {backend} backend's capture ops are cloned into the backward pass by MindSpore's recompute "
               "pass (the host, tensordump and kbk_statistics backends keep them out: backend: host)")
    else:
        how = "Cell.recompute runs the cell's construct again during backward"
    mode = "graph mode" if graph_mode else "PyNative"
    return (f"{len(hit)} selected cells run under recompute ({_quoted(hit)}; recompute() was called on "
            f"{_quoted(_recomputed_roots(model)) or 'a cell above them'}): in {mode} {how}, "
            "so the dump would record a second forward call per cell and file its gradients under it. "
            "Turn recompute off for the dumped run (MindFormers: recompute_config: {recompute: false}; or do not "
            "call cell.recompute()), or leave these cells out of the selection with exclude")
