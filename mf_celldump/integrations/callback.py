"""``CellDumpCallback``: cell dumps from a MindFormers YAML, ``Trainer(callbacks=...)`` or ``Model.train``.

One class serves two callback APIs, told apart by the arguments it is called with:

* MindSpore's (``Model.train``, MindFormers 1.x): ``on_train_begin(run_context)`` etc.;
* MindFormers 2.0's PyNative trainer: ``on_train_begin(args, state, model=[chunks], ...)``,
  ``on_step_begin(args, state, ...)``, ``on_step_end(args, state, loss=..., ...)``.

Capture is attached before any graph compilation: a scoped hook on
``mindspore.train.Model.build``/``infer_train_layout`` (see ``compile_hook``) catches
MindFormers runs that compile before ``Model.train``; otherwise ``on_train_begin`` attaches.
The hook is installed by the constructor (YAML callbacks are built before MindFormers
creates its ``Model``) and removed when training ends.

Importing this module imports MindSpore but never MindFormers. The class registers
itself with MindFormers' registry if MindFormers is already imported, and
``mf_celldump/registration/celldump_callback.py`` (the file YAML ``auto_register``
loads) registers it otherwise.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any, Optional, Union

from mindspore.train import Callback

from mf_celldump.config import ConfigError, DumpConfig
from mf_celldump.integrations.compile_hook import ModelCompileHook
from mf_celldump.integrations.lifecycle import DumpLifecycle, RunSummary

logger = logging.getLogger(__name__)


class CellDumpCallback(Callback):
    """Dump inputs/outputs (and gradients) of every selected cell for the selected steps.

    Keywords are the configuration keys (see README, "Configuration reference"); they are
    validated here, so a bad value fails when the callback is built, before training.
    ``config`` may hold a ``DumpConfig`` or a dict of the same keys (keywords win).
    """

    def __init__(self, config: Union[DumpConfig, Mapping, None] = None, **keys: Any):
        super().__init__()
        self.config = _build_config(config, keys)
        _make_log_visible()
        self._life = DumpLifecycle(self.config)
        self._step_offset = 0
        self._last_step_num: Optional[int] = None
        self._warned_multi_step = False
        self._hook = ModelCompileHook(self._on_model_compile).install()

    # ------------------------------------------------------------------------------------
    # public helpers
    @property
    def dump(self):
        """The attached ``CellDump`` of the current (or last) run, or None."""
        return self._life.dump

    @property
    def summary(self) -> RunSummary:
        return self._life.summary

    def close(self) -> Optional[RunSummary]:
        """Finish now: detach, process what is complete, remove the compile hook."""
        self._hook.remove()
        return self._life.finish(failed=False)

    # ------------------------------------------------------------------------------------
    # compile hook (Model.build / Model.infer_train_layout before Model.train)
    def _on_model_compile(self, model, train_dataset=None) -> None:
        if self._life.finished:
            return
        network = getattr(model, "_network", None)
        if network is None:
            network = getattr(model, "train_network", None)
        if network is None:
            logger.warning("mf_celldump: Model without a network compiled; capture not attached")
            return
        try:
            self._life.ensure_attached(network, initial_step=_dataset_init_step(train_dataset),
                                       origin=f"{type(model).__name__}.build (before compile)")
        except BaseException:
            # Training will not start, so no on_train_end/__exit__ would remove the hook.
            self._hook.remove()
            raise

    # ------------------------------------------------------------------------------------
    # MindSpore callback API, and the MindFormers 2.0 API under the same names
    def on_train_begin(self, *args, **kwargs):
        if _is_mindspore_call(args, kwargs):
            self._ms_train_begin(args[0])
        else:
            self._mf2_train_begin(*args, **kwargs)

    def on_train_step_begin(self, run_context):
        params = run_context.original_args()
        current = int(_param(params, "cur_step_num", 0))
        first = self._last_step_num if self._last_step_num is not None else current - 1
        if current - first > 1 and not self._warned_multi_step:
            self._warned_multi_step = True
            logger.warning(
                "mf_celldump: one callback step covers %d training steps (data sink); they are captured "
                "as step %d unless the capture backend numbers graph steps itself. Use sink_size 1 "
                "for one folder per step.", current - first, first + self._step_offset,
            )
        self._life.begin_step(first + self._step_offset)

    def on_train_step_end(self, run_context):
        params = run_context.original_args()
        self._last_step_num = int(_param(params, "cur_step_num", 0))
        self._life.end_step()

    def on_train_end(self, *args, **kwargs):
        # Same for both APIs.
        self._finish(failed=False)

    def __exit__(self, exc_type, exc, tb):
        # Runs also when training raises: process what is complete, keep the failed step
        # raw, and let the exception through.
        self._finish(failed=exc_type is not None)
        return False

    # MindFormers 2.0 PyNative trainer: the remaining events of its callback protocol.
    def on_step_begin(self, args=None, state=None, **kwargs):
        if not self._life.attached and kwargs.get("model") is not None:
            self._mf2_train_begin(args, state, **kwargs)
        self._life.begin_step(int(_param(state, "global_step", 0)))

    def on_step_end(self, args=None, state=None, **kwargs):
        self._life.end_step()

    def on_begin(self, args=None, state=None, **kwargs):
        """MindFormers 2.0 task start: nothing to do."""

    def on_end(self, args=None, state=None, **kwargs):
        self._finish(failed=False)

    def on_epoch_begin(self, args=None, state=None, **kwargs):
        """MindFormers 2.0 epoch start: steps carry the global step, nothing to do."""

    def on_epoch_end(self, args=None, state=None, **kwargs):
        """MindFormers 2.0 epoch end: nothing to do."""

    # ------------------------------------------------------------------------------------
    def _ms_train_begin(self, run_context) -> None:
        params = run_context.original_args()
        network = _param(params, "network")
        if network is None:  # Cells with __len__ can be falsy: compare with None
            network = _param(params, "train_network")
        start = int(_param(params, "cur_step_num", 0) or 0)
        self._step_offset = _initial_step_offset(params, self)
        self._last_step_num = start
        first_step = start + self._step_offset
        if self._life.finished:  # a second training run with the same callback
            self._life = DumpLifecycle(self.config)
        dump = self._life.dump
        if dump is not None and dump.network is not network and _unwrapped(dump.network) is not \
                _unwrapped(network):
            logger.warning(
                "mf_celldump: capture was attached at compile time to %s but training runs %s; "
                "re-attaching to the training network", type(dump.model).__name__, type(network).__name__,
            )
            dump.detach()
            self._life = DumpLifecycle(self.config)
        elif dump is not None and dump.initial_step != first_step:
            logger.info("mf_celldump: attached before compile with first step %d; training starts at "
                        "global step %d", dump.initial_step, first_step)
        self._life.ensure_attached(network, initial_step=first_step, origin="on_train_begin")

    def _mf2_train_begin(self, args=None, state=None, **kwargs) -> None:
        if self._life.finished:
            self._life = DumpLifecycle(self.config)
        network = _model_root(kwargs.get("model"))
        if network is None:
            raise ValueError(
                "CellDumpCallback: on_train_begin got no model (expected model=<Cell or list of model "
                "chunks> from the MindFormers 2.0 trainer)"
            )
        self._life.ensure_attached(
            network,
            initial_step=int(_param(state, "global_step", 0) or 0),
            output_dir=_param(args, "output_dir"),
            origin="on_train_begin (MindFormers 2.0 trainer)",
        )

    def _finish(self, failed: bool) -> None:
        self._hook.remove()
        self._life.finish(failed=failed)


# ----------------------------------------------------------------------------------------
def _build_config(config, keys) -> DumpConfig:
    if isinstance(config, DumpConfig):
        merged = config.to_dict()
    elif config is None:
        merged = {}
    elif isinstance(config, Mapping):
        merged = dict(config)
    else:
        raise ConfigError(
            f"CellDumpCallback: config must be a DumpConfig or a dict of configuration keys, "
            f"got {type(config).__name__}"
        )
    # MindFormers passes YAML mappings as its own dict subclass; keys are plain strings.
    merged.update({k: v for k, v in keys.items() if k != "auto_register"})
    built = DumpConfig.from_dict(merged, source="CellDumpCallback")
    if built.dump_path:
        path = built.resolved_dump_path()
        if os.path.exists(path) and not (os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)):
            raise ConfigError(f"CellDumpCallback: dump_path {path!r} exists but is not a writable directory")
    return built


def _make_log_visible() -> None:
    """Show our INFO messages (attach, per-step processing, the final summary) in a training log.

    MindFormers logs through its own logger, so in a run_mindformer.py job nothing
    configures Python's root logger and INFO records of ``mf_celldump`` would vanish. Only
    when neither the root logger nor ``mf_celldump``'s has a handler does this add one.
    """
    package_logger = logging.getLogger("mf_celldump")
    if package_logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package_logger.addHandler(handler)
    if package_logger.level == logging.NOTSET:
        package_logger.setLevel(logging.INFO)


def _is_mindspore_call(args, kwargs) -> bool:
    return len(args) == 1 and not kwargs and hasattr(args[0], "original_args")


def _param(params, key: str, default=None):
    """Read ``key`` from MindSpore's callback params (a dict), a config or a state object."""
    if params is None:
        return default
    value = params.get(key, default) if isinstance(params, Mapping) else getattr(params, key, default)
    return default if value is None else value


