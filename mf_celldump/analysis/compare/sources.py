"""What a comparison reads from each side: entries in execution order and the tensors they name.

The engine pairs a target side with a baseline side (a :class:`Unit`). A side is
anything that satisfies :class:`DumpSide`: today one rank folder (:class:`RankFolder`);
a step that first merges the shards of several tensor-parallel rank folders into one
side plugs in here, without the pairing or the report knowing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterator, Mapping, Optional, Protocol, Tuple

import numpy as np

from mf_celldump.analysis.compare import tensors
from mf_celldump.errors import CompareInputError
from mf_celldump.layout.naming import PARAMETERS_GRAD_KEY
from mf_celldump.layout.reader import DumpJson, RankDump


class DumpSide(Protocol):
    """One side of a unit: where its entries and tensors come from."""

    label: str  # shown to people: ``step0/rank3`` or a folder name
    step: Optional[int]
    rank: Optional[int]  # None: a single-card ``rank`` folder (rank 0)

    @property
    def framework(self) -> str: ...

    @property
    def task(self) -> str: ...

    @property
    def gradient_point(self) -> Optional[str]:
        """Where its weight gradients were read, as its dump.json says (``naming.PARAMETERS_GRAD_KEY``);
        None when it does not say (msprobe's dumps, ours before the key existed)."""

    def entries(self) -> Iterator[Tuple[str, Dict[str, Any]]]:
        """(entry name, body) in the dumper's execution order."""

    def tensor(self, record: Mapping[str, Any]) -> Optional[np.ndarray]:
        """The array a record names; None when it names none (statistics task).

        Raises :class:`tensors.TensorFileError` when the file is missing or unreadable."""


class RankFolder:
    """A ``step{N}/rank{R}`` folder of msprobe's layout (ours or msprobe's)."""

    def __init__(self, dump: RankDump):
        self.dump = dump
        self.label, self.step, self.rank = dump.label, dump.step, dump.rank
        self._tensors = tensors.TensorFolder(dump.data_dir)
        try:
            self._json = DumpJson(dump.dump_json)
        except OSError as err:
            raise CompareInputError(f"{dump.dump_json}: cannot read: {err.strerror}") from None
        if not self._json.has_data:  # read on, it would give no entries and its step would vanish unsaid
            raise CompareInputError(
                f"{dump.dump_json}: no \"data\" key; a dump.json holds its entries under \"data\" (msprobe's "
                f"layout), so {dump.label} cannot be compared: re-process the raw dump or leave the step out (--steps)"
            )

    @property
    def framework(self) -> str:
        return self._json.framework

    @property
    def task(self) -> str:
        return self._json.task

    @property
    def gradient_point(self) -> Optional[str]:
        said = self._json.header.get(PARAMETERS_GRAD_KEY)
        point = said.get("point") if isinstance(said, dict) else None
        return point if isinstance(point, str) else None

    def entries(self) -> Iterator[Tuple[str, Dict[str, Any]]]:
        return self._json.entries()

    def tensor(self, record: Mapping[str, Any]) -> Optional[np.ndarray]:
        return self._tensors.load(record)


@dataclass(frozen=True)
class Unit:
    """One target side and the baseline side it is compared with (one step and rank)."""

    target: DumpSide
    baseline: DumpSide

    @property
    def step(self) -> Optional[int]:
        return self.target.step

    @property
    def rank(self) -> int:
        """The target's rank number (a single-card ``rank`` folder is rank 0)."""
        return self.target.rank or 0

    @property
    def folder(self) -> str:
        return self.target.label
