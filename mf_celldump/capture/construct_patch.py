"""Replace a cell's ``construct`` with a capturing one, and put the original back exactly.

The wrapper is an instance attribute bound with ``types.MethodType`` (MindSpore's graph
parser needs a bound method whose first parameter is ``self``); restoring deletes it,
or puts back an instance ``construct`` the cell already had, so the cell's class is
never touched.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Callable

_MISSING = object()


@dataclass
class InstalledConstruct:
    cell: object
    previous: object  # the instance's own ``construct`` before wrapping, or _MISSING

    def restore(self) -> None:
        if self.previous is _MISSING:
            self.cell.__dict__.pop("construct", None)
        else:
            self.cell.__dict__["construct"] = self.previous


def install(cell, construct: Callable) -> InstalledConstruct:
    """Make ``construct(self, ...)`` the construct of this one ``cell``."""
    previous = cell.__dict__.get("construct", _MISSING)
    cell.__dict__["construct"] = types.MethodType(construct, cell)
    return InstalledConstruct(cell, previous)
