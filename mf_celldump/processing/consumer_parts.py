"""One value per call where MindSpore's parallel pass dumped it once per parallel-care consumer.

Under (semi-)auto parallel, when a probed value feeds N parallel-care consumers, MindSpore
deletes its ``'in'`` TensorDump and ``'out'`` DumpGradient and inserts a new TensorDump and
DumpGradient on each consumer's input, after its redistribution if it has one
(``parallel_tensordump.cc``: ``HandleDumpAfterRedistributionNode``, ``InsertNewTensorDump``,
``MakeInModeDumpAfterRedistribution``, ``MakeOutModeDumpBwdHookAfterRedistribution``). Each
copy keeps the file name, so a call of such a probe leaves N forward files (the value as
each consumer takes it) and N gradient files (the gradient coming back from each consumer,
in that consumer's layout, before its redistribution is undone). Only those files can be
copies: forward files MindSpore named ``_in`` (TensorDump ``'in'``), and in a parallel step
the gradient files it did not (DumpGradient ``'out'``). Capture hooks every gradient ``'in'``
under the pass (``capture/backends/tensordump._hook_modes``): MindSpore leaves such a hook on the
producer side, where it records the whole gradient once, so the gradient parts below come only
from ``'out'`` hooks (msprobe 26.2's pairing, or raw data of this format captured before), whose
sum lacks any user outside the parallel-care consumers.

MindSpore 2.9 copies for EVERY parallel-care consumer (``ParallelProcessor::StepRedistribution``
hands them all to the handler, also where ``Redistribution`` inserted no operator), so copies in
the producer's layout are copies too. Two copies of one shard shape may still hold different
regions of the value (split along different device axes): nothing in their names says which,
so their contents are compared.

Here each call's N captures become one, so consumers are never counted as calls:

* forward: the consumers' copies of one shape and equal contents (file bytes, or statistics
  rows) are one value, recorded once; copies of different shapes (consumers taking different
  layouts) or different contents (different regions) are kept as parts;
* backward: the parts of one shape (tensor files) are summed into one gradient only where the
  probe's forward copies were all found equal (the parts then are gradients of one region); in
  float64
  and rounded once to the dtype (``part_sums.py``): the exact sum rounded once, for float32
  parts within 2**29 of each other's magnitude and for any bfloat16/float16 parts; MindSpore's
  own ``AddN`` rounds after each term, so with three or more parts the last bit may differ; parts
  of different shapes, of a probe whose forward copies differ or were not captured (nothing
  shows they cover one region), or statistics rows (statistics of a sum cannot be formed from
  the parts' statistics), stay parts.

Parts are named as parts: the value at index path ``p`` becomes a list, part i at ``p + (i,)``
(``...input.0.0``, ``...input.0.1`` in msprobe's names), and the step's report says which
values are parts and why. Parts are numbered in execution order: the files do not say which
consumer a part came from (every copy has the same name), and the consumers' backward are
independent branches the scheduler orders freely (the emulation ran them 2, 0, 1), so part
i of a gradient need not be the consumer of forward part i. A sum does not depend on it.

The calls of a cell come from its probes that are never copied (a forward ``'out'`` dump,
a gradient of an ``'out'`` value); a cell all of whose values are copied takes the
smallest count among them. A call's copies are taken as consecutive in execution order
(true for a cell's calls in a chain; calls on independent values whose consumers
interleave would need more than the files say).
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, Dict, List, Optional, Tuple

from mf_celldump.layout import naming
from mf_celldump.rawformat.keys import KIND_TENSOR, SLOT_ARG, SLOT_KWARG, SLOT_OUTPUT, Capture

ShapeOf = Callable[[Capture], Optional[Tuple[int, ...]]]
# What a capture holds, comparable between captures of one shape and dtype (a digest of its file, or its
# statistics); None when it cannot be read.
ContentOf = Callable[[Capture], Optional[object]]


def _copyable(capture: Capture) -> Optional[bool]:
    """True: may be one of several consumers' copies; False: never copied; None: not a per-call value here."""
    key = capture.key
    if key.call is not None or key.kind != KIND_TENSOR or key.slot not in (SLOT_ARG, SLOT_KWARG, SLOT_OUTPUT):
        return None
    return capture.in_mode if key.direction == naming.FORWARD else not capture.in_mode


