"""Train the tiny LLaMA of ``tiny_llama.yaml`` on CPU with MindFormers 1.9 and dump it with mf_celldump.

It does what ``run_mindformer.py --config tiny_llama.yaml --register_path DIR`` does
(``DIR`` = ``mf-celldump register-path``), plus what a CPU needs: synthetic MindRecord
data and the CPU-only workarounds of ``cpu_workarounds.py``. At the end it prints where
the processed dump is and what is in it.

    python examples/run_tiny_llama.py --mode pynative --output-dir /tmp/tiny
    python examples/run_tiny_llama.py --mode graph --dump steps=1 --dump task=tensor

Two ranks, data parallel, on one CPU host: ``examples/distributed/run_2ranks.sh``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import List, Optional

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIG = os.path.join(HERE, "tiny_llama.yaml")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="MindFormers run config (YAML)")
    parser.add_argument("--mode", choices=("pynative", "graph"), default="pynative")
    parser.add_argument("--output-dir", default="./output",
                        help="MindFormers output_dir (the dump goes to <it>/celldump)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per epoch (sizes the data)")
    parser.add_argument("--epochs", type=int, default=None, help="override runner_config.epochs")
    parser.add_argument("--parallel", action="store_true",
                        help="data parallel over the msrun workers (use_parallel, one data shard per rank)")
    parser.add_argument("--save-checkpoint", action="store_true",
                        help="save a checkpoint after the last step")
    parser.add_argument("--resume-from", default=None,
                        help="checkpoint folder of an earlier run (<output_dir>/checkpoint): resume training")
    parser.add_argument("--dump", action="append", default=[], metavar="KEY=VALUE",
                        help="set a key of the CellDumpCallback entry (YAML value), e.g. steps=1-2")
    parser.add_argument("--python-callback", action="store_true",
                        help="build CellDumpCallback in Python from the YAML entry and pass it as "
                             "Trainer(callbacks=[...]) instead of letting MindFormers build it")
    return parser.parse_args(argv)


# -- data -----------------------------------------------------------------------------
def make_data(path: str, samples: int, seq_length: int, vocab_size: int, seed: int = 0) -> str:
    """Write a synthetic token MindRecord (deterministic, so every rank writes the same data)."""
    import numpy as np
    from mindspore.mindrecord import FileWriter

    os.makedirs(os.path.dirname(path), exist_ok=True)
    writer = FileWriter(path, shard_num=1, overwrite=True)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "tiny_llama")
    rng = np.random.default_rng(seed)
    rows = [{"input_ids": rng.integers(1, vocab_size, size=(seq_length + 1,)).astype(np.int32)}
            for _ in range(samples)]
    writer.write_raw_data(rows)
    writer.commit()
    return path


# -- config ---------------------------------------------------------------------------
def _world() -> tuple:
    """(rank, world size): MindSpore's communication once initialised, else msrun's variables."""
    try:
        from mindspore.communication import get_group_size, get_rank

        return int(get_rank()), int(get_group_size())
    except Exception:  # communication not initialised (single process)
        return int(os.environ.get("RANK_ID", "0") or 0), int(os.environ.get("RANK_SIZE", "1") or 1)


def _celldump_entry(config) -> dict:
    for entry in config.callbacks or []:
        if entry.get("type") == "CellDumpCallback":
            return entry
    raise SystemExit(f"{config}: no `type: CellDumpCallback` entry in callbacks")


def load_config(args: argparse.Namespace):
    """The run config with this run's settings applied (what run_mindformer.py's flags do)."""
    from mindformers import MindFormerConfig

    config = MindFormerConfig(os.path.abspath(args.config))
    config.context.mode = 0 if args.mode == "graph" else 1
    config.output_dir = os.path.abspath(args.output_dir)
    if args.epochs is not None:
        config.runner_config.epochs = args.epochs
    if args.parallel:
        config.use_parallel = True
        config.parallel_config.data_parallel = _world()[1]
    if args.save_checkpoint:
        config.callbacks.append({
            "type": "CheckpointMonitor", "prefix": "tiny_llama",
            "save_checkpoint_steps": args.steps, "keep_checkpoint_max": 1, "integrated_save": False,
        })
    if args.resume_from:
        config.load_checkpoint = os.path.abspath(args.resume_from)
        config.resume_training = True
    entry = _celldump_entry(config)
    for item in args.dump:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--dump {item!r}: expected KEY=VALUE")
        entry[key.strip()] = yaml.safe_load(value)
    return config


def prepare_data(config, steps: int) -> str:
    """Write this rank's copy of the data and point the config at it.

    Called after communication is initialised: msrun's scheduler process runs this script
    up to ``init()`` too, and must not write data. One copy per rank, so nothing assumes a
    filesystem shared between ranks.
    """
    rank, world = _world()
    if not config.use_parallel:
        world = 1
    data = os.path.join(config.output_dir, "data", f"rank{rank}", "tiny_llama.mindrecord")
    make_data(data, steps * config.runner_config.batch_size * world, config.model.model_config.seq_length,
              config.model.model_config.vocab_size)
    config.train_dataset.data_loader.dataset_dir = data
    config.train_dataset_task.dataset_config.data_loader.dataset_dir = data
    return data


def dump_path_of(config) -> str:
    entry = _celldump_entry(config)
    return os.path.abspath(entry.get("dump_path") or os.path.join(config.output_dir, "celldump"))


# -- run ------------------------------------------------------------------------------
def use_register_path() -> str:
    """What ``run_mindformer.py --register_path $(mf-celldump register-path)`` does."""
    from mf_celldump.integrations.registration_cli import registration_dir

    path = registration_dir()
    os.environ["REGISTER_PATH"] = path
    if path not in sys.path:
        sys.path.append(path)
    return path


def python_callbacks(config) -> list:
    """Move the YAML CellDumpCallback entry into a Python instance (``Trainer(callbacks=...)``)."""
    from mf_celldump import CellDumpCallback

    entry = _celldump_entry(config)
    config.callbacks.remove(entry)
    keys = {k: v for k, v in entry.items() if k not in ("type", "auto_register")}
    return [CellDumpCallback(**keys)]


def train(config, steps: int, callbacks=None) -> None:
    from mindformers import Trainer
    from mindformers.core.context import build_context

    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import cpu_workarounds  # noqa: F401  (registers CpuTrainOneStepCell)

    build_context(config)  # also initialises communication when use_parallel is true
    prepare_data(config, steps)
    Trainer(config, callbacks=callbacks).train()


def describe_dump(dump_path: str, rank: Optional[int] = None) -> str:
    """Where the processed dump is and what is in it (steps, ranks, entries, files)."""
    lines = [f"dump: {dump_path}"]
    pattern = os.path.join(dump_path, "step*", "rank*" if rank is None else f"rank{rank}")
    folders = sorted(glob.glob(pattern)) + ([] if rank is None else
                                            sorted(glob.glob(os.path.join(dump_path, "step*", "rank"))))
    if not folders:
        lines.append("  no processed step folders")
    for folder in sorted(folders, key=_step_rank_key):
        dump_json = os.path.join(folder, "dump.json")
        try:
            with open(dump_json, encoding="utf-8") as handle:
                entries = len(json.load(handle).get("data", {}))
        except (OSError, ValueError):
            entries = 0
        tensors = os.path.join(folder, "dump_tensor_data")
        files = len(os.listdir(tensors)) if os.path.isdir(tensors) else 0
        lines.append(f"  {os.path.relpath(folder, dump_path)}: {entries} entries, {files} tensor files")
    raw = os.path.join(dump_path, "_raw")
    leftovers = sorted(os.path.relpath(p, dump_path) for p in glob.glob(os.path.join(raw, "rank*", "step*")))
    if leftovers:
        lines.append(f"  unprocessed raw steps: {', '.join(leftovers)}")
    return "\n".join(lines)


def _step_rank_key(folder: str):
    step = os.path.basename(os.path.dirname(folder))[4:]
    return (int(step) if step.isdigit() else -1, folder)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    use_register_path()
    config = load_config(args)
    dump_path = dump_path_of(config)
    callbacks = python_callbacks(config) if args.python_callback else None
    try:
        train(config, args.steps, callbacks)
    finally:
        if os.environ.get("MS_ROLE") != "MS_SCHED":  # msrun's scheduler runs this file up to init()
            rank = _world()[0] if args.parallel else None
            print(describe_dump(dump_path, rank), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
