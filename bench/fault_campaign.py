"""The random fault campaign: faults drawn at random, each with its answer written down before it runs.

    python bench/fault_campaign.py run --out DIR [--faults 300] [--seed 0] [--jobs 2]
        [--models llama,qwen3,deepseek3] [--modes pynative,graph] [--tasks tensor,statistics]
    python bench/fault_campaign.py table --out DIR        # the Markdown tables of a finished run
    python bench/fault_campaign.py group --out DIR --model M --mode P --task T (--count N | --sample)

Models: MindFormers 1.9's legacy LLaMA (``examples/tiny_llama.yaml``) and the mcore Qwen3 and
DeepSeek-V3 (``examples/tiny_qwen3.yaml``, ``tiny_deepseek3.yaml``: MLA, a router, experts), on
CPU with the examples' patches. Each fault is one change a user or a bug makes (``KINDS``),
with its magnitude drawn log-uniform from the kind's range, on a cell drawn from the model's
cells of the kind's cell kind. One process per (model, mode, task) ("a group") trains the
baseline for ``STEPS`` steps with capture, draws its faults, writes each fault's expected
answer (first cell, step, direction, cause words) to ``plan.json``, and only then trains
every faulted run from the baseline's initial weights and compares it with ``mf-celldump
compare`` against the one shared baseline. Groups run in ``--jobs`` processes.

The expected answer is what a right verdict says, fixed by what the fault does, never by
what compare says today (``expect``). A verdict is **right** when its first divergence is an
expected cell at the expected step and direction and its headline (with the advice) holds
every cause word; **wrong** when it names something else; **missed** when it finds nothing.

Null pairs run in the same campaign and count false alarms: each group trains its baseline
twice (the same run twice), and graph against PyNative is compared per model and task.
Tensor parallel against one rank, bfloat16 reduction orders and another micro-batch split
are not made here (``NULL_PAIRS_ELSEWHERE``: the tests that run them).

This file imports nothing from ``tests/``; the CI test (``tests/test_fault_campaign.py``)
runs its ``--sample`` groups.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
EXAMPLES = os.path.join(REPO, "examples")
MODELS = ("llama", "qwen3", "deepseek3")
MODES = ("pynative", "graph")
TASKS = ("tensor", "statistics")
STEPS = 2  # step 0 and step 1: an update's effect shows at step 1
BATCH, SEQ, VOCAB = 2, 16, 128
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-6  # the baseline's AdamWeightDecay
NULL_PAIRS_ELSEWHERE = {
    "TP=2 against TP=1": "tests/test_compare_shards_msrun.py (msrun, two processes)",
    "bf16 with another reduction order": "tests/test_compare_noise_bound.py (bfloat16 runs written by numpy: "
                                         "MindSpore has no bfloat16 MatMul on CPU)",
    "another micro-batch split": "not made: a dump of 2 micro-batches pairs calls a dump of 1 has not",
}
ENTRY = re.compile(r"^Cell\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<dir>forward|backward|parameters_grad)\.(?P<call>\d+)$")


# -- the fault kinds --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Kind:
    """One kind of fault: its magnitude range (log-uniform; None: a discrete change) and the models it exists on."""

    name: str
    low: Optional[float]
    high: Optional[float]
    models: Tuple[str, ...]
    what: str


KINDS = (
    Kind("weight_element", 1.5, 1000.0, MODELS, "one element of a linear or norm weight scaled"),
    Kind("epsilon", 10.0, 1e4, MODELS, "a norm's epsilon scaled"),
    Kind("bias_dropped", None, None, (), "a bias dropped: none of the three models has a bias"),
    Kind("softmax_scale", 1.05, 4.0, MODELS, "an attention's softmax scale multiplied or divided"),
    Kind("rotary", 1.01, 2.0, MODELS, "the rotary frequencies scaled (another base)"),
    Kind("router_topk", None, None, ("deepseek3",), "the router's top-k one more or one fewer"),
    Kind("expert_weights", 1.1, 10.0, ("deepseek3",), "one routed expert's weights scaled"),
    Kind("embedding", 1.5, 1000.0, MODELS, "one element of a looked-up embedding row scaled"),
    Kind("lm_head", 1.5, 1000.0, MODELS, "one element of the output layer's weight scaled"),
    Kind("optimizer_lr", 1.1, 10.0, MODELS, "the learning rate scaled"),
    Kind("optimizer_betas", 1.1, 5.0, MODELS, "1 - beta1 or 1 - beta2 scaled"),
    Kind("optimizer_eps", 10.0, 1e4, MODELS, "Adam's epsilon scaled"),
    Kind("weight_decay", 1e-3, 0.1, MODELS, "weight decay set (the baseline has none)"),
    Kind("gradient_clipping", 1.5, 100.0, MODELS, "gradients clipped to the baseline's norm divided by m"),
    Kind("loss_scale", 2.0, 65536.0, MODELS, "a loss scale m (gradients unscaled before the update)"),
    Kind("data", 1.0, 32.0, MODELS, "m tokens of the batch of step k changed"),
    Kind("layer_init", 1.1, 10.0, MODELS, "one layer's initial weights scaled (its init std)"),
    Kind("dtype_cell", None, None, MODELS, "one norm computes in float16"),
    Kind("dtype_model", None, None, MODELS, "the model computes in float16"),
)
KIND = {k.name: k for k in KINDS}
OPTIMIZER_KINDS = ("optimizer_lr", "optimizer_betas", "optimizer_eps", "weight_decay", "gradient_clipping")


@dataclass
class Fault:
    """One drawn fault and the answer a right verdict gives, fixed before it runs."""

    id: str
    kind: str
    model: str
    mode: str
    task: str
    magnitude: Optional[float]
    target: str  # a cell path, a parameter name, an optimizer setting or "batch"
    cell_kind: str
    detail: dict = field(default_factory=dict)
    expect_cells: List[str] = field(default_factory=list)
    expect_step: int = 0
    expect_direction: str = "forward"
    expect_words: List[str] = field(default_factory=list)


def log_uniform(rng, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


# -- the models -------------------------------------------------------------------------------------------
def _examples_on_path() -> None:
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)


def build_loss_network(model: str, mode: str, dtype: Optional[str] = None):
    """The tiny ``model`` as a cell returning its loss from the inputs of ``batches`` (CPU patches applied)."""
    _examples_on_path()
    os.environ.setdefault("LOCAL_DEFAULT_PATH", os.path.abspath("mf_output"))
    sizes = {"compute_dtype": dtype} if dtype else None
    if model != "llama":
        import tiny_mcore

        return tiny_mcore.loss_network(model, mode, sizes=sizes)
    import cpu_workarounds  # noqa: F401  (MindFormers' LLaMA on CPU, see the file)
    import mindspore as ms
    from mindformers import MindFormerConfig
    from mindformers.core.context import build_context
    from mindformers.models.build_model import build_network

    config = MindFormerConfig(os.path.join(EXAMPLES, "tiny_llama.yaml"))
    config.context.mode = 0 if mode == "graph" else 1
    if dtype:
        config.model.model_config.compute_dtype = dtype
    build_context(config)
    ms.set_seed(0)
    net = build_network(config.model)
    net.set_train(True)
    return net


def batches(model: str, changed: Optional[dict] = None) -> list:
    """The ``STEPS`` batches every run trains on; ``changed`` = {"step", "positions", "tokens"} for the data fault."""
    import numpy as np
    from mindspore import Tensor

    rng = np.random.default_rng(0)
    out = []
    for step in range(STEPS):
        tokens = rng.integers(1, VOCAB, size=(BATCH, SEQ + 1)).astype(np.int32)
        if changed and changed["step"] == step:
            flat = tokens.reshape(-1)
            flat[changed["positions"]] = changed["tokens"]
        if model == "llama":  # LlamaForCausalLM takes seq + 1 tokens and shifts them itself
            out.append((Tensor(tokens),))
        else:
            out.append((Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:])))
    return out


def train_cell(network, fault: Optional[Fault], clip: Optional[float]):
    """``network`` + AdamWeightDecay in a training step with the fault's optimizer settings, loss scale, clipping."""
    from mindspore import nn, ops

    settings = dict(learning_rate=LR, beta1=BETA1, beta2=BETA2, eps=EPS, weight_decay=0.0)
    sens = 1.0
    if fault is not None:
        settings.update(fault.detail.get("optimizer", {}))
        sens = fault.detail.get("loss_scale", 1.0)
        clip = fault.detail.get("clip", None)
    optimizer = nn.AdamWeightDecay(network.trainable_params(), **settings)

    class CampaignStep(nn.TrainOneStepCell):
        """A training step with a loss scale (gradients unscaled before the update) and global-norm clipping."""

        def __init__(self, net, opt):
            super().__init__(net, opt, sens=sens)
            self.unscale = 1.0 / sens
            self.clip = clip

        def construct(self, *inputs):
            loss = self.network(*inputs)
            grads = self.grad(self.network, self.weights)(*inputs, ops.fill(loss.dtype, loss.shape, self.sens))
            grads = self.grad_reducer(grads)
            if self.unscale != 1.0:
                grads = tuple(g * self.unscale for g in grads)
            if self.clip is not None:
                grads = ops.clip_by_global_norm(grads, self.clip)
            return ops.depend(loss, self.optimizer(grads))

    step = CampaignStep(network, optimizer)
    step.set_train(True)
    return step


