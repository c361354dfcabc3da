"""Every exception mf_celldump raises, in one hierarchy under :class:`CellDumpError`.

A caller that wants "anything this package refused" catches ``CellDumpError``; one that
can act on a kind of failure catches its class. Each class here is one such kind; a
module that needs a finer, internally caught error subclasses one of them. Classes that
were ``ValueError``/``RuntimeError``/``OSError`` before keep that base too, so existing
``except ValueError`` callers behave as they did. This module imports nothing from the
package, so every module may import it.
"""

from __future__ import annotations


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


class ModelSpecError(CellDumpError, ValueError):
    """A model to check a layer mapping against cannot be built (unknown name, import failed, not a cell)."""


# -- capture ------------------------------------------------------------------------------------------

class UnsafePathError(CellDumpError, ValueError):
    """A name or link would place a file outside its root, or a path is not the plain file/folder expected."""


class AttachError(CellDumpError, RuntimeError):
    """The network cannot be captured as asked (wrong type, already attached, bad path, a detached handle)."""


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


# -- reading a dump in msprobe's layout ----------------------------------------------------------------

class DumpError(CellDumpError, ValueError):
    """A dump folder or ``dump.json`` cannot be read as msprobe's layout; the message names the file."""


class SummaryError(CellDumpError, ValueError):
    """A rank-summary file or message is not one ``ranks.summary`` writes; the message names its source."""


# -- the analysis tools -------------------------------------------------------------------------------

class CompareInputError(CellDumpError, ValueError):
    """The inputs cannot be compared (no dump, nothing pairs, bad option); the message says why."""


class RankCheckError(CellDumpError, ValueError):
    """A replica check cannot run on its inputs (unreadable summaries, nothing selected, bad groups)."""


class MissingExtra(CellDumpError, RuntimeError):
    """An optional dependency of an analysis tool (the ``compare`` extra) is not installed; the message says
    what needs it and how to install it."""
