"""The replica check written down: a table of findings (CSV, pandas) and a ranks x layers heat map (PNG).

Each heat-map cell is how far that rank's largest output or gradient of that layer lies
from the other replicas' mean, in orders of magnitude (|log10 ratio|); a cross marks a
weight that is not bit-identical to the majority, a red circle the first NaN/Inf.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np

from mf_celldump.ranks.replicas import MARK_ANOMALY, MARK_DEPARTURE, GroupResult

COLUMNS = ("step", "group", "finding", "rank", "direction", "cell", "tensor", "detail", "count")
HEAT_CAP = 3.0  # orders of magnitude: the colour scale saturates here
MAX_TICKS = 40
# Rows drawn at most: beyond, each row is the worst of consecutive ranks. Matplotlib's image
# resampling takes memory in proportion to the rows (126 MB at 1024 rows, 53 at 64); the
# table names every rank anyway.
MAX_ROWS = 128


def finding_rows(results: List[GroupResult], missing: Dict, labels: Dict[str, str]) -> List[dict]:
    rows = []
    for result in results:
        base = {"step": result.step, "group": labels.get(result.group) or "all"}
        for rank, anomaly in result.anomaly:
            rows.append(dict(base, finding=f"first {anomaly.kind}", rank=rank, direction=anomaly.direction,
                             cell=anomaly.cell, tensor=", ".join(s["slot"] for s in anomaly.slots),
                             detail=anomaly.entry))
        for item in result.departures:
            rows.append(dict(base, finding="departs", rank=item["rank"], direction="forward" if item["kind"] ==
                             "weight" else "backward", cell=item["cell"], tensor=item["label"],
                             detail=f"{item['kind']} not bit-identical to the majority", count=item["count"]))
        for item in result.suspects:
            rows.append(dict(base, finding="suspect", rank=item["rank"], cell=item["cell"], tensor=item["label"],
                             direction="backward" if item["label"].startswith(("backward", "grad")) else "forward",
                             detail=f"{item['metric']} x{10 ** item['deviation']:.3g} the other replicas' mean",
                             count=item["count"]))
        for key in result.varying:
            rows.append(dict(base, finding="varies", detail=f"{key}: differs on every replica"))
        for rank in missing.get((result.step, result.group), ()):
            rows.append(dict(base, finding="missing", rank=rank, detail="no data for this step"))
        if result.clean and not missing.get((result.step, result.group)):
            rows.append(dict(base, finding="clean", count=len(result.ranks)))
    return rows


def write_table(rows: List[dict], path: str) -> str:
    import pandas as pd

    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for column in ("step", "rank", "count"):  # integers with gaps, not floats
        frame[column] = frame[column].astype("Int64")
    frame.to_csv(path, index=False)
    os.chmod(path, 0o640)
    return path


def write_heatmap(result: GroupResult, path: str, title: str) -> Optional[str]:
    """The PNG of one step and group; None when there is nothing to draw."""
    if result.heat is None or not result.layers or not result.ranks:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heat, marks, labels = _binned(np.minimum(result.heat, HEAT_CAP), result.marks, result.ranks)
    rows, cols = heat.shape
    fig, axis = plt.subplots(figsize=(min(18.0, 3.0 + 0.45 * cols), min(14.0, 2.5 + 0.3 * rows)))
    image = axis.imshow(heat, aspect="auto", cmap="magma_r", vmin=0.0, vmax=HEAT_CAP, interpolation="nearest")
    for mark, style in ((MARK_DEPARTURE, dict(marker="x", color="tab:blue", label="weight not bit-identical")),
                        (MARK_ANOMALY, dict(marker="o", facecolors="none", edgecolors="red", label="first NaN/Inf"))):
        ys, xs = np.nonzero(marks & mark)
        if len(xs):
            axis.scatter(xs, ys, s=40, **style)
    _ticks(axis.set_xticks, axis.set_xticklabels, result.layers, rotation=60)
    _ticks(axis.set_yticks, axis.set_yticklabels, labels, rotation=0)
    axis.set_title(title, fontsize=9)
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=7, loc="upper right")
    fig.colorbar(image, ax=axis, label="|log10| off the other replicas (capped at 3)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    os.chmod(path, 0o640)
    return path


def _binned(heat: np.ndarray, marks: np.ndarray, ranks: List[int]):
    """At most MAX_ROWS rows: the worst value and every mark of each run of consecutive ranks."""
    size = -(-len(ranks) // MAX_ROWS)
    if size == 1:
        return heat, marks, [f"rank {r}" for r in ranks]
    pad = (-len(ranks)) % size
    heat = np.pad(heat, ((0, pad), (0, 0))).reshape(-1, size, heat.shape[1]).max(axis=1)
    marks = np.bitwise_or.reduce(np.pad(marks, ((0, pad), (0, 0))).reshape(-1, size, marks.shape[1]), axis=1)
    labels = [f"ranks {ranks[i]}-{ranks[min(i + size, len(ranks)) - 1]}" for i in range(0, len(ranks), size)]
    return heat, marks, labels


def _ticks(set_ticks, set_labels, labels: List[str], rotation: int) -> None:
    every = max(1, len(labels) // MAX_TICKS)
    set_ticks(range(0, len(labels), every))
    set_labels(labels[::every], rotation=rotation, ha="right", fontsize=7)
