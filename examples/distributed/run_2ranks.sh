#!/usr/bin/env bash
# Two ranks, data parallel, on one CPU host: the tiny LLaMA of examples/tiny_llama.yaml with
# CellDumpCallback. Each rank captures and processes only its own data into
# <output_dir>/celldump/step{N}/rank{R}/ (no shared filesystem assumed, no rank waits).
#
#   bash examples/distributed/run_2ranks.sh [OUTPUT_DIR] [pynative|graph] [extra run_tiny_llama.py args]
#
# It prints what a user needs (per rank: where its log is, its step lines and its dump; the
# verdict across ranks where rank_verdict is on; the command to run next). msrun's own output
# goes to OUTPUT_DIR/msrun.log, each rank's whole output to OUTPUT_DIR/msrun_log/worker_R.log.
#
# msrun starts workers with a bare `python`: the Python that has MindSpore must come first
# on PATH (e.g. PATH="$PWD/.venv/bin:$PATH"). On CPU, MindSpore's communication init picks
# the mccl backend; everything stays on the loopback address.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="$(mkdir -p "${1:-./output_2ranks}" && cd "${1:-./output_2ranks}" && pwd)"
MODE="${2:-pynative}"
shift $(( $# > 2 ? 2 : $# ))
PORT="${MASTER_PORT:-$(( 20000 + RANDOM % 20000 ))}"

echo "training 2 ranks under msrun ($MODE mode); msrun's output: $OUT/msrun.log"
status=0
msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port="$PORT" \
  --log_dir="$OUT/msrun_log" --join=True \
  "$HERE/../run_tiny_llama.py" --parallel --mode "$MODE" --output-dir "$OUT" "$@" >"$OUT/msrun.log" 2>&1 || status=$?

for rank in 0 1; do
  log="$OUT/msrun_log/worker_$rank.log"
  echo "rank $rank: log $log"
  [ -f "$log" ] || continue
  # the runner's own lines: one per step (at most 12 shown), a failure, then its closing "dump: PATH" block
  grep -E '^(step [0-9]+: loss|training FAILED)' "$log" | head -n 12 | sed 's/^/  /' || true
  awk '/^dump: /{show=1; print "  " $0; next} show && /^  /{print "  " $0; next} {show=0}' "$log"
done
# the verdict across ranks (rank_verdict: true), rank 0's lines
grep -hoE 'mf_celldump: ranks: step [0-9]+: .*' "$OUT/msrun_log/worker_0.log" 2>/dev/null | head -n 12 \
  | sed 's/^mf_celldump: ranks: /verdict: /' || true
if [ "$status" -ne 0 ]; then
  echo "msrun FAILED (exit $status): the end of $OUT/msrun.log and the rank logs above say why"
  exit "$status"
fi
TOOL="$(command -v mf-celldump || echo "python -m mf_celldump")"
echo "next: check the ranks' replicas against each other: $TOOL ranks $OUT/celldump"
