"""Tiny mcore models (Qwen3, DeepSeek-V3) trained by MindFormers on CPU; also a driver run in a subprocess.

    python tests/support/mcore_models.py train [--initial-weights F] [--ascend-named-tensordump] -- <runner args>
    python tests/support/mcore_models.py check --model qwen3 --dump DIR --weights F --out RESULT.json
    python tests/support/mcore_models.py numerics --model qwen3 --mode pynative --task tensor \
        [--data-mode forward] [--exclude-class FusedRMSNorm]

The models are the YAMLs of ``examples/`` (``tiny_qwen3.yaml``, ``tiny_deepseek3.yaml``: fp32,
dropout 0, 2 layers of width 64, vocab 128, seq 16, batch 2) trained through
``mindformers.Trainer`` by ``examples/run_tiny_llama.py --model ...``, with CellDumpCallback
from the YAML ``callbacks:`` entry. The CPU patches are ``examples/mcore_cpu_patches.py``
and the model builders ``examples/tiny_mcore.py`` (one copy each, shared with the capture
benchmark; ``tests/support/mcore_cpu_patches.py`` loads them).

``train`` adds, for tests only:

* ``--change-weights F``: a callback adds the changes listed in F (JSON) to chosen weight
  elements at ``on_train_begin``, before step 0 runs (a weight changed by a size fixed in advance).
* ``--initial-weights F``: a callback saves the model's parameters at ``on_train_begin``
  (before step 0), so ``check`` can rebuild the model with the weights step 0 ran with.
* ``--ascend-named-tensordump``: ``ops.TensorDump`` is replaced by a stand-in that writes the
  file at once and adds ``_in`` in "in" mode, as TensorDump does on Ascend (on CPU the real op
  ignores the mode), so the layer mapping's modes become visible in the raw file names.

``check`` rebuilds the model in PyNative mode from the same YAML and weights and re-runs
chosen cells on the inputs captured in a processed dump (``step0/rank``): forward outputs by
calling the fresh cell, input gradients by ``mindspore.grad`` of ``sum(output * captured
output gradient)``. It writes one result per checked entry (max abs error and tolerance).

Runs go in subprocesses: MindSpore's execution mode and MindFormers' registries (and its
``use_legacy`` switch) are per process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Dict, List, Optional

from tests.support.mcore_cpu_patches import load_example

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples")
PYTHON = sys.executable
# The models and their builders: examples/tiny_mcore.py (the capture benchmark uses them too).
_tiny_mcore = load_example("tiny_mcore")
MODELS = _tiny_mcore.MODELS
config_path = _tiny_mcore.config_path
build_model = _tiny_mcore.build_model
twin_train_cells = _tiny_mcore.twin_train_cells
token_batches = _tiny_mcore.token_batches


def run_driver(args: List[str], cwd: str, timeout: int = 900, env: Optional[dict] = None):
    """Start this file as a script in ``cwd``; returns the Popen (text output on stdout)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env["PYTHONPATH"] = os.pathsep.join([REPO, full_env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.Popen([PYTHON, os.path.abspath(__file__), *args], cwd=cwd, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# -- train ------------------------------------------------------------------------------------
def _register_weight_saver(path: str) -> None:
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
    from mindspore import save_checkpoint
    from mindspore.train import Callback

    class SaveInitialWeights(Callback):
        """Saves the network's parameters before the first step."""

        def on_train_begin(self, run_context):
            save_checkpoint(run_context.original_args().train_network, path)

    MindFormerRegister.register_cls(SaveInitialWeights, module_type=MindFormerModuleType.CALLBACK)


def _ending_with(by_name: dict, ending: str) -> list:
    """The weights named ``ending`` or ending with it, trying it without its leading parts too (a dump names
    cells from the model the trainer wraps, and a parameter's name may start below or above it)."""
    parts = ending.split(".")
    tails = [".".join(parts[start:]) for start in range(len(parts) - 1)]
    for tail in tails:  # the name itself first: the optimizer's moments (adam_m.NAME) end with it too
        if tail in by_name:
            return [by_name[tail]]
    for tail in tails:
        found = [p for name, p in by_name.items() if name.endswith("." + tail)]
        if found:
            return found
    return []


def _register_weight_changer(path: str) -> None:
    """A callback that adds, before the first step, the changes of ``path`` (JSON: ``[[weight name ending,
    [index...], delta], ...]``) to the network's weights; it fails on a name no weight ends with."""
    import numpy as np
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
    from mindspore import Tensor
    from mindspore.train import Callback

    with open(path, encoding="utf-8") as handle:
        changes = json.load(handle)

    class ChangeWeights(Callback):
        def on_train_begin(self, run_context):
            params = run_context.original_args().train_network.trainable_params()  # not the optimizer's state
            by_name = {p.name: p for p in params}
            for ending, index, delta in changes:
                found = _ending_with(by_name, ending)
                if len(found) != 1:
                    raise RuntimeError(f"weight {ending!r}: {len(found)} weights end with it (of {sorted(by_name)})")
                value = found[0].asnumpy().copy()
                value[tuple(index)] += np.asarray(delta, value.dtype)
                found[0].set_data(Tensor(value))

    MindFormerRegister.register_cls(ChangeWeights, module_type=MindFormerModuleType.CALLBACK)


def train(argv: List[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--initial-weights", default=None)
    parser.add_argument("--change-weights", default=None, help="JSON [[weight name ending, index, delta], ...]")
    parser.add_argument("--ascend-named-tensordump", action="store_true")
    parser.add_argument("runner_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    runner_args = ["--verbose"] + [a for a in args.runner_args if a != "--"]
    sys.path.insert(0, EXAMPLES)
    import run_tiny_llama

    if args.ascend_named_tensordump:
        import mindspore as ms

        from tests.support.tensordump_standin import AscendNamedTensorDump

        ms.ops.TensorDump = AscendNamedTensorDump
    first_callbacks = []
    if args.initial_weights:
        _register_weight_saver(os.path.abspath(args.initial_weights))
        first_callbacks.append({"type": "SaveInitialWeights"})
    if args.change_weights:
        _register_weight_changer(os.path.abspath(args.change_weights))
        first_callbacks.append({"type": "ChangeWeights"})
    if first_callbacks:
        load_config = run_tiny_llama.load_config

        def load_config_with_callbacks(ns):
            config = load_config(ns)
            config.callbacks[:0] = first_callbacks
            return config

        run_tiny_llama.load_config = load_config_with_callbacks
    return run_tiny_llama.main(runner_args)


# -- check ------------------------------------------------------------------------------------
def numerics(argv: List[str]) -> int:
    """Train a network with capture attached and its twin without, alternately; print both losses."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--mode", choices=("pynative", "graph"), required=True)
    parser.add_argument("--task", choices=("tensor", "statistics"), required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--data-mode", default="all")
    parser.add_argument("--exclude-class", action="append", default=[])
    args = parser.parse_args(argv)
    os.environ.setdefault("LOCAL_DEFAULT_PATH", os.path.abspath("mf_output"))
    import mf_celldump

    plain, captured = twin_train_cells(args.model, args.mode)
    dump = mf_celldump.attach(captured, {"dump_path": os.path.abspath("dump"), "task": args.task,
                                         "data_mode": args.data_mode, "exclude_classes": args.exclude_class})
    losses = []
    for step, batch in enumerate(token_batches(args.steps, 2, 16, 128)):
        loss_plain = float(plain(*batch).asnumpy())
        with dump.step(step):
            loss_captured = float(captured(*batch).asnumpy())
        losses.append([loss_plain, loss_captured])
    dump.detach()
    print("LOSSES " + json.dumps(losses), flush=True)
    return 0


class DumpFolder:
    """One processed output folder (``stepN/rank``): entries and their tensors as numpy arrays."""

    def __init__(self, folder: str):
        with open(os.path.join(folder, "dump.json"), encoding="utf-8") as handle:
            self.data = json.load(handle)["data"]
        self.tensors = os.path.join(folder, "dump_tensor_data")

    def entry(self, cell: str, cls: str, direction: str, call: int = 0) -> dict:
        return self.data[f"Cell.{cell}.{cls}.{direction}.{call}"]

    def value(self, node):
        """A dump.json leaf or list as the Python/numpy value it records (lists become tuples)."""
        import numpy as np

        if isinstance(node, list):
            return tuple(self.value(item) for item in node)
        if node is None:
            return None
        if node.get("type") == "mindspore.Tensor":
            return np.load(os.path.join(self.tensors, node["data_name"]), allow_pickle=False)
        return node.get("value")


def _to_ms(value):
    import numpy as np
    from mindspore import Tensor

    if isinstance(value, tuple):
        return tuple(_to_ms(v) for v in value)
    return Tensor(value) if isinstance(value, np.ndarray) else value


def _flat(value) -> list:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


def _compare(results: list, label: str, got, want, rtol: float, atol: float) -> None:
    import numpy as np

    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    ok = got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=atol))
    err = float(np.max(np.abs(got - want))) if got.shape == want.shape and got.size else None
    results.append({"what": label, "ok": ok, "max_abs_err": err, "shape": list(want.shape),
                    "got_shape": list(got.shape), "scale": float(np.max(np.abs(want))) if want.size else 0.0})


def check_cell(network, dump: DumpFolder, cell: str, cls: str, results: list, backward: bool = True,
               call: int = 0, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Re-run ``cell`` on its captured inputs; compare outputs and (``backward``) input gradients."""
    import mindspore as ms
    import numpy as np

    fresh = dict(network.cells_and_names())[cell]
    forward = dump.entry(cell, cls, "forward", call)
    args = [_to_ms(dump.value(a)) for a in forward["input_args"]]
    kwargs = {k: _to_ms(dump.value(v)) for k, v in forward["input_kwargs"].items()}
    out = fresh(*args, **kwargs)
    outs = _flat(out)
    for i, node in enumerate(forward["output"]):
        if isinstance(node, dict) and node.get("type") == "mindspore.Tensor":
            _compare(results, f"{cell} forward output.{i}", outs[i].asnumpy(), dump.value(node), rtol, atol)
    if not backward:
        return
    back = dump.entry(cell, cls, "backward", call)
    douts = [dump.value(node) if isinstance(node, dict) else None for node in back["input_args"]]
    positions = [i for i, node in enumerate(back["output"])
                 if isinstance(node, dict) and node.get("type") == "mindspore.Tensor"
                 and isinstance(args[i], ms.Tensor) and args[i].dtype in (ms.float32, ms.float16)]
    if not positions:
        return

    def weighted(*grad_args):
        call_args = list(args)
        for pos, value in zip(positions, grad_args):
            call_args[pos] = value
        result = _flat(fresh(*call_args, **kwargs))
        total = 0
        for item, dout in zip(result, douts):
            if dout is not None and isinstance(item, ms.Tensor):
                total = total + (item * ms.Tensor(dout)).sum()
        return total

    grads = ms.grad(weighted, grad_position=tuple(range(len(positions))))(*[args[p] for p in positions])
    grads = grads if isinstance(grads, tuple) else (grads,)
    for pos, grad in zip(positions, grads):
        want = dump.value(back["output"][pos])
        _compare(results, f"{cell} backward output.{pos}", grad.asnumpy(), np.asarray(want), rtol, atol)


# Cells re-run per model: (cell name, class, check backward too).
CHECKS: Dict[str, List[tuple]] = {
    "qwen3": [
        ("model.decoder.layers.0.self_attention", "SelfAttention", True),
        ("model.decoder.layers.1.self_attention", "SelfAttention", True),
        ("model.decoder.layers.0.self_attention.core_attention", "FlashAttention", True),
        ("model.decoder.layers.0.mlp", "MLPInterleaved", True),
        ("model.decoder.layers.1.mlp", "MLPInterleaved", True),
        ("model.decoder.layers.1", "TransformerLayer", True),
        ("model.loss", "CrossEntropyLoss", True),
        ("model", "GPTModel", False),
    ],
    "deepseek3": [
        ("model.decoder.layers.0.self_attention", "MLASelfAttentionConcatenated", True),
        ("model.decoder.layers.1.self_attention", "MLASelfAttentionConcatenated", True),
        ("model.decoder.layers.0.mlp", "MLPInterleaved", True),
        ("model.decoder.layers.1.mlp", "MoELayer", True),
        ("model.decoder.layers.1.mlp.experts", "FFNGroupedGEMM", True),
        ("model.decoder.layers.1.mlp.shared_experts", "SharedExpertMLPInterleaved", True),
        ("model.decoder.layers.1.mlp.router", "TopKRouter", False),
        ("model.mtp.layers.0.transformer_layer", "TransformerLayer", True),
        ("model.mtp.layers.0.eh_proj", "SequenceParallelLinear", True),
        ("model.loss", "CrossEntropyLoss", True),
        ("model", "GPTModel", False),
    ],
}


def check(argv: List[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--dump", required=True, help="a processed output folder (stepN/rank)")
    parser.add_argument("--weights", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("LOCAL_DEFAULT_PATH", os.path.abspath("mf_output"))
    network = build_model(args.model, "pynative", args.weights)
    dump = DumpFolder(args.dump)
    results: list = []
    for cell, cls, backward in CHECKS[args.model]:
        try:
            check_cell(network, dump, cell, cls, results, backward=backward)
        except Exception as err:  # reported as a failed check with its reason
            results.append({"what": f"{cell} ({cls})", "ok": False, "error": f"{type(err).__name__}: {err}"})
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"train": train, "check": check, "numerics": numerics}
    if not argv or argv[0] not in commands:
        print(__doc__)
        return 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
