"""Old name of :mod:`mf_celldump.mapping.entries`, kept until every import uses the new one.

Import ``ArgModes`` from ``mf_celldump.mapping`` (or ``mf_celldump.mapping.entries``).
"""

from mf_celldump.mapping.entries import ArgModes, LayerMapping, MappingError  # noqa: F401
