#!/usr/bin/env bash
# Run this first on a new Ascend cluster, on one NPU, in the environment of your MindFormers
# job (mf_celldump, MindSpore, MindFormers installed):
#
#   bash examples/ascend/acceptance.sh [--workdir /tmp/mf_celldump_acceptance]
#
# It trains the tiny MindFormers LLaMA in graph mode (and once in PyNative for reference
# values) with both tasks, steps "1,3", a resumed run and a run whose steps are all in the
# past, then prints PASS/FAIL per invariant (examples/ascend/acceptance.py says which).
# Exit code 0 when every invariant holds. Send the output (and the logs it names) with any
# report. `--emulate` runs the same on CPU against the emulation the test suite uses.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python}"
exec "$PYTHON" "$HERE/acceptance.py" --python "$PYTHON" "$@"
