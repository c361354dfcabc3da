"""Tiny real MindFormers models for ``mapping check --model``: real class and child names, built in seconds.

Each builder imports MindFormers lazily and runs in a temporary working directory,
because importing MindFormers creates ``./output/log`` in the current one. The mcore
builders switch MindFormers' global context to ``use_legacy: False`` (what a YAML run
with mcore models does), so use them in a process of their own, as the CLI does.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import tempfile
from typing import Any, Callable, Dict, Iterator, Optional

from mf_celldump.errors import ModelSpecError


def build_tiny_llama() -> Any:
    """Legacy LLaMA (``LlamaForCausalLM``) with 2 layers of width 64."""
    from mindformers.models.llama import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_layers=2, hidden_size=64, num_heads=4, vocab_size=128, seq_length=16, use_rope_slice=True
    )
    return LlamaForCausalLM(config)


def build_tiny_qwen3() -> Any:
    """mcore Qwen3 (GPTModel with SelfAttention, MLPInterleaved) with 2 layers of width 64."""
    _use_mcore()
    from mindformers.models.qwen3.configuration_qwen3 import Qwen3Config
    from mindformers.models.qwen3.modeling_qwen3_train import TrainingQwen3ForCausalLM

    config = Qwen3Config(
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        vocab_size=128,
        seq_length=16,
        max_position_embeddings=16,
    )
    return TrainingQwen3ForCausalLM(config)


def build_tiny_deepseek3() -> Any:
    """mcore DeepSeek-V3 (MLA, MoE with shared experts, one MTP layer) with 2 layers of width 64."""
    _use_mcore()
    from mindformers.models.deepseek3.configuration_deepseek_v3 import DeepseekV3Config
    from mindformers.models.deepseek3.modeling_deepseek_v3_train import TrainingDeepseekV3ForCausalLM

    config = DeepseekV3Config(
        num_hidden_layers=2,
        first_k_dense_replace=1,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=128,
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        moe_grouped_gemm=True,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        v_head_dim=16,
        vocab_size=128,
        seq_length=16,
        max_position_embeddings=16,
        num_nextn_predict_layers=1,
    )
    return TrainingDeepseekV3ForCausalLM(config)


def _use_mcore() -> None:
    from mindformers.core.context.build_context import build_context

    build_context(
        {"use_legacy": False, "context": {"mode": 0, "device_target": "CPU"}, "parallel_config": {}}
    )


BUILTIN_MODELS: Dict[str, Callable[[], Any]] = {
    "tiny-llama": build_tiny_llama,
    "tiny-qwen3": build_tiny_qwen3,
    "tiny-deepseek3": build_tiny_deepseek3,
}


def build_builtin(name: str) -> Any:
    """Build the built-in model ``name`` (see ``BUILTIN_MODELS``) in a temporary working directory."""
    if name not in BUILTIN_MODELS:
        raise ModelSpecError(f"unknown built-in model {name!r}; built-in: {', '.join(BUILTIN_MODELS)}")
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="mf_celldump_model_") as tmp, stdout_to_stderr():
        os.chdir(tmp)
        try:
            return BUILTIN_MODELS[name]()
        except ImportError as err:
            raise ModelSpecError(f"{name} needs mindformers: {err}") from None
        finally:
            os.chdir(old)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to 2 meanwhile, so MindFormers' console log stays out of a report on stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def build_model(spec: str) -> Any:
    """Build the network named by ``--model``: a built-in name or ``package.module:callable``."""
    if spec in BUILTIN_MODELS:
        return build_builtin(spec)
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ModelSpecError(
            f"expected a built-in model ({', '.join(BUILTIN_MODELS)}) or 'package.module:callable', "
            f"got {spec!r}"
        )
    if os.getcwd() not in sys.path:
        # like `python -m`: a module next to the user's files is importable from the console script too
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ModelSpecError(f"cannot import {module_name!r}: {err}") from None
    factory: Optional[Callable[[], Any]] = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise ModelSpecError(f"{module_name!r} has no callable {attr!r}")
    try:
        with stdout_to_stderr():
            network = factory()
    except Exception as err:  # a user factory can fail in any way; report it as bad input
        raise ModelSpecError(f"{spec} raised {type(err).__name__}: {err}") from None
    if not hasattr(network, "cells_and_names"):
        raise ModelSpecError(f"{spec} returned {type(network).__name__}, not a MindSpore nn.Cell")
    return network
