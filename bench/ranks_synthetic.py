"""Synthetic statistics dumps of many data-parallel ranks, in msprobe's layout, with faults on chosen ranks.

A LLaMA-shaped cell tree (embedding, ``layers.N`` with attention wq/wk/wv/wo and a
feed-forward w1/w2/w3, two norms each, final norm, head): forward entries in call order
(parent first, as our dumps), backward entries in reverse, then the weight gradients
(``parameters_grad``). 33 entries per layer plus 9. Every replica holds the same weights;
activations differ by a few percent from rank to rank (different data); weight gradients
are the reduced ones (equal on every rank) unless ``local_grads``.

Faults (``Fault``): ``weight`` (one weight's statistics differ on that rank), ``scale``
(that cell's forward output and every later forward output x factor), ``nan`` (that cell's
forward output and everything after it NaN).

    python bench/ranks_synthetic.py OUT --ranks 8 --steps 2 --entries 1000
"""

from __future__ import annotations

import argparse
import math
import os
import zlib
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

HIDDEN = 64
LAYER_CELLS = (  # (name, class, weights {name: shape}, output width)
    ("", "LLamaDecodeLayer", {}, HIDDEN),
    ("attention_norm", "LlamaRMSNorm", {"weight": [HIDDEN]}, HIDDEN),
    ("attention", "LLamaAttention", {}, HIDDEN),
    ("attention.wq", "Linear", {"weight": [HIDDEN, HIDDEN]}, HIDDEN),
    ("attention.wk", "Linear", {"weight": [HIDDEN, HIDDEN]}, HIDDEN),
    ("attention.wv", "Linear", {"weight": [HIDDEN, HIDDEN]}, HIDDEN),
    ("attention.wo", "Linear", {"weight": [HIDDEN, HIDDEN]}, HIDDEN),
    ("ffn_norm", "LlamaRMSNorm", {"weight": [HIDDEN]}, HIDDEN),
    ("feed_forward", "LlamaFeedForward", {}, HIDDEN),
    ("feed_forward.w1", "Linear", {"weight": [4 * HIDDEN, HIDDEN]}, 4 * HIDDEN),
    ("feed_forward.w3", "Linear", {"weight": [4 * HIDDEN, HIDDEN]}, 4 * HIDDEN),
    ("feed_forward.w2", "Linear", {"weight": [HIDDEN, 4 * HIDDEN]}, HIDDEN),
)
TOKENS = 32


@dataclass(frozen=True)
class Fault:
    kind: str  # weight | scale | nan
    rank: int
    step: int
    cell: str
    factor: float = 100.0