def gradient_norm(network, batch) -> float:
    """The global norm of step 0's gradients (the clipping kind clips below it)."""
    import mindspore as ms
    import numpy as np

    grads = ms.value_and_grad(network, None, network.trainable_params())(*batch)[1]
    return float(np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads)))


# -- a model's structure, read before any fault is drawn ---------------------------------------------------
@dataclass
class Structure:
    """What the draw and the expected answers need: cells by path, parameters, the baseline's execution order."""

    cells: Dict[str, str]  # path -> class name
    params: Dict[str, Tuple[int, ...]]  # parameter name -> shape
    forward: List[str]  # forward entry paths of step 0, in execution order
    backward: List[str]  # backward entry paths of step 0, in execution order
    tokens: List[int]  # the input tokens of step 0 (an embedding fault takes a row that is looked up)
    grad_norm: float = 0.0

    def owner(self, param: str) -> str:
        return param.rsplit(".", 1)[0]

    def first_forward(self, owners: Sequence[str]) -> List[str]:
        """The first cell in execution order that computes with one of ``owners``' weights."""
        wanted = set(owners)
        return [next(p for p in self.forward if p in wanted)]

    def param_owners(self) -> List[str]:
        return [self.owner(name) for name in self.params]


def read_order(dump: str) -> Tuple[List[str], List[str]]:
    with open(os.path.join(dump, "step0", "rank", "dump.json"), encoding="utf-8") as handle:
        data = json.load(handle)["data"]
    order: Dict[str, List[str]] = {"forward": [], "backward": []}
    for name in data:
        match = ENTRY.match(name)
        if match and match["dir"] in order and match["path"] not in order[match["dir"]]:
            order[match["dir"]].append(match["path"])
    return order["forward"], order["backward"]


