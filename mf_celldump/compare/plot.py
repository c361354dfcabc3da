"""The depth plot: per-layer worst metrics along the network, forward and backward, divergence marked."""

from __future__ import annotations

import math
from typing import Optional

from mf_celldump.compare.report import Divergence, layer_table
from mf_celldump.compare.store import Store
from mf_celldump.layout.naming import DIRECTIONS

FLOOR = 1e-12  # plotted instead of 0 on the log axis
MAX_TICKS = 40


def write_plot(
    store: Store, path: str, step: str, rank: str, first: Optional[Divergence], title: str
) -> bool:
    """Write the PNG; False when there is nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = layer_table(store, step, rank)
    if table.empty:
        return False
    labels = list(dict.fromkeys(table.sort_values("depth").layer))
    fig, axes = plt.subplots(2, 1, figsize=(min(16.0, max(6.0, 0.45 * len(labels) + 2)), 6.5), sharex=True)
    for axis, direction in zip(axes, DIRECTIONS):
        part = table[table.direction == direction]
        _series(
            axis,
            part,
            "1 - cosine",
            lambda r: None if _value(r, "cosine") is None else 1.0 - r.cosine,
            "tab:blue",
            "o",
        )
        _series(axis, part, "rel_err", lambda r: r.rel_err, "tab:orange", "s")
        _series(axis, part, "stat_rel (statistics)", lambda r: r.stat_rel, "tab:green", "^")
        axis.set_yscale("log")
        axis.set_ylabel(direction)
        axis.grid(True, which="major", alpha=0.3)
        if first is not None and first.direction == direction and first.step == step and first.rank == rank:
            layer = _layer_of(first.cell, labels)
            if layer is not None:
                x = labels.index(layer)
                axis.axvline(x, color="red", linestyle="--")
                axis.annotate(
                    f"first divergence\n{first.cell}",
                    (x, 0.95),
                    xycoords=("data", "axes fraction"),
                    color="red",
                    fontsize=8,
                    ha="left",
                    va="top",
                )
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7, loc="lower right")
    every = max(1, len(labels) // MAX_TICKS)  # a deep model: label every n-th group
    axes[-1].set_xticks(range(0, len(labels), every))
    axes[-1].set_xticklabels(labels[::every], rotation=60, ha="right", fontsize=7)
    axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _series(axis, part, label, value, color, marker) -> None:
    points = [(int(r.depth), value(r)) for r in part.itertuples() if _finite(value(r))]
    if points:
        xs, ys = zip(*points)
        axis.plot(xs, [max(y, FLOOR) for y in ys], marker=marker, color=color, label=label, linewidth=1)


def _finite(value) -> bool:
    return value is not None and not (isinstance(value, float) and (math.isnan(value) or math.isinf(value)))


def _value(row, name):
    value = getattr(row, name)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _layer_of(cell: str, labels) -> Optional[str]:
    for label in sorted(labels, key=len, reverse=True):
        if cell == label or cell.startswith(label + "."):
            return label
    return None
