"""Compare two dumps in msprobe's layout and say where they first diverge; find the first NaN/Inf.

The logic of ``mf-celldump compare TARGET BASELINE`` (``engine``) and ``mf-celldump
anomalies DUMP`` (``anomalies``); their command lines are in ``mf_celldump.cli``. See
docs/compare.md.
"""