def cell_kind(path: str, cls: str) -> str:
    """The cell kind a table row counts: by class, the output layer by its name."""
    if path.endswith(("output_layer", "lm_head")):
        return "lm_head"
    for word, kind in (("Norm", "norm"), ("FreqsMgr", "rotary"), ("RotaryEmbedding", "rotary"),
                       ("Embedding", "embedding"), ("TopKRouter", "router"), ("FFNGroupedGEMM", "experts"),
                       ("FlashAttention", "attention"), ("Attention", "attention"), ("Linear", "linear")):
        if word in cls:
            return kind
    return cls


def _cells_of(structure: Structure, kinds: Sequence[str]) -> List[str]:
    return sorted(p for p, c in structure.cells.items() if cell_kind(p, c) in kinds and p in structure.forward)


def _rotary_cells(structure: Structure) -> List[str]:
    return [p for p, c in structure.cells.items() if c in ("FreqsMgr", "RotaryEmbedding") and p in structure.forward
            and not p.endswith("apply_rotary_emb")]


def _layers(structure: Structure) -> List[str]:
    return sorted({m.group(0) for p in structure.params for m in [re.search(r"^.*?\.layers\.\d+", p)] if m})


def _weight_params(structure: Structure, kinds: Sequence[str]) -> List[str]:
    return sorted(n for n in structure.params
                  if cell_kind(structure.owner(n), structure.cells.get(structure.owner(n), "")) in kinds
                  and structure.owner(n) in structure.forward)


# -- the draw: each fault with its expected answer ----------------------------------------------------------
def _pick(rng, items: Sequence):
    return items[int(rng.integers(len(items)))]


def _element(rng, structure: Structure, param: str, row: Optional[int] = None) -> int:
    import numpy as np

    shape = structure.params[param]
    if row is None:
        return int(rng.integers(int(np.prod(shape))))
    return row * int(np.prod(shape[1:])) + int(rng.integers(int(np.prod(shape[1:]))))


def draw_fault(name: str, rng, s: Structure, model: str, mode: str, task: str, number: int) -> Fault:
    """One fault of kind ``name``: target, magnitude and the answer a right verdict gives."""
    kind = KIND[name]
    magnitude = None if kind.low is None else log_uniform(rng, kind.low, kind.high)
    fault = Fault(id=f"{model}-{mode}-{task}-{number:03d}-{name}", kind=name, model=model, mode=mode, task=task,
                  magnitude=magnitude, target="", cell_kind="")
    first_weight = s.first_forward(s.param_owners())  # the first cell that computes with a weight
    groups = {"weight_element": _draw_weight, "embedding": _draw_weight, "lm_head": _draw_weight,
              "expert_weights": _draw_expert, "layer_init": _draw_layer, "loss_scale": _draw_loss_scale,
              "data": _draw_data}
    for attribute_kind in ("epsilon", "softmax_scale", "rotary", "router_topk", "dtype_cell"):
        groups[attribute_kind] = _draw_attribute
    for optimizer_kind in OPTIMIZER_KINDS:
        groups[optimizer_kind] = _draw_optimizer
    if name == "dtype_model":
        fault.detail = {"dtype": "float16"}
        fault.target, fault.expect_cells, fault.expect_words = "model", first_weight, ["dtype"]
    else:
        groups[name](fault, rng, s, first_weight)
    fault.cell_kind = _fault_cell_kind(fault, s)
    return fault


