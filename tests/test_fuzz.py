"""Property-based fuzz (Hypothesis) of every reader of other people's files, under a memory bound.

Each target of ``tests/support/fuzz_targets.py`` runs in a child Python whose address space is
capped at 600 MiB (RLIMIT_AS; an idle child takes ~140 MiB), with a bounded number of
examples (``FUZZ_SCALE=4`` runs four times as many). A failing target prints
Hypothesis' falsifying example.
"""

from __future__ import annotations

import os

import pytest

from tests.support.fuzz_targets import EXAMPLES
from tests.support.hostile_dumps import limited_python

LIMIT_MB = 600


@pytest.mark.parametrize("target", sorted(EXAMPLES))
def test_fuzz(target):
    proc = limited_python(f"import sys; from tests.support.fuzz_targets import main; sys.exit(main({target!r}))",
                          limit_mb=LIMIT_MB, timeout=900)
    assert proc.returncode == 0, (proc.stdout[-2000:] + proc.stderr[-6000:])
    tried = int(proc.stdout.split(f"EXAMPLES {target} ")[1].split()[0])
    scale = float(os.environ.get("FUZZ_SCALE", "1"))
    assert tried >= int(EXAMPLES[target] * scale), proc.stdout[-500:]
