"""MindSpore's callback protocol (``Model.train``, MindFormers 1.x) -> a ``TrainingRun``.

MindSpore calls ``on_train_begin(run_context)``, ``on_train_step_begin/end(run_context)``
and ``on_train_end(run_context)``; ``run_context.original_args()`` carries the network
and step counters. This adapter turns them into global steps (resumed MindFormers runs
count from their ``initial_step``) and drives the run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Optional

from mf_celldump.capture.selection import unwrap
from mf_celldump.errors import AttachError, WrapperError
from mf_celldump.integrations.rerun import StepRerun, StepSnapshot
from mf_celldump.integrations.run import TrainingRun
from mf_celldump.integrations.watching import signals_from_outputs, stopping_callbacks_before

logger = logging.getLogger(__name__)


def param(params: Any, key: str, default=None):
    """Read ``key`` from MindSpore's callback params (a dict), a config or a state object."""
    if params is None:
        return default
    value = params.get(key, default) if isinstance(params, Mapping) else getattr(params, key, default)
    return default if value is None else value


def dataset_init_step(dataset) -> int:
    """The step a dataset resumes from (MindFormers sets it when resuming), else 0."""
    getter = getattr(dataset, "get_init_step", None)
    if getter is None:
        return 0
    try:
        return int(getter() or 0)
    except Exception:  # not every dataset node supports it
        return 0