def _draw_weight(fault: Fault, rng, s: Structure, first_weight: List[str]) -> None:
    """One element of a weight scaled; an embedding's in a row the batch looks up."""
    kinds = {"weight_element": ("linear", "norm"), "embedding": ("embedding",), "lm_head": ("lm_head",)}[fault.kind]
    param = _pick(rng, _weight_params(s, kinds))
    row = _pick(rng, s.tokens) if fault.kind == "embedding" else None
    fault.detail = {"scale": {param: [_element(rng, s, param, row)]}, "factor": fault.magnitude}
    fault.target, fault.expect_cells = param, [s.owner(param)]


def _draw_attribute(fault: Fault, rng, s: Structure, first_weight: List[str]) -> None:
    """A cell's setting changed: the cell that holds it computes differently first."""
    cells = {"epsilon": _cells_of(s, ("norm",)), "dtype_cell": _cells_of(s, ("norm",)),
             "softmax_scale": sorted(p for p, c in s.cells.items()  # the cells that hold the scale
                                     if c in ("FlashAttention", "LLamaAttention") and p in s.forward),
             "rotary": _rotary_cells(s), "router_topk": _cells_of(s, ("router",))}[fault.kind]
    fault.target = _pick(rng, cells)
    fault.expect_cells = [fault.target]
    factor = fault.magnitude
    if fault.kind in ("softmax_scale", "rotary") and rng.random() < 0.5:
        factor = 1.0 / fault.magnitude
    fault.detail = {"attribute": fault.target, "factor": factor}
    if fault.kind == "router_topk":
        fault.detail["topk"] = _pick(rng, [1, 3])  # the baseline routes each token to 2 of 4 experts


def _draw_expert(fault: Fault, rng, s: Structure, first_weight: List[str]) -> None:
    cell = _pick(rng, _cells_of(s, ("experts",)))
    expert = int(rng.integers(4))
    params = [n for n in s.params if s.owner(n) == cell]
    fault.detail = {"expert_scale": {p: expert for p in params}, "experts": 4, "factor": fault.magnitude}
    fault.target, fault.expect_cells = f"{cell} expert {expert}", [cell]


def _draw_layer(fault: Fault, rng, s: Structure, first_weight: List[str]) -> None:
    layer = _pick(rng, _layers(s))
    params = [n for n in s.params if n.startswith(layer + ".")
              and cell_kind(s.owner(n), s.cells.get(s.owner(n), "")) != "norm"]
    fault.detail = {"scale_all": params, "factor": fault.magnitude}
    fault.target, fault.expect_cells = layer, s.first_forward([s.owner(p) for p in params])


def _draw_optimizer(fault: Fault, rng, s: Structure, first_weight: List[str]) -> None:
    """Step 0 agrees; its update differs, so weights differ at step 1's start."""
    magnitude = fault.magnitude
    setting = {"optimizer_lr": "learning_rate", "optimizer_eps": "eps", "weight_decay": "weight_decay",
               "gradient_clipping": "clip", "optimizer_betas": _pick(rng, ["beta1", "beta2"])}[fault.kind]
    base = {"learning_rate": LR, "eps": EPS, "weight_decay": 0.0, "beta1": BETA1, "beta2": BETA2}.get(setting)
    if setting == "clip":
        fault.detail = {"clip": s.grad_norm / magnitude}
    elif setting in ("beta1", "beta2"):
        fault.detail = {"optimizer": {setting: 1.0 - (1.0 - base) * magnitude}}
    elif setting == "weight_decay":
        fault.detail = {"optimizer": {setting: magnitude}}
    else:
        fault.detail = {"optimizer": {setting: base * magnitude}}
    fault.target = setting
    fault.expect_cells, fault.expect_step, fault.expect_words = first_weight, 1, ["update of step 0"]


def _draw_loss_scale(fault: Fault, rng, s: Structure, first_weight: List[str]) -> None:
    fault.detail = {"loss_scale": fault.magnitude}
    fault.target = "loss scale"
    # the gradient fed to the model differs: named at the loss's backward or at a wrapper before it
    loss = next((i for i, p in enumerate(s.backward) if p.endswith("loss")), 0)
    fault.expect_cells, fault.expect_direction = s.backward[:loss + 1], "backward"
    fault.expect_words = ["loss scale"]


