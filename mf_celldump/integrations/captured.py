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


def _unprocessed(dump) -> List[int]:
    """Captured steps of this rank with no msprobe output in place yet."""
    rank_dir = naming.output_rank_dir_name(dump.rank, dump.distributed)
    return [step for step in dump.captured_steps
            if not os.path.isfile(os.path.join(dump.dump_path, naming.step_dir_name(step), rank_dir,
                                               naming.DUMP_JSON))]


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


def process_captured(dump, steps: Optional[Sequence[int]] = None, observer=None, timeout: Optional[float] = None):
    """Turn this rank's complete raw steps into msprobe's layout; a ``ProcessingReport``.

    ``dump`` is the handle ``attach`` returned (attached or detached). Steps MindSpore
    writes after the fact are waited for first (up to ``timeout``).
    """
    from mf_celldump.processing.driver import process_dump

    waited = wait_for_files(dump, steps, timeout)
    report = process_dump(dump.dump_path, steps=steps, ranks=[dump.rank], jobs=dump.config.jobs,
                          only_complete=True, observer=observer)
    report.problems.extend(waited.problems(dump.rank))
    return report