def _initial_step_offset(params, me) -> int:
    """How many steps ran before ``cur_step_num`` started counting (resumed MindFormers runs).

    MindFormers 1.x resumes by skipping data and passing ``runner_config.initial_step`` to
    its own monitors (``default_args``), while MindSpore's ``cur_step_num`` restarts at 0;
    MindSpore's ``initial_step`` param is set only on fault-tolerance restarts (then it wins,
    as in MindFormers' monitors). Callbacks built from YAML receive no such argument, so read
    the value MindFormers gave its own monitors, else the dataset's resume step.
    """
    explicit = _param(params, "initial_step")
    if explicit is not None:
        return int(explicit)
    for callback in _param(params, "list_callback", ()) or ():
        if callback is me or not type(callback).__module__.startswith("mindformers"):
            continue
        value = getattr(callback, "initial_step", None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    # No MindFormers monitor in the run: MindFormers also tells the dataset how many steps
    # to skip on resume (``data_skip_steps``, by default ``initial_step``).
    return _dataset_init_step(_param(params, "train_dataset"))


def _dataset_init_step(dataset) -> int:
    """The step a dataset resumes from (MindFormers sets it when resuming), else 0."""
    getter = getattr(dataset, "get_init_step", None)
    if getter is None:
        return 0
    try:
        return int(getter() or 0)
    except Exception:  # not every dataset node supports it
        return 0


def _unwrapped(network):
    from mf_celldump.capture.selection import unwrap

    return unwrap(network)


def _model_root(model):
    """The cell to name from: the model, or a container for several pipeline chunks."""
    if isinstance(model, (list, tuple)):
        chunks = [m for m in model if m is not None]
        if not chunks:
            return None
        if len(chunks) == 1:
            return chunks[0]
        from mf_celldump.integrations.chunks import ModelChunks

        return ModelChunks(chunks)
    return model


def register_with_mindformers(cls=CellDumpCallback) -> None:
    """Register ``cls`` as a MindFormers CALLBACK so YAML ``type: CellDumpCallback`` finds it."""
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

    registry = MindFormerRegister.registry.get(MindFormerModuleType.CALLBACK, {})
    if registry.get(cls.__name__) is not cls:
        MindFormerRegister.register_cls(cls, module_type=MindFormerModuleType.CALLBACK)


if "mindformers" in sys.modules:
    # MindFormers is loaded already (e.g. the user's script imported it first): register now.
    # Otherwise importing this module must not import MindFormers (slow, creates ./output);
    # the registration module does it for YAML runs.
    try:
        register_with_mindformers()
    except Exception as _err:  # a partial/odd MindFormers install must not break the import
        logger.debug("MindFormers registration skipped: %s", _err)
