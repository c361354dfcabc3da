"""mf_celldump: cell-level precision dump for MindSpore/MindFormers, in msprobe's layout.

``attach(network, config)`` wraps every cell of a network with capture ops and returns
a handle whose ``detach()`` restores it; ``process_captured(handle)`` turns what it
captured into ``step{N}/rank{R}/`` folders; ``CellDumpCallback`` does both from a
MindFormers YAML ``callbacks:`` entry; ``process_dump(path)`` processes any raw dump
(a crashed run's, say). Importing this package does not import MindSpore or MindFormers.
"""

__version__ = "0.1.0"  # pyproject.toml reads it from here

from mf_celldump.config import DumpConfig
from mf_celldump.errors import AttachError, CellDumpError, ConfigError, MappingError, ProcessingError, StepError

__all__ = [
    "AttachError",
    "CellDumpCallback",
    "CellDumpError",
    "ConfigError",
    "DumpConfig",
    "MappingError",
    "ProcessingError",
    "StepError",
    "attach",
    "process_captured",
    "process_dump",
    "__version__",
]

# Heavy parts (MindSpore, MindFormers) load on first use, not on import: name -> (module, attribute).
_LAZY = {
    "attach": ("mf_celldump.capture.session", "attach"),
    "process_captured": ("mf_celldump.integrations.captured", "process_captured"),
    "process_dump": ("mf_celldump.processing.driver", "process_dump"),
    "CellDumpCallback": ("mf_celldump.integrations.callback", "CellDumpCallback"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'mf_celldump' has no attribute {name!r}")
