"""The stand-in's own parts (see ../README.md); the package's modules re-export them under the paths
MindFormers 2.1 imports. Written from hyper_parallel's source (repository mindspore-ai/hyper-parallel):
each object names the file it stands for."""

from __future__ import annotations

import enum


def needs_cards(qualified_name: str, source: str):
    """A class for a hyper_parallel object that only a run on several cards uses: building or calling it
    raises, naming it (``source``: the file of hyper_parallel it stands for)."""

    def refuse(*args, **kwargs):
        raise NotImplementedError(f"{qualified_name} ({source}) is not in the test stand-in of hyper_parallel: "
                                  "it is used on several cards only")

    return type(qualified_name.rsplit(".", 1)[-1], (), {"__new__": lambda cls, *a, **k: refuse(),
                                                        "__doc__": f"Stand-in for {source}: refused."})


def refused_function(qualified_name: str, source: str):
    def function(*args, **kwargs):
        raise NotImplementedError(f"{qualified_name} ({source}) is not in the test stand-in of hyper_parallel: "
                                  "it is used on several cards only")
    function.__name__ = qualified_name.rsplit(".", 1)[-1]
    return function


class DTensor:
    """``hyper_parallel/core/dtensor.py`` ``DTensor``: a tensor with a device mesh and placements. On one card
    no tensor is one; 2.1 only asks ``isinstance``."""

    def __new__(cls, *args, **kwargs):
        raise NotImplementedError("DTensor (hyper_parallel/core/dtensor.py) needs a device mesh: several cards")


class SkipDTensorDispatch:
    """``hyper_parallel/core/dtensor.py`` ``SkipDTensorDispatch``: turns DTensor op dispatch off inside the
    block (``core/shard/_op_dispatch``). With no DTensor there is nothing to turn off."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class HSDPModule:
    """``hyper_parallel/core/fully_shard/api.py`` ``HSDPModule``: the class ``fully_shard`` mixes into a sharded
    module. A single-card model is never one."""


class Placement:
    """``hyper_parallel/core/placement_types.py``: how a tensor lies over one mesh axis."""

    def is_shard(self, dim=None):
        return False

    def is_replicate(self):
        return False

    def is_partial(self, reduce_op=None):
        return False


class Shard(Placement):
    """Split along tensor axis ``dim``."""

    def __init__(self, dim: int):
        self.dim = dim

    def is_shard(self, dim=None):
        return dim is None or dim == self.dim

    def __eq__(self, other):
        return isinstance(other, Shard) and other.dim == self.dim

    def __hash__(self):
        return hash(("Shard", self.dim))


class Replicate(Placement):
    """The whole tensor on every rank of the axis."""

    def is_replicate(self):
        return True

    def __eq__(self, other):
        return isinstance(other, Replicate)

    def __hash__(self):
        return hash("Replicate")


class Partial(Placement):
    """Each rank holds a part of a sum (or other reduction) still to be reduced."""

    def __init__(self, reduce_op: str = "sum"):
        self.reduce_op = reduce_op

    def is_partial(self, reduce_op=None):
        return reduce_op is None or reduce_op == self.reduce_op

    def __eq__(self, other):
        return isinstance(other, Partial) and other.reduce_op == self.reduce_op

    def __hash__(self):
        return hash(("Partial", self.reduce_op))


class CheckpointPolicy(enum.Enum):
    """``hyper_parallel/core/activation_checkpoint/activation_checkpoint.py`` ``CheckpointPolicy``: what
    selective recompute does with an op's output (save, recompute, or swap to host)."""

    MUST_SAVE = 0
    PREFER_SAVE = 1
    MUST_RECOMPUTE = 2
    PREFER_RECOMPUTE = 3
    MUST_SWAP = 4


class HookRole(enum.Enum):
    """``core/pipeline_parallel/hook_coordinator`` roles (pipeline overlap only)."""

    FORWARD = 0
    BACKWARD = 1


class MetaStepType(enum.Enum):
    """``core/pipeline_parallel`` schedule step kinds (pipeline schedules only)."""

    FWD = 0
    BWD = 1


class OffloadPolicy:
    """``hyper_parallel/core/fully_shard/utils.py``: no offload."""


class CPUOffloadPolicy(OffloadPolicy):
    """``hyper_parallel/core/fully_shard/utils.py``: parameters kept on the host (fully_shard only)."""

    def __init__(self, pin_memory: bool = True):
        self.pin_memory = pin_memory


class MixedPrecisionPolicy:
    """``hyper_parallel/core/fully_shard/api.py`` mixed precision of a sharded module's parameters and reduce."""

    def __init__(self, param_dtype=None, reduce_dtype=None, output_dtype=None, cast_forward_inputs=True):
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.output_dtype, self.cast_forward_inputs = output_dtype, cast_forward_inputs
