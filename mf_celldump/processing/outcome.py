"""What happened to one step of one rank: a row of the processing report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

INCOMPLETE = "INCOMPLETE"  # how the problem of a step the capture did not complete begins (report.py counts them)


@dataclass
class StepOutcome:
    """What happened to one step of one rank (a row of the report)."""

    rank: int
    step: int
    output: str
    status: str  # processed | already-processed | skipped-incomplete | failed (no output written)
    complete: bool = True
    entries: int = 0  # msprobe entries: one per cell call and direction, plus weight_grad_entries
    files: int = 0  # raw files read: tensor_files + value_files
    records: int = 0  # captures that came from records.jsonl or statistic.csv, not from a file
    raw_removed: bool = False
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    tensor_files: int = 0  # raw tensor files read (statistics computed; with task tensor, linked as data files)
    value_files: int = 0  # raw files holding a non-tensor argument (int, float, bool, None)
    foreign_kept: List[str] = field(default_factory=list)  # files we did not write, left in the raw folder
    output_written: bool = False  # this run put the output in place
    weight_grad_entries: int = 0  # of the entries: parameters_grad ones (a cell's weight gradients in the step)
    tensors: int = 0  # tensor leaves the written dump.json holds
    values: int = 0  # its other leaves: numbers, bools, None, and null where nothing was captured

    def counts_text(self) -> str:
        """What the numbers of this step are, in words (the per-step log line)."""
        text = f"{entries_text(self.entries, self.weight_grad_entries)}"
        if self.output_written:
            text += f" holding {leaves_text(self.tensors, self.values)}"
        text += f"; {counted(self.files, 'raw file')} read"
        if self.files:
            text += f" ({files_text(self.tensor_files, self.value_files)})"
        if self.records:
            text += f", {counted(self.records, 'capture')} read from records.jsonl or statistic.csv"
        return text


def counted(number: int, noun: str, plural: str = "") -> str:
    """``1 tensor``, ``2 tensors`` (``plural`` when not ``noun + "s"``)."""
    return f"{number} {noun}" if number == 1 else f"{number} {plural or noun + 's'}"


def entries_text(entries: int, weight_grad_entries: int) -> str:
    """``30 entries (cell calls)``, or ``30 entries (26 cell calls, 4 weight-gradient entries)``."""
    total = counted(entries, "entry", "entries")
    if not weight_grad_entries:
        return f"{total} (cell calls)"
    calls = counted(entries - weight_grad_entries, "cell call")
    return f"{total} ({calls}, {counted(weight_grad_entries, 'weight-gradient entry', 'weight-gradient entries')})"


def leaves_text(tensors: int, values: int) -> str:
    """What dump.json holds: ``215 tensors and 48 non-tensor values`` (the main job's summary says the same)."""
    return f"{counted(tensors, 'tensor')} and {counted(values, 'non-tensor value')}"


def files_text(tensor_files: int, value_files: int) -> str:
    """The raw files read: ``215 tensor files, 44 value files`` (a value's file holds a number, bool or None)."""
    return f"{counted(tensor_files, 'tensor file')}, {counted(value_files, 'value file')}"
