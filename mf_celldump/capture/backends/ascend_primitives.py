"""Every MindSpore primitive and private API the Ascend backends drive, in one replaceable object.

The ``tensordump`` and ``kbk_statistics`` backends take everything that touches
MindSpore's dump machinery from an :class:`AscendPrimitives`: the TensorDump /
DumpGradient primitives compiled into graphs, the eager kernels that move TensorDump's
step counter, its step filter, the device synchronisation, the kernel-by-kernel dump's
iteration controls, and the environment MindSpore reads its dump settings from.
``from_mindspore()`` builds the real one; tests on CPU pass a stand-in built by
``tests/support/ascend_emulation.py`` (the same backend code then runs end to end). Nothing
here may be imported by a backend directly, or it would escape the stand-in.

Source abbreviations used in comments (MindSpore repository paths):
TDC ``mindspore/ccsrc/tools/tensor_dump/tensordump.cc`` (``debug/dump/tensordump_control.cc``
up to 2.7.0), DCP ``mindspore/ccsrc/pybind_api/utils/dump_control_py.cc``, TDT
``mindspore/ccsrc/plugin/ascend/res_manager/mbuf_manager/tdt_manager.cc``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, MutableMapping, Sequence

from mf_celldump.capture.backends.base import synchronize_device
from mf_celldump.errors import BackendSetupError

# TDC GetTaskType: a TensorDump whose file name is exactly this moves the step counter
# that replaces ``{step}`` in later file names (TensorDumpManager::UpdateStep); it writes nothing.
UPDATE_STEP_FLAG = "<tensordump-update-step>"
# A step filter no step reaches (TDC NeedDump: `valid_steps_.empty() || valid_steps_.find(step) != end`):
# the way to say "write nothing", since the empty list means "every step". Fits size_t.
UNREACHABLE_STEP = 2**62
# Where this process's count of update markers is kept (see ``AscendPrimitives.updates_sent``).
UPDATES_SENT_ENV = "MF_CELLDUMP_TENSORDUMP_UPDATES"


@dataclass
class AscendPrimitives:
    """What the Ascend backends call; see the module docstring."""

    dump_out: Any  # ops.TensorDump(): graph-callable ``(file, x)``
    dump_in: Any  # ops.TensorDump("in")
    dump_gradient: Any  # ops.DumpGradient(): graph-callable ``(path, x, "in"|"out")``
    run_op_tensordump: Callable[[str, Any], None]  # one TensorDump kernel launched eagerly (device path)
    tensordump_python: Callable[[str, Any], None]  # ops.tensordump(file, x) eagerly (host python path)
    tensordump_set_step: Callable[[Sequence[int]], None]  # _c_expression._tensordump_set_step
    synchronize: Callable[[], None]  # every stream of the device has finished
    set_init_iter: Callable[[int], None]  # _c_expression._set_init_iter
    dump_step: Callable[[int], None]  # _c_expression._dump_step
    make_marker_tensor: Callable[[], Any]  # the small tensor markers carry
    environ: MutableMapping[str, str] = field(default_factory=lambda: os.environ)
    # MsContext::backend_policy(): TDT OpenTsd opens the TensorDump channel only under "ge".
    backend_policy: Callable[[], str] = lambda: "ge"
    soc_version: Callable[[], str] = lambda: ""  # MsContext ascend_soc_version(), e.g. "ascend910b"
    # mindspore.get_auto_parallel_context: the settings that decide how micro-batches are scheduled
    auto_parallel_context: Callable[[str], Any] = field(default_factory=lambda: _auto_parallel_context)

    @classmethod
    def from_mindspore(cls) -> AscendPrimitives:
        """The real primitives of the installed MindSpore; a missing API is named with the version."""
        import mindspore as ms
        from mindspore import Tensor, ops

        c_expression = _module("mindspore._c_expression", ms.__version__)
        primitive = _module("mindspore.ops.primitive", ms.__version__)
        set_step = _require(c_expression, "_tensordump_set_step", ms.__version__)
        init_iter = _require(c_expression, "_set_init_iter", ms.__version__)
        dump_step = _require(c_expression, "_dump_step", ms.__version__)
        run_op = _require(primitive, "_run_op", ms.__version__)
        dump_gradient = _require(ops, "DumpGradient", ms.__version__)
        tensordump = _require(ops, "tensordump", ms.__version__)

        def run_op_tensordump(file: str, tensor) -> None:
            # A TensorDump kernel launched on its own travels the device -> host channel, like
            # the graph's TensorDumps, so its counter update applies to them (kCallFromCXX);
            # MindSpore's test_tensordump_when_graph_pynative_hybrid_rank_step and msprobe 26.2
            # (GraphModeCellDump.step) send the update marker this way.
            run_op(ops.TensorDump(), "TensorDump", (file, tensor))

        def synchronize() -> None:
            if ms.get_context("device_target") == "CPU":  # no "[ERROR] CPU device is not supported" printed
                synchronize_device("CPU")
            else:
                ms.runtime.synchronize()

        return cls(
            dump_out=ops.TensorDump(),
            dump_in=ops.TensorDump("in"),
            dump_gradient=dump_gradient(),
            run_op_tensordump=run_op_tensordump,
            tensordump_python=tensordump,
            tensordump_set_step=set_step,
            synchronize=synchronize,
            set_init_iter=init_iter,
            dump_step=dump_step,
            make_marker_tensor=lambda: Tensor([0.0], ms.float32),
            backend_policy=_backend_policy,
            soc_version=_soc_version,
        )

    # -- the process-wide count of update markers ------------------------------------
    def updates_sent(self) -> int:
        """Update markers sent through the device path in this process = TensorDump's graph step now.

        MindSpore keeps the counter in a process-wide singleton (TDC ``step_``, starting at 0)
        and offers no way to read it; the count is kept beside it, in this process's
        environment, tagged with the process id so a child process (which starts a new
        counter at 0) does not inherit it.
        """
        pid, _, count = self.environ.get(UPDATES_SENT_ENV, "").partition(":")
        if pid != str(os.getpid()) or not count.isdigit():
            return 0
        return int(count)

    def send_update_marker(self) -> None:
        """Move TensorDump's step counters: the graph one (device path) and the python one."""
        marker = self.make_marker_tensor()
        self.run_op_tensordump(UPDATE_STEP_FLAG, marker)
        self.environ[UPDATES_SENT_ENV] = f"{os.getpid()}:{self.updates_sent() + 1}"
        # The python-path counter serves eager TensorDump calls ({step} in PyNative code);
        # msprobe 26.2 and MindSpore's own hybrid test move it too.
        self.tensordump_python(UPDATE_STEP_FLAG, marker)


