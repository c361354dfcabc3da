"""``mf-celldump ranks``: check the data-parallel replicas of a dump against each other.

Inputs are dump roots (``step*/rank*/dump.json``, ours or msprobe's, any task) and/or
rank-summary files written by ``--save-summaries`` on other nodes: one node summarises its
own ranks (a few kilobytes per rank and step), the files are brought together and checked
in one run. Each rank folder is read once, one entry at a time; the replica check keeps
per step and replica group what does not grow with the number of ranks
(``ranks.replicas``).

Written down as a table of findings (CSV) and a ranks x layers heat map (PNG): each heat-map
cell is how far that rank's largest output or gradient of that layer lies from the other
replicas' mean, in orders of magnitude (|log10 ratio|); a cross marks a weight that is not
bit-identical to the majority, a red circle the first NaN/Inf.
"""

from __future__ import annotations

import csv
import gzip
import json
import logging
import os
import tempfile
import textwrap
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
from tqdm import tqdm

from mf_celldump.analysis.extras import pyplot
from mf_celldump.errors import DumpError, MissingExtra, RankCheckError, SummaryError
from mf_celldump.layout.reader import find_rank_dumps
from mf_celldump.ranks.groups import ReplicaGroups
from mf_celldump.ranks.rank_summary import RankSummary, from_json, summarize
from mf_celldump.ranks.replicas import MARK_ANOMALY, MARK_DEPARTURE, CheckOptions, GroupResult, ReplicaChecks, step_line
from mf_celldump.userinput import IndexSelection

logger = logging.getLogger(__name__)
SUMMARY_SUFFIXES = (".jsonl.gz", ".jsonl")
MAX_LINE = 64 << 20  # one summary line is kilobytes; far more is not a summary
MAX_HEATMAPS = 16
DEFAULT_OUTPUT = "ranks_out"
MAX_UNJUDGED_LINES = 8  # rank folders whose unjudged records get a line; the rest are counted


@dataclass
class CheckRequest:
    paths: Tuple[str, ...]
    steps: IndexSelection = field(default_factory=IndexSelection)
    ranks: IndexSelection = field(default_factory=IndexSelection)
    replicas: ReplicaGroups = field(default_factory=ReplicaGroups)
    options: CheckOptions = field(default_factory=CheckOptions)
    output: Optional[str] = None  # folder for the table and heat maps
    save_summaries: Optional[str] = None  # write every summary read here (.jsonl.gz)
    check: bool = True
    progress: bool = True


@dataclass
class CheckResult:
    request: CheckRequest
    results: List[GroupResult] = field(default_factory=list)
    missing: Dict[Tuple[Optional[int], str], List[int]] = field(default_factory=dict)
    group_labels: Dict[str, str] = field(default_factory=dict)
    summaries: int = 0
    table: Optional[str] = None
    heatmaps: List[str] = field(default_factory=list)
    heatmap_note: str = ""  # why there are none although there was data to draw (no matplotlib)
    unjudged: List[Dict[str, Any]] = field(default_factory=list)  # per summary with records it cannot judge

    @property
    def lines(self) -> List[str]:
        lines = [step_line(r, self.missing.get((r.step, r.group), ()), self.group_labels.get(r.group))
                 for r in self.results]
        for item in self.unjudged[:MAX_UNJUDGED_LINES]:
            more = item["count"] - len(item["first"])
            lines.append(f"step {'-' if item['step'] is None else item['step']} rank {item['rank']}: "
                         f"{item['count']} records not judged (their statistics or shape cannot be read): "
                         f"{'; '.join(item['first'])}{f' and {more} more' if more > 0 else ''}")
        if len(self.unjudged) > MAX_UNJUDGED_LINES:
            lines.append(f"records not judged in {len(self.unjudged) - MAX_UNJUDGED_LINES} more rank folders")
        return lines

    @property
    def diverged(self) -> bool:
        return any(r.anomaly or r.first_departure or r.varying for r in self.results)


