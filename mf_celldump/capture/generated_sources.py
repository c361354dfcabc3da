"""Where the source of generated graph-mode ``construct`` wrappers lives while attached.

MindSpore's compiler reads a function's source file from disk for its debug info
(``ReadSectionDebugInfoFromFile`` in ``mindspore/core/utils/info.cc``); a name that is
not a real file gets two log lines per compiled node ("Get realpath failed" at ERROR
level): hundreds on a small mcore model. So each wrapper's source is also written to a
private temporary folder of this process (0o700), registered with ``linecache`` for
Python's own tracebacks, and removed at detach: only the files written here.
"""

from __future__ import annotations

import linecache
import logging
import os
import tempfile
import weakref
from typing import List, Optional

logger = logging.getLogger(__name__)


class GeneratedSources:
    """The source files of one attached dump's generated wrappers (removed at detach, or when
    the handle is collected or the interpreter exits, for a dump never detached)."""

    def __init__(self) -> None:
        self._folder: Optional[str] = None
        self._files: List[str] = []
        self._finalizer: Optional[weakref.finalize] = None

    def add(self, name: str, source: str) -> str:
        """Write ``source`` as ``{name}.py``; the file name to compile it under."""
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="mf_celldump-constructs-")
            self._finalizer = weakref.finalize(self, _remove, self._folder, self._files)
        path = os.path.join(self._folder, f"{name}.py")
        try:
            with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640), "w", encoding="utf-8") as handle:
                handle.write(source)
            self._files.append(path)
        except OSError as err:  # debug info only: compiling works without the file
            logger.debug("generated construct source not written to %s: %s", path, err)
        linecache.cache[path] = (len(source), None, source.splitlines(True), path)
        return path

    def remove(self) -> None:
        """Remove the files written here and their folder (if nothing else is in it)."""
        if self._finalizer is not None:
            self._finalizer()  # runs _remove once
            self._finalizer = None
        self._folder = None
        self._files = []


def _remove(folder: str, files: List[str]) -> None:
    for path in files:
        linecache.cache.pop(path, None)
        try:
            os.remove(path)
        except OSError as err:
            logger.debug("could not remove %s: %s", path, err)
    try:
        os.rmdir(folder)
    except OSError as err:
        logger.debug("could not remove %s: %s", folder, err)
