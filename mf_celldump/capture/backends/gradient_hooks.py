"""One ``ops.InsertGradientOf`` per probe key, built once and reused every step (PyNative).

Building a new ``InsertGradientOf`` (or ``DumpGradient``) per call costs ~1.5 ms on CPU
because MindSpore parses the hook's closure; a cached hook per probe does the same work.

The inputs of one call go through ONE hook applied to the tuple of their tensors
(``apply_many``): ``InsertGradientOf`` takes a tuple and its function receives the tuple
of their gradients (MindSpore 2.9, PyNative and graph). Tied into one op, an input that
depends on no parameter (an attention mask) is on the gradient path as soon as another
input of the call is, so its gradient is recorded too, as msprobe's per-call
``CellBackwardHook`` records it; and one hook per call costs less than one per tensor.
"""

from __future__ import annotations

from typing import Callable, Dict, Tuple

from mindspore import ops

from mf_celldump.capture.runtime import CaptureRuntime
from mf_celldump.rawformat.keys import ProbeKey


class GradientHookCache:
    """Hands each gradient to ``sink(gradient, key, mode)`` while a captured step runs."""

    def __init__(self, runtime: CaptureRuntime, sink: Callable):
        self._runtime = runtime
        self._sink = sink
        self._hooks: Dict[tuple, object] = {}

    def apply(self, tensor, key: ProbeKey, mode: str = "out"):
        hook = self._hooks.get((key, mode))
        if hook is None:
            runtime, sink = self._runtime, self._sink

            def on_gradient(gradient):
                if runtime.active:
                    sink(gradient, key, mode)
                return gradient

            hook = self._hooks[(key, mode)] = ops.InsertGradientOf(on_gradient)
        return hook(tensor)

    def apply_many(self, tensors: Tuple, keys: Tuple[ProbeKey, ...], modes: Tuple[str, ...]) -> Tuple:
        """``tensors`` through one hook whose function hands each gradient to the sink under its key."""
        hook = self._hooks.get((keys, modes))
        if hook is None:
            runtime, sink = self._runtime, self._sink

            def on_gradients(gradients):
                if runtime.active:
                    for gradient, key, mode in zip(gradients, keys, modes):
                        if gradient is not None:
                            sink(gradient, key, mode)
                return gradients

            hook = self._hooks[(keys, modes)] = ops.InsertGradientOf(on_gradients)
        return tuple(hook(tuple(tensors)))


class ParameterAliases:
    """Tensors that are a Parameter or share its memory through our gradient hooks.

    A hooked Parameter comes back as a new tensor sharing its memory; when a parent cell
    passes it on to a child, the child's hook wraps that alias again. A deferred capture
    must take all of them at once, before the optimizer updates the Parameter in place.
    Kept for the running step only, with references so ids are not reused meanwhile.
    """

    def __init__(self, runtime: CaptureRuntime) -> None:
        self._runtime = runtime
        self._step = None
        self._aliases: Dict[int, object] = {}

    def _current(self) -> Dict[int, object]:
        if self._step != self._runtime.step:
            self._step, self._aliases = self._runtime.step, {}
        return self._aliases

    def is_parameter(self, tensor) -> bool:
        from mindspore import Parameter

        return isinstance(tensor, Parameter) or id(tensor) in self._current()

    def hooked(self, tensor, result) -> None:
        """``result`` is ``tensor`` passed through a gradient hook."""
        if result is not tensor and self.is_parameter(tensor):
            self._current()[id(result)] = result

    def hooked_all(self, tensors: Tuple, results: Tuple) -> Tuple:
        """``hooked`` for each of a call's tied inputs; returns ``results``."""
        for tensor, result in zip(tensors, results):
            self.hooked(tensor, result)
        return results
