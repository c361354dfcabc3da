"""Run one comparison: find the rank folders to pair, stream them through the store, collect the result."""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from mf_celldump.compare import metrics
from mf_celldump.compare.pairing import PairOptions, Unit, UnitPairer, load_unit
from mf_celldump.compare.plot import write_plot
from mf_celldump.compare.report import Divergence, first_divergence, skip_reasons, unit_counts, write_csv
from mf_celldump.compare.store import Store
from mf_celldump.config import IndexSelection
from mf_celldump.layout.reader import DumpError, DumpJson, RankDump, find_rank_dumps
from mf_celldump.mapping import AUTO, LayerMapping, resolve_mapping
from mf_celldump.mapping.baseline_names import MsprobeView

logger = logging.getLogger(__name__)
NONE = "none"


class CompareInputError(ValueError):
    """The inputs cannot be compared (no dump, nothing pairs, bad option); the message says why."""


@dataclass
class CompareRequest:
    target: str
    baseline: str
    output: str
    mapping: Tuple[str, ...] = (AUTO,)
    steps: IndexSelection = field(default_factory=IndexSelection)
    ranks: IndexSelection = field(default_factory=IndexSelection)
    thresholds: Dict[str, metrics.Thresholds] = field(
        default_factory=lambda: dict(metrics.DEFAULT_THRESHOLDS)
    )
    qkv_groups: Optional[int] = None
    progress: bool = True


@dataclass
class CompareResult:
    request: CompareRequest
    units: List[Dict]
    unpaired: List[str]
    mapping_sources: Tuple[str, ...]
    frameworks: Tuple[str, str]
    tasks: Tuple[str, str]
    first: Optional[Divergence]
    skipped: List[tuple]
    csv_path: str
    plot_path: Optional[str]

    @property
    def diverged(self) -> bool:
        return self.first is not None

    @property
    def compared(self) -> int:
        """Tensor pairs that were compared (within thresholds or not)."""
        return sum((unit["ok"] or 0) + (unit["diverged"] or 0) for unit in self.units)


def match_units(targets: Sequence[RankDump], baselines: Sequence[RankDump], request: CompareRequest):
    """Pair rank folders by step and rank; one folder on each side always pairs."""
    targets = [t for t in targets if _selected(t, request)]
    baselines = [b for b in baselines if _selected(b, request)]
    if len(targets) == 1 and len(baselines) == 1:
        return [Unit(targets[0], baselines[0])], []
    index = {(b.step, b.rank or 0): b for b in baselines}
    units, unpaired = [], []
    for target in targets:
        partner = index.get((target.step, target.rank or 0))
        if partner is None:
            unpaired.append(target.label)
        else:
            units.append(Unit(target, partner))
    return units, unpaired


def _selected(dump: RankDump, request: CompareRequest) -> bool:
    step_ok = dump.step is None or dump.step in request.steps
    return step_ok and (dump.rank or 0) in request.ranks


def run(request: CompareRequest) -> CompareResult:
    try:
        targets, baselines = find_rank_dumps(request.target), find_rank_dumps(request.baseline)
    except DumpError as err:
        raise CompareInputError(str(err)) from None
    units, unpaired = match_units(targets, baselines, request)
    if not units:
        raise CompareInputError(
            f"no rank folder of {request.target} ({', '.join(t.label for t in targets)}) has a partner in "
            f"{request.baseline} ({', '.join(b.label for b in baselines)}) "
            f"for steps {request.steps.describe()}, "
            f"ranks {request.ranks.describe()}"
        )
    os.makedirs(request.output, mode=0o750, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".compare-", dir=request.output) as work:
        store = Store(os.path.join(work, "pairs.sqlite"))
        try:
            return _compare(store, units, unpaired, request)
        finally:
            store.close()


def _compare(store: Store, units: List[Unit], unpaired: List[str], request: CompareRequest) -> CompareResult:
    mapping: Optional[LayerMapping] = None
    view = None
    frameworks = tasks = ("", "")
    for unit in units:
        target, baseline = _open(unit.target), _open(unit.baseline)
        classes = load_unit(store, target, baseline)
        if mapping is None:
            frameworks, tasks = (target.framework, baseline.framework), (target.task, baseline.task)
            mapping = _mapping(request.mapping, set(classes.values()), frameworks)
            view = MsprobeView(mapping)
        options = PairOptions(request.thresholds, request.qkv_groups)
        UnitPairer(store, view, classes, unit, options).run(request.progress)
        store.reset_unit()
    first = first_divergence(store)
    csv_path = os.path.join(request.output, "compare_pairs.csv")
    write_csv(store, csv_path)
    plot_path = os.path.join(request.output, "compare_depth.png")
    step, rank = (first.step, first.rank) if first else (units[0].step, units[0].rank)
    title = f"{request.target} vs {request.baseline} (step {step or '-'}, {rank})"
    if not write_plot(store, plot_path, step, rank, first, title):
        plot_path = None
    for path in (csv_path, plot_path):
        if path:
            os.chmod(path, 0o640)
    return CompareResult(
        request,
        unit_counts(store),
        unpaired,
        mapping.sources if mapping else (),
        frameworks,
        tasks,
        first,
        skip_reasons(store),
        csv_path,
        plot_path,
    )


def _open(dump: RankDump) -> DumpJson:
    try:
        return DumpJson(dump.dump_json)
    except OSError as err:
        raise CompareInputError(f"{dump.dump_json}: cannot read: {err.strerror}") from None


def _mapping(specs: Tuple[str, ...], classes: set, frameworks: Tuple[str, str]) -> LayerMapping:
    """``auto``: the bundled mappings for our classes when the frameworks differ, none otherwise."""
    if not specs or specs == (NONE,):
        return LayerMapping()
    if specs == (AUTO,) and frameworks[0] == frameworks[1]:
        return LayerMapping()
    return resolve_mapping(tuple(specs), classes)
