"""Compare rules: the optional ``key=value`` items after the mode lists of a mapping entry.

    wq: linear_qkv([in], [out], layout=sbh, split=qkv:q)

msprobe compare keeps only the text before the first ``(`` of a value
(``preprocess_layer_mapping`` in msprobe/core/compare/layer_mapping/layer_mapping.py), so
these items are invisible to it; ``mf-celldump compare`` reads them to line tensors up:

* ``layout=sbh``: the baseline's activations are [seq, batch, ...] where ours are
  [batch, seq, ...] (Megatron); a baseline tensor of 3 or more dimensions is compared
  after swapping its first two axes. ``layout=bsh`` (the default) changes nothing.
* ``split=qkv:q|k|v``: the baseline is a fused q/k/v projection, interleaved per query
  group (``[q of the group's heads, k, v]`` for each group, Megatron's ``linear_qkv``);
  this cell's tensor is the named part.
* ``split=chunk:I/N``: the baseline is N equal chunks along the last axis and this cell is
  chunk I (``linear_fc1`` = gate then up: ``w1`` is ``chunk:0/2``, ``w3`` ``chunk:1/2``).
* ``act=silu``: this cell's forward output is the baseline's after the activation.
* ``in=[a, b, ...]``: which baseline input each of our positional inputs is compared
  with: an index, a keyword name (``hidden_states``) or ``_`` (not compared).
* ``shard=column|row|vocab|split|none|reduce|gather|scatter|reduce_scatter|copy``: how a
  tensor-parallel cell's tensors are split over
  the ranks of its group, for ``mf-celldump compare --target-tp/--baseline-tp`` (which puts
  the shards back together before comparing, ``compare/shards.py``). On a class's ``""``
  entry it holds for every cell of the class; on the entry of one cell, for that cell.
  Without either, ``DEFAULT_SHARDS`` names the usual tensor-parallel classes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional, Tuple, Union

from mf_celldump.errors import RuleError

RuleValue = Union[str, Tuple[str, ...]]

LAYOUTS = ("bsh", "sbh")
QKV_PARTS = ("q", "k", "v")
ACTIVATIONS = ("silu", "gelu", "relu")
# column: output features split (weight rows); row: input features split (weight columns), the
# output a partial sum until reduced; vocab: embedding rows split, the output reduced; split:
# every activation split on its last axis, no weight split (attention over the local heads, an
# activation function between a column- and a row-parallel layer); none: replicated.
# reduce, gather, scatter, reduce_scatter, copy: the communication-region cells (all-reduce: partial sums in,
# replicated out; all-gather / split on the last axis; reduce-scatter on the first; identity whose backward
# all-reduces).
SHARDS = ("column", "row", "vocab", "split", "none", "reduce", "gather", "scatter", "reduce_scatter", "copy")
DEFAULT_SHARDS = {  # class name -> shard rule (MindFormers' mcore and Megatron-core spell them alike)
    "ColumnParallelLinear": "column",
    "RowParallelLinear": "row",
    "VocabParallelEmbedding": "vocab",
    # MindFormers' region cells (parallel_core/inference/tensor_parallel/mappings.py); Megatron-core's regions
    # are autograd functions, not modules, so they leave no entry of their own.
    "ReduceFromModelParallelRegion": "reduce",
    "GatherFromModelParallelRegion": "gather",
    "ScatterToModelParallelRegion": "scatter",
    "ReduceScatterToModelParallelRegion": "reduce_scatter",
}
_CHUNK_RE = re.compile(r"chunk:(\d+)/(\d+)$")
_QKV_RE = re.compile(r"qkv:([qkv])$")
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$|\d+$")

RULE_SYNTAX = (
    "layout=sbh|bsh, split=qkv:q|k|v or split=chunk:I/N, act=silu|gelu|relu, "
    "in=[index, keyword name or _, ...], "
    "shard=column|row|vocab|split|none|reduce|gather|scatter|reduce_scatter|copy"
)


@dataclass(frozen=True)
class Split:
    """Which part of a fused baseline tensor (last axis) this cell corresponds to."""

    kind: str  # "qkv" or "chunk"
    part: str  # q/k/v, or the chunk index
    count: int = 0  # number of chunks (chunk only)


@dataclass(frozen=True)
class CompareRules:
    """The parsed rules of one entry (all optional)."""

    layout: str = "bsh"
    split: Optional[Split] = None
    act: Optional[str] = None
    inputs: Tuple[str, ...] = ()
    shard: Optional[str] = None

    @property
    def seq_first(self) -> bool:
        return self.layout == "sbh"

    def baseline_input(self, index: int) -> Optional[str]:
        """Baseline input slot for our positional input ``index``: ``"2"``, ``"hidden_states"`` or None."""
        if index < len(self.inputs):
            return None if self.inputs[index] == "_" else self.inputs[index]
        return str(index)


def check_rule(key: str, value: RuleValue) -> None:
    """Raise :class:`RuleError` unless ``key=value`` is a valid rule."""
    if key == "layout":
        _scalar(key, value, LAYOUTS)
    elif key == "split":
        text = _scalar(key, value, None)
        chunk = _CHUNK_RE.match(text)
        if chunk and int(chunk.group(1)) < int(chunk.group(2)):
            return
        if not _QKV_RE.match(text):
            raise RuleError(f"split={text!r}: expected qkv:q, qkv:k, qkv:v or chunk:I/N with I < N")
    elif key == "act":
        _scalar(key, value, ACTIVATIONS)
    elif key == "shard":
        _scalar(key, value, SHARDS)
    elif key == "in":
        items = value if isinstance(value, tuple) else (value,)
        bad = [item for item in items if item != "_" and not _NAME_RE.match(item)]
        if bad:
            raise RuleError(f"in=[...]: {', '.join(map(repr, bad))} is not an index, a keyword name or _")
    else:
        raise RuleError(f"unknown rule {key!r}; known: {RULE_SYNTAX}")


def _scalar(key: str, value: RuleValue, allowed) -> str:
    if isinstance(value, tuple):
        raise RuleError(f"{key}= takes one value, not a list")
    if allowed is not None and value not in allowed:
        raise RuleError(f"{key}={value!r}: expected one of {', '.join(allowed)}")
    return value


def parse_rules(items: Tuple[Tuple[str, RuleValue], ...]) -> CompareRules:
    """Build :class:`CompareRules` from validated ``(key, value)`` items (later items win)."""
    found: Dict[str, RuleValue] = dict(items)
    inputs = found.get("in", ())
    return CompareRules(
        layout=str(found.get("layout", "bsh")),
        split=_split(str(found["split"])) if "split" in found else None,
        act=str(found["act"]) if "act" in found else None,
        inputs=inputs if isinstance(inputs, tuple) else (inputs,),
        shard=str(found["shard"]) if "shard" in found else None,
    )


def _split(text: str) -> Split:
    chunk = _CHUNK_RE.match(text)
    if chunk:
        return Split("chunk", chunk.group(1), int(chunk.group(2)))
    return Split("qkv", text.split(":", 1)[1])


def format_rules(items: Tuple[Tuple[str, RuleValue], ...]) -> str:
    """``key=value`` items in file syntax, comma-separated."""
    return ", ".join(f"{k}=[{', '.join(v)}]" if isinstance(v, tuple) else f"{k}={v}" for k, v in items)
