"""The tiny mcore models of this folder's YAMLs, built for a training loop of your own (CPU).

``tiny_qwen3.yaml`` and ``tiny_deepseek3.yaml`` give MindFormers 1.9's mcore Qwen3 and
DeepSeek-V3; ``mcore_cpu_patches.py`` makes them run on CPU. Where ``run_tiny_llama.py``
trains them through ``mindformers.Trainer``, these functions hand you the network (or a
plain ``nn.TrainOneStepCell`` around it) and token batches, for loops that call
``mf_celldump.attach`` themselves: the capture benchmark and the tests use them.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = ("qwen3", "deepseek3")


def config_path(model: str) -> str:
    """The example YAML of ``model`` (``qwen3`` or ``deepseek3``)."""
    return os.path.join(HERE, f"tiny_{model}.yaml")


def _apply_patches(mode: str) -> None:
    if HERE not in sys.path:
        sys.path.insert(0, HERE)
    import mcore_cpu_patches

    mcore_cpu_patches.apply(mode)


def _config(model: str, mode: str, sizes: Optional[dict] = None):
    from mindformers import MindFormerConfig
    from mindformers.core.context import build_context

    config = MindFormerConfig(config_path(model))
    config.context.mode = 0 if mode == "graph" else 1
    for key, value in (sizes or {}).items():
        config.model.model_config[key] = value
    build_context(config)
    _apply_patches(mode)
    return config


def build_model(model: str, mode: str = "pynative", weights: Optional[str] = None):
    """The tiny ``model`` of its example YAML (CPU patches applied), optionally with saved weights."""
    from mindformers.models.build_model import build_network

    network = build_network(_config(model, mode).model)
    if weights:
        import mindspore as ms

        params = ms.load_checkpoint(weights)
        not_loaded, _ = ms.load_param_into_net(network, params)
        if not_loaded:
            raise RuntimeError(f"parameters not in {weights}: {not_loaded}")
    network.set_train(True)
    return network


def twin_train_cells(model: str, mode: str, seed: int = 0, sizes: Optional[dict] = None, count: int = 2):
    """``count`` identical ``nn.TrainOneStepCell`` (same seed) of the example ``model``, resized by ``sizes``.

    Plain ``TrainOneStepCell`` + ``AdamWeightDecay`` on a cell returning the LM loss (labels by
    position 4 of GPTModel's construct): a network with and one without capture, compared in one
    process."""
    import copy

    import mindspore as ms
    from mindformers.models.build_model import build_network
    from mindspore import nn

    config = _config(model, mode, sizes)
    cells = []
    for _ in range(count):
        ms.set_seed(seed)
        net = _loss_only(build_network(copy.deepcopy(config.model)))
        train = nn.TrainOneStepCell(net, nn.AdamWeightDecay(net.trainable_params(), learning_rate=1e-3))
        train.set_train(True)
        cells.append(train)
    return cells


def loss_network(model: str, mode: str, seed: int = 0, sizes: Optional[dict] = None):
    """The example ``model`` as a cell taking ``(input_ids, labels)`` and returning the LM loss (no optimizer),
    for a training wrapper of your own (the fault campaign sets its optimizer, loss scale and clipping)."""
    import mindspore as ms
    from mindformers.models.build_model import build_network

    config = _config(model, mode, sizes)
    ms.set_seed(seed)
    return _loss_only(build_network(config.model))


def _loss_only(net):
    """``net`` (GPTModel's causal LM) behind a cell returning the loss alone (labels by position 4)."""
    from mindspore import nn

    class LossOnly(nn.Cell):
        def __init__(self, inner):
            super().__init__()
            self.net = inner

        def construct(self, input_ids, labels):
            return self.net(input_ids, None, None, None, labels)[0]

    net.set_train(True)
    wrapped = LossOnly(net)
    wrapped.set_train(True)
    return wrapped


def token_batches(count: int, batch: int, seq_length: int, vocab_size: int, seed: int = 0) -> list:
    """(input_ids, labels) tensor pairs; labels are the next tokens."""
    import numpy as np
    from mindspore import Tensor

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        tokens = rng.integers(1, vocab_size, size=(batch, seq_length + 1)).astype(np.int32)
        out.append((Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:])))
    return out
