#!/usr/bin/env bash
# Two ranks, data parallel, on one CPU host: the tiny LLaMA of examples/tiny_llama.yaml with
# CellDumpCallback. Each rank captures and processes only its own data into
# <output_dir>/celldump/step{N}/rank{R}/ (no shared filesystem assumed, no rank waits).
#
#   bash examples/distributed/run_2ranks.sh [OUTPUT_DIR] [pynative|graph] [extra run_tiny_llama.py args]
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

msrun --worker_num=2 --local_worker_num=2 --master_addr=127.0.0.1 --master_port="$PORT" \
  --log_dir="$OUT/msrun_log" --join=True \
  "$HERE/../run_tiny_llama.py" --parallel --mode "$MODE" --output-dir "$OUT" "$@"

echo "worker logs: $OUT/msrun_log/worker_*.log"
for rank in 0 1; do
  # the runner's closing summary: "dump: PATH" and its indented lines
  awk '/^dump: /{show=1; print; next} show && /^  /{print; next} {show=0}' "$OUT/msrun_log/worker_$rank.log"
done
