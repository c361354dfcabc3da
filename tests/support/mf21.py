"""MindFormers 2.1's PyNative trainer on MindSpore 2.10, on CPU, for tests.

``setup()`` puts the stand-in ``hyper_parallel`` (``tests/support/hyper_parallel_standin``) first on
``sys.path``, sets the device, and binds CPU equivalents of the kernels MindSpore 2.10 lacks on CPU into
MindFormers' own modules and classes (never into ``mindspore``, never into the plugin): module globals
``mint``/``rms_norm``/``FlashAttentionScore`` of the modules that call them, and the ``reset_parameter``
of the layers whose delayed initialisation calls in-place kernels (``normal_``, ``fill_``, ``zero_``).
Each equivalent computes what the kernel computes, with operations MindSpore has on CPU, so autograd
goes through it. ``tiny_qwen3_config`` is a 2-layer Qwen3 (hidden 32) that trains a step in about a
second here (a loaded machine).
"""

from __future__ import annotations

import os
import sys

import numpy as np

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hyper_parallel_standin")
SEQ, VOCAB = 8, 64


class _Mint:
    """``mindspore.mint`` as a MindFormers module sees it: every function MindSpore has, plus CPU
    equivalents of the ones whose kernels MindSpore 2.10 lacks on CPU."""

    def __init__(self, mint):
        self._mint = mint

    def __getattr__(self, name):
        return getattr(self._mint, name)

    @staticmethod
    def _dtype(dtype):
        import mindspore as ms

        return dtype if dtype is not None else ms.float32

    def ones(self, size, dtype=None):
        return self.full(size, 1, dtype=dtype)

    def zeros(self, size, dtype=None):
        return self.full(size, 0, dtype=dtype)

    def full(self, size, fill_value, dtype=None):  # FillScalar
        import mindspore as ms

        shape = (size,) if isinstance(size, int) else tuple(size)
        return ms.Tensor(np.full(shape, fill_value, dtype=np.float64)).astype(self._dtype(dtype))

    def zeros_like(self, x, dtype=None):  # ZerosLikeExt
        return self.full(x.shape, 0, dtype=dtype or x.dtype)

    def ones_like(self, x, dtype=None):  # OnesLikeExt
        return self.full(x.shape, 1, dtype=dtype or x.dtype)

    def tril(self, x, diagonal=0):  # TrilExt
        import mindspore as ms

        return ms.Tensor(np.tril(x.asnumpy(), diagonal)).astype(x.dtype)

    def arange(self, start=0, end=None, step=1, dtype=None):  # Arange
        import mindspore as ms

        values = np.arange(start, end, step) if end is not None else np.arange(start)
        return ms.Tensor(values).astype(self._dtype(dtype) if dtype is not None else ms.int64)

    def stack(self, tensors, dim=0):  # StackExt
        from mindspore import ops

        return ops.stack(list(tensors), dim)

    def addcmul(self, x, tensor1, tensor2, value=1):  # AddcmulExt
        return x + tensor1 * tensor2 * value

    def outer(self, a, b):  # Outer
        return a.reshape(-1, 1) * b.reshape(1, -1)

    def index_select(self, x, dim, index):  # IndexSelect: Gather is on CPU and differentiable
        from mindspore import ops

        return ops.gather(x, index, dim)

    def scatter_add(self, x, dim, index, src):  # ScatterAddExt (in the loss's own backward: no grad through it)
        import mindspore as ms

        out = x.asnumpy().copy()
        idx, values = index.asnumpy(), src.asnumpy()
        grid = list(np.indices(idx.shape))
        grid[dim] = idx
        np.add.at(out, tuple(grid), values)
        return ms.Tensor(out).astype(x.dtype)


def _rms_norm(x, gamma, epsilon=1e-6):
    """RmsNorm: ``x / sqrt(mean(x^2) + eps) * gamma`` over the last axis, and the reciprocal deviation."""
    from mindspore import ops

    rstd = ops.rsqrt((x * x).mean(-1, keep_dims=True) + epsilon)
    return x * rstd * gamma, rstd


