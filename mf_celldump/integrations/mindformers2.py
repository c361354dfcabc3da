"""MindFormers 2.x's PyNative-trainer callback protocol -> a ``TrainingRun``.

``on_train_begin(args, state, model=[chunks], optimizer=..., ...)``,
``on_step_begin(args, state, ...)``, ``on_step_end(args, state, loss=..., ...)``; ``state``
is a ``TrainerState`` with ``global_step``, ``args`` the training arguments.

With virtual pipeline stages one rank holds several chunks of the model (``model=[chunk,
...]``). One capture covers all of them so the rank has one raw tree: ``ModelChunks``
names them, cells are named ``chunk{i}.<name in chunk i>``. The container is never
called and does not rename parameters (children are inserted without the attribute hook
that would prefix parameter names).
"""

from __future__ import annotations

from typing import Any, Optional

from mindspore import nn

from mf_celldump.integrations.mindspore_callback import param
from mf_celldump.integrations.run import TrainingRun
from mf_celldump.integrations.watching import number
from mf_celldump.watch import StepSignals


class ModelChunks(nn.Cell):
    """Holds the chunks as children ``chunk0``, ``chunk1``, ... for naming only."""

    def __init__(self, chunks):
        super().__init__(auto_prefix=False)
        for index, chunk in enumerate(chunks):
            self.insert_child_to_cell(f"chunk{index}", chunk)

    def construct(self, *args, **kwargs):
        raise RuntimeError("ModelChunks only names model chunks for capture; call the chunks themselves")


def model_root(model: Any):
    """The cell to name from: the model, or a container for several pipeline chunks."""
    if isinstance(model, (list, tuple)):
        chunks = [m for m in model if m is not None]
        if not chunks:
            return None
        if len(chunks) == 1:
            return chunks[0]
        return ModelChunks(chunks)
    return model


class MindFormers2Adapter:
    """Typed MindFormers 2.x trainer hooks."""

    def on_train_begin(self, run: TrainingRun, args: Any = None, state: Any = None,
                       model: Optional[Any] = None, **kwargs: Any) -> None:
        network = model_root(model)
        if network is None:
            raise ValueError(
                "CellDumpCallback: on_train_begin got no model (expected model=<Cell or list of model "
                "chunks> from the MindFormers 2.x trainer)"
            )
        run.ensure_attached(network, initial_step=int(param(state, "global_step", 0) or 0),
                            output_dir=param(args, "output_dir"),
                            origin="on_train_begin (MindFormers 2.x trainer)")

    def on_step_begin(self, run: TrainingRun, args: Any = None, state: Any = None, **kwargs: Any) -> None:
        if not run.attached and kwargs.get("model") is not None:
            self.on_train_begin(run, args, state, **kwargs)
        run.begin_step(int(param(state, "global_step", 0)))

    def on_step_end(self, run: TrainingRun, args: Any = None, state: Any = None, **kwargs: Any) -> None:
        # The trainer passes the step's loss and gradient norm (loss=, grad_norm=): the watch's signals.
        signals = StepSignals(loss=number(kwargs.get("loss")), grad_norm=number(kwargs.get("grad_norm")))
        run.end_step(signals if run.watching is not None else None)
