"""The tiny-Qwen3 section of ``bench_capture.py``: step time with and without capture, same process.

Model: MindFormers 1.9's mcore ``TrainingQwen3ForCausalLM`` from ``examples/tiny_qwen3.yaml``
resized to the LLaMA section's shape (batch 2, seq 64, hidden 128, 4 layers, 4 heads with
2 KV heads of 32, FFN 256, vocab 1000, float32), with the CPU patches of
``examples/mcore_cpu_patches.py``; trained with plain ``nn.TrainOneStepCell`` +
``AdamWeightDecay`` in PyNative or Graph mode.

One worker per (mode, task) builds two identical networks (same seed) in one process:
one without capture, one with ``mf_celldump.attach`` (``data_mode: all``, backend auto:
graph -> host, PyNative -> tensordump / device_stats). After the first step of each (the
graph compile, timed separately) they run alternately, step by step, so machine load
drifting during the run affects both alike; the ratio of the medians is the cost of capture.
"""

from __future__ import annotations

import os
import statistics as stats_mod
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLES = os.path.join(REPO, "examples")

CONFIGS = ["qwen3_pynative_tensor", "qwen3_pynative_statistics", "qwen3_graph_tensor", "qwen3_graph_statistics"]
MODEL = dict(seq_length=64, max_position_embeddings=64, hidden_size=128, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32, intermediate_size=256, vocab_size=1000)
BATCH = 2


def _networks(mode: str, seed: int):
    """(plain train cell, train cell to capture): two tiny Qwen3 with the same initial weights."""
    import tiny_mcore  # examples/tiny_mcore.py

    return tiny_mcore.twin_train_cells("qwen3", mode, seed, MODEL)


def _batches(count: int, seed: int):
    import tiny_mcore

    return tiny_mcore.token_batches(count, BATCH, MODEL["seq_length"], MODEL["vocab_size"], seed)


def _step(train, batch, sync, dump=None, step=None) -> tuple:
    t0 = time.perf_counter()
    if dump is not None:
        dump.begin_step(step)
    loss = float(train(*batch).asnumpy())
    sync()
    if dump is not None:
        dump.end_step()
    return (time.perf_counter() - t0) * 1000.0, loss


def worker(name: str, steps: int, seed: int, sync, tree_size) -> dict:
    """Run one configuration of ``CONFIGS``; returns medians, ratio, compile times, losses."""
    import mf_celldump

    _, mode, task = name.split("_")
    plain, captured = _networks(mode, seed)
    dump_path = os.path.join(os.getcwd(), "dump")
    dump = mf_celldump.attach(captured, {"dump_path": dump_path, "task": task, "data_mode": "all"})
    batches = _batches(steps + 1, seed)
    first_plain, _ = _step(plain, batches[0], sync)
    first_captured, _ = _step(captured, batches[0], sync, dump, 0)
    plain_ms, captured_ms, losses, files, nbytes = [], [], [], [], []
    for i in range(1, steps + 1):
        ms_plain, loss_plain = _step(plain, batches[i], sync)
        before = tree_size(dump_path)
        ms_captured, loss_captured = _step(captured, batches[i], sync, dump, i)
        after = tree_size(dump_path)
        plain_ms.append(ms_plain)
        captured_ms.append(ms_captured)
        losses.append((loss_plain, loss_captured))
        files.append(after[0] - before[0])
        nbytes.append(after[1] - before[1])
    backend, cells = dump.backend.name, len(dump.cells)
    dump.detach()
    plain_median, captured_median = stats_mod.median(plain_ms), stats_mod.median(captured_ms)
    return {
        "config": name, "mode": mode, "task": task, "backend": backend, "cells": cells,
        "plain_ms": plain_ms, "captured_ms": captured_ms,
        "plain_median_ms": plain_median, "captured_median_ms": captured_median,
        "ratio": captured_median / plain_median,
        "first_step_plain_ms": first_plain, "first_step_captured_ms": first_captured,
        "losses": losses, "same_losses": all(a == b for a, b in losses),
        "files_per_step": files, "bytes_per_step": nbytes, "loadavg_end": os.getloadavg(),
    }


def table(results) -> str:
    head = ("| mode | task | backend | cells | ms/step no capture (median) | with capture | x no capture "
            "| first step (compile) no capture / with | files/step | MB/step | losses equal |")
    lines = [head, "|---|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for res in results:
        if "error" in res:
            lines.append(f"| {res['config']} | FAILED: {res['error']} | | | | | | | | | |")
            continue
        files = stats_mod.median(res["files_per_step"])
        mb = stats_mod.median(res["bytes_per_step"]) / 1e6
        lines.append(
            f"| {res['mode']} | {res['task']} | {res['backend']} | {res['cells']} | {res['plain_median_ms']:.0f} "
            f"| {res['captured_median_ms']:.0f} | **{res['ratio']:.2f}** | {res['first_step_plain_ms'] / 1000:.1f} s / "
            f"{res['first_step_captured_ms'] / 1000:.1f} s | {files:.0f} | {mb:.2f} | {res['same_losses']} |")
    return "\n".join(lines)


for _path in (REPO, EXAMPLES):
    if _path not in sys.path:
        sys.path.insert(0, _path)