class _FlashAttentionScore:
    """FlashAttentionScore (layouts BSH and BNSD, grouped key/value heads, ``attn_mask`` 1 = masked):
    ``softmax(q k^T * scale + mask) v``, returning (max, sum, softmax out, attention out) like the kernel
    (only the last is used by 2.1's ``FlashAttention``)."""

    def __init__(self, head_num, scale_value=1.0, input_layout="BSH", **kwargs):
        self.head_num, self.scale, self.layout = head_num, scale_value, input_layout

    def _heads(self, x, heads):
        if self.layout == "BNSD":
            return x
        batch, seq, hidden = x.shape
        return x.reshape(batch, seq, heads, hidden // heads).transpose(0, 2, 1, 3)

    def __call__(self, query, key, value, real_shift=None, padding_mask=None, attn_mask=None, prefix=None,
                 actual_seq_qlen=None, actual_seq_kvlen=None):
        import mindspore as ms
        from mindspore import mint, ops

        q = self._heads(query, self.head_num)
        kv_heads = key.shape[1] if self.layout == "BNSD" else None
        if kv_heads is None:
            kv_heads = key.shape[-1] // (query.shape[-1] // self.head_num)
        k, v = self._heads(key, kv_heads), self._heads(value, kv_heads)
        if kv_heads != self.head_num:
            repeat = self.head_num // kv_heads
            k, v = ops.repeat_interleave(k, repeat, 1), ops.repeat_interleave(v, repeat, 1)
        # Views (transposes upstream) are made contiguous: MindSpore 2.10's CPU matmul of a strided view
        # gave NaN here.
        # In float32 as the kernel accumulates (2.1 feeds it float16; a float16 -1e9 is -inf, and 0 * -inf NaN).
        dtype = q.dtype
        q, k, v = (t.contiguous().astype(ms.float32) for t in (q, k, v))
        scores = mint.matmul(q, k.transpose(0, 1, 3, 2).contiguous()) * self.scale
        if attn_mask is not None:
            scores = scores + attn_mask.astype(ms.float32) * -1e9
        out = mint.matmul(ops.softmax(scores, -1), v).astype(dtype)
        if self.layout != "BNSD":
            batch, heads, seq, dim = out.shape
            out = out.transpose(0, 2, 1, 3).reshape(batch, seq, heads * dim)
        return None, None, None, out


def _normal_init(std):
    def reset(param, rng):
        param.set_data(_tensor(rng.normal(0.0, std, param.shape), param.dtype))
    return reset


def _tensor(values, dtype):
    import mindspore as ms

    return ms.Tensor(np.asarray(values, dtype=np.float32)).astype(dtype)


def _bind_reset_parameters(rng) -> None:
    """Delayed initialisation (``init_states`` -> ``reset_parameter``) with data set from numpy, as the
    layers' own ``normal_(0, 0.01)``/``fill_(1)``/``zero_()`` do."""
    from mindformers.pynative.base_models.common.embeddings.vocab_embedding import VocabEmbedding
    from mindformers.pynative.layers.layer_norm import FusedRMSNorm
    from mindformers.pynative.layers.linear import Linear

    def linear_reset(self):
        if not self.skip_weight_param_allocation and self.weight is not None:
            _normal_init(0.01)(self.weight, rng)
        if self.has_bias and self.bias is not None and self.bias_init is not None:
            self.bias.set_data(_tensor(np.zeros(self.bias.shape), self.bias.dtype))

    Linear.reset_parameter = linear_reset
    VocabEmbedding.reset_parameter = lambda self: _normal_init(0.01)(self.weight, rng)
    FusedRMSNorm.reset_parameter = lambda self: self.weight.set_data(_tensor(np.ones(self.weight.shape),
                                                                             self.weight.dtype))


MINT_MODULES = (
    "mindformers.pynative.base_models.common.embeddings.rotary_pos_embedding",
    "mindformers.pynative.base_models.common.embeddings.vocab_embedding",
    "mindformers.pynative.base_models.gpt.gpt_model",
    "mindformers.pynative.layers.mask_generate",
    "mindformers.pynative.layers.flash_attention",
    "mindformers.pynative.loss.loss",
    "mindformers.pynative.trainer.utils",
    "mindformers.pynative.optimizer.adamw",
)


def setup(seed: int = 0) -> None:
    """Make the 2.1 PyNative trainer importable and runnable here (idempotent)."""
    if STANDIN not in sys.path:
        sys.path.insert(0, STANDIN)
    import importlib

    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_device("CPU")  # Cell.to_empty() allocates on the set device (meta otherwise)
    for name in MINT_MODULES:
        module = importlib.import_module(name)
        if not isinstance(module.mint, _Mint):
            module.mint = _Mint(module.mint)
    layer_norm = importlib.import_module("mindformers.pynative.layers.layer_norm")
    layer_norm.rms_norm = _rms_norm
    flash = importlib.import_module("mindformers.pynative.layers.flash_attention")
    flash.FlashAttentionScore = _FlashAttentionScore
    _bind_reset_parameters(np.random.default_rng(seed))


def tiny_qwen3_config(steps: int = 3, **training) -> dict:
    """A 2.1 ``TrainConfig`` dict: a 2-layer Qwen3 (hidden 32, 4 heads, 2 key/value heads), CPU, no saving."""
    return {
        "training": {"steps": steps, "local_batch_size": 2, "global_batch_size": 2, **training},
        "optimizer": {"type": "AdamW"},
        "lr_scheduler": {"type": "ConstantWarmUpLR", "learning_rate": 1e-3, "warmup_steps": 0, "total_steps": steps},
        "context": {"mode": 1, "device_target": "CPU"},
        "checkpoint": {"enable_save": False},
        "train_dataset": {"dataloader": {"type": "MockHFDataLoader"}},
        "model": {"model_type": "qwen3", "architectures": "Qwen3ForCausalLM", "num_hidden_layers": 2,
                  "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 8, "vocab_size": VOCAB, "max_position_embeddings": 32, "seq_length": SEQ,
                  "use_flash_attention": True, "tie_word_embeddings": False, "hidden_dropout": 0.0,
                  "attention_dropout": 0.0, "params_dtype": "float32",
                  "compute_dtype": "float32", "layernorm_compute_dtype": "float32",
                  "softmax_compute_dtype": "float32", "rotary_dtype": "float32"},
    }


def token_dataset(batches: int = 32, batch: int = 2, nan_at: int = -1):
    """Random token batches (``input_ids``, ``labels``), the same on every run."""
    import mindspore.dataset as ds

    def rows():
        rng = np.random.default_rng(0)
        for _ in range(batches * batch):
            ids = rng.integers(0, VOCAB, SEQ + 1).astype(np.int32)
            yield ids[:-1], ids[1:]

    return ds.GeneratorDataset(rows, ["input_ids", "labels"], shuffle=False).batch(batch, drop_remainder=True)


__all__ = ["setup", "tiny_qwen3_config", "token_dataset"]
