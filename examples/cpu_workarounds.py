"""CPU-only workarounds for training MindFormers 1.9's legacy LLaMA on a machine without NPU.

They belong to the example (and the tests), never to mf_celldump itself:

* ``CpuTrainOneStepCell``: ``MFTrainOneStepCell`` checks gradient overflow with NPU
  float-status ops that do not exist on CPU; this subclass checks ``isfinite`` instead.
  It is registered as a MindFormers WRAPPER so YAML ``runner_wrapper: {type:
  CpuTrainOneStepCell}`` finds it.
* In the model config (see ``tiny_llama.yaml``): ``use_rope_slice: True`` (else a
  BatchMatMul broadcast fails on CPU), ``fused_rms_norm: False`` (the fused RmsNorm kernel
  is Ascend-only), ``use_flash_attention: False``, and ``sink_mode: False``.
"""

from __future__ import annotations

from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
from mindformers.wrapper import MFTrainOneStepCell
from mindspore import ops


class CpuTrainOneStepCell(MFTrainOneStepCell):
    """MFTrainOneStepCell whose overflow check works on CPU (any non-finite gradient)."""

    def get_overflow_status(self, status, compute_output):
        non_finite = [ops.logical_not(ops.isfinite(grad).all()) for grad in compute_output]
        return ops.stack(non_finite).any()


def register() -> None:
    """Make ``type: CpuTrainOneStepCell`` resolvable in a MindFormers run config."""
    registry = MindFormerRegister.registry.get(MindFormerModuleType.WRAPPER, {})
    if registry.get(CpuTrainOneStepCell.__name__) is not CpuTrainOneStepCell:
        MindFormerRegister.register_cls(CpuTrainOneStepCell, module_type=MindFormerModuleType.WRAPPER)


register()
