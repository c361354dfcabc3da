"""Exceptions of the processing subsystem: bad input stops the run, with a message saying what to do."""

from __future__ import annotations

from mf_celldump import fsutil


class ProcessingError(Exception):
    """Base class: the dump cannot be processed as asked (the CLI exits with status 2)."""


class DumpNotFoundError(ProcessingError):
    """The dump path does not exist or is not a folder."""


class EmptyDumpError(ProcessingError):
    """The dump folder holds neither raw capture data nor processed output."""


class NotACaptureDumpError(ProcessingError):
    """The folder has content, but no ``_raw/rank*/manifest.json`` written by mf_celldump."""


class ManifestError(ProcessingError):
    """A rank's ``manifest.json`` is unreadable or lacks required fields."""


# A name or symlink would place a file outside the dump folder (raised by fsutil; the
# CLI treats it like a ProcessingError).
UnsafePathError = fsutil.UnsafePathError


class NpyReadError(Exception):
    """One raw ``.npy`` file is truncated or corrupt; it is reported and the others are processed."""
