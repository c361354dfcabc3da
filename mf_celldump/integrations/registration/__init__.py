"""Files MindFormers loads by path through ``--register_path`` + ``auto_register``.

``mf-celldump register-path`` prints this directory. Importing this package does nothing
(its registration module imports MindSpore and MindFormers only when MindFormers loads it).
"""

import os

REGISTRATION_MODULE = "celldump_callback"
CALLBACK_CLASS = "CellDumpCallback"


def registration_dir() -> str:
    """Directory of the file that YAML ``auto_register: celldump_callback.CellDumpCallback`` loads."""
    return os.path.dirname(os.path.abspath(__file__))