def initial_step_offset(params, owner) -> int:
    """How many steps ran before ``cur_step_num`` started counting (resumed MindFormers runs).

    MindFormers 1.x resumes by skipping data and passing ``runner_config.initial_step`` to
    its own monitors (``default_args``), while MindSpore's ``cur_step_num`` restarts at 0;
    MindSpore's ``initial_step`` param is set only on fault-tolerance restarts (then it wins,
    as in MindFormers' monitors). Callbacks built from YAML receive no such argument, so read
    the value MindFormers gave its own monitors, else the dataset's resume step.
    """
    explicit = param(params, "initial_step")
    if explicit is not None:
        return int(explicit)
    for callback in param(params, "list_callback", ()) or ():
        if callback is owner or not type(callback).__module__.startswith("mindformers"):
            continue
        value = getattr(callback, "initial_step", None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return dataset_init_step(param(params, "train_dataset"))


def steps_per_sink(params) -> int:
    """Training steps one callback step covers: ``sink_size`` (the whole dataset for -1) in graph-mode dataset
    sink, else 1. ``Model._train_dataset_sink_process`` (``mindspore/train/model.py``, 2.9) sets
    ``dataset_sink_mode`` and ``sink_size`` in the callback params and adds ``dataset_helper.sink_size()`` to
    ``cur_step_num`` per callback step in graph mode (1 in PyNative). On CPU ``Model.train`` never sinks: it
    falls back to ``_train_process``, which sets neither."""
    if param(params, "dataset_sink_mode") is not True:
        return 1
    import mindspore as ms

    if ms.get_context("mode") != ms.GRAPH_MODE:
        return 1
    size = int(param(params, "sink_size", -1))
    if size > 0:
        return size
    dataset = param(params, "train_dataset")
    return int(dataset.get_dataset_size()) if dataset is not None else 0


def sink_refusal(params) -> Optional[str]:
    """Why ``steps: "anomaly"`` cannot run under this dataset sink (None: it can)."""
    steps = steps_per_sink(params)
    if steps == 1:
        return None
    return (f"steps: 'anomaly' cannot run under dataset sink mode with sink_size {param(params, 'sink_size', -1)} "
            f"({steps or 'all the dataset'} steps per graph launch): the callback sees only the last step of each "
            "sink, so a rule firing in an earlier step is missed; no step can be rerun (the batch is read inside "
            "the graph); and a sink captured as one step mixes its steps' calls. Train with sink_size: 1 or "
            "dataset_sink_mode: False, or name the steps to capture")


def _same_model(attached, network) -> bool:
    """True when ``network`` wraps the model the dump is attached to; a wrapper that cannot be read is
    not the same (re-attaching then refuses it with the reason)."""
    try:
        return unwrap(attached) is unwrap(network)
    except WrapperError:
        return False


class MindSporeAdapter:
    """Typed MindSpore callback hooks; ``owner`` is the callback object MindSpore holds."""

    def __init__(self, owner):
        self.owner = owner
        self.step_offset = 0
        self.last_step_num: Optional[int] = None
        self.warned_multi_step = False
        self.snapshot: Optional[StepSnapshot] = None  # the running step's start, while the watch may rerun it
        self.sinking = False  # dataset sink mode: the batch is read inside the graph, no step is rerun

    def on_train_begin(self, run: TrainingRun, run_context) -> None:
        params = run_context.original_args()
        network = param(params, "network")
        if network is None:  # Cells with __len__ can be falsy: compare with None
            network = param(params, "train_network")
        start = int(param(params, "cur_step_num", 0) or 0)
        self.step_offset = initial_step_offset(params, self.owner)
        self.last_step_num = start
        first_step = start + self.step_offset
        self.sinking = param(params, "dataset_sink_mode") is True
        refusal = sink_refusal(params) if run.watching is not None and run.watching.captures_on_trigger else None
        if refusal:
            raise AttachError(refusal)  # the callback's __exit__ detaches a dump the compile hook attached
        dump = run.dump
        if dump is not None and not _same_model(dump.network, network):
            logger.warning("mf_celldump: capture was attached at compile time to %s but training runs %s; "
                           "re-attaching to the training network", type(dump.model).__name__,
                           type(network).__name__)
            dump.detach()
            run.dump = None
        elif dump is not None and dump.initial_step != first_step:
            logger.info("mf_celldump: attached before compile with first step %d; training starts at "
                        "global step %d", dump.initial_step, first_step)
        run.ensure_attached(network, initial_step=first_step, origin="on_train_begin")
        earlier = stopping_callbacks_before(param(params, "list_callback"), self.owner) if run.watching else []
        if earlier:
            logger.warning("mf_celldump watch: %s come(s) before CellDumpCallback in the callbacks and stop(s) "
                           "training in the step end of a NaN or a norm spike, before the watch sees that step: put "
                           "the CellDumpCallback entry before them in callbacks:", "; ".join(earlier))

    def on_train_step_begin(self, run: TrainingRun, run_context) -> None:
        current = int(param(run_context.original_args(), "cur_step_num", 0))
        first = self.last_step_num if self.last_step_num is not None else current - 1
        if current - first > 1 and not self.warned_multi_step:
            self.warned_multi_step = True
            logger.warning(
                "mf_celldump: one callback step covers %d training steps (data sink); they are captured "
                "as step %d unless the capture backend numbers graph steps itself. Use sink_size 1 "
                "for one folder per step.", current - first, first + self.step_offset,
            )
        run.begin_step(first + self.step_offset)
        self.snapshot = None
        if run.watching is not None and run.watching.wants_snapshot and run.dump is not None and not self.sinking:
            self.snapshot = StepSnapshot.take(param(run_context.original_args(), "train_network"))

    def on_train_step_end(self, run: TrainingRun, run_context) -> None:
        params = run_context.original_args()
        self.last_step_num = int(param(params, "cur_step_num", 0))
        # The watch reads what the step returned (loss, overflow flag, loss scale, global norm): no new op.
        signals, rerun = None, None
        if run.watching is not None:
            signals = signals_from_outputs(param(params, "net_outputs"))
            batch = param(params, "train_dataset_element")
            if self.snapshot is not None and batch is not None:
                rerun = StepRerun(param(params, "train_network"), tuple(batch), self.snapshot)
        self.snapshot = None
        run.end_step(signals, rerun)
        if run.stop_requested:
            run_context.request_stop()  # Model.train ends after this step, then on_train_end runs as usual
