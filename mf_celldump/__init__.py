"""mf_celldump: cell-level precision dump for MindSpore/MindFormers, in msprobe's layout.

``attach(network, config)`` wraps every cell of a network with capture ops and returns
a handle whose ``detach()`` restores it; ``CellDumpCallback`` does the same from a
MindFormers YAML ``callbacks:`` entry; ``process_dump`` turns raw capture files into
``step{N}/rank{R}/`` folders. Importing this package does not import MindFormers.
"""

from mf_celldump.config import ConfigError, DumpConfig

__version__ = "0.1.0"

__all__ = [
    "CellDumpCallback",
    "ConfigError",
    "DumpConfig",
    "attach",
    "process_dump",
    "__version__",
]


def __getattr__(name):
    # Heavy parts (MindSpore, MindFormers) load on first use, not on import.
    if name == "attach":
        from mf_celldump.capture.session import attach

        return attach
    if name == "process_dump":
        from mf_celldump.processing.driver import process_dump

        return process_dump
    if name == "CellDumpCallback":
        from mf_celldump.integrations.callback import CellDumpCallback

        return CellDumpCallback
    raise AttributeError(f"module 'mf_celldump' has no attribute {name!r}")
