"""Stand-in of ``hyper_parallel/__init__.py`` (the names MindFormers 2.1 imports from the top package)."""

from hyper_parallel._standin import DTensor, SkipDTensorDispatch, needs_cards, refused_function
from hyper_parallel.platform import get_platform

DeviceMesh = needs_cards("hyper_parallel.DeviceMesh", "hyper_parallel/core/device_mesh.py")
PipelineStage = needs_cards("hyper_parallel.PipelineStage", "hyper_parallel/core/pipeline_parallel")
init_device_mesh = refused_function("hyper_parallel.init_device_mesh", "hyper_parallel/core/device_mesh.py")
shard_module = refused_function("hyper_parallel.shard_module", "hyper_parallel/core/shard/api.py")
init_process_group = refused_function("hyper_parallel.init_process_group", "hyper_parallel/collectives/cc.py")

__all__ = ["DTensor", "DeviceMesh", "PipelineStage", "SkipDTensorDispatch", "get_platform", "init_device_mesh",
           "init_process_group", "shard_module"]
