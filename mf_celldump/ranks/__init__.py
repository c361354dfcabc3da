"""Across ranks: each rank's step reduced to a summary, data-parallel replicas checked against each other.

``summary`` (one rank folder to a few kilobytes), ``replicas`` (the check of one step's
replica group, memory independent of the number of ranks), ``groups`` (which ranks are
replicas), ``verdict`` (the one line per step), ``check`` (``mf-celldump ranks`` over dumps
and summary files), ``report`` (table, ranks x layers heat map). Reads the layout (and
compare's NaN/Inf test and depth groups), never MindSpore, so the processing worker can
summarise steps beside training. See docs/ranks.md.
"""
