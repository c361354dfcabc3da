"""CPU-only patches that let MindFormers 1.9's mcore models (Qwen3, DeepSeek-V3) train on a CPU.

They belong to the examples and the tests, never to mf_celldump itself (the tests import
this file; there is one copy). ``apply(mode)`` must run after MindFormers' context is
built with ``use_legacy: False`` and before the model is built: several patches replace a
symbol a cell's ``__init__`` reads (an operator class, a method a ``Morph`` wraps).

Each patch replaces one symbol in this process; nothing installed is edited. Every patch
is idempotent (a second ``apply`` changes nothing) and says which CPU limitation of
MindSpore 2.9 / MindFormers 1.9 it works around. P = needed in PyNative, G = in Graph
mode. The replacements compute the same function in fp32; Ascend runs the fused kernels
(and bf16), so numbers differ from an NPU run, not between our two modes.

Configuration switches that go with them (in ``tiny_qwen3.yaml`` / ``tiny_deepseek3.yaml``):
``compute_dtype: float32`` (bf16 Reshape/Sub have no CPU kernel), ``hidden_dropout: 0``
(``DropoutExt`` has no CPU kernel), ``mtp_loss_scaling_factor`` set for DeepSeek-V3 (None
fails in ``multi_token_prediction.py`` on any device), ``monitor_config: {monitor_on:
False}`` (``base_trainer.py`` fails on None), and ``architectures: [Training...]``, which
``register_training_classes`` makes resolvable.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

_MARK = "_mf_celldump_cpu_patch"


def _already(owner, name) -> bool:
    return getattr(getattr(owner, name, None), _MARK, False)


def _set(owner, name, value) -> None:
    """Replace ``owner.name`` with ``value`` once (a marked value is never wrapped again)."""
    if _already(owner, name):
        return
    try:
        setattr(value, _MARK, True)
    except AttributeError:  # bound builtins; classes and functions accept attributes
        pass
    setattr(owner, name, value)


# -- 4. registry: PyNative resolves Qwen3ForCausalLM to mindformers.pynative (None here) ------------
def register_training_classes() -> None:
    """(P, G) ``Qwen3ForCausalLM.__new__`` returns ``PyNativeQwen3ForCausalLM`` in PyNative, which is
    None without the ``hyper_parallel`` package (same for DeepSeek-V3). Registering the training-graph
    classes under their own names lets ``model_config.architectures`` name them in both modes."""
    from mindformers.models.deepseek3.modeling_deepseek_v3_train import TrainingDeepseekV3ForCausalLM
    from mindformers.models.qwen3.modeling_qwen3_train import TrainingQwen3ForCausalLM
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

    for cls in (TrainingQwen3ForCausalLM, TrainingDeepseekV3ForCausalLM):
        MindFormerRegister.register_cls(cls, module_type=MindFormerModuleType.MODELS, legacy=False)


# -- 5. Morph in PyNative ---------------------------------------------------------------------------
def _morph_call(self, *args):
    """Run the wrapped function eagerly: the same operations Graph mode expands ``Morph`` into."""
    return self.__morph_fn__(*args)


# -- 6. FusedRMSNorm ----------------------------------------------------------------------------------
def _rms_norm_construct(self, x):
    """x * rsqrt(mean(x^2) + eps) * w in the layernorm compute dtype (P.RmsNorm has no CPU kernel)."""
    original_type = x.dtype
    x = ops.cast(x, self.compute_type)
    variance = ops.mean(ops.square(x), -1, True)
    output = x * ops.rsqrt(variance + self.eps) * ops.cast(self.weight, self.compute_type)
    return ops.cast(output, original_type)


# -- 7. FlashAttention ----------------------------------------------------------------------------------
def _attention_init(original_init):
    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        # The softmax scale FlashAttentionScore was built with, kept as a plain float (a graph constant).
        self.cpu_softmax_scale = float(self.flash_attention.scale_value)
    return __init__


def _attention_construct(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                         packed_seq_params=None, alibi_mask=None, prefix=None, padding_mask=None,
                         actual_seq_qlen=None, actual_seq_kvlen=None):
    """Masked softmax(Q K^T * scale) V in fp32 for the (S, B, N, D) layout, with GQA head repetition.

    ``FlashAttentionScore`` has no CPU kernel and ``use_flash_attention: False`` does not avoid it.
    The mask carries 1 where a position is masked out (as for FlashAttentionScore)."""
    dtype = query.dtype
    q = ops.transpose(ops.cast(query, ms.float32), (1, 2, 0, 3))  # (B, N, S, D)
    k = ops.transpose(ops.cast(key, ms.float32), (1, 2, 0, 3))
    v = ops.transpose(ops.cast(value, ms.float32), (1, 2, 0, 3))
    n_rep = q.shape[1] // k.shape[1]
    if n_rep > 1:
        k = ops.repeat_interleave(k, n_rep, 1)
        v = ops.repeat_interleave(v, n_rep, 1)
    scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * self.cpu_softmax_scale
    if attention_mask is not None:
        scores = scores + ops.cast(attention_mask, ms.float32) * -1.0e9
    probs = ops.softmax(scores, -1)
    context = ops.matmul(probs, v)  # (B, N, S, Dv)
    s, b = context.shape[2], context.shape[0]
    context = ops.reshape(ops.transpose(context, (2, 0, 1, 3)), (s, b, -1))
    return ops.cast(context, dtype)


# -- 8. Outer in rotary_pos_embedding.py ----------------------------------------------------------------
class _CpuOuter(nn.Cell):
    """outer(x, y) as reshape x reshape (the ``Outer`` primitive has no CPU kernel). Exact.

    The leading underscore keeps this stand-in out of dumps (mf_celldump skips such classes)."""

    def construct(self, x, y):
        return ops.reshape(x, (-1, 1)) * ops.reshape(y, (1, -1))


# -- 9. VocabParallelEmbedding ------------------------------------------------------------------------
def _embedding_func(self, input_, weight):
    """Gather rows (no TP, no sequence parallel on one CPU). P fails on the Embedding kernel, G on
    EmbeddingDenseBackward; ``ops.gather`` has both on CPU."""
    bs, seq_len = input_.shape
    hidden = weight.shape[1]
    output = ops.gather(weight, ops.reshape(input_, (bs * seq_len,)), 0)
    return ops.reshape(output, (bs, seq_len, hidden))


# -- 11. router TopkExt ---------------------------------------------------------------------------------
def _topk():
    """``TopkExt`` has no CPU kernel (P, G); ``ops.TopK(sorted=True)`` takes the same (x, k)."""
    return ops.TopK(sorted=True)


# -- 12. FFNGroupedGEMM -----------------------------------------------------------------------------------
def _dense_experts_forward(self, tokens, probs, routing_map, w1, w2, num_tokens_per_expert=None):
    """Every expert on every token (SwiGLU), weighted by the routing probabilities of the chosen ones.

    The token dispatcher fails on CPU (``SortExt`` in P, ``CumsumExt`` in G; ``GroupedMatmul``,
    ``Swiglu`` and ``AlltoAll`` further on). Same result as dispatch + grouped GEMM + combine."""
    hidden = self.hidden_size
    ffn = self.moe_ffn_hidden_size
    experts = self.num_local_experts
    w1 = ops.reshape(w1, (experts, hidden, ffn * 2))
    w2 = ops.reshape(w2, (experts, ffn, hidden))
    x = ops.reshape(tokens, (1, -1, hidden))
    x = ops.tile(x, (experts, 1, 1))  # (E, T, h)
    fc1 = ops.bmm(x, w1)  # (E, T, 2F)
    gate = fc1[:, :, :ffn]
    up = fc1[:, :, ffn:]
    act = gate * ops.sigmoid(gate) * up
    out = ops.bmm(act, w2)  # (E, T, h)
    k = routing_map.shape[-1]
    index = ops.reshape(ops.cast(routing_map, ms.int32), (-1, k))
    one_hot = ops.OneHot()(index, experts, ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32))  # (T,k,E)
    weights = (one_hot * ops.reshape(ops.cast(probs, ms.float32), (-1, k, 1))).sum(1)  # (T, E)
    weights = ops.expand_dims(ops.transpose(ops.cast(weights, out.dtype), (1, 0)), -1)  # (E, T, 1)
    combined = (out * weights).sum(0)
    return ops.reshape(combined, tokens.shape)


# -- 13. shared experts in PyNative ------------------------------------------------------------------------
def _shared_experts_construct(cls):
    def construct(self, hidden_states):
        """``MLP.construct`` returns three values that shared_experts.py unpacks into two (P only)."""
        outputs = super(cls, self).construct(hidden_states)
        shared_experts_output, output_bias = outputs[0], outputs[1]
        if self.use_shared_expert_gate:
            gate = self.sigmoid(self.shared_experts_gate(self.cast(hidden_states, self.router_dense_type)))
            shared_experts_output = self.mul_shared_gate(shared_experts_output, self.cast(gate, self.compute_dtype))
        return shared_experts_output, output_bias
    return construct


def apply(mode: str) -> None:
    """Apply every patch needed in ``mode`` ("pynative" or "graph"); safe to call again."""
    from mindformers.parallel_core.training_graph import loss_func
    from mindformers.parallel_core.training_graph.base_models.common.embeddings import rotary_pos_embedding
    from mindformers.parallel_core.training_graph.tensor_parallel.layers import VocabParallelEmbedding
    from mindformers.parallel_core.training_graph.transformer.flash_attention import FlashAttention
    from mindformers.parallel_core.training_graph.transformer.moe import router, shared_experts
    from mindformers.parallel_core.training_graph.transformer.moe.ffn import FFNGroupedGEMM
    from mindformers.parallel_core.training_graph.transformer.norm import FusedRMSNorm
    from mindspore.ops.operations import Morph

    if mode not in ("pynative", "graph"):
        raise ValueError(f"mode must be 'pynative' or 'graph', not {mode!r}")
    register_training_classes()
    _set(FusedRMSNorm, "construct", _rms_norm_construct)
    if not _already(FlashAttention, "__init__"):
        _set(FlashAttention, "__init__", _attention_init(FlashAttention.__init__))
    _set(FlashAttention, "construct", _attention_construct)
    _set(rotary_pos_embedding, "Outer", _CpuOuter)
    _set(VocabParallelEmbedding, "embedding_func", _embedding_func)
    _set(router, "TopkExt", _topk)
    _set(FFNGroupedGEMM, "forward_func", _dense_experts_forward)
    if mode == "pynative":
        _set(Morph, "__call__", _morph_call)
        # 10. loss_func.py: OneHotExt, and ZerosLikeExt in the custom bprop, have no CPU kernel in
        # PyNative; ops.OneHot / ops.ZerosLike take the same arguments. Exact. The router's expert
        # load count (moe_router_enable_expert_bias, DeepSeek-V3's default) uses OneHotExt too.
        _set(loss_func, "OneHotExt", _one_hot_ext)
        _set(loss_func, "ZerosLikeExt", _zeros_like)
        _set(router, "OneHotExt", _one_hot_ext)
        for cls in (shared_experts.SharedExpertMLP, shared_experts.SharedExpertMLPInterleaved):
            _set(cls, "construct", _shared_experts_construct(cls))


def _one_hot_ext(axis=-1):
    return ops.OneHot(axis=axis)


def _zeros_like():
    return ops.ZerosLike()
