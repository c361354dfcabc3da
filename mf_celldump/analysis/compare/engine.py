"""Run one comparison: find the sides to pair, stream them through the store, collect the result.

Steps: locate the rank folders of both dumps and plan the units (``plan_units``: one
target folder against one baseline folder of the same step and rank; a step that merges
tensor-parallel shards into one side belongs there), pair and measure each unit
(:class:`pairing.UnitPairer`), then read the findings back (first divergence, weights,
coverage) and write the CSV, the depth plot and the HTML report.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Callable, List, Optional, Sequence, Tuple

from mf_celldump.analysis.compare import msprobe_rules, pairing, plot, verdicts
from mf_celldump.analysis.compare.coverage import measure_coverage
from mf_celldump.analysis.compare.pairing import PairOptions, UnitPairer, Warnings, load_unit
from mf_celldump.analysis.compare.report import crc_summary, first_divergence, unit_counts, weight_summary, write_csv
from mf_celldump.analysis.compare.request import NONE, PYTORCH, CompareRequest, CompareResult, RankFolders
from mf_celldump.analysis.compare.sources import RankFolder, Unit
from mf_celldump.analysis.compare.store import Store
from mf_celldump.analysis.compare.workers import Workers
from mf_celldump.errors import CompareInputError
from mf_celldump.layout.reader import RankDump
from mf_celldump.mapping import AUTO, LayerMapping, resolve_mapping
from mf_celldump.mapping.baseline_names import MsprobeView

logger = logging.getLogger(__name__)

__all__ = ["CompareInputError", "CompareRequest", "CompareResult", "choose_mapping", "plan_units", "run"]


def plan_units(targets: Sequence[RankDump], baselines: Sequence[RankDump], request: CompareRequest):
    """Pair rank folders by step and rank (one folder on each side always pairs); (units, unpaired labels)."""
    targets = [t for t in targets if _selected(t, request)]
    baselines = [b for b in baselines if _selected(b, request)]
    if len(targets) == 1 and len(baselines) == 1:
        return [Unit(RankFolder(targets[0]), RankFolder(baselines[0]))], []
    index = {(b.step, b.rank or 0): b for b in baselines}
    units, unpaired = [], []
    for target in targets:
        partner = index.get((target.step, target.rank or 0))
        if partner is None:
            unpaired.append(target.label)
        else:
            units.append(Unit(RankFolder(target), RankFolder(partner)))
    return units, unpaired


def _selected(dump: RankDump, request: CompareRequest) -> bool:
    step_ok = dump.step is None or dump.step in request.steps
    return step_ok and (dump.rank or 0) in request.ranks


Findings = Callable[[CompareResult], None]


def run(request: CompareRequest, folders: Optional[RankFolders] = None,
        findings: Optional[Findings] = None) -> CompareResult:
    """Compare ``folders`` (found from the request when not given); ``findings`` completes the result (the
    launched rank of a merged side) before any report is written, so every output says the same."""
    folders = folders or RankFolders.find(request)
    targets, baselines = folders.target, folders.baseline
    units, unpaired = plan_units(targets, baselines, request)
    if not units:
        raise CompareInputError(
            f"no rank folder of {request.target} ({', '.join(t.label for t in targets)}) has a partner in "
            f"{request.baseline} ({', '.join(b.label for b in baselines)}) "
            f"for steps {request.steps.describe()}, "
            f"ranks {request.ranks.describe()}"
        )
    _check_order(units[0], request)
    os.makedirs(request.output, mode=0o750, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".compare-", dir=request.output) as work:
        store = Store(os.path.join(work, "pairs.sqlite"))
        try:
            with Workers(request.jobs, preload=(pairing.__name__, plot.__name__)) as workers:
                result = _compare(store, units, unpaired, request, workers)
                if findings is not None:
                    findings(result)
                _write_reports(store, result, workers)
            return result
        finally:
            store.close()


def _check_order(unit: Unit, request: CompareRequest) -> None:
    """A PyTorch target with a MindSpore baseline: the bundled mappings rename MindSpore cells, so
    ``auto`` cannot pair anything; say the arguments look swapped instead of blaming the mapping."""
    frameworks = (unit.target.framework, unit.baseline.framework)
    if frameworks[0] == PYTORCH and frameworks[1] != PYTORCH and tuple(request.mapping) == (AUTO,):
        raise CompareInputError(
            f"TARGET {request.target} is a PyTorch dump and BASELINE {request.baseline} a {frameworks[1]} one: "
            "the layer mapping renames MindSpore cells to the baseline's names, so give your MindSpore run "
            f"first: mf-celldump compare {request.baseline} {request.target}"
        )


def _compare(store: Store, units: List[Unit], unpaired: List[str], request: CompareRequest,
             workers: Workers) -> CompareResult:
    mapping: Optional[LayerMapping] = None
    view = None
    frameworks = tasks = ("", "")
    warnings = Warnings()
    for unit in units:
        loaded = load_unit(store, unit, warnings, workers)
        if mapping is None:
            frameworks = (unit.target.framework, unit.baseline.framework)
            tasks = (unit.target.task, unit.baseline.task)
            mapping = choose_mapping(request.mapping, set(loaded.classes.values()), frameworks)
            view = MsprobeView(mapping)
        options = PairOptions(request.thresholds, request.qkv_groups, msprobe_rules.dump_mode(*tasks))
        UnitPairer(store, view, loaded.classes, unit, options, warnings).run(loaded, request.progress, workers)
        store.reset_unit()
    store.commit()
    return CompareResult(
        request=request,
        units=unit_counts(store),
        unpaired=unpaired,
        mapping_sources=mapping.sources if mapping else (),
        frameworks=frameworks,
        tasks=tasks,
        first=first_divergence(store),
        weights=weight_summary(store),
        coverage=measure_coverage(store, request.min_coverage),
        crc=crc_summary(store),
        csv_path=os.path.join(request.output, "compare_pairs.csv"),
        warnings=warnings.lines(),
        factors=verdicts.common_factors(store),
        weight_timing=verdicts.weight_timing(store),
        diverged_directions=[r[0] for r in store.query(
            "select distinct direction from pairs where kind = 'activation' and status = 'diverged'")],
        **_precision_findings(store),
    )


def _precision_findings(store: Store) -> dict:
    """Where the dtype changes, and what a statistics dump cannot decide (``verdicts``)."""
    first = first_divergence(store)
    return {"dtype_change": verdicts.dtype_change(store),
            "statistics_undecided": verdicts.statistics_undecided(store, first)}


def _write_reports(store: Store, result: CompareResult, workers: Workers) -> None:
    """The CSV, report.html and the depth plot; the plot (matplotlib: the slowest) in a worker when they run."""
    request = result.request
    first = result.first
    step, rank = (first.step, first.rank) if first else (result.units[0]["step"], result.units[0]["rank"])
    ranks = first.rank_text if first else f"rank {rank}"
    title = f"{request.target} vs {request.baseline} (step {'-' if step is None else step}, {ranks})"
    plot_path = os.path.join(request.output, "compare_depth.png")
    plot_args = (plot_path, step, rank, first, title, request.thresholds)
    plotting = workers.submit(plot.plot_in_worker, store.path, *plot_args)
    write_csv(store, result.csv_path)
    if request.html:  # before the plot: matplotlib leaves the heap fragmented (measured: +7 MB peak after it)
        from mf_celldump.analysis.compare.html_report import write_html
        from mf_celldump.analysis.compare.report_data import report_data

        result.html_path = os.path.join(request.output, "report.html")
        write_html(result.html_path, report_data(store, result))
    result.plot_note = plotting.result() if plotting else plot.write_plot(store, *plot_args)
    result.plot_path = None if result.plot_note else plot_path
    for path in (result.csv_path, result.plot_path, result.html_path):
        if path:
            os.chmod(path, 0o640)


def choose_mapping(specs: Tuple[str, ...], classes: set, frameworks: Tuple[str, str]) -> LayerMapping:
    """``auto``: the bundled mappings for our classes when the frameworks differ, none otherwise."""
    if not specs or specs == (NONE,):
        return LayerMapping()
    if specs == (AUTO,) and frameworks[0] == frameworks[1]:
        return LayerMapping()
    return resolve_mapping(tuple(specs), classes)
