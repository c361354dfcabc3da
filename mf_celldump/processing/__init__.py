"""Processing: turn raw capture files (``_raw/rank{R}/step{N}``) into msprobe's dump layout.

Entry point: :func:`mf_celldump.processing.pipeline.process_dump`; the
``mf-celldump process`` command wraps it (``processing.cli``).
"""
