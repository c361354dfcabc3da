"""``CellDumpCallback``: cell dumps from a MindFormers YAML, ``Trainer(callbacks=...)`` or ``Model.train``.

One class serves two trainer protocols, told apart by the arguments it is called with,
each translated by its adapter into the calls of one ``TrainingRun``:

* MindSpore's (``Model.train``, MindFormers 1.x): ``on_train_begin(run_context)`` etc.
  (``mindspore_callback.MindSporeAdapter``);
* MindFormers 2.x's PyNative trainer: ``on_train_begin(args, state, model=[chunks], ...)``,
  ``on_step_begin(args, state, ...)``, ``on_step_end(args, state, loss=..., ...)``
  (``mindformers2.MindFormers2Adapter``).

Capture is attached before any graph compilation: a scoped hook on
``mindspore.train.Model.build``/``infer_train_layout`` (see ``compile_hook``) catches
MindFormers runs that compile before ``Model.train``; otherwise ``on_train_begin`` attaches.
The hook is installed by the constructor (YAML callbacks are built before MindFormers
creates its ``Model``) and removed when training ends.

Importing this module imports MindSpore but never MindFormers. The class registers
itself with MindFormers' registry if MindFormers is already imported, and
``mf_celldump/integrations/registration/celldump_callback.py`` (the file YAML ``auto_register``
loads) registers it otherwise.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any, Optional, Union

from mindspore.train import Callback

from mf_celldump.config import DumpConfig
from mf_celldump.errors import ConfigError
from mf_celldump.fsutil import writable_dir_problem
from mf_celldump.integrations.compile_hook import ModelCompileHook
from mf_celldump.integrations.mindformers2 import MindFormers2Adapter
from mf_celldump.integrations.mindspore_callback import MindSporeAdapter, dataset_init_step
from mf_celldump.integrations.run import RunSummary, TrainingRun

logger = logging.getLogger(__name__)


class CellDumpCallback(Callback):
    """Dump inputs/outputs (and gradients) of every selected cell for the selected steps.

    Output is msprobe's dump layout, ``<dump_path>/step{N}/rank{R}/`` (``rank/`` on a single
    card), readable by ``msprobe compare``/``graph_visualize`` and ``mf-celldump compare``.
    Capture is attached before the graph is compiled (``on_train_begin``, or earlier when
    MindFormers compiles first); each captured step is processed by a worker process beside
    training, and ``on_train_end`` waits for it (unless ``process_on_train_end`` is False).
    Every keyword is validated here, so a bad value raises ``ConfigError`` (naming the key,
    the value and what is valid) when the callback is built, before training; an unknown
    key does too, with the closest valid key.

    Args:
        config (Union[DumpConfig, dict], optional): A ``DumpConfig``, or a dict of the keys
            below. Keywords given beside it win. Default: ``None`` (every key at its default).
        dump_path (str, optional): Folder for the raw capture (``_raw/``) and the processed
            dump (``step{N}/``). One folder holds one run: a folder holding another run's dump
            is refused before training; a resumed run continues its own. Default: ``None``,
            meaning ``<output root>/celldump`` beside MindFormers' own output: ``$LOCAL_DEFAULT_PATH``
            (MindFormers 1.x sets it from the run config's ``output_dir``), else ``./output``.
            MindFormers 2.x's PyNative trainer ignores a config's ``output_dir``, and so does this.
        task (str, optional): ``"statistics"`` (numbers only) or ``"tensor"`` (every value as
            a ``.npy`` file, plus statistics). Default: ``"statistics"``.
        data_mode (str, optional): ``"forward"``, ``"backward"`` or ``"all"``. Default: ``"all"``.
        steps (Union[str, int, list], optional): Global steps to capture, 0-based: ``"all"``,
            an int, a string such as ``"0,5-7"``, or a list such as ``[0, "5-7"]`` (at most
            10,000 items). Default: ``"all"``.
        ranks (Union[str, int, list], optional): Ranks that capture, same syntax as ``steps``.
            Default: ``"all"``.
        include (Union[str, list[str]], optional): ``fnmatch`` patterns (case-sensitive) on
            cell names as ``cells_and_names()`` gives them after training wrappers are peeled
            off, e.g. ``"model.layers.*"``; an empty list is refused. The model root,
            classes whose names start with ``_`` and ``grad_reducer`` are never captured.
            Default: ``["*"]``.
        exclude (Union[str, list[str]], optional): Patterns of cell names to skip, applied
            after ``include``. Default: ``[]``.
        exclude_classes (Union[str, list[str]], optional): Cell class names to skip, exactly
            as ``type(cell).__name__``. Default: ``[]``.
        layer_mapping (Union[str, list[str]], optional): ``"auto"`` (the bundled mappings
            with a section for a class of the network), bundled names (``"llama"``,
            ``"mcore_gpt"``), paths of your own YAML mapping files (layered over the bundled
            ones, yours win per class and child), or ``"none"``/``None``/``False`` for no
            mapping. Default: ``"auto"``. See ``docs/layer-mapping.md``.
        statistics (Union[str, list[str]], optional): Any of ``"max"``, ``"min"``, ``"mean"``,
            ``"norm"``, ``"md5"`` (msprobe's name for a CRC-32), ``"nan_count"``,
            ``"inf_count"``; not empty. Default: ``["max", "min", "mean", "norm"]``.
        backend (str, optional): ``"auto"`` picks by device, mode and task (one log line
            says which and why); or force one of ``"tensordump"``, ``"host"``,
            ``"device_stats"`` (statistics task only), ``"kbk_statistics"``. Default:
            ``"auto"``. See ``docs/capture.md``.
        parameters (bool, optional): Record each captured cell's own weights in its forward
            entries and their gradients as ``parameters_grad`` entries, as msprobe's L0 dump
            does. Default: ``True``.
        process_on_train_end (bool, optional): Process complete steps in a worker process
            during training and at its end; ``False`` leaves everything raw for
            ``mf-celldump process``. Default: ``True``.
        process_timeout (float, optional): Seconds ``on_train_end`` waits for processing
            still running, > 0 and at most a year; what is left stays raw for
            ``mf-celldump process``. Default: ``1800``.
        jobs (int, optional): Processes the processing of a step uses, a positive int.
            Default: ``None``: 1 in the worker process beside training, the CPU count when
            the training process processes steps itself (the worker could not start).
            ``mf-celldump process`` has its own ``--jobs``.
        rank_verdict (bool, optional): In a distributed run rank 0 logs, per captured step,
            which replica went wrong first and where. Default: ``True``. See ``docs/ranks.md``.
        rank_verdict_timeout (float, optional): Seconds rank 0 waits at train end for the
            other ranks' summaries, > 0 and at most a year. Default: ``20`` (below
            MindSpore's 30 s node timeout).
        replica_groups (str, optional): Which ranks are data-parallel replicas: ``"all"``,
            ``"model_parallel=T[,pipeline_stages=P]"``, or groups such as ``"0,2;1,3"`` or
            ``"0-3;4-7"``. Default: ``"all"``.
        watch (Union[bool, dict], optional): Check every step's loss, overflow flag and global norm (what the
            step already returned) against rules: ``true`` for the defaults, or a mapping of ``nan_inf_loss``,
            ``nan_inf_grad_norm``, ``overflow``, ``loss_spike``, ``grad_norm_spike``, ``spike_window``, ``stop``.
            With ``steps: "anomaly"`` the step a rule fires at is captured (rerun where the wrapper skipped its
            update, else the next step). Default: ``False``. See ``docs/watch.md``.
        anomaly_captures (int, optional): With ``steps: "anomaly"``: captures per run at most. Default: ``1``.
        anomaly_max_bytes (int, optional): With ``steps: "anomaly"``: no capture that would take ``dump_path``
            past this many bytes. Default: ``None`` (no bound).
        auto_register (str, optional): Accepted and ignored; in a YAML entry it tells
            MindFormers to import the registration module
            (``celldump_callback.CellDumpCallback``).

    Raises:
        ConfigError: A key is unknown, a value is invalid, or ``dump_path`` is not a
            writable folder.

    Examples:
        In a MindFormers run config, launched with
        ``--register_path "$(mf-celldump register-path)"``:

        .. code-block:: yaml

            callbacks:
              - type: MFLossMonitor
              - type: CellDumpCallback
                auto_register: celldump_callback.CellDumpCallback
                task: statistics
                data_mode: all
                steps: "0,5-7"
                ranks: "0-7"
                layer_mapping: auto
                dump_path: /cache/celldump

        From Python, with MindFormers' ``Trainer`` or MindSpore's ``Model.train``:

        >>> from mf_celldump import CellDumpCallback
        >>> dump = CellDumpCallback(task="tensor", steps="0-1", include=["model.layers.0.*"])
        >>> trainer = Trainer(config, callbacks=[dump])           # mindformers.Trainer
        >>> trainer.train()
        >>> model.train(2, dataset, callbacks=[dump])              # or mindspore.train.Model
        >>> dump.summary                                           # what was captured and processed
    """

    def __init__(self, config: Union[DumpConfig, Mapping, None] = None, **keys: Any):
        super().__init__()
        self.config = _build_config(config, keys)
        _make_log_visible()
        self._run = TrainingRun(self.config)
        self._mindspore = MindSporeAdapter(self)
        self._mindformers2 = MindFormers2Adapter()
        self._hook = ModelCompileHook(self._on_model_compile).install()

    @property
    def dump(self):
        """The attached ``CellDump`` of the current (or last) run, or None."""
        return self._run.dump

    @property
    def summary(self) -> RunSummary:
        return self._run.summary

    def close(self) -> Optional[RunSummary]:
        """Finish now: detach, process what is complete, remove the compile hook."""
        self._hook.remove()
        return self._run.finish(failed=False)

    def _fresh_run(self) -> TrainingRun:
        """The run to use for a new training: a second ``train()`` with this callback starts anew."""
        if self._run.finished:
            self._run = TrainingRun(self.config, run_tag=self._run.run_tag + 1)
        return self._run

    # -- compile hook (Model.build / Model.infer_train_layout before Model.train) ----------
    def _on_model_compile(self, model, train_dataset=None) -> None:
        if self._run.finished:
            return
        network = getattr(model, "_network", None)
        if network is None:
            network = getattr(model, "train_network", None)
        if network is None:
            logger.warning("mf_celldump: Model without a network compiled; capture not attached")
            return
        try:
            self._run.ensure_attached(network, initial_step=dataset_init_step(train_dataset),
                                      origin=f"{type(model).__name__}.build (before compile)")
        except BaseException:
            # Training will not start, so no on_train_end/__exit__ would remove the hook.
            self._hook.remove()
            raise

    # -- MindSpore's protocol, and MindFormers 2.x's under the same names -----------------
    def on_train_begin(self, *args, **kwargs):
        if _is_mindspore_call(args, kwargs):
            self._mindspore.on_train_begin(self._fresh_run(), args[0])
        else:
            self._mindformers2.on_train_begin(self._fresh_run(), *args, **kwargs)

    def on_train_step_begin(self, run_context):
        self._mindspore.on_train_step_begin(self._run, run_context)

    def on_train_step_end(self, run_context):
        self._mindspore.on_train_step_end(self._run, run_context)

    def on_train_end(self, *args, **kwargs):
        self._finish(failed=False)  # same for both protocols

    def __exit__(self, exc_type, exc, tb):
        # Runs also when training raises: process what is complete, keep the failed step
        # raw, and let the exception through.
        self._finish(failed=exc_type is not None)
        return False

    # MindFormers 2.x PyNative trainer: the remaining events of its protocol.
    def on_step_begin(self, args=None, state=None, **kwargs):
        self._mindformers2.on_step_begin(self._run, args, state, **kwargs)

    def on_step_end(self, args=None, state=None, **kwargs):
        self._mindformers2.on_step_end(self._run, args, state, **kwargs)

    def on_begin(self, args=None, state=None, **kwargs):
        """MindFormers 2.x task start: nothing to do."""

    def on_end(self, args=None, state=None, **kwargs):
        self._finish(failed=False)

    def on_epoch_begin(self, args=None, state=None, **kwargs):
        """MindFormers 2.x epoch start: steps carry the global step, nothing to do."""

    def on_epoch_end(self, args=None, state=None, **kwargs):
        """MindFormers 2.x epoch end: nothing to do."""

    def _finish(self, failed: bool) -> None:
        self._hook.remove()
        self._run.finish(failed=failed)


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
        problem = writable_dir_problem(built.resolved_dump_path(), create=False)
        if problem:
            raise ConfigError(f"CellDumpCallback: dump_path {problem}")
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
