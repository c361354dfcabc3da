"""Micro-batches per step, and whether MindSpore runs their backward in micro-batch order.

Graph-mode TensorDump files (Ascend) carry no call number: processing pairs a backward
capture with a forward call by execution order (docs/raw-format.md, "Call index
inference"). Under gradient accumulation and pipeline schedules every captured cell
runs once per micro-batch per call site, micro-batches have equal shapes, and the
backward of micro-batch k runs after its forward, between later forwards. So processing
needs the number of micro-batches and the order their backward runs in; this module
finds both at attach, from the training wrappers (found by what they hold,
``capture/wrappers.py``: the micro-batch count is the length of their slicer list, the
schedule the marks MindSpore's passes read) and MindSpore's parallel settings, and the
manifest records them (``micro_batches``).

What the order rests on (MindSpore sources, repository mindspore-ai/mindspore):

* pipeline parallel (``pipeline_stages`` > 1), 1F1B without interleave:
  ``ccsrc/frontend/parallel/graph_util/pipeline_split_utils.cc`` ``ReorderForForward`` /
  ``ReorderForBackward`` put control edges between the micro-batches' border nodes,
  sorted by micro-batch (``CompFunc``): backward of micro-batch k before that of k+1;
* 1F1B and GPipe with ``pipeline_interleave``:
  ``ccsrc/frontend/parallel/pipeline_transformer/pipeline_scheduler.cc``
  ``InterleavedScheduler::Reorder`` and ``gpipe_interleave_scheduler.cc``
  ``GpipeInterleavedScheduler::Reorder`` order the units by ``SortFuncBetweenMicro``:
  within one chunk (a cell belongs to one) micro-batches ascend, forward and backward;
* gradient accumulation without pipeline (``GradAccumulation`` / ``GradAccumulationCell``,
  whose slices carry ``grad_accu_num``): ``ccsrc/frontend/parallel/graph_util/
  grad_accumulation_utils.cc`` ``ReorderGradAccumulation`` makes the backward end of
  micro-batch k precede the forward start of k+1 (all run from
  ``parallel_whole_graph_processor.cc`` ``ParallelWholeGraphProcessor::Process``, under
  semi_auto_parallel / auto_parallel only).

Nothing orders them elsewhere: in stand-alone or data-parallel graphs the micro-batches'
backward are independent branches the scheduler may run in any order; the seqpipe,
seqvpp, seqsmartvpp and zero_bubble_v schedulers split micro-batches further
(``seqpipe_scheduler.cc``) or split the backward (``zero_bubble_v``), and
``MicroBatchInterleaved`` runs its slices as parallel branches whose communication, not
compute, is ordered (``micro_interleaved_order_control.cc``). There attach refuses
backward capture with the graph-mode TensorDump backends, naming what works instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

from mf_celldump.capture.wrappers import ACCUMULATION, INTERLEAVE, MICRO_BATCH_KINDS, UNMARKED, Layer

ORDERED_SCHEDULERS = ("1f1b", "gpipe")
SEMI_AUTO_MODES = ("semi_auto_parallel", "auto_parallel")


@dataclass(frozen=True)
class ParallelSettings:
    """The parts of MindSpore's auto-parallel context that decide how micro-batches are scheduled."""

    parallel_mode: str = "stand_alone"
    pipeline_stages: int = 1
    pipeline_interleave: bool = False
    pipeline_scheduler: str = "1f1b"

    @classmethod
    def read(cls, get: Callable[[str], Any]) -> ParallelSettings:
        """From ``get(key)`` (``mindspore.get_auto_parallel_context``); a key MindSpore lacks keeps its default."""
        values = {}
        for key in ("parallel_mode", "pipeline_stages", "pipeline_interleave", "pipeline_scheduler"):
            try:
                value = get(key)
            except (ValueError, KeyError, AttributeError, RuntimeError, TypeError):
                continue
            if value is not None:
                values[key] = value
        return cls(parallel_mode=str(values.get("parallel_mode", cls.parallel_mode)),
                   pipeline_stages=int(values.get("pipeline_stages", cls.pipeline_stages)),
                   pipeline_interleave=bool(values.get("pipeline_interleave", cls.pipeline_interleave)),
                   pipeline_scheduler=str(values.get("pipeline_scheduler", cls.pipeline_scheduler)).lower())


