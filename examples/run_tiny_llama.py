"""Train a tiny MindFormers 1.9 model on CPU and dump it with mf_celldump.

``--model llama`` (default) trains the legacy LLaMA of ``tiny_llama.yaml``; ``--model qwen3``
and ``--model deepseek3`` the mcore Qwen3 and DeepSeek-V3 (MLA, MoE with a shared expert,
MTP) of ``tiny_qwen3.yaml`` / ``tiny_deepseek3.yaml``, with the CPU patches of
``mcore_cpu_patches.py``. It does what ``run_mindformer.py --config <that YAML> --register_path DIR`` does
(``DIR`` = ``mf-celldump register-path``), plus what a CPU needs: synthetic MindRecord
data and the CPU-only workarounds of ``cpu_workarounds.py``. MindFormers' and
MindSpore's own output goes to ``<output-dir>/run_tiny_llama.log`` (``--verbose`` shows
it instead); the terminal shows one line per training step, then where the processed
dump is and what is in it. MindFormers' caches (``output/log``, the ``modules/`` of
``auto_register``) go under ``<output-dir>`` too, not into the working directory.

    python examples/run_tiny_llama.py --mode pynative --output-dir /tmp/tiny
    python examples/run_tiny_llama.py --mode graph --dump steps=1 --dump task=tensor
    python examples/run_tiny_llama.py --model qwen3 --mode graph --dump steps=0,2

Two ranks, data parallel, on one CPU host: ``examples/distributed/run_2ranks.sh``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import shutil
import sys
from typing import List, Optional

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_CONFIGS = {
    "llama": os.path.join(HERE, "tiny_llama.yaml"),
    "qwen3": os.path.join(HERE, "tiny_qwen3.yaml"),
    "deepseek3": os.path.join(HERE, "tiny_deepseek3.yaml"),
}
MODEL_TITLES = {"llama": "LLaMA", "qwen3": "Qwen3 (mcore)", "deepseek3": "DeepSeek-V3 (mcore)"}


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=tuple(MODEL_CONFIGS), default="llama",
                        help="which tiny model: its YAML in examples/ (default llama)")
    parser.add_argument("--config", default=None,
                        help="MindFormers run config (YAML); default: the --model's YAML in examples/")
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
    parser.add_argument("--set", action="append", default=[], metavar="DOTTED.KEY=VALUE", dest="settings",
                        help="set a key of the run config (YAML value), e.g. context.jit_config.jit_level=O1")
    parser.add_argument("--python-callback", action="store_true",
                        help="build CellDumpCallback in Python from the YAML entry and pass it as "
                             "Trainer(callbacks=[...]) instead of letting MindFormers build it")
    parser.add_argument("--verbose", action="store_true",
                        help="show MindFormers' and MindSpore's own output here instead of in the log file")
    args = parser.parse_args(argv)
    if args.config is None:
        args.config = MODEL_CONFIGS[args.model]
    return args


# -- data -----------------------------------------------------------------------------
def make_data(path: str, samples: int, seq_length: int, vocab_size: int, seed: int = 0,
              with_labels: bool = False) -> str:
    """Write a synthetic token MindRecord (deterministic, so every rank writes the same data).

    Legacy models take ``seq_length + 1`` tokens and shift them themselves; mcore models
    (``with_labels``) take ``input_ids`` and ``labels`` of ``seq_length`` each."""
    import numpy as np
    from mindspore.mindrecord import FileWriter

    os.makedirs(os.path.dirname(path), exist_ok=True)
    writer = FileWriter(path, shard_num=1, overwrite=True)
    schema = {"input_ids": {"type": "int32", "shape": [-1]}}
    if with_labels:
        schema["labels"] = {"type": "int32", "shape": [-1]}
    writer.add_schema(schema, "tiny_model")
    rng = np.random.default_rng(seed)
    tokens = [rng.integers(1, vocab_size, size=(seq_length + 1,)).astype(np.int32) for _ in range(samples)]
    if with_labels:
        rows = [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]
    else:
        rows = [{"input_ids": t} for t in tokens]
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
    raise SystemExit("the run config has no `type: CellDumpCallback` entry in `callbacks:`")


def _selected_steps(config):
    """The steps the CellDumpCallback entry selects (None: every step), read as the callback reads the
    entry, so every value the callback takes is taken here (``anomaly`` selects none before training)."""
    from mf_celldump.config import DumpConfig

    keys = {k: v for k, v in _celldump_entry(config).items() if k not in ("type", "auto_register")}
    steps = DumpConfig.from_dict(keys, source="CellDumpCallback").steps
    return None if steps.spans is None else steps


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
    for item in args.settings:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected DOTTED.KEY=VALUE")
        *parents, last = key.strip().split(".")
        node = config
        for name in parents:  # a missing level is created (e.g. context.jit_config in the CPU config)
            if name not in node:
                node[name] = type(config)()
            node = node[name]
        node[last] = yaml.safe_load(value)
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
    data = os.path.join(config.output_dir, "data", f"rank{rank}", "tiny_model.mindrecord")
    make_data(data, steps * config.runner_config.batch_size * world, config.model.model_config.seq_length,
              config.model.model_config.vocab_size, with_labels=is_mcore(config))
    config.train_dataset.data_loader.dataset_dir = data
    config.train_dataset_task.dataset_config.data_loader.dataset_dir = data
    return data


def is_mcore(config) -> bool:
    """Whether the config builds an mcore model (``use_legacy: False``)."""
    return config.get("use_legacy", True) is False


def dump_path_of(config) -> str:
    entry = _celldump_entry(config)
    return os.path.abspath(entry.get("dump_path") or os.path.join(config.output_dir, "celldump"))


# -- run ------------------------------------------------------------------------------
def use_register_path() -> str:
    """What ``run_mindformer.py --register_path $(mf-celldump register-path)`` does."""
    from mf_celldump.integrations.registration import registration_dir

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
    if is_mcore(config):
        import mcore_cpu_patches

        mcore_cpu_patches.apply("graph" if config.context.mode == 0 else "pynative")
    prepare_data(config, steps)
    Trainer(config, callbacks=callbacks).train()


def keep_caches_in(output_dir: str) -> None:
    """MindFormers writes ``./output/log`` and the ``modules/`` cache of ``auto_register`` into the
    working directory; point both at ``output_dir`` (before MindFormers is imported)."""
    os.environ.setdefault("LOCAL_DEFAULT_PATH", output_dir)  # mindformers/tools/logger.py, tools/utils.py
    os.environ.setdefault("OM_MODULES_CACHE", os.path.join(output_dir, "modules"))  # tools/hub/hub.py


def describe_dump(dump_path: str, rank: Optional[int] = None) -> str:
    """Where the processed dump is and what is in it: per output folder, entries and files."""
    lines = [f"dump: {dump_path}"]
    pattern = os.path.join(dump_path, "step*", "rank*" if rank is None else f"rank{rank}")
    folders = sorted(glob.glob(pattern)) + ([] if rank is None else
                                            sorted(glob.glob(os.path.join(dump_path, "step*", "rank"))))
    if not folders:
        lines.append("  no processed step folders")
    for folder in sorted(folders, key=_step_rank_key):
        entries, tensors, values = _folder_counts(folder)
        tensor_dir = os.path.join(folder, "dump_tensor_data")
        files = len(os.listdir(tensor_dir)) if os.path.isdir(tensor_dir) else 0
        where = f"{files} tensor files in dump_tensor_data/" if os.path.isdir(tensor_dir) else "statistics only"
        lines.append(f"  {os.path.relpath(folder, dump_path)}: {entries} entries (cell calls, forward and "
                     f"backward, and weight gradients), {tensors} tensors ({where}), {values} non-tensor "
                     f"value{'' if values == 1 else 's'}")
    raw = os.path.join(dump_path, "_raw")
    mine = "rank*" if rank is None else f"rank{rank}"  # another rank's step may still be processing
    leftovers = sorted(os.path.relpath(p, dump_path) for p in glob.glob(os.path.join(raw, mine, "step*")))
    if leftovers:
        lines.append(f"  unprocessed raw steps: {', '.join(leftovers)} (`mf-celldump process {dump_path}`)")
    return "\n".join(lines)


def _folder_counts(folder: str):
    """(entries, tensor leaves, other leaves) of one output folder's dump.json: what processing's log calls its
    tensors and non-tensor values."""
    try:
        with open(os.path.join(folder, "dump.json"), encoding="utf-8") as handle:
            data = json.load(handle).get("data", {})
    except (OSError, ValueError):
        return 0, 0, 0
    counts = {"tensor": 0, "value": 0}

    def walk(node) -> None:  # None and null count as non-tensor values, as the processing log counts them
        if isinstance(node, dict) and "type" in node:
            counts["tensor" if node["type"] == "mindspore.Tensor" else "value"] += 1
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif node is None:
            counts["value"] += 1

    walk(list(data.values()))
    return len(data), counts["tensor"], counts["value"]


def _step_rank_key(folder: str):
    step = os.path.basename(os.path.dirname(folder))[4:]
    return (int(step) if step.isdigit() else -1, folder)


def _announce(console, config, args, dump_path: str) -> None:
    import mindformers

    entry = _celldump_entry(config)
    title = MODEL_TITLES.get(args.model, args.model)
    console.say(f"Training a tiny {title} with MindFormers {mindformers.__version__} on CPU ({args.mode} mode), "
                f"{args.steps} steps per epoch; CellDumpCallback: task={entry.get('task', 'statistics')}, "
                f"steps={entry.get('steps', 'all')}")
    if console.log_path:
        console.say(f"MindFormers' and MindSpore's own output: {console.log_path}")
    console.say(f"dump folder: {dump_path}")


def _closing(console, dump_path: str, rank: Optional[int], failed: Optional[BaseException],
             end_note: Optional[str] = None, second_run: Optional[List[str]] = None) -> None:
    """The closing lines: what failed, what is in the dump, then one hint. ``end_note`` (``ending_note``: the
    selected steps the run never reached, or no watch rule fired) is the last line, and then no hint at
    ``process``, which cannot make those steps."""
    if failed is not None:
        console.say(f"training FAILED: {type(failed).__name__}: {failed}")
        if type(failed).__name__ == "DumpInUseError":
            console.say(_rerun_refused(dump_path, "or output_dir" not in str(failed)))
        if console.log_path:
            console.say(f"(its traceback, and MindFormers' own output, are in {console.log_path})")
    console.say(describe_dump(dump_path, rank))
    processed = _processed_steps(dump_path)
    if failed is None and rank is None and (processed or end_note is None):
        console.say(_compare_hint(dump_path, second_run))
    if end_note:
        console.say(end_note)


def _rerun_refused(dump_path: str, dump_path_set: bool) -> str:
    """The way out of a second run into the folder of a first, in this example's own flags (``dump_path_set``:
    the entry names the folder, so another --output-dir would not move it)."""
    flag = "--dump dump_path=DIR" if dump_path_set else "--output-dir (or --dump dump_path=DIR)"
    return (f"  {dump_path} holds an earlier run's dump, and a second run never mixes with it: give another "
            f"{flag}, or delete that folder first")


def _processed_steps(dump_path: str) -> List[str]:
    """The step folders of ``dump_path`` that hold a processed rank folder, in step order."""
    return sorted((folder for folder in glob.glob(os.path.join(dump_path, "step*"))
                   if glob.glob(os.path.join(folder, "rank*", "dump.json"))),
                  key=lambda folder: _step_rank_key(os.path.join(folder, "rank")))


def celldump_command() -> str:
    """The ``mf-celldump`` command as it runs in the user's shell once this one's PATH is gone: the script
    installed beside this Python, by its absolute path, else this Python's ``-m mf_celldump``."""
    script = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "mf-celldump")
    if os.access(script, os.X_OK):
        return shlex.quote(script)
    return f"{shlex.quote(sys.executable)} -m mf_celldump"


