"""What happened to one step of one rank: a row of the processing report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List


@dataclass
class StepOutcome:
    """What happened to one step of one rank (a row of the report)."""

    rank: int
    step: int
    output: str
    status: str  # processed | already-processed | skipped-incomplete | failed (no output written)
    complete: bool = True
    entries: int = 0  # msprobe entries: one per cell call and direction
    files: int = 0  # raw files read: tensor_files + value_files
    records: int = 0  # captures that came from records.jsonl or statistic.csv, not from a file
    raw_removed: bool = False
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    tensor_files: int = 0  # raw tensor files read (statistics computed; with task tensor, linked as data files)
    value_files: int = 0  # raw files holding a non-tensor argument (int, float, bool, None)
    foreign_kept: List[str] = field(default_factory=list)  # files we did not write, left in the raw folder
    output_written: bool = False  # this run put the output in place

    def counts_text(self) -> str:
        """What the numbers of this step are, in words (the per-step log line)."""
        text = f"{self.entries} entries (cell calls), {self.files} raw files read"
        if self.files:
            text += f" ({self.tensor_files} tensors, {self.value_files} non-tensor values)"
        if self.records:
            text += f", {self.records} captures read from records.jsonl or statistic.csv"
        return text
