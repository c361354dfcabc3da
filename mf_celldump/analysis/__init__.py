"""The analysis tools: they read dumps in msprobe's layout (ours or anyone's) and say what differs.

``compare`` (two dumps: where they first diverge, and on which rank), ``anomalies`` (the first
NaN/Inf or out-of-range value in execution order), ``replica_report`` (data-parallel replicas checked
against each other over dump folders and summary files, with a findings table and heat maps).
They read the layout through ``mf_celldump.layout`` and use the training core's replica check;
nothing in the training core imports them. Tables are plain CSV (the standard library); the
plots need the ``compare`` extra (``pip install "mf_celldump[compare]"``: matplotlib), and
without it the commands write everything else and say what to install.
"""