def _backend_policy() -> str:
    """``MsContext::backend_policy()``. The Ascend plugin's context init sets "ge" whenever the device
    target is Ascend, and the device context's Initialize then calls OpenTsd
    (``plugin/ascend/ascend_device_context.cc`` MSCONTEXT_REGISTER_INIT_FUNC,
    ``AscendDeviceContext::Initialize``). A private getter: if it goes away, assume the Ascend default
    rather than refuse."""
    import mindspore as ms

    try:
        return str(ms.context._context()._context_handle.get_backend_policy())
    except (AttributeError, RuntimeError, TypeError):
        return "ge"


def _soc_version() -> str:
    """``MsContext::ascend_soc_version()`` ("ascend910" is 910A, "ascend910b" 910B1-4), "" if unknown."""
    try:
        from mindspore._c_expression import MSContext

        return str(MSContext.get_instance().get_ascend_soc_version())
    except (ImportError, AttributeError, RuntimeError):
        return ""

def _auto_parallel_context(key: str) -> Any:
    import mindspore as ms

    return ms.get_auto_parallel_context(key)


def _module(name: str, version: str):
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise BackendSetupError(f"MindSpore {version} has no module {name} ({err}); "
                                "Ascend capture needs MindSpore 2.7.0 or later") from None


def _require(owner, name: str, version: str):
    value = getattr(owner, name, None)
    if value is None:
        raise BackendSetupError(f"MindSpore {version} has no {owner.__name__}.{name}, which Ascend capture "
                                "needs (available from MindSpore 2.7.0)")
    return value
