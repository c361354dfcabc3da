"""From one step's captures to the entries its output holds: grouped, linked, checked and named.

The work is split so that it can also run one cell at a time (``indexed_step``): grouping
and the checks of an entry only ever look at the captures of one cell, while parents look
across cells (``entries.link_parents``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from mf_celldump import fsutil
from mf_celldump.processing import msprobe_json
from mf_celldump.processing.consumer_parts import merge_consumer_parts
from mf_celldump.processing.entries import Entry, ShapeOf, assign_calls, group_entries, link_parents
from mf_celldump.rawformat.captured import Capture
from mf_celldump.rawformat.manifest import Manifest

MAX_NAMED_REPEATS = 20  # "a second capture" problems named one by one per step; the rest are counted


@dataclass
class SecondCaptures:
    """The step's values captured twice under one name: the first few named, then counted."""

    named: List[str] = field(default_factory=list)
    unnamed: int = 0
    first_unnamed: str = ""

    def add(self, capture: Capture, first: Capture, where: str) -> None:
        if len(self.named) < MAX_NAMED_REPEATS:
            self.named.append(f"{capture.origin}: a second capture of {where} (first: {first.origin}); not used, "
                              "raw data kept")
            return
        self.unnamed += 1
        self.first_unnamed = self.first_unnamed or str(capture.origin)

    def finish(self, problems: List[str]) -> None:
        problems.extend(self.named)
        if self.unnamed:
            problems.append(f"{self.unnamed} more second captures not used, not listed (the first at "
                            f"{self.first_unnamed}); raw data kept")


def grouped_entries(manifest: Manifest, captures: List[Capture], problems: List[str],
                    shape_of: Optional[ShapeOf] = None, warnings: Optional[List[str]] = None) -> List[Entry]:
    """Entries in execution order, calls numbered, parents not yet linked."""
    if shape_of is not None:
        captures = merge_consumer_parts(captures, shape_of, problems, warnings if warnings is not None else problems)
    assign_calls(captures, shape_of, manifest.micro_batches)
    return group_entries(captures, manifest.cells, problems)


def usable_entries(manifest: Manifest, entries: List[Entry], problems: List[str],
                   seconds: SecondCaptures) -> List[Entry]:
    """The entries whose names and index paths can be written, each capture given its data name;
    a second value under one name is not used (``seconds``)."""
    safe = []
    for entry in entries:
        try:
            fsutil.check_component(entry.name)
        except fsutil.UnsafePathError as err:
            problems.append(f"{manifest.path}: cell {entry.cell.cell_id}: {err}; its captures are skipped")
            continue
        gaps = msprobe_json.index_gap_problem(entry.captures)
        if gaps is not None:
            problems.append(f"{entry.name}: {gaps}; its captures are skipped")
            continue
        safe.append(entry)
        _name_captures(entry, problems, seconds)
    return safe


def _name_captures(entry: Entry, problems: List[str], seconds: SecondCaptures) -> None:
    seen: Dict[Tuple[str, str], Capture] = {}
    for capture in entry.captures:
        io, label = msprobe_json.io_label_of(capture, entry.cell)
        first = seen.get((io, label))
        if first is not None:
            seconds.add(capture, first, f"{entry.name}.{io}.{label}")
            continue
        try:
            capture.data_name = fsutil.check_component(msprobe_json.data_name_of(entry.name, io, label))
        except fsutil.UnsafePathError as err:
            problems.append(f"{capture.origin}: {err}; not used")
            continue
        seen[(io, label)] = capture


def build_entries(manifest: Manifest, captures: List[Capture], problems: List[str],
                  shape_of: Optional[ShapeOf] = None, warnings: Optional[List[str]] = None) -> List[Entry]:
    """Entries in execution order with parents and data names; duplicates become problems."""
    entries = grouped_entries(manifest, captures, problems, shape_of, warnings)
    link_parents(entries)
    seconds = SecondCaptures()
    safe = usable_entries(manifest, entries, problems, seconds)
    seconds.finish(problems)
    return safe
