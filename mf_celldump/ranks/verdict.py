"""A replica check's result as the one line per step that rank 0 logs and ``mf-celldump ranks`` prints.

    step 3: rank 2: first NaN at layers.2 (forward); rank 1 departs first at layers.0.up
    param.weight (3 of 4 replicas agree); suspect: rank 2 at layers.1 forward.0 output.0
    (Norm x1e+03 the other replicas'); rank 3 missing
    step 0: clean (4 replicas)
    step 0: no NaN/Inf; rank 0 is the only replica: nothing to compare it with
"""

from __future__ import annotations

from typing import Iterable, List, Optional

from mf_celldump.ranks.replicas import GroupResult

MAX_NAMED = 8


def ranks_text(ranks: Iterable[int], limit: int = MAX_NAMED) -> str:
    ranks = sorted(ranks)
    shown = ", ".join(str(r) for r in ranks[:limit])
    more = f" and {len(ranks) - limit} more" if len(ranks) > limit else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + shown + more


def findings(result: GroupResult) -> List[str]:
    """The parts of a step's line, most decisive first: NaN/Inf, departure, suspects."""
    parts = []
    if result.anomaly:
        first = result.anomaly[0][1]
        parts.append(f"{ranks_text(r for r, _ in result.anomaly)}: first {first.kind} at {first.cell} "
                     f"({first.direction})")
    departure = result.first_departure
    if departure is not None:
        what = "weight gradient" if departure["kind"] == "grad" else "weight"
        agree = (f"no majority among {departure['replicas']} replicas, shown against rank {departure['reference']}"
                 if departure["no_majority"] else
                 f"{departure['majority']} of {departure['replicas']} replicas agree")
        parts.append(f"{ranks_text(departure['ranks'])} departs first at {departure['cell']} "
                     f"{departure['label']} ({what} not bit-identical; {agree})")
    if result.varying:
        parts.append(f"{len(result.varying)} weights differ on every replica (first: {result.varying[0]}): "
                     "are these ranks replicas? see --replicas / replica_groups")
    for suspect in result.suspects[:3]:
        factor = 10 ** abs(suspect["deviation"])
        side = "x" if suspect["deviation"] > 0 else "/"
        parts.append(f"suspect: rank {suspect['rank']} at {suspect['cell']} {suspect['label']} "
                     f"({suspect['metric']} {side}{factor:.3g} the other replicas'"
                     + ("; two replicas: shown against the lower rank" if suspect["no_majority"] else "") + ")")
    if len(result.suspects) > 3:
        parts.append(f"{len(result.suspects) - 3} more suspects")
    return parts


def step_line(result: GroupResult, missing: Iterable[int] = (), group_label: Optional[str] = None) -> str:
    """One line: ``step N[, GROUP]: clean (K replicas)`` or the findings, then the ranks without data.

    A single replica has no other to agree with: its line says only that it holds no NaN/Inf.
    """
    where = f"step {'-' if result.step is None else result.step}"
    if group_label:
        where += f", {group_label}"
    parts = findings(result)
    missing = sorted(missing)
    if missing:
        parts.append(f"{ranks_text(missing)} missing (no data for this step)")
    if not parts:
        if len(result.ranks) == 1:
            return f"{where}: no NaN/Inf; {ranks_text(result.ranks)} is the only replica: nothing to compare it with"
        return f"{where}: clean ({len(result.ranks)} replicas)"
    return f"{where}: " + "; ".join(parts)
