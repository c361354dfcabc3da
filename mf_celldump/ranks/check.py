"""``mf-celldump ranks``: check the data-parallel replicas of a dump against each other.

Inputs are dump roots (``step*/rank*/dump.json``, ours or msprobe's, any task) and/or
rank-summary files written by ``--save-summaries`` on other nodes: one node summarises its
own ranks (a few kilobytes per rank and step), the files are brought together and checked
in one run. Each rank folder is read once, one entry at a time; the replica check keeps
per step and replica group what does not grow with the number of ranks
(``ranks.replicas``).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import tempfile
import textwrap
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

from tqdm import tqdm

from mf_celldump.config import IndexSelection
from mf_celldump.layout.reader import DumpError, find_rank_dumps
from mf_celldump.ranks import report
from mf_celldump.ranks.groups import GroupKey, ReplicaGroups
from mf_celldump.ranks.replicas import CheckOptions, GroupCheck, GroupResult
from mf_celldump.ranks.summary import RankSummary, SummaryError, from_json, summarize
from mf_celldump.ranks.verdict import step_line

logger = logging.getLogger(__name__)
SUMMARY_SUFFIXES = (".jsonl.gz", ".jsonl")
MAX_LINE = 64 << 20  # one summary line is kilobytes; far more is not a summary
MAX_HEATMAPS = 16


class RankCheckError(ValueError):
    """Inputs that cannot be checked; the message names the file or option and what would be valid."""


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

    @property
    def lines(self) -> List[str]:
        return [step_line(r, self.missing.get((r.step, r.group), ()), self.group_labels.get(r.group))
                for r in self.results]

    @property
    def diverged(self) -> bool:
        return any(r.anomaly or r.first_departure or r.varying for r in self.results)


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


class ReplicaChecks:
    """Every step's replica groups, fed one rank summary at a time in any order."""

    def __init__(self, replicas: ReplicaGroups, options: CheckOptions, world: int, spill_dir: str):
        self.replicas, self.options, self.world, self.spill_dir = replicas, options, world, spill_dir
        self.checks: Dict[Tuple[Optional[int], str], GroupCheck] = {}
        self.labels: Dict[str, str] = {}

    def group(self, rank: int) -> Optional[str]:
        key: Optional[GroupKey] = self.replicas.group_of(rank, self.world)
        if key is None:
            return None
        group = ",".join(str(k) for k in key)
        self.labels[group] = self.replicas.label(key)
        return group

    def add(self, summary: RankSummary) -> None:
        group = self.group(summary.rank)
        if group is None:
            return
        check = self.checks.get((summary.step, group))
        if check is None:
            check = self.checks[(summary.step, group)] = GroupCheck(summary.step, group, self.options, self.spill_dir)
        check.add(summary)

    def finish(self, expected=None, steps=None) -> Tuple[List[GroupResult], Dict[tuple, List[int]]]:
        """Results by step and group, and the ranks missing in each: of ``expected`` ranks when given,
        else of the ranks seen in any step. ``steps``: also report these when no rank had them."""
        wanted: Dict[str, set] = {}
        if expected is not None:
            for rank in expected:
                group = self.group(rank)
                if group is not None:
                    wanted.setdefault(group, set()).add(rank)
        else:
            for (_, group), check in self.checks.items():
                wanted.setdefault(group, set()).update(check.ranks)
        keys = set(self.checks) | {(step, group) for step in (steps or ()) for group in wanted}
        results, missing = [], {}
        for step, group in sorted(keys, key=lambda k: (_step_key(k[0]), k[1])):
            check = self.checks.get((step, group))
            result = check.finish() if check else GroupResult(step, group, [])
            results.append(result)
            absent = sorted(wanted.get(group, set()) - set(result.ranks))
            if absent:
                missing[(step, group)] = absent
        return results, missing


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
    rows = report.finding_rows(result.results, result.missing, result.group_labels)
    result.table = report.write_table(rows, os.path.join(output, "ranks_findings.csv"))
    for group_result in result.results[:MAX_HEATMAPS]:
        label = result.group_labels.get(group_result.group)
        suffix = f"_group{group_result.group.replace(',', '-')}" if label else ""
        name = f"ranks_heatmap_step{'-' if group_result.step is None else group_result.step}{suffix}.png"
        line = step_line(group_result, result.missing.get((group_result.step, group_result.group), ()), label)
        title = "\n".join(textwrap.wrap(line, 150)[:3])
        path = report.write_heatmap(group_result, os.path.join(output, name), title)
        if path:
            result.heatmaps.append(path)


def _fold(request: CheckRequest, result: CheckResult, checks: ReplicaChecks) -> None:
    writer = SummaryWriter(request.save_summaries) if request.save_summaries else None
    try:
        for summary in _sources(request):
            result.summaries += 1
            if writer is not None:
                writer.write(summary)
            if request.check:
                checks.add(summary)
    finally:
        if writer is not None:
            writer.close()


def _step_key(step: Optional[int]) -> int:
    return -1 if step is None else step
