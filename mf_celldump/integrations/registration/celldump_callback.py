"""Registers ``CellDumpCallback`` with MindFormers; loaded by YAML ``auto_register``.

Use with ``run_mindformer.py --register_path "$(mf-celldump register-path)"`` and a
callback entry ``{type: CellDumpCallback, auto_register: celldump_callback.CellDumpCallback}``.
MindFormers copies this single file into a module cache and imports it, so it only
imports from the installed package (no relative imports).
"""

from mf_celldump.integrations.callback import CellDumpCallback, register_with_mindformers

register_with_mindformers(CellDumpCallback)

__all__ = ["CellDumpCallback"]