def second_run_arguments(argv: List[str], output_dir: str, seed: int, dump_path: Optional[str]) -> List[str]:
    """This run's arguments for a second run that differs by its seed (so its initial weights differ), into
    folders of its own: ``--output-dir`` gets a suffix, and so does ``dump_path`` where the entry sets one."""
    suffix = f"-seed{seed + 1}"
    out: List[str] = []
    skip = False
    for i, item in enumerate(argv):
        if skip:
            skip = False
            continue
        if item == "--output-dir" or item.startswith("--output-dir="):
            skip = item == "--output-dir"
            continue
        follows = argv[i - 1] if i > 0 else ""
        if (follows == "--set" and item.startswith("seed=")) or (follows == "--dump" and item.startswith("dump_path=")):
            out.pop()
            continue
        out.append(item)
    out += ["--output-dir", output_dir.rstrip(os.sep) + suffix, "--set", f"seed={seed + 1}"]
    return out + (["--dump", f"dump_path={dump_path}{suffix}"] if dump_path else [])


def _compare_hint(dump_path: str, second_run: Optional[List[str]] = None) -> str:
    """How to compare this dump with another run's, every step both hold, by a command that runs as printed
    in the user's shell; with ``second_run`` (this script's arguments for a run that differs) how to make
    that run first. msprobe's own command is offered only where it is installed."""
    steps = _processed_steps(dump_path)
    tool = celldump_command()
    if not steps:
        return (f"nothing processed yet: `{tool} process {dump_path}` makes the step folders; then compare "
                f"two runs with {tool} compare <other run's dump> {dump_path} -o compare_out")
    if second_run is None:
        hint = f"compare two runs (every step): {tool} compare <other run's dump> {dump_path} -o compare_out"
    else:
        script = " ".join(shlex.quote(a) for a in [sys.executable, os.path.abspath(__file__)] + second_run)
        other = _dump_path_of_arguments(second_run)
        hint = ("compare two runs, every step: make a second one that differs (another seed: other initial "
                f"weights), then compare the two dumps:\n  {script}\n  {tool} compare {shlex.quote(other)} "
                f"{shlex.quote(dump_path)} -o compare_out")
    if shutil.which("msprobe"):
        step = os.path.basename(steps[0])
        hint += (f"\n  (or msprobe's, one step at a time: msprobe compare -tp <other run's dump>/{step} "
                 f"-gp {dump_path}/{step} -o compare_out)")
    return hint