def _draw_data(fault: Fault, rng, s: Structure, first_weight: List[str]) -> None:
    step, count = int(rng.integers(STEPS)), max(1, int(round(fault.magnitude)))
    inputs = [r * (SEQ + 1) + j for r in range(BATCH) for j in range(SEQ)]  # positions read as inputs
    positions = sorted(int(p) for p in rng.choice(inputs, size=min(count, len(inputs)), replace=False))
    fault.detail = {"data": {"step": step, "positions": positions,
                             "tokens": [int(t) for t in rng.integers(1, VOCAB, size=len(positions))]}}
    fault.target, fault.expect_step, fault.expect_words = "batch", step, ["data differ"]
    # the model's input differs: named at a cell that runs before any weight is used, or at the lookup
    fault.expect_cells = s.forward[:s.forward.index(first_weight[0]) + 1]


def _fault_cell_kind(fault: Fault, s: Structure) -> str:
    if fault.kind in OPTIMIZER_KINDS:
        return "optimizer"
    fixed = {"loss_scale": "loss scale", "data": "data", "layer_init": "layer", "dtype_model": "model"}
    if fault.kind in fixed:
        return fixed[fault.kind]
    path = fault.expect_cells[0]
    return cell_kind(path, s.cells.get(path, ""))


def kinds_on(model: str) -> List[str]:
    return [k.name for k in KINDS if model in k.models]


# CI's fixed sample (PyNative, tensor task): every kind that can be made at least once, 27 faults in all.
SAMPLE = {
    "llama": ["weight_element", "epsilon", "softmax_scale", "rotary", "embedding", "lm_head", "optimizer_lr",
              "loss_scale", "data"],
    "qwen3": ["weight_element", "epsilon", "softmax_scale", "rotary", "optimizer_betas", "optimizer_eps",
              "weight_decay", "layer_init", "dtype_cell"],
    "deepseek3": ["router_topk", "expert_weights", "embedding", "gradient_clipping", "data", "layer_init",
                  "dtype_model", "weight_element", "softmax_scale"],
}


def draw(structure: Structure, model: str, mode: str, task: str, count: int, seed: int,
         sample: bool = False) -> List[Fault]:
    """``count`` faults spread over the model's kinds (every kind once before any twice), or the CI sample."""
    import numpy as np

    rng = np.random.default_rng([seed, MODELS.index(model), MODES.index(mode), TASKS.index(task)])
    if sample:
        names = SAMPLE[model]
    else:
        names = []
        while len(names) < count:
            names += [str(n) for n in rng.permutation(kinds_on(model))]
        names = names[:count]
    return [draw_fault(name, rng, structure, model, mode, task, i) for i, name in enumerate(names)]


# -- making a fault and running it --------------------------------------------------------------------------
def set_weights(network, weights: dict, fault: Optional[Fault]) -> None:
    """The baseline's initial weights, with the fault's changed elements, rows or layers."""
    import numpy as np
    from mindspore import Tensor

    detail = fault.detail if fault else {}
    for param in network.trainable_params():
        value = weights[param.name].copy()
        if param.name in detail.get("scale", {}):
            value.reshape(-1)[detail["scale"][param.name]] *= detail["factor"]
        if param.name in detail.get("expert_scale", {}):
            value.reshape(detail["experts"], -1)[detail["expert_scale"][param.name]] *= detail["factor"]
        if param.name in detail.get("scale_all", []):
            value *= detail["factor"]
        param.set_data(Tensor(value.astype(np.float32)))


def set_attribute(network, fault: Fault) -> None:
    """The fault on a cell's setting: epsilon, softmax scale, rotary frequencies, top-k, a norm's dtype."""
    import mindspore as ms
    import numpy as np
    from mindspore import Tensor

    cell = dict(network.cells_and_names())[fault.detail["attribute"]]
    factor = fault.detail["factor"]
    if fault.kind == "epsilon":
        cell.eps = float(cell.eps) * factor
    elif fault.kind == "softmax_scale" and hasattr(cell, "cpu_softmax_scale"):
        cell.cpu_softmax_scale = cell.cpu_softmax_scale * factor
    elif fault.kind == "softmax_scale":  # LLaMA's attention multiplies its scores by inv_norm_factor
        cell.inv_norm_factor = Tensor(cell.inv_norm_factor.asnumpy() * factor, cell.inv_norm_factor.dtype)
    elif fault.kind == "rotary" and hasattr(cell, "inv_freq"):
        cell.inv_freq = Tensor(cell.inv_freq.asnumpy() * factor, ms.float32)
    elif fault.kind == "rotary":  # LLaMA's FreqsMgr holds cos and sin of position x frequency, per position row
        cos, sin = cell.freqs_cos.asnumpy(), cell.freqs_sin.asnumpy()
        angles = np.arange(cos.shape[0])[:, None] * np.arctan2(sin[1], cos[1])[None, :] * factor
        cell.freqs_cos = Tensor(np.cos(angles), cell.freqs_cos.dtype)
        cell.freqs_sin = Tensor(np.sin(angles), cell.freqs_sin.dtype)
    elif fault.kind == "router_topk":  # the router's k (its ``topk`` is the TopK operation)
        cell.num_experts_chosen = fault.detail["topk"]
    elif fault.kind == "dtype_cell":
        cell.compute_type = ms.float16