def _calls_per_cell(groups: Dict[tuple, List[Capture]], copyable: Dict[tuple, bool]) -> Dict[tuple, int]:
    """(cell, direction) -> its number of calls: the most common count of its never-copied probes, else
    the smallest count of its probes."""
    counts: Dict[tuple, List[int]] = {}
    fallback: Dict[tuple, int] = {}
    for probe, group in groups.items():
        where = probe[:2]
        fallback[where] = min(fallback.get(where, len(group)), len(group))
        if not copyable[probe]:
            counts.setdefault(where, []).append(len(group))
    return {where: Counter(counts[where]).most_common(1)[0][0] if where in counts else fallback[where]
            for where in fallback}


def merge_consumer_parts(captures: List[Capture], shape_of: ShapeOf, problems: List[str],
                         warnings: List[str], content_of: Optional[ContentOf] = None) -> List[Capture]:
    """``captures`` with each call's consumer copies merged (module docstring); other captures unchanged.
    Without ``content_of`` copies of one shape are taken as one region."""
    if not any(c.in_mode for c in captures):
        return captures  # not a (semi-)auto parallel graph: MindSpore copied nothing
    groups: Dict[tuple, List[Capture]] = {}
    copyable: Dict[tuple, bool] = {}
    for capture in captures:
        flag = _copyable(capture)
        if flag is not None:
            groups.setdefault(capture.probe, []).append(capture)
            copyable[capture.probe] = flag
    calls = _calls_per_cell(groups, copyable)
    replaced: Dict[int, List[Capture]] = {}
    merge = _CallMerger(shape_of, content_of, warnings)
    for probe, group in sorted(groups.items(), key=lambda item: item[0][1] != naming.FORWARD):
        count = calls[probe[:2]]
        if not copyable[probe] or len(group) == count:
            continue
        if count == 0 or len(group) % count:
            problems.append(f"cell id {probe[0]} {probe[1]} {probe[2]}{list(probe[3])}: {len(group)} captures for "
                            f"{count} calls, not one per parallel-care consumer of each; numbered as calls")
            continue
        group.sort(key=lambda c: c.sort_key)
        size = len(group) // count
        for start in range(0, len(group), size):
            merged = merge(group[start:start + size])
            replaced[id(group[start])] = merged
            for dropped in group[start + 1:start + size]:
                replaced[id(dropped)] = []
    out: List[Capture] = []
    for capture in captures:
        out.extend(replaced.get(id(capture), [capture]))
    return out


class _CallMerger:
    """Merges one call's copies of one probe; forward probes first, so that a gradient is summed only where
    the same probe's forward copies were found to hold one region."""

    def __init__(self, shape_of: ShapeOf, content_of: Optional[ContentOf], warnings: List[str]):
        self.shape_of, self.content_of, self.warnings = shape_of, content_of, warnings
        self.forward_differs: Dict[tuple, bool] = {}  # (cell, slot, path) -> a call's copies differed

    def __call__(self, copies: List[Capture]) -> List[Capture]:
        """One capture (a value, or a sum of gradient files), else the call's parts."""
        shapes = [self.shape_of(c) for c in copies]
        same = None not in shapes and len(set(shapes)) == 1
        first = copies[0]
        where = (first.key.cell_id, first.key.slot, first.key.path)
        if first.key.direction == naming.FORWARD:
            differs = same and self._contents_differ(copies)
            self.forward_differs[where] = self.forward_differs.get(where, False) or not same or differs
            if same and not differs:
                return [first]
            return self._parts(copies, "their contents differ (one shard shape, different regions of the value)"
                               if same else "their shapes differ (the consumers take different layouts)")
        if not same:
            return self._parts(copies, "their shapes differ (the consumers take different layouts)")
        if any(c.file is None for c in copies):
            return self._parts(copies, "statistics of a sum cannot be formed from the parts' statistics")
        if self.forward_differs.get(where, True):
            return self._parts(copies, "the forward copies of this value differ or were not captured, so nothing "
                                       "shows the parts are gradients of one region")
        first.parts = tuple(c.file for c in copies[1:])
        return [first]

    def _contents_differ(self, copies: List[Capture]) -> bool:
        if self.content_of is None:
            return False
        contents = [self.content_of(c) for c in copies]
        return None in contents or any(content != contents[0] for content in contents[1:])

    def _parts(self, copies: List[Capture], why: str) -> List[Capture]:
        key = copies[0].key
        self.warnings.append(f"cell id {key.cell_id} {key.direction} {key.slot}{list(key.path)}: {len(copies)} "
                             "parts, one per parallel-care consumer (MindSpore's parallel pass), recorded as parts: "
                             f"{why}")
        parts = []
        for index, copy in enumerate(copies):
            part = copy.copy()
            part.key = copy.key.with_path(copy.key.path + (index,))
            parts.append(part)
        return parts
