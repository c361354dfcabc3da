"""What a processing run did: one row per (rank, step) (:class:`StepOutcome`), and the run's report of them with
its problems, warnings and summary text (:class:`ProcessingReport`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

INCOMPLETE = "INCOMPLETE"  # how the problem of a step the capture did not complete begins (the summary counts them)


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


@dataclass
class ProcessingReport:
    """Outcome of a run: one row per (rank, step), plus problems not tied to a step."""

    dump_path: str
    outcomes: List[StepOutcome] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    selection_matched_nothing: bool = False
    selection_message: str = ""  # the one sentence saying so, when the selection matched nothing

    @property
    def processed(self) -> List[StepOutcome]:
        return [o for o in self.outcomes if o.status == "processed"]

    @property
    def failed(self) -> List[StepOutcome]:
        """Steps whose output could not be written (their raw data is kept)."""
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def nothing_to_do(self) -> bool:
        """True when no step needed processing (e.g. a second run over the same dump)."""
        waiting = any(o.status == "skipped-incomplete" for o in self.outcomes)
        return not self.processed and not self.all_problems and not waiting and not self.selection_matched_nothing

    @property
    def all_problems(self) -> List[str]:
        out = list(self.problems)
        for outcome in self.outcomes:
            out.extend(f"step {outcome.step} rank {outcome.rank}: {p}" for p in outcome.problems)
        return out

    @property
    def ok(self) -> bool:
        return not self.all_problems

    @property
    def entries(self) -> int:
        return sum(o.entries for o in self.processed)

    @property
    def weight_grad_entries(self) -> int:
        return sum(o.weight_grad_entries for o in self.processed)

    @property
    def files(self) -> int:
        """Raw files read: tensor_files + value_files."""
        return sum(o.files for o in self.processed)

    @property
    def tensors(self) -> int:
        """Tensor leaves of the dump.json files written."""
        return sum(o.tensors for o in self.processed)

    @property
    def values(self) -> int:
        """Their other leaves (numbers, bools, None, null where nothing was captured)."""
        return sum(o.values for o in self.processed)

    @property
    def tensor_files(self) -> int:
        return sum(o.tensor_files for o in self.processed)

    @property
    def value_files(self) -> int:
        return sum(o.value_files for o in self.processed)

    def summary(self, max_problems: int = 20) -> str:
        """Human-readable summary (what the CLI prints)."""
        lines = [f"dump: {self.dump_path}"]
        if self.selection_matched_nothing:
            lines.append(self.selection_message or "nothing processed: the selection matches nothing in this dump")
        elif self.nothing_to_do:
            lines.append("nothing to do: every selected step is already processed")
        lines.extend(self._processed_lines())
        lines.extend(self._other_status_lines())
        warnings = list(self.warnings) + [w for o in self.outcomes for w in o.warnings]
        if warnings:
            lines.append(f"warnings: {len(warnings)}")
            lines.extend(f"  {w}" for w in warnings[:max_problems])
        problems = self.all_problems
        if problems:
            lines.append(f"PROBLEMS: {len(problems)} (raw data of the affected steps was kept)")
            lines.extend(f"  {p}" for p in problems[:max_problems])
            if len(problems) > max_problems:
                lines.append(f"  ... and {len(problems) - max_problems} more")
        return "\n".join(lines)

    def _processed_lines(self) -> List[str]:
        done = self.processed
        if not done:
            return []
        steps = sorted({o.step for o in done})
        ranks = sorted({o.rank for o in done})
        shown = [o.output for o in done[:4]] + (["..."] if len(done) > 4 else [])
        return [
            f"processed {len(done)} step folder(s): steps {ranges(steps)}, ranks {ranges(ranks)}; "
            f"{entries_text(self.entries, self.weight_grad_entries)} holding {leaves_text(self.tensors, self.values)}; "
            f"{counted(self.files, 'raw file')} read ({files_text(self.tensor_files, self.value_files)})",
            f"output in {self.dump_path}: {', '.join(shown)}",
        ]

    def _other_status_lines(self) -> List[str]:
        lines = []
        for status, text in (("already-processed", "already processed"),
                             ("skipped-incomplete", "incomplete, skipped"),
                             ("failed", "FAILED, raw data kept")):
            rows = [o for o in self.outcomes if o.status == status]
            if rows:
                lines.append(f"{text}: {len(rows)} step folder(s) (steps {ranges(sorted({o.step for o in rows}))})")
        finished = [o for o in self.outcomes if o.status == "already-processed" and o.raw_removed]
        if finished:
            lines.append(f"removed the raw data of {len(finished)} step folder(s) processed earlier")
        incomplete = [o for o in self.processed if not o.complete]
        named = [o for o in incomplete if any(p.startswith(INCOMPLETE) for p in o.problems)]
        if named:
            lines.append(f"{INCOMPLETE}: {len(named)} step folder(s) (steps {ranges(sorted({o.step for o in named}))}) "
                         "hold only part of their step (no completion marker: the run stopped mid-step); their raw "
                         "data is kept (see PROBLEMS)")
        noted = [o for o in incomplete if o not in named]
        if noted:
            lines.append(f"note: {len(noted)} processed step(s) had no completion marker (steps "
                         f"{ranges(sorted({o.step for o in noted}))}): the run may have stopped mid-step")
        return lines


def ranges(values: List[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    if not values:
        return "none"
    parts = []
    start = prev = values[0]
    for value in values[1:] + [None]:
        if value is not None and value == prev + 1:
            prev = value
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ",".join(parts)
