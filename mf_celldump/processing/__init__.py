"""Processing: raw capture files -> msprobe's layout (``step{N}/rank{R}/``).

``driver.process_dump`` runs a whole dump (also the ``mf-celldump process`` command);
``step_transaction`` turns one step of one rank into an output folder, crash-safely;
``entries`` numbers calls and finds parents; ``msprobe_json`` writes the three JSON
files; ``file_tasks``/``worker_pool``/``npystats`` read the tensor files; ``raw_cleanup``
deletes consumed raw data (only files we wrote); ``space`` words file-system failures.
"""
