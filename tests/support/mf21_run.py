"""Train a tiny Qwen3 with MindFormers 2.1's PyNative trainer and a ``CellDumpCallback`` (a subprocess of
``tests/test_mindformers2_trainer.py``; needs MindFormers 2.1 beside MindSpore 2.10, see ``mf21.py``).

``python -m tests.support.mf21_run WORKDIR --route python|yaml [--steps N] [--dump KEY=JSON ...]
[--fail-at-step K] [--nan-at-step K] [--output-dir-key] [--accumulate N] [--checkpoint-every N] [--resume]``
runs in WORKDIR and prints one ``RESULT`` line
(JSON: the callback's summary, the losses and skipped steps the trainer logged, the last global step).
``--route yaml`` builds the callback from the run config's ``callbacks:`` (``auto_register``, with
``REGISTER_PATH`` set as ``run_mindformer.py --register_path`` does); ``--fail-at-step`` raises in a
callback at that step's begin (as a data error would, inside the loop); ``--nan-at-step`` makes the
step's loss infinite (its embedding weight, restored at the step's end), with
``training.use_skip_step_on_nan``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _arguments(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("--route", choices=("python", "yaml"), default="python")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--dump", action="append", default=[], help="KEY=JSON, a CellDumpCallback keyword")
    parser.add_argument("--fail-at-step", type=int, default=None)
    parser.add_argument("--nan-at-step", type=int, default=None)
    parser.add_argument("--output-dir-key", action="store_true", help="the config carries output_dir: (2.1 ignores it)")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per step (global batch / local)")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="save a checkpoint to ./ckpt every N steps")
    parser.add_argument("--resume", action="store_true", help="load ./ckpt (2.1 resumes its global_step)")
    return parser.parse_args(argv)


def _keys(pairs):
    keys = {"layer_mapping": None}
    for pair in pairs:
        key, _, value = pair.partition("=")
        keys[key] = json.loads(value)
    return keys


class _Events:
    """A 2.1 ``TrainerCallback`` after ours: records what the trainer did, injects the failures asked for."""

    def __init__(self, options):
        from mindformers.pynative.callback import TrainerCallback

        self.options, self.losses, self.last_step = options, [], None
        self.poisoned = None
        base = TrainerCallback
        events = self

        class Events(base):
            def on_step_begin(self, args, state, **kwargs):
                step = state.global_step
                if events.options.fail_at_step == step:
                    raise RuntimeError(f"injected data failure at step {step}")
                if events.options.nan_at_step == step:
                    events.poison(kwargs["model"][0])

            def on_step_end(self, args, state, **kwargs):
                events.losses.append(float(kwargs["loss"]))
                events.last_step = state.global_step
                events.restore()

        self.callback = Events()

    def poison(self, model):
        import numpy as np

        weight = model.model.embedding.word_embeddings.weight
        self.poisoned = (weight, weight.asnumpy().copy())
        weight.set_data(type(weight)(np.full(weight.shape, np.inf, np.float32)))

    def restore(self):
        if self.poisoned is not None:
            import mindspore as ms

            weight, value = self.poisoned
            weight.set_data(ms.Tensor(value))
            self.poisoned = None


def _yaml_config(path, config, keys):
    import yaml

    config = dict(config, callbacks=[dict({"type": "CellDumpCallback",
                                           "auto_register": "celldump_callback.CellDumpCallback"}, **keys)])
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)
    return path


def main(argv=None) -> int:
    options = _arguments(argv)
    os.chdir(options.workdir)
    sys.path.insert(0, REPO)
    from tests.support import mf21

    mf21.setup()
    from mindformers.pynative.trainer import Trainer

    training = {"use_skip_step_on_nan": True} if options.nan_at_step is not None else {}
    if options.accumulate > 1:
        training["global_batch_size"] = 2 * options.accumulate  # local batch 2: accumulation in 2.1's Python loop
    config = mf21.tiny_qwen3_config(steps=options.steps, **training)
    if options.output_dir_key:
        config["output_dir"] = "./output_dir_key"
    if options.checkpoint_every or options.resume:
        config["checkpoint"] = {"enable_save": bool(options.checkpoint_every), "save_path": "./ckpt",
                                "save_interleaved_steps": options.checkpoint_every or 1,
                                "load_path": "./ckpt" if options.resume else ""}
    keys = _keys(options.dump)
    events = _Events(options)
    if options.route == "yaml":
        from mf_celldump.integrations.registration import registration_dir

        os.environ["REGISTER_PATH"] = registration_dir()
        trainer = Trainer(_yaml_config("run.yaml", config, keys), train_dataset=mf21.token_dataset())
        trainer.callback_handler.callbacks.append(events.callback)
        dump = next(c for c in trainer.callback_handler.callbacks if type(c).__name__ == "CellDumpCallback")
    else:
        from mf_celldump import CellDumpCallback

        dump = CellDumpCallback(**keys)
        trainer = Trainer(config, train_dataset=mf21.token_dataset(), callbacks=[dump, events.callback])
    try:
        trainer.train()
    finally:
        summary = dump.summary
        print("RESULT " + json.dumps({
            "captured": summary.captured_steps, "processed": sorted(summary.processed_steps),
            "dump_path": summary.dump_path or (dump.dump.dump_path if dump.dump is not None else None),
            "notes": summary.notes, "problems": summary.problems, "losses": events.losses,
            "last_step": events.last_step, "skipped_steps": trainer.state.skipped_steps,
            "max_steps": trainer.state.max_steps}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