def train_and_dump(model: str, mode: str, task: str, dump: str, weights: Optional[dict],
                   fault: Optional[Fault] = None, clip: Optional[float] = None):
    """One run of ``STEPS`` captured steps into ``dump`` (processed); returns the fresh network and its losses."""
    import mf_celldump
    from mf_celldump.processing.driver import process_dump

    network = build_loss_network(model, mode, (fault.detail.get("dtype") if fault else None))
    if weights is None:
        weights = {p.name: p.asnumpy() for p in network.trainable_params()}
    set_weights(network, weights, fault)
    if fault is not None and "attribute" in fault.detail:
        set_attribute(network, fault)
    step = train_cell(network, fault, clip)
    handle = mf_celldump.attach(step, {"dump_path": dump, "task": task, "steps": f"0-{STEPS - 1}"})
    losses = []
    for number, batch in enumerate(batches(model, fault.detail.get("data") if fault else None)):
        with handle.step(number):
            losses.append(float(step(*batch).asnumpy()))
    handle.detach()
    if not process_dump(dump, jobs=1).ok:
        raise RuntimeError(f"processing {dump} failed")
    return network, weights, losses


def compare(target: str, baseline: str, out: str) -> Tuple[int, dict]:
    """``mf-celldump compare TARGET BASELINE --json`` in this process: (exit code, its JSON)."""
    from mf_celldump.cli import main as celldump_main

    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        code = celldump_main(["compare", target, baseline, "-o", out, "--json", "--jobs", "1"])
    try:
        return code, json.loads(text.getvalue())
    except ValueError:
        return code, {"headline": text.getvalue()[-500:], "first_divergence": None, "advice": []}


def judge(fault: Optional[Fault], code: int, result: dict) -> dict:
    """right / wrong / missed (a fault) or clean / false alarm (a null pair), with what compare answered."""
    first = result.get("first_divergence") or None
    words = " ".join([result.get("headline", "")] + list(result.get("advice") or [])).lower()
    answer = {"code": code, "headline": result.get("headline", ""), "verdict": result.get("verdict"),
              "cell": first and first.get("cell"), "step": first and first.get("step"),
              "direction": first and first.get("direction"), "inputs_differ": first and first.get("inputs_differ")}
    if fault is None:
        answer["outcome"] = "clean" if code == 0 and first is None else "false alarm"
        return answer
    if first is None:
        answer["outcome"], answer["wrong_in"] = "missed", []
        return answer
    wrong = [part for part, bad in (("cell", first.get("cell") not in fault.expect_cells),
                                    ("step", first.get("step") != fault.expect_step),
                                    ("direction", first.get("direction") != fault.expect_direction)) if bad]
    wrong += [f"words '{w}'" for w in fault.expect_words if w.lower() not in words]
    answer["outcome"], answer["wrong_in"] = ("wrong" if wrong else "right"), wrong
    return answer


# -- one group: one baseline per (model, mode, task), its faults and its null pair ----------------------------
def run_group(out: str, model: str, mode: str, task: str, count: int, seed: int, sample: bool) -> str:
    """Baseline, the plan (expected answers, written first), the same run again, then every fault."""
    import numpy as np

    folder = os.path.join(out, f"{model}-{mode}-{task}")
    os.makedirs(folder, exist_ok=True)
    os.chdir(folder)  # MindFormers writes its logs and caches into the working directory
    baseline = os.path.join(folder, "baseline")
    shutil.rmtree(baseline, ignore_errors=True)
    started = time.time()
    network, weights, losses = train_and_dump(model, mode, task, baseline, None)
    forward, backward = read_order(baseline)
    first_batch = batches(model)[0]
    structure = Structure(cells={p: type(c).__name__ for p, c in network.cells_and_names() if p},
                          params={p.name: tuple(p.shape) for p in network.trainable_params()},
                          forward=forward, backward=backward,
                          tokens=sorted({int(t) for t in np.asarray(first_batch[0].asnumpy())[:, :SEQ].reshape(-1)}))
    structure.grad_norm = gradient_norm(network, first_batch)
    faults = draw(structure, model, mode, task, count, seed, sample)
    with open(os.path.join(folder, "plan.json"), "w", encoding="utf-8") as handle:
        json.dump({"baseline_losses": losses, "grad_norm": structure.grad_norm,
                   "faults": [asdict(f) for f in faults]}, handle, indent=1)
    results = os.path.join(folder, "results.jsonl")
    with open(results, "w", encoding="utf-8") as handle:
        handle.write(json.dumps({"null": "same run twice", "model": model, "mode": mode, "task": task,
                                 **_run_and_judge(model, mode, task, folder, baseline, weights, None, losses)}) + "\n")
        for fault in faults:
            record = {"fault": asdict(fault), **_run_and_judge(model, mode, task, folder, baseline,
                                                                 weights, fault, losses)}
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            print(f"{fault.id}: {record['outcome']} ({record.get('error') or record['headline'][:100]})", flush=True)
    print(f"group {model}-{mode}-{task}: {len(faults)} faults in {time.time() - started:.0f} s", flush=True)
    return results


