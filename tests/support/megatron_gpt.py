"""A tiny Megatron-core GPTModel on CPU, the PyTorch baseline of the cross-framework tests.

    python tests/support/megatron_gpt.py OUT [--task tensor|statistics]

builds the model (LLaMA-shaped: RMSNorm, RoPE, SwiGLU, no biases, untied output layer,
fp32, dropout 0), runs one forward and backward step on a fixed batch under msprobe's
own PyTorch dumper (level L0) and writes into OUT:

* ``weights.npz``: every parameter, by Megatron's state-dict name;
* ``batch.npz``: ``tokens`` [batch, seq + 1] (inputs are ``[:, :-1]``, labels ``[:, 1:]``);
* ``dump/step0/rank/...``: msprobe's PyTorch dump;
* ``result.json``: the loss.

CPU-only remedies (test side only, none changes results with dropout 0; see
shared/reference/cross-framework-facts.md): ``torch.cuda.current_device`` returns the
CPU device (RoPE moves ``inv_freq`` there), the CUDA RNG tracker's ``fork()`` is a no-op
context, and the causal mask is passed explicitly (the default one is made on cuda).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class TinyGPT:
    """Sizes shared by the Megatron model and the MindFormers LLaMA converted from it."""

    num_layers: int = 2
    hidden_size: int = 64
    num_heads: int = 4
    num_query_groups: int = 4
    ffn_hidden_size: int = 176  # what MindFormers' LLaMA derives from hidden 64, multiple_of 16
    vocab_size: int = 128
    seq_length: int = 16
    batch_size: int = 2
    eps: float = 1e-5
    seed: int = 1234


def tokens(cfg: TinyGPT):
    """The fixed batch: token ids in [1, vocab) (0 is LLaMA's pad id, masked out of its loss)."""
    import numpy as np

    rng = np.random.default_rng(cfg.seed)
    return rng.integers(1, cfg.vocab_size, size=(cfg.batch_size, cfg.seq_length + 1)).astype(np.int32)


class _NoFork:
    """Stands in for Megatron's CUDA RNG tracker: dropout is 0, so forking RNG states changes nothing."""

    def fork(self, *args, **kwargs):
        return contextlib.nullcontext()

    def __getattr__(self, name):
        raise AttributeError(name)


def apply_cpu_remedies() -> None:
    """The three CPU obstacles of megatron-core 0.16.1, each replaced in this process only."""
    import torch
    from megatron.core import tensor_parallel
    from megatron.core.transformer import attention, dot_product_attention

    torch.cuda.current_device = lambda: torch.device("cpu")
    tracker = _NoFork()
    tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: tracker
    for module in (dot_product_attention, attention):
        if hasattr(module, "get_cuda_rng_tracker"):
            module.get_cuda_rng_tracker = tensor_parallel.get_cuda_rng_tracker


def init_parallel() -> None:
    """World size 1 on gloo; tensor and pipeline parallel 1."""
    import torch
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():  # an in-process store: no port to collide with other jobs
        store = torch.distributed.HashStore()
        torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def build_model(cfg: TinyGPT):
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed  # noqa: F401
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(cfg.seed)
    config = TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_heads,
        num_query_groups=cfg.num_query_groups,
        ffn_hidden_size=cfg.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=cfg.eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        init_method_std=0.05,
    )
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=cfg.vocab_size,
        max_sequence_length=cfg.seq_length,
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )
    return model.float()


def weights(model) -> dict:
    return {
        name: value.detach().cpu().numpy().copy()
        for name, value in model.state_dict().items()
        if value is not None and hasattr(value, "numpy") and "_extra_state" not in name
    }


def step(model, cfg: TinyGPT, batch):
    """Forward with labels (per-token loss), mean, backward. Returns the loss as a float."""
    import torch

    ids = torch.from_numpy(batch[:, :-1].astype("int64"))
    labels = torch.from_numpy(batch[:, 1:].astype("int64"))
    seq = ids.shape[1]
    position_ids = torch.arange(seq).unsqueeze(0).expand_as(ids)
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1).view(1, 1, seq, seq)
    mask = mask.expand(ids.shape[0], 1, seq, seq)
    loss = model(ids, position_ids, mask, labels=labels).float().mean()
    loss.backward()
    return float(loss.detach())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out")
    parser.add_argument("--task", choices=("tensor", "statistics"), default="tensor")
    args = parser.parse_args(argv)
    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from tests.support import msprobe_dumpers

    cfg = TinyGPT()
    apply_cpu_remedies()
    init_parallel()
    model = build_model(cfg)
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, "weights.npz"), **weights(model))
    batch = tokens(cfg)
    np.savez(os.path.join(args.out, "batch.npz"), tokens=batch)
    model.train()
    dump = os.path.join(args.out, "dump")
    loss = msprobe_dumpers.dump_torch_step(model, lambda: step(model, cfg, batch), dump, task=args.task)
    with open(os.path.join(args.out, "result.json"), "w", encoding="utf-8") as handle:
        json.dump({"loss": loss, "config": asdict(cfg)}, handle)
    print(json.dumps({"loss": loss}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