def mindspore_parallel_settings() -> ParallelSettings:
    import mindspore as ms

    return ParallelSettings.read(ms.get_auto_parallel_context)


@dataclass(frozen=True)
class MicroBatches:
    """``count`` micro-batches per step; ``unordered`` says why their backward order is unknown (None: in
    micro-batch order); ``source`` what was found, for messages and the manifest."""

    count: int
    unordered: Optional[str]
    source: str

    @property
    def in_order(self) -> bool:
        return self.unordered is None

    def refusal(self, backend: str) -> str:
        return (f"the {backend} backend in graph mode names no call in its files, so each backward capture is paired "
                f"with a forward call by execution order; with {self.source} that order is not known: "
                f"{self.unordered}. Capture forward only (data_mode: forward), use PyNative mode, or train under "
                "semi_auto_parallel / auto_parallel with a 1f1b or gpipe pipeline schedule or GradAccumulation, "
                "where MindSpore runs micro-batches in order")


def _wrappers(layers: Sequence[Layer]) -> List[Layer]:
    """The wrappers among ``layers`` that run the network once per micro-batch."""
    return [layer for layer in layers if layer.kind in MICRO_BATCH_KINDS and layer.count > 1]


def _why_unordered(wrappers: List[Layer], settings: ParallelSettings) -> Optional[str]:
    kinds = {layer.kind for layer in wrappers}
    if INTERLEAVE in kinds:
        named = ", ".join(layer.class_name for layer in wrappers if layer.kind == INTERLEAVE)
        return (f"{named} runs its slices as parallel branches (only their communication is ordered, "
                "micro_interleaved_order_control.cc); set micro_batch_interleave_num to 1 for the captured run")
    if UNMARKED in kinds:
        named = ", ".join(layer.class_name for layer in wrappers if layer.kind == UNMARKED)
        return (f"{named} slices micro-batches without the marks MindSpore's passes order them by (grad_accu_num "
                "on its slices, a pipeline_end or forward_end Add), so their backward are independent branches")
    if settings.parallel_mode not in SEMI_AUTO_MODES:
        return (f"parallel_mode is {settings.parallel_mode}: no MindSpore pass orders the micro-batches, whose "
                "backward are independent branches")
    if settings.pipeline_stages > 1:
        if settings.pipeline_scheduler not in ORDERED_SCHEDULERS:
            return (f"pipeline_scheduler {settings.pipeline_scheduler!r} splits micro-batches or their backward "
                    f"further; {' and '.join(ORDERED_SCHEDULERS)} run them in order")
        return None
    if ACCUMULATION not in kinds:
        return ("with pipeline_stages 1 only gradient accumulation (GradAccumulation) is ordered by MindSpore "
                "(grad_accumulation_utils.cc ReorderGradAccumulation)")
    return None


def detect(layers: Sequence[Layer], settings: ParallelSettings) -> MicroBatches:
    """The micro-batches of a network whose wrappers (outermost first, ``wrappers.peel``) are ``layers``."""
    wrappers = _wrappers(layers)
    count = 1
    for layer in wrappers:
        count *= layer.count
    if count <= 1:
        return MicroBatches(1, None, "no micro-batches")
    source = ", ".join(layer.describe() for layer in wrappers)
    source += (f" under {settings.parallel_mode}, pipeline_stages {settings.pipeline_stages}, scheduler "
               f"{settings.pipeline_scheduler}{' (interleaved)' if settings.pipeline_interleave else ''}")
    return MicroBatches(count, _why_unordered(wrappers, settings), source)
