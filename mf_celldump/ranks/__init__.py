"""Across ranks, as training needs it: each rank's step reduced to a summary, replicas checked.

``rank_summary`` (one rank folder to a few kilobytes; the processing worker makes it beside
training), ``replicas`` (the check of one step's replica group, memory independent of the
number of ranks, ``ReplicaChecks`` over many steps and groups, and the one line per step),
``groups`` (which ranks are replicas; the configuration validates with it). Reads the layout,
never MindSpore. The ``mf-celldump ranks`` command over dump folders and summary files, with
its table and heat maps, is ``mf_celldump.analysis.replica_report``. See docs/ranks.md.
"""
