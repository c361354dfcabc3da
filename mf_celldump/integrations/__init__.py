"""Trainer integrations: the MindSpore/MindFormers callback, its compile hook and registration.

Nothing here is imported by ``import mf_celldump``; ``mf_celldump.CellDumpCallback`` loads
``integrations.callback`` on first use.
"""
