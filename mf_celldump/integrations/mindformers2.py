"""MindFormers 2.x's PyNative-trainer callback protocol -> a ``TrainingRun``.

``on_train_begin(args, state, model=[chunks], optimizer=..., ...)``,
``on_step_begin(args, state, ...)``, ``on_step_end(args, state, loss=..., ...)``; ``state``
is a ``TrainerState`` with ``global_step``, ``args`` the training arguments.

With virtual pipeline stages one rank holds several chunks of the model (``model=[chunk,
...]``). One capture covers all of them so the rank has one raw tree: ``ModelChunks``
names them, cells are named ``chunk{i}.<name in chunk i>``. The container is never
called and does not rename parameters (children are inserted without the attribute hook
that would prefix parameter names).

Facts of MindFormers 2.1's trainer (``mindformers/pynative/trainer/trainer.py``, read in the 2.1.0
wheel, and run here on CPU: ``tests/test_mindformers2_trainer.py``):

* Output: 2.1 writes its ``log/`` under its output root, ``$LOCAL_DEFAULT_PATH`` or ``./output``
  (``mindformers/tools/utils.py`` ``get_output_root_path``). Its ``TrainConfig`` has no
  ``output_dir`` but keeps unknown keys, and its YAML templates still carry one, which 2.1 ignores:
  so does the dump (``<output root>/celldump``).
* Overflow: with ``training.use_skip_step_on_nan`` a non-finite step skips the optimizer update and
  increments ``state.skipped_steps``: that increase is the watch's overflow flag. ``on_step_end``
  gets no batch (the loop takes it from ``_next_batch()``), so the step cannot be rerun: the watch
  captures the next step and says why.
* Stop: the loop re-reads ``state.max_steps`` every iteration (``while step < state.max_steps``), so
  a stop sets it to the finished step count at ``on_step_end``.
* Pipeline: a stage that is not last gets ``loss`` None or 0.0 with ``has_last=False``: no loss
  signal there (a 0.0 is not a loss).
* Lifecycle: ``on_begin``/``on_end`` have no call site, and ``on_train_end`` is called after the
  loop's ``try/finally``, not in it: a run that raises never ends the capture here. The raw writer
  still writes every step that ended before the process exits (``rawformat/writer_thread.py``) and
  its last log line names them and the ``mf-celldump process`` to run.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Optional

from mindspore import nn

from mf_celldump.integrations.mindspore_callback import param
from mf_celldump.integrations.run import TrainingRun
from mf_celldump.integrations.watching import number
from mf_celldump.watch import StepSignals

logger = logging.getLogger(__name__)


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

    def __init__(self):
        self._skipped_steps: Optional[int] = None  # state.skipped_steps after the last step
        self._no_loss_said = False

    def on_train_begin(self, run: TrainingRun, args: Any = None, state: Any = None,
                       model: Optional[Any] = None, **kwargs: Any) -> None:
        network = model_root(model)
        if network is None:
            raise ValueError(
                "CellDumpCallback: on_train_begin got no model (expected model=<Cell or list of model "
                "chunks> from the MindFormers 2.x trainer)"
            )
        self._skipped_steps = _skipped(state)
        run.ensure_attached(network, initial_step=int(param(state, "global_step", 0) or 0),
                            output_dir=output_root(),
                            origin="on_train_begin (MindFormers 2.x trainer)")

    def on_step_begin(self, run: TrainingRun, args: Any = None, state: Any = None, **kwargs: Any) -> None:
        if not run.attached and kwargs.get("model") is not None:
            self.on_train_begin(run, args, state, **kwargs)
        run.begin_step(int(param(state, "global_step", 0)))

    def on_step_end(self, run: TrainingRun, args: Any = None, state: Any = None, **kwargs: Any) -> None:
        # The trainer passes the step's loss and gradient norm (loss=, grad_norm=), and counts the steps
        # whose update it skipped (state.skipped_steps): the watch's signals.
        skipped = _skipped(state)
        overflow = None
        if skipped is not None:
            overflow = self._skipped_steps is not None and skipped > self._skipped_steps
            self._skipped_steps = skipped
        loss = number(kwargs.get("loss"))
        if kwargs.get("has_last") is False:  # a pipeline stage that is not last: its loss is None or 0.0
            loss = None
            if not self._no_loss_said and run.watching is not None:
                self._no_loss_said = True
                logger.warning("mf_celldump watch: this rank is a pipeline stage without the loss (has_last=False): "
                               "its loss rules are not checked; the gradient norm still is")
        signals = StepSignals(loss=loss, grad_norm=number(kwargs.get("grad_norm")), overflow=overflow)
        run.end_step(signals if run.watching is not None else None)
        if run.stop_requested:
            stop_training(state)


def _skipped(state: Any) -> Optional[int]:
    value = param(state, "skipped_steps")
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def stop_training(state: Any) -> None:
    """End a 2.x run after the step that just ended: its loop runs while ``global_step < max_steps``."""
    done = param(state, "global_step")
    if done is None or not hasattr(state, "max_steps"):
        logger.error("mf_celldump watch: stop is set, but this trainer's state has no global_step/max_steps to "
                     "end the run with: training goes on")
        return
    if state.max_steps > done:
        state.max_steps = int(done)
        logger.warning("mf_celldump watch: stop: max_steps set to %d, so the trainer ends after this step", done)


def output_root() -> Optional[str]:
    """MindFormers' output root (where 2.1 writes ``log/``), when MindFormers is loaded; else None (the
    configuration's own default: ``$LOCAL_DEFAULT_PATH`` or ``./output``)."""
    utils = sys.modules.get("mindformers.tools.utils")
    getter = getattr(utils, "get_output_root_path", None)
    if getter is None:
        return None
    try:
        return getter()
    except Exception as err:  # noqa: BLE001  -- an odd install: fall back to the same default
        logger.debug("get_output_root_path failed: %s", err)
        return None
