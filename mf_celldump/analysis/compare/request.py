"""A comparison's request (what the user asked), the rank folders it names (found once) and its result.

The command line builds a :class:`CompareRequest`, finds the rank folders of both sides once
(:meth:`RankFolders.find`) and hands both to the engine, or to ``shards`` which merges
tensor-parallel groups first and hands the engine the merged folders: no step reads a dump
root's folders a second time. :class:`CompareResult` is what every output (terminal, JSON,
report.html) is written from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from mf_celldump.analysis.compare import thresholds
from mf_celldump.analysis.compare.coverage import MIN_COVERAGE, Coverage
from mf_celldump.analysis.compare.pairing import ACTIVATION, WEIGHT, WEIGHT_GRAD
from mf_celldump.analysis.compare.report import Divergence
from mf_celldump.errors import CompareInputError, DumpError
from mf_celldump.layout.reader import RankDump, find_rank_dumps
from mf_celldump.mapping import AUTO
from mf_celldump.userinput import IndexSelection

NONE = "none"
DEFAULT_OUTPUT = "compare_out"
PYTORCH = "pytorch"

# What a comparison concludes (the command turns it into an exit status).
DIVERGED, WITHIN, LOW_COVERAGE, NOTHING = "diverged", "within thresholds", "too little compared", "nothing compared"
COMMON_FACTOR = "common factor"  # every difference is one factor (clipping, a loss scale): neither clean nor diverged


@dataclass
class CompareRequest:
    target: str
    baseline: str
    output: str = DEFAULT_OUTPUT
    mapping: Tuple[str, ...] = (AUTO,)
    steps: IndexSelection = field(default_factory=IndexSelection)
    ranks: IndexSelection = field(default_factory=IndexSelection)
    thresholds: Dict[str, thresholds.Thresholds] = field(
        default_factory=lambda: dict(thresholds.DEFAULT_THRESHOLDS)
    )
    qkv_groups: Optional[int] = None
    min_coverage: float = MIN_COVERAGE
    progress: bool = True
    html: bool = True
    jobs: Optional[int] = 1  # processes pairing each unit; None: the CPUs available, for large units only


@dataclass
class RankFolders:
    """The rank folders of both sides, in (step, rank) order, found once per comparison."""

    target: List[RankDump]
    baseline: List[RankDump]

    @classmethod
    def find(cls, request: CompareRequest) -> RankFolders:
        try:
            return cls(find_rank_dumps(request.target), find_rank_dumps(request.baseline))
        except DumpError as err:
            raise CompareInputError(str(err)) from None


@dataclass
class CompareResult:
    request: CompareRequest
    units: List[Dict]
    unpaired: List[str]
    mapping_sources: Tuple[str, ...]
    frameworks: Tuple[str, str]
    tasks: Tuple[str, str]
    first: Optional[Divergence]
    weights: Dict[str, Any]
    coverage: Coverage
    crc: Dict[str, Any]
    csv_path: str
    plot_path: Optional[str] = None
    plot_note: str = ""
    html_path: Optional[str] = None
    warnings: List[str] = field(default_factory=list)  # input read but not what a dump holds, named
    factors: List[Dict[str, Any]] = field(default_factory=list)  # verdicts.common_factors
    weight_timing: Dict[str, Any] = field(default_factory=dict)  # verdicts.weight_timing
    diverged_directions: List[str] = field(default_factory=list)  # activation directions with a diverged pair
    dtype_change: Optional[Dict[str, Any]] = None  # verdicts.dtype_change
    statistics_undecided: Optional[Dict[str, Any]] = None  # verdicts.statistics_undecided

    @property
    def compared(self) -> int:
        """Tensor pairs that were compared (within thresholds or not), every kind."""
        return sum((unit["ok"] or 0) + (unit["diverged"] or 0) for unit in self.units)

    @property
    def weights_diverged(self) -> int:
        return sum(self.weights[kind]["diverged"] for kind in self.weights)

    def factor_of(self, kind: str, direction: Optional[str] = None) -> Optional[Dict[str, Any]]:
        return next((f for f in self.factors if f["kind"] == kind and f["direction"] == direction), None)

    @property
    def explained_by_factors(self) -> bool:
        """Every difference found is a common factor (weights differing only after the optimizer ran on
        gradients that differed by one count as its consequence)."""
        if any(self.factor_of(ACTIVATION, d) is None for d in self.diverged_directions):
            return False
        if self.weights.get(WEIGHT_GRAD, {}).get("diverged") and self.factor_of(WEIGHT_GRAD) is None:
            return False
        timing = self.weight_timing
        late = timing.get("after_optimizer") and timing.get("gradients_differ_before")
        return not (self.weights.get(WEIGHT, {}).get("diverged") and not late)

    @property
    def verdict(self) -> str:
        if self.first is not None or self.weights_diverged:
            return COMMON_FACTOR if self.factors and self.explained_by_factors else DIVERGED
        if not self.compared:
            return NOTHING
        return WITHIN if self.coverage.enough else LOW_COVERAGE

    @property
    def swapped(self) -> bool:
        """The target is a PyTorch dump and the baseline a MindSpore one: the arguments look reversed."""
        return self.frameworks[0] == PYTORCH and self.frameworks[1] != PYTORCH