def _run_and_judge(model, mode, task, folder, baseline, weights, fault: Optional[Fault], base_losses) -> dict:
    """One run against the baseline; ``losses_differ`` tells a fault that changed nothing from a missed one."""
    name = fault.id if fault else "again"
    dump, out = os.path.join(folder, f"run-{name}"), os.path.join(folder, f"compare-{name}")
    started = time.time()
    try:
        _, _, losses = train_and_dump(model, mode, task, dump, weights, fault)
        code, result = compare(dump, baseline, out)
    except Exception as err:  # a fault the model cannot run is recorded with its reason, never dropped
        return {"outcome": "not run", "error": f"{type(err).__name__}: {err}"[:500], "headline": "",
                "seconds": round(time.time() - started, 1)}
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return {**judge(fault, code, result), "losses": losses, "losses_differ": losses != base_losses,
            "seconds": round(time.time() - started, 1)}


# -- the whole campaign ---------------------------------------------------------------------------------------
def _group_command(out: str, model: str, mode: str, task: str, count: int, seed: int, sample: bool) -> List[str]:
    command = [sys.executable, os.path.abspath(__file__), "group", "--out", out, "--model", model, "--mode", mode,
               "--task", task, "--seed", str(seed)]
    return command + (["--sample"] if sample else ["--count", str(count)])


def run_groups(out: str, groups: Sequence[Tuple[str, str, str]], count: int, seed: int, jobs: int,
               sample: bool = False) -> List[dict]:
    """Every group in its own process (its execution mode and MindFormers' registries are per process)."""
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)

    def one(group):
        log = os.path.join(out, "-".join(group) + ".log")
        with open(log, "w", encoding="utf-8") as handle:
            code = subprocess.call(_group_command(out, *group, count, seed, sample), stdout=handle,
                                   stderr=subprocess.STDOUT, env=env, cwd=out)
        return {"group": "-".join(group), "exit": code, "log": log}

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, groups))


