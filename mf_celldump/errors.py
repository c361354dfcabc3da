"""Every exception mf_celldump raises, in one hierarchy under :class:`CellDumpError`.

A caller that wants "anything this package refused" catches ``CellDumpError``; one that
can act on a kind of failure catches its class. Each class here is one such kind; a
module that needs a finer, internally caught error subclasses one of them. Classes that
were ``ValueError``/``RuntimeError``/``OSError`` before keep that base too, so existing
``except ValueError`` callers behave as they did. This module imports nothing from the
package, so every module may import it; ``short_repr`` is how a bad value appears in a
message (bounded, whatever the value's size).
"""

from __future__ import annotations

import reprlib
from typing import Any


class CellDumpError(Exception):
    """Base class: mf_celldump refused an input or could not do what was asked; the message says why.

    MindFormers' registry re-raises an error of a class it builds as ``type(e)(f"{cls.__name__}: {e}")``
    (``tools/register/register.py``), in front of a message that already starts with that name
    (``CellDumpCallback: unknown key ...``): the doubled name is dropped here, for every message
    that passes there. A message is bounded too, whatever value it quotes."""

    def __init__(self, *args):
        if args and isinstance(args[0], str):
            args = (_bounded(_single_prefix(args[0])),) + args[1:]
        super().__init__(*args)


MAX_MESSAGE_CHARS = 4000  # an error names values; one of millions of characters helps no one


def _single_prefix(message: str) -> str:
    """``"X: X: rest"`` as ``"X: rest"`` (X a class name: a capital, no spaces)."""
    head, sep, rest = message.partition(": ")
    if sep and head[:1].isupper() and " " not in head and rest.startswith(head + ": "):
        return rest
    return message


def _bounded(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    keep = MAX_MESSAGE_CHARS // 2 - 40  # the whole stays within the bound, so bounding twice changes nothing
    return f"{message[:keep]} ... ({len(message) - 2 * keep} characters left out) ... {message[-keep:]}"


# -- configuration and layer mapping ------------------------------------------------------------------

class ConfigError(CellDumpError, ValueError):
    """A configuration key has an invalid value; the message names the key, the value and what is valid."""


class MappingError(ConfigError):
    """A layer-mapping file or entry is invalid; the message names the file, the line and the problem."""


class ReplicaSpecError(ConfigError):
    """A ``replica_groups`` / ``--replicas`` value is not understood; the message shows the valid syntax."""


class EntryError(MappingError):
    """A mapping entry string does not follow the entry syntax; ``reason`` says why, ``column`` where."""

    def __init__(self, reason: str, column: int):
        super().__init__(f"column {column}: {reason}")
        self.reason = reason
        self.column = column


class RuleError(MappingError):
    """A compare rule of a mapping entry is unknown or has a bad value; the message says what is valid."""


class ModelSpecError(CellDumpError, ValueError):
    """A model to check a layer mapping against cannot be built (unknown name, import failed, not a cell)."""


# -- capture ------------------------------------------------------------------------------------------

class UnsafePathError(CellDumpError, ValueError):
    """A name or link would place a file outside its root, or a path is not the plain file/folder expected."""


class AttachError(CellDumpError, RuntimeError):
    """The network cannot be captured as asked (wrong type, already attached, bad path, a detached handle)."""


class WrapperError(AttachError):
    """A cell around the model that cannot be understood; attach refuses it."""


class DumpInUseError(AttachError):
    """``dump_path`` holds another run's data for this rank; the message says how to start or resume."""


class BackendModeError(AttachError):
    """The backend cannot capture in this execution mode; the message names one that can."""


class BackendSetupError(AttachError):
    """The backend cannot capture in this environment (MindSpore version, dump settings, paths);
    the message says what to change. Raised before any training step."""


class StepError(CellDumpError, ValueError):
    """A step number that is not a global step: an int from 0 to ``rawformat.names.MAX_STEP``."""


class ExchangeError(CellDumpError, RuntimeError):
    """Ranks cannot exchange their verdicts through rank 0's store (it cannot be served or reached)."""


# -- processing raw data ------------------------------------------------------------------------------

class ProcessingError(CellDumpError):
    """The dump cannot be processed as asked (the CLI exits with status 2)."""


class DumpNotFoundError(ProcessingError):
    """The dump path does not exist or is not a folder."""


class EmptyDumpError(ProcessingError):
    """The dump folder holds neither raw capture data nor processed output."""


class NotACaptureDumpError(ProcessingError):
    """The folder has content, but no ``_raw/rank*/manifest.json`` written by mf_celldump."""


class RawDataError(ProcessingError):
    """A file under ``{dump_path}/_raw`` is not as this mf_celldump writes it; the message names the file."""


class ManifestError(RawDataError, ValueError):
    """A rank's ``manifest.json`` is unreadable, of another raw-format version, or lacks a field."""


class NpyReadError(RawDataError):
    """One raw ``.npy`` file is truncated or corrupt; it is reported and the others are processed."""


class IndexFileError(CellDumpError, OSError):
    """The on-disk index of a large records file could not be written or read (a full disk, most often); an
    ``OSError``, so the step takes its usual file-system path and its raw data is kept."""


# -- reading a dump in msprobe's layout ----------------------------------------------------------------

class DumpError(CellDumpError, ValueError):
    """A dump folder or ``dump.json`` cannot be read as msprobe's layout; the message names the file."""


class TensorFileError(DumpError):
    """A tensor file is missing, outside the dump, or unreadable; the message names it, ``why`` says
    what is wrong without the path (for counting alike failures together)."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: {why}")
        self.why = why


class SummaryError(CellDumpError, ValueError):
    """A rank-summary file or message is not one ``ranks.rank_summary`` writes; the message names its source."""


# -- the analysis tools -------------------------------------------------------------------------------

class CompareInputError(CellDumpError, ValueError):
    """The inputs cannot be compared (no dump, nothing pairs, bad option); the message says why."""


class ShardError(CompareInputError):
    """Shards that cannot be put together as their rule says; the message names the entry, tensor and rule."""


class NotComparable(CellDumpError, ValueError):
    """A pair of tensors cannot be compared element by element; the message says why."""


class RankCheckError(CellDumpError, ValueError):
    """A replica check cannot run on its inputs (unreadable summaries, nothing selected, bad groups)."""


class MissingExtra(CellDumpError, RuntimeError):
    """An optional dependency of an analysis tool (the ``compare`` extra) is not installed; the message says
    what needs it and how to install it."""


# Values in messages are shown through reprlib: a short text whatever the value's size or
# depth (a YAML alias bomb expands to billions of items when fully repr'd).
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = _SHORT.maxset = _SHORT.maxfrozenset = 4
_SHORT.maxlevel = 2
SHORT_REPR_MAX = 120


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to at most ``SHORT_REPR_MAX`` characters, in time independent of the value's size."""
    text = _SHORT.repr(value)
    return text if len(text) <= SHORT_REPR_MAX else text[: SHORT_REPR_MAX - 3] + "..."
