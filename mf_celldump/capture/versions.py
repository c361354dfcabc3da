"""The MindSpore versions capture supports, checked when a dump is attached (before training).

2.7.0 is the floor: ``ops.DumpGradient``, ``_dump_step`` and the ``td_flag`` naming of
statistics rows first appear there (absent from v2.5.0, v2.6.0 and r2.6 of
``mindspore/python/mindspore/ops/operations/debug_ops.py`` and
``runtime/graph_scheduler/actor/debug_actor.cc``). The tests run on 2.7.2, 2.8.0,
2.9.0 and 2.10.0 (``.ci/run``); keep ``pyproject.toml`` in step with these values.
"""

from __future__ import annotations

import logging
from typing import Optional

from packaging.version import InvalidVersion, Version

logger = logging.getLogger(__name__)

MINIMUM = (2, 7, 0)
NEWEST_TESTED = (2, 10)


def _text(version) -> str:
    return ".".join(str(part) for part in version)


def mindspore_version_problem(installed: str) -> Optional[str]:
    """Why ``installed`` cannot be used (None when it can); logs a warning for untested newer versions."""
    try:
        release = Version(installed).release
    except InvalidVersion:
        logger.warning("cannot read the MindSpore version %r; assuming it is supported", installed)
        return None
    if tuple(release[:3]) < MINIMUM:
        return (f"mf_celldump needs MindSpore {_text(MINIMUM)} or later (ops.DumpGradient, _dump_step and the "
                f"td_flag naming of statistics rows start there); installed: MindSpore {installed}. Install "
                f"MindSpore {_text(MINIMUM)} to {_text(NEWEST_TESTED)}.x")
    if tuple(release[:2]) > NEWEST_TESTED:
        logger.warning("MindSpore %s is newer than the newest version mf_celldump is tested with (%s.x); Ascend "
                       "graph capture relies on private MindSpore APIs: run examples/ascend/acceptance.sh first",
                       installed, _text(NEWEST_TESTED))
    return None