def graph_against_pynative(out: str) -> List[dict]:
    """The graph baseline of each model and task against its PyNative baseline: a null pair."""
    records = []
    for model in MODELS:
        for task in TASKS:
            graph, pynative = (os.path.join(out, f"{model}-{mode}-{task}", "baseline") for mode in MODES)
            if os.path.isdir(graph) and os.path.isdir(pynative):
                code, result = compare(graph, pynative, os.path.join(out, f"compare-{model}-{task}-modes"))
                records.append({"null": "graph against PyNative", "model": model, "mode": "both", "task": task,
                                **judge(None, code, result)})
    with open(os.path.join(out, "null_modes.jsonl"), "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)
    return records


def load_results(out: str) -> Tuple[List[dict], List[dict]]:
    """(fault records, null-pair records) of every group under ``out``."""
    faults, nulls = [], []
    for name in sorted(os.listdir(out)):
        for path in (os.path.join(out, name, "results.jsonl"), os.path.join(out, name)):
            if os.path.isfile(path) and path.endswith(".jsonl"):
                with open(path, encoding="utf-8") as handle:
                    for line in handle:
                        record = json.loads(line)
                        (nulls if "null" in record else faults).append(record)
    return faults, nulls


# -- the tables -------------------------------------------------------------------------------------------------
def verdict_words(headline: str) -> str:
    """A headline's words with its numbers and names taken out: what kind of answer it gave."""
    text = headline.split(": ")[0] if headline.startswith(("FIRST", "NO ", "NOTHING")) else headline[:60]
    return re.sub(r"\d+(\.\d+)?", "N", text).strip()


def _magnitude_bin(value: Optional[float]) -> str:
    if value is None:
        return "discrete"
    low = 10 ** (math.floor(math.log10(value) * 2) / 2)
    return f"{low:.3g}-{low * math.sqrt(10):.3g}"


def tables(out: str) -> str:
    """The campaign's Markdown: per kind and cell kind, detection against magnitude, null pairs, kinds not made."""
    faults, nulls = load_results(out)
    rows: Dict[Tuple[str, str], List[dict]] = {}
    for record in faults:
        rows.setdefault((record["fault"]["kind"], record["fault"]["cell_kind"]), []).append(record)
    lines = ["| fault kind | cell kind | models | faults | right | wrong | missed | not run | loss unchanged | "
             "smallest right | largest not right | verdict words (count) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (kind, ckind), records in sorted(rows.items(), key=lambda i: ([k.name for k in KINDS].index(i[0][0]), i[0][1])):
        count = {o: sum(r["outcome"] == o for r in records) for o in ("right", "wrong", "missed", "not run")}
        right = [r["fault"]["magnitude"] for r in records if r["outcome"] == "right" and r["fault"]["magnitude"]]
        other = [r["fault"]["magnitude"] for r in records if r["outcome"] != "right" and r["fault"]["magnitude"]]
        words: Dict[str, int] = {}
        for r in records:
            key = verdict_words(r.get("headline") or r.get("error") or "")
            words[key] = words.get(key, 0) + 1
        models = ", ".join(sorted({r["fault"]["model"] for r in records}))
        unchanged = sum(r.get("losses_differ") is False for r in records)
        lines.append(f"| {kind} | {ckind} | {models} | {len(records)} | {count['right']} | {count['wrong']} | "
                     f"{count['missed']} | {count['not run']} | {unchanged} | "
                     f"{_fmt(min(right) if right else None)} | "
                     f"{_fmt(max(other) if other else None)} | "
                     + "; ".join(f"{w} ({n})" for w, n in sorted(words.items(), key=lambda i: -i[1])) + " |")
    lines += ["", "Detection against magnitude (right / faults, per half decade of the magnitude):", "",
              "| fault kind | magnitude | right / faults | wrong in (count) |", "|---|---|---|---|"]
    bins: Dict[Tuple[str, str], List[dict]] = {}
    for record in faults:
        bins.setdefault((record["fault"]["kind"], _magnitude_bin(record["fault"]["magnitude"])), []).append(record)
    for (kind, span), records in sorted(bins.items(), key=lambda i: ([k.name for k in KINDS].index(i[0][0]),
                                                                       _bin_start(i[0][1]))):
        parts: Dict[str, int] = {}
        for r in records:
            for part in r.get("wrong_in") or ([r["outcome"]] if r["outcome"] != "right" else []):
                parts[part] = parts.get(part, 0) + 1
        lines.append(f"| {kind} | {span} | {sum(r['outcome'] == 'right' for r in records)} / {len(records)} | "
                     + ", ".join(f"{p} ({n})" for p, n in sorted(parts.items())) + " |")
    lines += ["", "| null pair | runs | false alarms | verdict words |", "|---|---|---|---|"]
    for pair in ("same run twice", "graph against PyNative"):
        records = [r for r in nulls if r["null"] == pair]
        words = sorted({verdict_words(r.get("headline") or r.get("error") or "") for r in records})
        lines.append(f"| {pair} | {len(records)} | {sum(r['outcome'] != 'clean' for r in records)} | "
                     f"{'; '.join(words)} |")
    lines += [f"| {pair} | not in this campaign | - | {where} |" for pair, where in NULL_PAIRS_ELSEWHERE.items()]
    lines += ["", "Kinds that cannot be made on a model:", ""]
    lines += [f"- {k.name} on {', '.join(m for m in MODELS if m not in k.models)}: "
              + (k.what if not k.models else "the model has no such cell")
              for k in KINDS if set(k.models) != set(MODELS)]
    return "\n".join(lines) + "\n"


def _fmt(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3g}"


def _bin_start(span: str) -> float:
    return -1.0 if span == "discrete" else float(span.split("-")[0])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("run", "group", "table"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--faults", type=int, default=300, help="faults in all, shared over the groups (run)")
    parser.add_argument("--count", type=int, default=0, help="faults of this group (group)")
    parser.add_argument("--sample", action="store_true", help="the CI sample's faults of the model (group, run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--model", choices=MODELS)
    parser.add_argument("--mode", choices=MODES)
    parser.add_argument("--task", choices=TASKS)
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out)
    if args.command == "group":
        run_group(out, args.model, args.mode, args.task, args.count, args.seed, args.sample)
        return 0
    statuses: List[dict] = []
    if args.command == "run":
        groups = [(m, p, t) for m in args.models.split(",") for p in args.modes.split(",")
                  for t in args.tasks.split(",")]
        started = time.time()
        statuses = run_groups(out, groups, math.ceil(args.faults / len(groups)), args.seed, args.jobs, args.sample)
        graph_against_pynative(out)
        for status in statuses:
            print(f"{status['group']}: exit {status['exit']} ({status['log']})")
        print(f"campaign: {len(groups)} groups in {time.time() - started:.0f} s with {args.jobs} processes")
    text = tables(out)
    failed = [s for s in statuses if s["exit"]]
    if failed:  # a group that stopped (its baseline could not run) is named, never left out silently
        text += "\nGroups that stopped before their faults ran:\n\n" + "".join(
            f"- {s['group']}: exit {s['exit']}, see {s['log']}\n" for s in failed)
    with open(os.path.join(out, "table.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
