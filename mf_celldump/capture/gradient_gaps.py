"""Why an input of a captured call has no recorded gradient: one log line per cell class.

msprobe 26.2 ties the top-level tensor positional arguments of each call into one
backward hook (``CellBackwardHook``) when at least one of them is differentiable, and
numbers the gradients it records (``backward.N.output.i``) by position among those
tensors only: a tensor inside a tuple argument, a keyword argument or a non-tensor
argument takes no number. When no tensor input of a call is differentiable (only int or
bool tensors, e.g. ``input_ids``), msprobe hooks nothing; we write an explicit ``null``
for each of those tensor inputs instead, and say why here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Set, Tuple

logger = logging.getLogger(__name__)

NOT_DIFFERENTIABLE = "not-differentiable"
NESTED = "nested"

_WHY = {
    NOT_DIFFERENTIABLE: ("no gradient can exist for its tensor inputs %s (%s: no floating-point tensor among "
                         "the call's inputs); written as null"),
    NESTED: ("gradients of tensors inside tuple/list arguments %s (%s) are not recorded, as msprobe records none; "
             "backward output indices count top-level tensor arguments only"),
}


@dataclass
class GradientGapLog:
    """Logs each (cell class, reason) once per attached dump."""

    _seen: Set[Tuple[str, str]] = field(default_factory=set)

    def note(self, class_name: str, reason: str, slots: str, detail: str) -> None:
        if (class_name, reason) in self._seen:
            return
        self._seen.add((class_name, reason))
        logger.info("%s: " + _WHY[reason], class_name, slots, detail)


def differentiable_dtypes() -> tuple:
    """MindSpore dtypes that can carry a gradient (float and complex): a call whose tensor inputs have
    none of them gets the explicit nulls."""
    from mindspore.common import dtype as mstype

    return tuple(mstype.float_type) + tuple(getattr(mstype, "complex_type", ()))
