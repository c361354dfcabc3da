"""Exceptions of the processing subsystem (defined in ``mf_celldump.errors``): bad input stops the run,
with a message saying what to do. ``UnsafePathError`` (a name or symlink would place a file outside
the dump folder; raised by fsutil) the CLI treats like a ``ProcessingError``."""

from __future__ import annotations

from mf_celldump.errors import (
    DumpNotFoundError,
    EmptyDumpError,
    ManifestError,
    NotACaptureDumpError,
    NpyReadError,
    ProcessingError,
    UnsafePathError,
)

__all__ = [
    "DumpNotFoundError",
    "EmptyDumpError",
    "ManifestError",
    "NotACaptureDumpError",
    "NpyReadError",
    "ProcessingError",
    "UnsafePathError",
]
