#!/usr/bin/env bash
# Run this first on a new Ascend cluster, in the environment of your MindFormers job
# (mf_celldump, MindSpore, MindFormers installed; msrun next to the Python):
#
#   bash examples/ascend/acceptance.sh [--workdir /tmp/mf_celldump_acceptance] [--npus 2]
#
# It trains the tiny MindFormers LLaMA (PyNative reference; graph jit_level O0, O1, O2 with
# steps "1,3"; statistics; a big dump with slicing; resumed and past runs; bf16; with 2 NPUs
# data, tensor and pipeline parallel) and runs small-network scenarios (gradient
# accumulation, control flow, process-wide settings, the GE check, MindSpore < 2.7, ...),
# then prints PASS/FAIL/SKIP per check, each naming the defect it guards against
# (docs/acceptance.md). Exit code 0 when nothing FAILs. Send the output (and the logs it
# names) with any report. `--emulate` runs the same flags on CPU against the emulation.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python}"
exec "$PYTHON" "$HERE/acceptance.py" --python "$PYTHON" "$@"