def layers_for(entries: int) -> int:
    return max(1, (entries - 9) // (3 * len(LAYER_CELLS) - 3))


def cell_list(layers: int) -> List[Tuple[str, str, Dict[str, list], int]]:
    cells = [("model.tok_embeddings", "LlamaEmbedding", {"embedding_weight": [1000, HIDDEN]}, HIDDEN)]
    for index in range(layers):
        prefix = f"model.layers.{index}"
        cells.extend((f"{prefix}.{name}" if name else prefix, cls, weights, width)
                     for name, cls, weights, width in LAYER_CELLS)
    cells.append(("model.norm_out", "LlamaRMSNorm", {"weight": [HIDDEN]}, HIDDEN))
    cells.append(("lm_head", "Linear", {"weight": [1000, HIDDEN]}, 1000))
    return cells


def _unit(*key) -> float:
    """A deterministic number in [0, 1) from a key."""
    return (zlib.crc32(repr(key).encode()) & 0xFFFFFF) / float(1 << 24)


def _noise(*key) -> float:
    """Deterministic, roughly normal (sum of uniforms), mean 0, standard deviation 1."""
    return (sum(_unit(i, *key) for i in range(6)) - 3.0) * math.sqrt(2.0)


def _record(shape: Sequence[int], norm: float, mean: float = 0.0) -> str:
    if math.isnan(norm):
        values = ("NaN",) * 4
    else:
        elements = math.prod(shape)
        peak = norm / math.sqrt(elements) * 4.0
        values = (repr(peak), repr(-peak * 0.9), repr(mean), repr(norm))
    return ('{"type": "mindspore.Tensor", "dtype": "Float32", "shape": %s, "Max": %s, "Min": %s, "Mean": %s, '
            '"Norm": %s}' % ((list(shape),) + values))


class RankWriter:
    """Writes one rank's dump.json for one step."""

    def __init__(self, cells, step: int, rank: int, faults: Iterable[Fault], local_grads: bool):
        self.cells, self.step, self.rank, self.local_grads = cells, step, rank, local_grads
        self.faults = [f for f in faults if f.rank == rank and f.step == step]

    def _fault(self, kind: str) -> Optional[Fault]:
        return next((f for f in self.faults if f.kind == kind), None)

    def forward_norms(self) -> List[float]:
        scale, nan = self._fault("scale"), self._fault("nan")
        factor, bad = 1.0, False
        norms = []
        for cell, _, _, width in self.cells:
            factor *= scale.factor if scale is not None and cell == scale.cell else 1.0
            bad = bad or (nan is not None and cell == nan.cell)
            base = 10 ** (1.0 + 2.0 * _unit(cell)) * math.sqrt(width / HIDDEN)
            norms.append(math.nan if bad else base * factor * math.exp(0.05 * _noise(cell, self.step, self.rank)))
        return norms

    def weight(self, cell: str, name: str, shape) -> str:
        norm = 10 ** (0.5 + _unit(cell, name)) * (1.0 + 0.001 * self.step)
        fault = self._fault("weight")
        mean = 0.001 * _noise(cell, name, self.step)
        if fault is not None and fault.cell == cell:
            mean += 1e-6  # one element changed: the statistics move a little
        return _record(shape, norm, mean)

    def grad(self, cell: str, name: str, shape, anomalous: bool) -> str:
        norm = 10 ** (-2.0 + _unit(cell, name, "g")) * (1.0 + 0.01 * self.step)
        if self.local_grads:
            norm *= math.exp(0.1 * _noise(cell, name, self.step, self.rank))
        return _record(shape, math.nan if anomalous else norm)

    def entries(self) -> Iterable[str]:
        norms = self.forward_norms()
        anomalous = any(math.isnan(n) for n in norms)
        for (cell, cls, weights, width), norm in zip(self.cells, norms):
            params = ", ".join(f'"{n}": {self.weight(cell, n, s)}' for n, s in weights.items())
            yield (f'"Cell.{cell}.{cls}.forward.0": {{"input_args": [{_record([TOKENS, HIDDEN], 30.0)}], '
                   f'"input_kwargs": {{}}, "output": [{_record([TOKENS, width], norm)}], "parameters": {{{params}}}}}')
        for cell, cls, _, width in reversed(self.cells):
            grad_norm = math.nan if anomalous else 10 ** (-1.0 + _unit(cell, "b")) * \
                math.exp(0.05 * _noise(cell, "b", self.step, self.rank))
            yield (f'"Cell.{cell}.{cls}.backward.0": {{"input_args": [{_record([TOKENS, width], grad_norm)}], '
                   f'"output": [{_record([TOKENS, HIDDEN], grad_norm)}]}}')
        for cell, cls, weights, _ in self.cells:
            if weights:
                grads = ", ".join(f'"{n}": [{self.grad(cell, n, s, anomalous)}]' for n, s in weights.items())
                yield f'"Cell.{cell}.{cls}.parameters_grad.0": {{{grads}}}'

    def write(self, folder: str) -> None:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "dump.json"), "w", encoding="utf-8") as handle:
            handle.write('{"task": "statistics", "level": "L0", "framework": "mindspore", '
                         '"dump_data_dir": null, "data": {\n')
            handle.write(",\n".join(self.entries()))
            handle.write("\n}}\n")


def write_dump(root: str, ranks: int, steps: Sequence[int], entries: int = 1000,
               faults: Iterable[Fault] = (), local_grads: bool = False,
               ranks_here: Optional[Iterable[int]] = None) -> int:
    """``root/step{S}/rank{R}/dump.json`` for every step and rank (``ranks_here``: only these); returns
    the number of entries per file."""
    cells = cell_list(layers_for(entries))
    faults = list(faults)
    for step in steps:
        for rank in (range(ranks) if ranks_here is None else ranks_here):
            RankWriter(cells, step, rank, faults, local_grads).write(os.path.join(root, f"step{step}", f"rank{rank}"))
    return 3 * len(cells) - sum(1 for c in cells if not c[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--entries", type=int, default=1000)
    args = parser.parse_args()
    count = write_dump(args.out, args.ranks, range(args.steps), args.entries)
    print(f"{args.ranks} ranks x {args.steps} steps x {count} entries under {args.out}")


if __name__ == "__main__":
    main()
