"""The depth plot: per-layer worst metrics along the network, forward and backward, divergence marked."""

from __future__ import annotations

import math
from typing import Mapping, Optional, Tuple

from mf_celldump.analysis.compare.report import Divergence, layer_table
from mf_celldump.analysis.compare.store import PAIRS, Store
from mf_celldump.analysis.compare.thresholds import Thresholds, thresholds_for
from mf_celldump.analysis.extras import pyplot
from mf_celldump.errors import MissingExtra
from mf_celldump.layout.naming import DIRECTIONS

FLOOR = 1e-12  # plotted instead of 0 on the log axis
MAX_TICKS = 40


NO_PLOT = (
    "no plot: no compared activation belongs to a depth group (cells named like model.layers.N, "
    "the embedding, the final norm, the head)"
)


def dominant_limits(store: Store, step, rank, table) -> Tuple[str, Thresholds]:
    """The dtype most compared activations of a unit have, and its thresholds (the lines on the plots)."""
    row = store.query(
        "select dtype, baseline_dtype, count(*) from pairs where status != 'skipped' and kind = 'activation' "
        "and step is ? and rank = ? group by dtype, baseline_dtype order by count(*) desc limit 1",
        (step, rank),
    )
    dtype, base_dtype = (row[0][0], row[0][1]) if row else ("float32", "float32")
    return dtype or "float32", thresholds_for(dtype or "", base_dtype or "", table)


def plot_in_worker(store_path: str, *args) -> str:
    """:func:`write_plot` in a worker process, reading the store through its own connection."""
    store = Store.reader(store_path, PAIRS)
    try:
        return write_plot(store, *args)
    finally:
        store.close()


def write_plot(
    store: Store, path: str, step, rank, first: Optional[Divergence], title: str, table: Mapping[str, Thresholds]
) -> str:
    """Write the PNG; returns "" when written, else why there is nothing to plot (or no matplotlib)."""
    layers = layer_table(store, step, rank)
    if not layers:
        return NO_PLOT
    try:
        plt = pyplot("the depth plot")
    except MissingExtra as err:
        return f"no plot: {err}"
    dtype, limits = dominant_limits(store, step, rank, table)
    lines = {"1 - cosine": 1.0 - limits.cosine, "rel_err": limits.rel_err, "stat_rel": limits.stat_rel}
    labels = list(dict.fromkeys(row.layer for row in layers))  # in depth order
    fig, axes = plt.subplots(2, 1, figsize=(min(16.0, max(6.0, 0.45 * len(labels) + 2)), 6.5), sharex=True)
    for axis, direction in zip(axes, DIRECTIONS):
        part = [row for row in layers if row.direction == direction]
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
        for (_name, value), color in zip(lines.items(), ("tab:blue", "tab:orange", "tab:green")):
            if value > 0:
                axis.axhline(value, color=color, linestyle=":", linewidth=0.8)
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
    axes[0].set_title(f"{title}\ndotted: {dtype} thresholds", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return ""


def _series(axis, part, label, value, color, marker) -> None:
    points = [(r.depth, value(r)) for r in part if _finite(value(r))]
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