def default_output(paths: Tuple[str, ...]) -> str:
    """Where the table and heat maps go without ``-o``: beside the first input, not the working folder.

    ``<dump>/ranks_out`` for a dump root, ``ranks_out`` beside a summary file; when that folder
    may not be written (someone else's dump, a read-only mount), ``./ranks_out`` and a warning.
    """
    first = paths[0]
    if not os.path.exists(first):
        raise RankCheckError(f"{first}: no such file or folder; give dump roots (step*/rank*/dump.json) or "
                             "rank-summary files ending in .jsonl.gz")
    parent = os.path.dirname(os.path.abspath(first)) if is_summary_file(first) else first
    target = os.path.join(parent, DEFAULT_OUTPUT)
    if os.path.isdir(target) and os.access(target, os.W_OK | os.X_OK):
        return target
    if os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK) and not os.path.lexists(target):
        return target
    if os.path.isdir(parent):
        logger.warning("%s cannot be written: the table and heat maps go to ./%s (-o FOLDER to choose)", target,
                       DEFAULT_OUTPUT)
    return DEFAULT_OUTPUT


def is_summary_file(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(SUMMARY_SUFFIXES)


class SummaryWriter:
    """Rank summaries as gzip-compressed JSON lines, one per rank and step (file mode 0o640)."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        self._raw = os.fdopen(fd, "wb")
        self._gzip = gzip.GzipFile(fileobj=self._raw, mode="wb")

    def write(self, summary: RankSummary) -> None:
        self._gzip.write(json.dumps(summary.to_json(), separators=(",", ":")).encode("utf-8") + b"\n")

    def close(self) -> None:
        self._gzip.close()
        self._raw.close()


def read_summaries(path: str) -> Iterator[RankSummary]:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            for number, line in enumerate(iter(lambda: handle.readline(MAX_LINE + 1), b""), 1):
                if len(line) > MAX_LINE:
                    raise RankCheckError(f"{path}: line {number} is longer than {MAX_LINE} bytes: not a rank summary")
                if line.strip():
                    yield from_json(json.loads(line), f"{path}: line {number}")
    except (OSError, EOFError, ValueError) as err:
        if isinstance(err, (SummaryError, RankCheckError)):
            raise RankCheckError(str(err)) from None
        raise RankCheckError(f"{path}: cannot read rank summaries: {err}") from None


def _sources(request: CheckRequest) -> Iterator[RankSummary]:
    """Every selected rank's summary, rank folder by rank folder, then file by file."""
    for path in request.paths:
        if is_summary_file(path):
            yield from (s for s in read_summaries(path) if _selected(request, s.step, s.rank))
            continue
        try:
            dumps = [d for d in find_rank_dumps(path) if _selected(request, d.step, d.rank or 0)]
        except DumpError as err:
            raise RankCheckError(f"{err} (or give a rank-summary file ending in .jsonl.gz)") from None
        bar = tqdm(dumps, desc=f"summarize {path}", unit="rank", disable=None if request.progress else True,
                   leave=False)
        for dump in bar:
            try:
                yield summarize(dump.dump_json, dump.step, dump.rank or 0)
            except (DumpError, OSError) as err:
                raise RankCheckError(f"{dump.dump_json}: {err}") from None


def _selected(request: CheckRequest, step: Optional[int], rank: int) -> bool:
    return (step is None or step in request.steps) and rank in request.ranks


def _world(request: CheckRequest) -> int:
    """Number of ranks (highest rank + 1): needed only to place pipeline stages."""
    if request.replicas.pipeline_stages == 1:
        return 0
    highest = -1
    for path in request.paths:
        if is_summary_file(path):
            highest = max([highest] + [s.rank for s in read_summaries(path)])
        else:
            highest = max([highest] + [d.rank or 0 for d in find_rank_dumps(path)])
    return highest + 1


def run(request: CheckRequest) -> CheckResult:
    """Summarise every input rank and check the replicas of each step (``request.check``)."""
    result = CheckResult(request)
    world = _world(request)
    problem = request.replicas.check_world(world) if world else None
    if problem:
        raise RankCheckError(f"--replicas {request.replicas.describe()}: {problem}")
    if request.output:
        os.makedirs(request.output, mode=0o750, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ranks-", dir=request.output) as spill:
        checks = ReplicaChecks(request.replicas, request.options, world, spill)
        _fold(request, result, checks)
        if not result.summaries:
            raise RankCheckError(f"no rank folder or summary in {', '.join(request.paths)} for steps "
                                 f"{request.steps.describe()}, ranks {request.ranks.describe()}")
        if request.check:
            result.results, result.missing = checks.finish()
            result.group_labels = checks.labels
    if request.check and request.output:
        _write(result)
    return result


def _write(result: CheckResult) -> None:
    """The findings table and one heat map per step and group (the first MAX_HEATMAPS)."""
    output = result.request.output
    rows = finding_rows(result.results, result.missing, result.group_labels)
    result.table = write_table(rows, os.path.join(output, "ranks_findings.csv"))
    for group_result in result.results[:MAX_HEATMAPS]:
        label = result.group_labels.get(group_result.group)
        suffix = f"_group{group_result.group.replace(',', '-')}" if label else ""
        name = f"ranks_heatmap_step{'-' if group_result.step is None else group_result.step}{suffix}.png"
        line = step_line(group_result, result.missing.get((group_result.step, group_result.group), ()), label)
        try:
            path = write_heatmap(group_result, os.path.join(output, name), line)
        except MissingExtra as err:  # the table is written; the check's verdict does not depend on a picture
            result.heatmap_note = f"no heat maps: {err}"
            return
        if path:
            result.heatmaps.append(path)


def _fold(request: CheckRequest, result: CheckResult, checks: ReplicaChecks) -> None:
    writer = SummaryWriter(request.save_summaries) if request.save_summaries else None
    try:
        for summary in _sources(request):
            result.summaries += 1
            if summary.unjudged:
                result.unjudged.append({"step": summary.step, "rank": summary.rank, "count": summary.unjudged,
                                        "first": summary.unjudged_first})
            if writer is not None:
                writer.write(summary)
            if request.check:
                checks.add(summary)
    finally:
        if writer is not None:
            writer.close()


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
            alone = {"detail": "the only replica: nothing to compare it with"} if len(result.ranks) == 1 else {}
            rows.append(dict(base, finding="clean", count=len(result.ranks), **alone))
    return rows


def write_table(rows: List[dict], path: str) -> str:
    """The findings as CSV, one column per ``COLUMNS``; a finding without a value there has an empty field."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    with os.fdopen(fd, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow(["" if row.get(column) is None else row[column] for column in COLUMNS])
    os.chmod(path, 0o640)
    return path


def write_heatmap(result: GroupResult, path: str, title: str) -> Optional[str]:
    """The PNG of one step and group; None when there is nothing to draw. ``MissingExtra`` without
    matplotlib."""
    if result.heat is None or not result.layers or not result.ranks:
        return None
    plt = pyplot("drawing a heat map")
    heat, marks, labels = _binned(np.minimum(result.heat, HEAT_CAP), result.marks, result.ranks)
    rows, cols = heat.shape
    # Constrained layout keeps the colour bar's label and the tick labels inside the figure; the
    # height leaves room for that label even with two ranks.
    width, height = max(6.0, min(18.0, 3.0 + 0.45 * cols)), max(4.0, min(14.0, 2.5 + 0.3 * rows))
    fig, axis = plt.subplots(figsize=(width, height), layout="constrained")
    image = axis.imshow(heat, aspect="auto", cmap="magma_r", vmin=0.0, vmax=HEAT_CAP, interpolation="nearest")
    for mark, style in ((MARK_DEPARTURE, dict(marker="x", color="tab:blue", label="weight not bit-identical")),
                        (MARK_ANOMALY, dict(marker="o", facecolors="none", edgecolors="red", label="first NaN/Inf"))):
        ys, xs = np.nonzero(marks & mark)
        if len(xs):
            axis.scatter(xs, ys, s=40, **style)
    _ticks(axis.set_xticks, axis.set_xticklabels, result.layers, rotation=60)
    _ticks(axis.set_yticks, axis.set_yticklabels, labels, rotation=0)
    axis.set_title("\n".join(textwrap.wrap(title, int(width * 12))[:3]), fontsize=9)  # ~12 characters an inch
    if axis.get_legend_handles_labels()[0]:
        axis.legend(fontsize=7, loc="upper right")
    bar = fig.colorbar(image, ax=axis, fraction=0.04, pad=0.02)
    bar.set_label(f"|log10| off the other replicas (capped at {HEAT_CAP:g})", fontsize=8)
    fig.savefig(path, dpi=100, bbox_inches="tight")
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
