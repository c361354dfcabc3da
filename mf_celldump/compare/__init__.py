"""Compare two dumps in msprobe's layout and say where they first diverge; find the first NaN/Inf.

``mf-celldump compare TARGET BASELINE`` (:mod:`mf_celldump.compare.cli`) and
``mf-celldump anomalies DUMP`` (:mod:`mf_celldump.compare.anomalies`). See docs/compare.md.
"""
