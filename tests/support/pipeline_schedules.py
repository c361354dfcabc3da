"""The order in which one pipeline stage runs its micro-batches' forward and backward units, as
MindSpore's schedulers fix it with control edges (semi_auto_parallel / auto_parallel, Ascend).

Written from MindSpore's sources (repository mindspore-ai/mindspore):

* ``one_f_one_b`` -- ``ccsrc/frontend/parallel/graph_util/pipeline_split_utils.cc``
  ``ReorderForForward`` / ``ReorderForBackward`` (``pipeline_interleave`` off): stage ``s`` of
  ``S`` runs ``S - s`` forwards, then alternates backward ``i - (S - s)`` and forward ``i``,
  then the remaining backwards; units of one kind in micro-batch order (``CompFunc``).
* ``interleaved`` -- ``ccsrc/frontend/parallel/pipeline_transformer/pipeline_scheduler.cc``
  ``InterleavedScheduler::Reorder`` / ``WarmUpPhaseReorder``: forward units sorted by
  (micro // S, chunk, micro), backward units by (micro // S, -chunk, micro)
  (``SortFuncBetweenMicro``); ``bias = S * (chunks - 1) + (S - s - 1) * 2`` forwards before
  the first backward, then backward ``i - bias`` after forward ``i``, then the rest.
* ``gpipe`` -- ``gpipe_interleave_scheduler.cc`` ``GpipeInterleavedScheduler::Reorder``: every
  forward (sorted), then every backward (sorted).
* ``grad_accumulation`` -- ``ccsrc/frontend/parallel/graph_util/grad_accumulation_utils.cc``
  ``ReorderGradAccumulation``: the backward of micro-batch k ends before the forward of k+1.

A unit is ``(direction, chunk, micro)`` with direction ``"F"`` or ``"B"``.
"""

from __future__ import annotations

from typing import List, Tuple

Unit = Tuple[str, int, int]


def one_f_one_b(stage: int, stages: int, micro: int) -> List[Unit]:
    warmup = min(stages - stage, micro)
    order: List[Unit] = [("F", 0, m) for m in range(warmup)]
    for m in range(warmup, micro):
        order += [("B", 0, m - warmup), ("F", 0, m)]
    order += [("B", 0, m) for m in range(micro - warmup, micro)]
    return order


def _sorted_units(stages: int, micro: int, chunks: int, backward: bool) -> List[Tuple[int, int]]:
    units = [(chunk, m) for chunk in range(chunks) for m in range(micro)]
    return sorted(units, key=lambda u: (u[1] // stages, -u[0] if backward else u[0], u[1]))


def interleaved(stage: int, stages: int, micro: int, chunks: int) -> List[Unit]:
    if micro < 2 * stages or micro % stages:
        # InterleavedScheduler::Reorder raises the same condition
        raise ValueError(f"For 1F1B Scheduler, MicroBatch num must be a multiple of StageNum, and must be larger or "
                         f"equal than StageNum * 2, but got MicroBatch:{micro} StageNum:{stages}")
    forward = [("F",) + u for u in _sorted_units(stages, micro, chunks, False)]
    backward = [("B",) + u for u in _sorted_units(stages, micro, chunks, True)]
    total = micro * chunks
    bias = stages * (chunks - 1) + (stages - stage - 1) * 2
    order: List[Unit] = forward[:bias + 1]
    for i in range(bias, total):
        order.append(backward[i - bias])
        if i + 1 < total:
            order.append(forward[i + 1])
    order += backward[total - bias:]
    return order


def gpipe(stages: int, micro: int, chunks: int) -> List[Unit]:
    return ([("F",) + u for u in _sorted_units(stages, micro, chunks, False)]
            + [("B",) + u for u in _sorted_units(stages, micro, chunks, True)])


def grad_accumulation(micro: int) -> List[Unit]:
    return [unit for m in range(micro) for unit in (("F", 0, m), ("B", 0, m))]


def check(order: List[Unit], micro: int, chunks: int) -> None:
    """Every unit once; a micro-batch's backward after its forward, chunk by chunk in data order."""
    assert sorted(order) == sorted((d, c, m) for d in "FB" for c in range(chunks) for m in range(micro)), order
    seen = set()
    for direction, chunk, m in order:
        if direction == "F":
            assert chunk == 0 or ("F", chunk - 1, m) in seen, order
        else:
            assert ("F", chunks - 1, m) in seen and (chunk == chunks - 1 or ("B", chunk + 1, m) in seen), order
        seen.add((direction, chunk, m))
