"""Layer mappings: per-cell dump modes (``in``/``out``) and baseline names from YAML files.

``resolve_mapping`` turns the ``layer_mapping`` setting into one :class:`LayerMapping`,
``modes_for_network`` says which cell gets which :class:`ArgModes`, and
``check_mapping`` reports entries that match no cell. See docs/layer-mapping.md.
"""

from mf_celldump.mapping.check import MappingReport, check_mapping, log_mapping_warnings
from mf_celldump.mapping.modes import MODES, TOP_LAYER, ArgModes, LayerMapping, merge
from mf_celldump.mapping.parser import load_mapping_file, parse_entry, parse_mapping_text
from mf_celldump.mapping.resolve import (
    AUTO,
    bundled_classes,
    bundled_names,
    load_bundled,
    modes_for_network,
    named_classes,
    resolve_mapping,
)

__all__ = [
    "AUTO",
    "MODES",
    "TOP_LAYER",
    "ArgModes",
    "LayerMapping",
    "MappingReport",
    "bundled_classes",
    "bundled_names",
    "check_mapping",
    "load_bundled",
    "load_mapping_file",
    "log_mapping_warnings",
    "merge",
    "modes_for_network",
    "named_classes",
    "parse_entry",
    "parse_mapping_text",
    "resolve_mapping",
]