def _dump_path_of_arguments(argv: List[str]) -> str:
    """The dump folder a run with these arguments writes (``--dump dump_path=`` or ``<--output-dir>/celldump``)."""
    args = parse_args(argv)
    for item in args.dump:
        key, _, value = item.partition("=")
        if key.strip() == "dump_path" and value:
            return os.path.abspath(str(yaml.safe_load(value)))
    return os.path.join(os.path.abspath(args.output_dir), "celldump")


def ending_note(selected, progress, dump_path: str) -> Optional[str]:
    """What a run that ended normally did not capture, and why: selected steps after the last step it reached,
    or, with ``steps: anomaly``, no rule that fired (None when neither)."""
    if selected is None or progress is None:
        return None
    if selected.on_anomaly:
        if any(glob.glob(os.path.join(dump_path, *parts)) for parts in (("step*", "rank*"), ("_raw", "*", "step*"))):
            return None
        return "steps=anomaly: no watch rule fired, so no step was captured (the rules: docs/watch.md)"
    unreached = selected.from_value(progress.last_step + 1, 6)
    if not unreached:
        return None
    shown = ",".join(str(step) for step in unreached[:5]) + (",..." if len(unreached) > 5 else "")
    return (f"selected step{'s' if len(unreached) > 1 else ''} {shown} never reached: the run ended after step "
            f"{progress.last_step} (more --steps or --epochs reach {'them' if len(unreached) > 1 else 'it'})")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    output_dir = os.path.abspath(args.output_dir)
    os.makedirs(output_dir, exist_ok=True)
    keep_caches_in(output_dir)
    under_msrun = "MS_ROLE" in os.environ  # msrun keeps each worker's output in its own log already
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    from console import Console, step_progress_callback

    console = Console.plain() if args.verbose or under_msrun else \
        Console.to_log(os.path.join(output_dir, "run_tiny_llama.log"))
    failed: Optional[BaseException] = None
    dump_path: Optional[str] = None
    selected, progress, second_run = None, None, None
    try:
        use_register_path()
        config = load_config(args)
        dump_path = dump_path_of(config)
        _announce(console, config, args, dump_path)
        entry = _celldump_entry(config)
        own_dump_path = dump_path if entry.get("dump_path") else None
        second_run = second_run_arguments(sys.argv[1:] if argv is None else list(argv), output_dir,
                                          int(config.get("seed", 0) or 0), own_dump_path)
        selected = _selected_steps(config)  # before python_callbacks() takes the entry out of the config
        processed = entry.get("process_on_train_end", True) is not False
        callbacks = python_callbacks(config) if args.python_callback else []
        total = args.steps * int(config.runner_config.epochs or 1)
        progress = step_progress_callback(console, total, dump_path, selected, processed)
        callbacks.append(progress)
        train(config, args.steps, callbacks)
    except Exception as err:  # reported below; --verbose shows the traceback
        failed = err
        if args.verbose or under_msrun:
            raise
        import traceback

        traceback.print_exc()  # into the log file
    finally:
        console.restore()
        if os.environ.get("MS_ROLE") != "MS_SCHED" and dump_path is not None:
            _closing(console, dump_path, _world()[0] if args.parallel else None, failed,
                     ending_note(selected, progress, dump_path) if failed is None else None, second_run)
    return 1 if failed is not None else 0


if __name__ == "__main__":
    sys.exit(main())
