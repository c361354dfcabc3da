"""The MindFormers LLaMA that computes the same function as tests/support/megatron_gpt.py, dumped on CPU.

    python tests/support/megatron_llama.py MEGATRON_DIR OUT --run NAME[:VARIANT[:TASK]] ... [--tool ours|msprobe]

Weights come from ``MEGATRON_DIR/weights.npz`` (written by tests/support/megatron_gpt.py) and are
converted to MindFormers' legacy ``LlamaForCausalLM``: ``linear_qkv`` holds q, k, v
interleaved per query group (``[q of the group's heads, k, v]`` per group) and is split
into ``wq``/``wk``/``wv``; ``linear_fc1`` holds gate then up (``w1``, ``w3``); linear
weights are [out, in] on both sides. The batch is ``MEGATRON_DIR/batch.npz``.

Each ``--run`` is one PyNative training step (forward and backward, SGD with learning
rate 0 so the weights stay) dumped into ``OUT/NAME``:

* ``--tool ours`` (default): through mf_celldump's public API (``attach`` ... ``process``),
  in PyNative or (``--mode graph``) graph mode;
* ``--tool msprobe``: through msprobe's own MindSpore L0 dumper (tests/support/msprobe_dumpers.py).

Variants change our side only: ``clean``; ``perturb`` scales
``model.layers.1.attention.wo.weight`` by 1.05; ``nan`` sets one element of
``model.layers.1.feed_forward.w2.weight`` to NaN; ``w3`` adds -0.17 to one element of
``model.layers.1.feed_forward.w3.weight`` (a change that moves the output's Mean by
percents but its Max, Min and Norm by less than 1e-3); ``rope`` builds the model with
RoPE theta 5000 instead of 10000 (the cause sits in ``apply_rotary_emb``, a cell that
has no Megatron partner). Run in a scratch working directory
(``import mindformers`` creates ``./output``). Prints one JSON line per run with its loss.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from tests.support.megatron_gpt import TinyGPT  # noqa: E402  (no torch import at module level)

PERTURBED = "model.layers.1.attention.wo.weight"
POISONED = "model.layers.1.feed_forward.w2.weight"
NUDGED = "model.layers.1.feed_forward.w3.weight"
NUDGE = (138, 22, -0.17)  # row, column, added value: the output's Mean -2.4%, Norm -6e-6, Max and Min unchanged
VARIANTS = ("clean", "perturb", "nan", "w3", "rope")
ROPE_THETA = {"rope": 5000.0}  # Megatron's rotary base is 10000


def convert(meg: dict, cfg: TinyGPT) -> dict:
    """Megatron state-dict arrays -> MindFormers LLaMA parameter arrays (float32)."""
    import numpy as np

    heads, groups = cfg.num_heads, cfg.num_query_groups
    dim = cfg.hidden_size // heads
    per_group = heads // groups
    out = {
        "model.tok_embeddings.embedding_weight": meg["embedding.word_embeddings.weight"],
        "model.norm_out.weight": meg["decoder.final_layernorm.weight"],
        "lm_head.weight": meg["output_layer.weight"],
    }
    for i in range(cfg.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = meg[src + "self_attention.linear_qkv.weight"].reshape(groups, (per_group + 2) * dim, -1)
        out[dst + "attention.wq.weight"] = qkv[:, : per_group * dim].reshape(heads * dim, -1)
        out[dst + "attention.wk.weight"] = qkv[:, per_group * dim : (per_group + 1) * dim].reshape(
            groups * dim, -1
        )
        out[dst + "attention.wv.weight"] = qkv[:, (per_group + 1) * dim :].reshape(groups * dim, -1)
        out[dst + "attention.wo.weight"] = meg[src + "self_attention.linear_proj.weight"]
        gate, up = np.split(meg[src + "mlp.linear_fc1.weight"], 2, axis=0)
        out[dst + "feed_forward.w1.weight"] = gate
        out[dst + "feed_forward.w3.weight"] = up
        out[dst + "feed_forward.w2.weight"] = meg[src + "mlp.linear_fc2.weight"]
        out[dst + "attention_norm.weight"] = meg[src + "input_layernorm.weight"]
        out[dst + "ffn_norm.weight"] = meg[src + "pre_mlp_layernorm.weight"]
    return {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in out.items()}


def apply_variant(params: dict, variant: str) -> dict:
    import numpy as np

    params = dict(params)
    if variant == "perturb":
        params[PERTURBED] = params[PERTURBED] * np.float32(1.05)
    elif variant == "nan":
        poisoned = params[POISONED].copy()
        poisoned[3, 5] = np.nan
        params[POISONED] = poisoned
    elif variant == "w3":
        nudged = params[NUDGED].copy()
        row, column, value = NUDGE
        nudged[row, column] += np.float32(value)
        params[NUDGED] = nudged
    elif variant not in ("clean", "rope"):
        raise SystemExit(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    return params


def build(cfg: TinyGPT, params: dict, mode: str = "pynative", theta: float = 10000.0):
    """LlamaForCausalLM of the same sizes, on CPU (PyNative or graph mode), with ``params`` loaded;
    plus its train step."""
    import mindspore as ms
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM
    from mindspore import nn

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    config = LlamaConfig(
        batch_size=cfg.batch_size,
        seq_length=cfg.seq_length,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        n_kv_heads=cfg.num_query_groups,
        vocab_size=cfg.vocab_size,
        intermediate_size=cfg.ffn_hidden_size,
        rms_norm_eps=cfg.eps,
        theta=theta,
        use_rope_slice=True,
        fused_rms_norm=False,
        use_flash_attention=False,
        use_past=False,
        compute_dtype="float32",
        layernorm_compute_type="float32",
        softmax_compute_type="float32",
        rotary_dtype="float32",
        param_init_type="float32",
        checkpoint_name_or_path="",
    )
    net = LlamaForCausalLM(config)
    names = {p.name for p in net.get_parameters()}
    missing = sorted(names - set(params)) + sorted(set(params) - names)
    if missing:
        raise SystemExit(f"weight conversion does not match the model: {missing}")
    ms.load_param_into_net(
        net, {name: ms.Parameter(ms.Tensor(value), name=name) for name, value in params.items()}
    )
    net.set_train(True)
    train = nn.TrainOneStepCell(net, nn.SGD(net.trainable_params(), learning_rate=0.0))
    train.set_train(True)
    return net, train


def dump_ours(train, batch, out: str, task: str) -> float:
    import mindspore as ms
    from mindspore.common.api import _pynative_executor

    import mf_celldump

    dump = mf_celldump.attach(
        train,
        {
            "dump_path": out,
            "task": task,
            "steps": "0",
            "layer_mapping": "none",
            "process_on_train_end": False,
        },
    )
    dump.begin_step(0)
    loss = float(train(ms.Tensor(batch)).asnumpy())
    _pynative_executor.sync()
    dump.end_step()
    dump.detach()
    report = mf_celldump.process_captured(dump)
    if not report.ok:
        raise SystemExit(f"processing failed: {report.summary()}")
    return loss


def dump_msprobe(net, train, batch, out: str, task: str) -> float:
    import mindspore as ms

    from tests.support import msprobe_dumpers

    return msprobe_dumpers.dump_mindspore_step(
        net, lambda: float(train(ms.Tensor(batch)).asnumpy()), out, task
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("megatron_dir")
    parser.add_argument("out")
    parser.add_argument("--run", action="append", required=True, metavar="NAME[:VARIANT[:TASK]]")
    parser.add_argument("--tool", choices=("ours", "msprobe"), default="ours")
    parser.add_argument("--mode", choices=("pynative", "graph"), default="pynative",
                        help="execution mode of our runs (msprobe's dumper runs in PyNative only)")
    args = parser.parse_args(argv)
    import mindspore  # noqa: F401  (before msprobe)
    import numpy as np

    cfg = TinyGPT()
    with np.load(os.path.join(args.megatron_dir, "weights.npz")) as meg:
        base = convert({k: meg[k] for k in meg.files}, cfg)
    with np.load(os.path.join(args.megatron_dir, "batch.npz")) as data:
        batch = data["tokens"]
    for spec in args.run:
        name, _, rest = spec.partition(":")
        variant, _, task = rest.partition(":")
        mode = args.mode if args.tool == "ours" else "pynative"
        theta = ROPE_THETA.get(variant, 10000.0)
        net, train = build(cfg, apply_variant(base, variant or "clean"), mode, theta)
        target = os.path.join(args.out, name)
        if args.tool == "ours":
            loss = dump_ours(train, batch, target, task or "tensor")
        else:
            loss = dump_msprobe(net, train, batch, target, task or "tensor")
        print(json.dumps({"run": name, "variant": variant or "clean", "loss": loss}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
