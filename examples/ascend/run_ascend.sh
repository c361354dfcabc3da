#!/usr/bin/env bash
# Launch a MindFormers run on one Ascend node (8 NPUs) with CellDumpCallback in its config.
#
#   MINDFORMERS_DIR=/path/to/mindformers CONFIG=/path/to/my_qwen3.yaml bash run_ascend.sh
#
# CONFIG is your usual run config with the entry of celldump_callback.yaml added to
# `callbacks:`. For several nodes use msrun's --worker_num (all ranks) / --local_worker_num
# (this node) / --node_rank / --master_addr as in your normal launch; nothing else changes.
set -euo pipefail
: "${MINDFORMERS_DIR:?set MINDFORMERS_DIR to the MindFormers checkout that has run_mindformer.py}"
: "${CONFIG:?set CONFIG to your run config (with the CellDumpCallback entry)}"
WORKERS="${WORKERS:-8}"
PORT="${MASTER_PORT:-8118}"
REGISTER_PATH_DIR="$(mf-celldump register-path)"   # the folder of celldump_callback.py
# Graph-mode TensorDump sends each tensor to the host in one piece unless MindSpore slices it;
# MindSpore documents that large or frequent dumps fail without these, and reads them once, when
# the device starts (so here, not in Python). Slices of MB (1-2048); seconds it waits for the host
# writer (0-600, at most op_timeout; if the writer is slower it drops what is queued).
export MS_DUMP_SLICE_SIZE="${MS_DUMP_SLICE_SIZE:-256}"
export MS_DUMP_WAIT_TIME="${MS_DUMP_WAIT_TIME:-600}"

cd "$MINDFORMERS_DIR"
msrun --worker_num="$WORKERS" --local_worker_num="$WORKERS" --master_port="$PORT" \
  --log_dir=msrun_log --join=True \
  run_mindformer.py --config "$CONFIG" --register_path "$REGISTER_PATH_DIR"

# Each rank logs a summary line "mf_celldump: rank R: captured steps ...; processed ..."
grep -h "mf_celldump: rank" msrun_log/worker_*.log || true
