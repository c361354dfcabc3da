"""A scoped hook that runs a callback just before ``mindspore.train.Model`` compiles ahead of ``train()``.

Why: MindFormers sometimes compiles the training graph before ``Model.train`` runs
(distributed graph runs that load a checkpoint, ``only_save_strategy``, the
``compile_model`` helper). All of those go through ``Model.build`` (MindFormers 1.9:
``mindformers/checkpoint/utils.py::compile_model`` and
``mindformers/trainer/utils.py::transform_and_load_checkpoint`` call ``model.build``);
``Model.infer_train_layout`` compiles the same training graph. Cells wrapped after that
compile are silently ignored, so capture must be attached before it. The ``Model``
instance does not exist yet when a YAML callback is built (MindFormers creates the
callbacks first, then ``Model(...)``, then compiles), so the hook patches the two
methods on the class, only while a callback owns it, and restores them on ``remove()``.

The patched methods hold the owner weakly: a forgotten hook never keeps a callback
alive, and when the owner is garbage-collected the methods are restored.
"""

from __future__ import annotations

import logging
import weakref
from typing import Callable, List, Tuple

logger = logging.getLogger(__name__)

# Model methods that compile the training graph before Model.train (MindSpore 2.x).
COMPILING_METHODS = ("build", "infer_train_layout")

_ABSENT = object()


class ModelCompileHook:
    """While installed, ``on_compile(model, train_dataset)`` runs before ``Model.build`` and
    ``Model.infer_train_layout``.

    ``on_compile`` must be a bound method; it is held through a ``WeakMethod``.
    """

    def __init__(self, on_compile: Callable, model_class=None):
        self._on_compile = weakref.WeakMethod(on_compile)
        self._model_class = model_class
        self._patches: List[Tuple[str, object, object]] = []  # (name, original in __dict__, patched)
        self._finalizer = None

    @property
    def installed(self) -> bool:
        return bool(self._patches)

    def install(self) -> ModelCompileHook:
        if self._patches:
            return self
        bound = self._on_compile()
        if bound is None:  # the owner is gone already: nothing would ever remove the patch
            return self
        model_class = self._model_class
        if model_class is None:
            from mindspore.train import Model as model_class
        self._model_class = model_class
        for name in COMPILING_METHODS:
            if not hasattr(model_class, name):
                continue  # older MindSpore without infer_train_layout
            original = model_class.__dict__.get(name, _ABSENT)
            patched = _make_patched(name, getattr(model_class, name), weakref.ref(self))
            setattr(model_class, name, patched)
            self._patches.append((name, original, patched))
        # Restore the class if the owner disappears without ever reaching remove().
        self._finalizer = weakref.finalize(bound.__self__, _restore, model_class, list(self._patches))
        del bound
        logger.debug("compile hook installed on %s.%s", model_class.__name__, "/".join(COMPILING_METHODS))
        return self

    def remove(self) -> None:
        if not self._patches:
            return
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _restore(self._model_class, self._patches)
        self._patches = []
        logger.debug("compile hook removed from %s", self._model_class.__name__)

    def __enter__(self) -> ModelCompileHook:
        return self.install()

    def __exit__(self, *exc_info) -> bool:
        self.remove()
        return False


def _make_patched(name: str, original, hook_ref: weakref.ref):
    def patched(model, *args, **kwargs):
        hook = hook_ref()
        if hook is not None and hook.installed:
            callback = hook._on_compile()
            if callback is not None:
                # Both methods take the training dataset first (or as ``train_dataset=``).
                dataset = kwargs.get("train_dataset", args[0] if args else None)
                callback(model, dataset)
        return original(model, *args, **kwargs)

    patched.__name__ = name
    patched.__qualname__ = f"Model.{name}"
    patched.__doc__ = getattr(original, "__doc__", None)
    patched.__wrapped__ = original
    patched._mf_celldump_hook = True
    return patched


def _restore(model_class, patches) -> None:
    # Undo in reverse order. If someone patched the method again after us, we cannot take
    # ours out of their chain; it stays as a pass-through (it calls nobody once its hook
    # is removed or gone).
    for name, original, patched in reversed(patches):
        if model_class.__dict__.get(name) is not patched:
            logger.debug("Model.%s was patched again after the compile hook; leaving it in place", name)
            continue
        if original is _ABSENT:
            delattr(model_class, name)
        else:
            setattr(model_class, name, original)
