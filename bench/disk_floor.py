"""The disk's sustained floor for writing captured steps: the same bytes per step, written step after
step by a plain ``np.save`` loop into folders that are kept, as a run keeps its raw steps.

The first few steps go to free page cache and are several times faster; once the kernel's dirty
pages reach its writeback thresholds, each step costs what the disk absorbs. That steady time is
the floor of any tool that writes these bytes. Default: the large LLaMA's 397 tensors, 482 MB a
step, 30 steps (about 15 GB; the folder is removed at the end).

Run:  python bench/disk_floor.py [--mb 482] [--files 397] [--steps 30] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np


def _dirty_kb() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("Dirty:"):
                return int(line.split()[1])
    return -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=482.0, help="bytes per step, in MB")
    parser.add_argument("--files", type=int, default=397, help="files per step")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="a folder on the disk to measure")
    args = parser.parse_args()
    per_file = max(1, int(args.mb * 1e6 / args.files / 4))
    array = np.random.default_rng(0).standard_normal(per_file).astype(np.float32)
    root = tempfile.mkdtemp(prefix="disk-floor-", dir=args.dir)
    times = []
    try:
        for step in range(args.steps):
            folder = os.path.join(root, f"step{step}")
            os.makedirs(folder)
            t0 = time.perf_counter()
            for i in range(args.files):
                np.save(os.path.join(folder, f"{i}.npy"), array, allow_pickle=False)
            times.append((time.perf_counter() - t0) * 1000.0)
            print(f"step {step}: {times[-1]:.0f} ms, dirty {_dirty_kb() / 1024:.0f} MiB", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    steady = times[len(times) // 2:]
    mb = args.files * array.nbytes / 1e6
    print(f"{args.files} files, {mb:.1f} MB a step: first step {times[0]:.0f} ms; steady (median of the last "
          f"{len(steady)} steps) {statistics.median(steady):.0f} ms, {mb / statistics.median(steady) * 1000:.0f} MB/s")


if __name__ == "__main__":
    main()
