"""Processing what an attached capture wrote, for hand-written training loops.

Capture writes raw files and knows which steps it captured; processing reads raw files
and knows nothing of capture. These two functions join them from above, so data flows
one way (``CellDumpCallback`` does the same through ``TrainingRun``)::

    dump = mf_celldump.attach(net, config)
    ...
    dump.detach()
    report = mf_celldump.process_captured(dump)

Captured files are written beside training (the raw writer's thread; MindSpore's for
graph-mode TensorDump): both functions wait for them first; the report names steps still
missing then.
"""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

from mf_celldump.layout import naming
from mf_celldump.layout.reader import output_run_id


def _unprocessed(dump) -> List[int]:
    """Captured steps of this rank with no msprobe output of this run in place yet.

    An output counts when its ``dump.json`` names this dump's run (``layout.naming.RUN_ID_KEY``):
    one of an earlier run under the same step number is not this step's.
    """
    rank_dir = naming.output_rank_dir_name(dump.rank, dump.distributed)
    return [step for step in dump.captured_steps
            if output_run_id(os.path.join(dump.dump_path, naming.step_dir_name(step), rank_dir,
                                          naming.DUMP_JSON)) != dump.run_id]


def _writes_nothing(dump) -> Optional[str]:
    """Why this rank's capture writes nothing by configuration (None when it may write)."""
    if dump.rank not in dump.config.ranks:
        return (f"rank {dump.rank} is not in ranks={dump.config.ranks.describe()}: this rank captures nothing, so "
                "there is nothing to process here")
    if not dump.steps_remain:
        return (f"steps={dump.config.steps.describe()} all lie before this run's first step {dump.initial_step}: "
                "nothing was captured, so there is nothing to process")
    return None


def wait_for_files(dump, steps: Optional[Sequence[int]] = None, timeout: Optional[float] = None):
    """Wait until MindSpore has written the captured ``steps`` (default: those not processed yet); a ``StepsWait``.

    Returns at once for captures whose files are written during the step. ``timeout``
    defaults to ``processing.async_steps.DEFAULT_TIMEOUT_S``.
    """
    from mf_celldump.processing import async_steps

    wanted = list(_unprocessed(dump) if steps is None else steps)
    if dump.attached:
        dump.wait_written()  # our writer's files and step markers (a detached dump's are all written)
    if not dump.writes_later or not wanted:
        return async_steps.StepsWait(ready=wanted)
    return async_steps.wait_for_steps(dump.dump_path, dump.rank, wanted, timeout=timeout)


def discard_unselected(dump, timeout: Optional[float] = None) -> List[str]:
    """Delete what MindSpore wrote for steps that were not selected (the step filter stayed open for
    another TensorDump user) once it has finished them; returns what is left to say.

    MindSpore's writer is one FIFO, so once the last such step's marker is there every earlier
    one is too. Does nothing for other captures.
    """
    from mf_celldump.processing import async_steps
    from mf_celldump.processing.driver import process_dump

    if not dump.writes_unselected:
        return []
    notes = []
    last = dump.last_unselected_step
    if last is not None:
        waited = async_steps.wait_for_steps(dump.dump_path, dump.rank, [last], timeout=timeout,
                                            include_unselected=True)
        if waited.missing:
            notes.append(f"rank {dump.rank}: MindSpore was still writing steps that were not selected after "
                         f"{waited.waited_s:.0f} s; `mf-celldump process {dump.dump_path}` deletes them once written")
    report = process_dump(dump.dump_path, steps=[], ranks=[dump.rank], jobs=1, only_complete=True)
    return notes + list(report.warnings)


def process_captured(dump, steps: Optional[Sequence[int]] = None, observer=None, timeout: Optional[float] = None):
    """Turn this rank's complete raw steps into msprobe's layout; a ``ProcessingReport``.

    ``dump`` is the handle ``attach`` returned (attached or detached). Steps MindSpore
    writes after the fact are waited for first (up to ``timeout``).
    """
    from mf_celldump.processing.driver import process_dump
    from mf_celldump.processing.outcome import ProcessingReport

    silent = _writes_nothing(dump)
    if silent is not None:  # legal configuration: say so instead of "no dump here"
        return ProcessingReport(dump.dump_path, warnings=[silent])
    waited = wait_for_files(dump, steps, timeout)
    report = process_dump(dump.dump_path, steps=steps, ranks=[dump.rank], jobs=dump.config.jobs,
                          only_complete=True, observer=observer)
    report.problems.extend(waited.problems(dump.rank))
    report.warnings.extend(discard_unselected(dump, timeout))
    return report
