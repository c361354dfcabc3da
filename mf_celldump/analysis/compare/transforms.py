"""Bring a baseline tensor into our tensor's layout, as the mapping entry's compare rules declare.

Activations, in order: ``layout=sbh`` swaps the first two axes of a baseline tensor of 3+
dimensions; ``split`` takes our part of a fused last axis; ``act`` applies the activation
our cell ends with. Weights and their gradients ([out, in] on both sides): ``split`` takes
our rows of a fused first axis, the same parts as the activations (a fused projection's
output features are its weight's rows); layout and activation do not apply. Finally a
tensor with the same number of elements and the same last axis is reshaped to our shape
(``[b, s, h]`` against ``[b*s, h]``). Whatever cannot be lined up raises
:class:`NotComparable` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from mf_celldump.errors import NotComparable
from mf_celldump.mapping.compare_rules import CompareRules, Split


@dataclass(frozen=True)
class Plan:
    """What is done to one baseline tensor before it is compared with ours."""

    rules: CompareRules
    use_split: bool = False
    use_act: bool = False
    weight: bool = False  # a weight or weight gradient: split along rows, no layout, no activation
    qkv_groups: Optional[int] = None

    @property
    def split(self) -> Optional[Split]:
        return self.rules.split if self.use_split else None

    @property
    def act(self) -> Optional[str]:
        return self.rules.act if self.use_act and not self.weight else None

    @property
    def partial(self) -> bool:
        """The compared values are a part or a function of the baseline's: its recorded statistics do not apply."""
        return self.split is not None or self.act is not None

    @property
    def identity(self) -> bool:
        """Nothing moves: the two tensors' bytes may be compared (CRC-32)."""
        return not self.partial and (self.weight or not self.rules.seq_first)

    def describe(self) -> str:
        """Short text of the transforms applied to the baseline, for the table."""
        steps = []
        if self.rules.seq_first and not self.weight:
            steps.append("sbh->bsh")
        if self.split is not None:
            split = self.split
            rows = " rows" if self.weight else ""
            count = f"/{split.count}" if split.kind == "chunk" else ""
            steps.append(f"split{rows} {split.kind}:{split.part}{count}")
        if self.act:
            steps.append(self.act)
        return ", ".join(steps)

    def apply(self, baseline: np.ndarray, target_shape: tuple) -> np.ndarray:
        if self.weight:
            return weight_to_target(baseline, target_shape, self.split, self.qkv_groups)
        return to_target(baseline, target_shape, self.rules, self.use_split, self.use_act, self.qkv_groups)


def describe(rules: CompareRules, use_split: bool, use_act: bool) -> str:
    """Short text of the transforms applied to a baseline activation."""
    return Plan(rules, use_split, use_act).describe()


def to_target(
    baseline: np.ndarray,
    target_shape: tuple,
    rules: CompareRules,
    use_split: bool,
    use_act: bool,
    qkv_groups: Optional[int] = None,
) -> np.ndarray:
    """The baseline array transformed to compare with a target array of ``target_shape``."""
    array = baseline
    if rules.seq_first and array.ndim >= 3:
        array = np.swapaxes(array, 0, 1)
    if use_split and rules.split is not None:
        part_size = target_shape[-1] if target_shape else 0
        array = take_part(array, rules.split, part_size, qkv_groups)
    if use_act and rules.act:
        array = activation(rules.act, array)
    return _reshaped(array, target_shape)


def weight_to_target(
    baseline: np.ndarray, target_shape: tuple, split: Optional[Split], qkv_groups: Optional[int] = None
) -> np.ndarray:
    """A baseline weight (or its gradient) to compare with ours: our rows of a fused projection."""
    array = baseline
    if split is not None:
        if array.ndim < 1 or not target_shape:
            raise NotComparable(f"a weight of shape {list(array.shape)} has no rows to split")
        rows = np.moveaxis(array, 0, -1)
        array = np.moveaxis(take_part(rows, split, int(target_shape[0]), qkv_groups), -1, 0)
    return _reshaped(array, target_shape)


def _reshaped(array: np.ndarray, target_shape: tuple) -> np.ndarray:
    if tuple(array.shape) != tuple(target_shape):
        same_last = bool(target_shape) and array.ndim > 0 and array.shape[-1] == target_shape[-1]
        if array.size == int(np.prod(target_shape)) and same_last:
            return array.reshape(target_shape)
        raise NotComparable(f"shape {list(array.shape)} (after transforms) against {list(target_shape)}")
    return array


def take_part(array: np.ndarray, split: Split, part_size: int, groups: Optional[int]) -> np.ndarray:
    """Our part of a fused last axis: chunk I of N, or q/k/v of a per-group interleaved projection."""
    fused = array.shape[-1]
    if split.kind == "chunk":
        if fused % split.count:
            raise NotComparable(f"last axis {fused} does not split into {split.count} chunks")
        return np.split(array, split.count, axis=-1)[int(split.part)]
    if split.part == "q":
        q_size, kv_size = part_size, (fused - part_size) // 2
    else:
        kv_size = part_size
        q_size = fused - 2 * kv_size
    if q_size <= 0 or kv_size <= 0 or q_size + 2 * kv_size != fused:
        raise NotComparable(f"a {split.part} part of {part_size} does not fit a fused q/k/v axis of {fused}")
    if not groups:
        raise NotComparable("number of query groups unknown; give --qkv-groups")
    if q_size % groups or kv_size % groups:
        raise NotComparable(f"{groups} query groups do not divide q {q_size} / kv {kv_size}")
    q_per, kv_per = q_size // groups, kv_size // groups
    grouped = array.reshape(*array.shape[:-1], groups, q_per + 2 * kv_per)
    start = {"q": 0, "k": q_per, "v": q_per + kv_per}[split.part]
    width = q_per if split.part == "q" else kv_per
    part = grouped[..., start : start + width]
    return part.reshape(*array.shape[:-1], groups * width)


def activation(name: str, array: np.ndarray) -> np.ndarray:
    values = array.astype(np.float64)
    if name == "silu":
        return values / (1.0 + np.exp(-values))
    if name == "relu":
        return np.maximum(values, 0.0)
    if name == "gelu":  # the tanh approximation, as Megatron's fused gelu
        return 0.5 * values * (1.0 + np.tanh(0.7978845608028654 * (values + 0.044715 * values**3)))
    raise NotComparable(f"unknown activation {name!r}")
