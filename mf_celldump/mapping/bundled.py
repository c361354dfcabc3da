"""The layer-mapping files shipped with the package (``layer_mapping/*.yaml``)."""

from __future__ import annotations

from importlib import resources
from typing import FrozenSet, Optional, Tuple

from mf_celldump.mapping.entries import LayerMapping, MappingError
from mf_celldump.mapping.parser import parse_mapping_text

PACKAGE = "mf_celldump.layer_mapping"
SUFFIX = ".yaml"


def bundled_names() -> Tuple[str, ...]:
    """Names of the bundled mappings (file names without ``.yaml``), sorted."""
    root = resources.files(PACKAGE)
    return tuple(sorted(p.name[: -len(SUFFIX)] for p in root.iterdir() if p.name.endswith(SUFFIX)))


def bundled_label(name: str) -> str:
    """How a bundled file is named in messages and ``LayerMapping.sources``."""
    return f"bundled/{name}{SUFFIX}"


def load_bundled(name: str) -> LayerMapping:
    """Parse the bundled mapping ``name`` (e.g. ``llama``); entries are marked as bundled."""
    if name not in bundled_names():
        raise MappingError(f"unknown bundled layer mapping {name!r}; bundled: {', '.join(bundled_names())}")
    text = resources.files(PACKAGE).joinpath(name + SUFFIX).read_text(encoding="utf-8")
    return parse_mapping_text(text, source=bundled_label(name), bundled=True)


def bundled_classes(name: str) -> FrozenSet[str]:
    """Cell classes that the bundled mapping ``name`` has sections for (what ``auto`` matches on)."""
    return frozenset(load_bundled(name).classes)


def bundled_name_of(path: str) -> Optional[str]:
    """The bundled mapping whose text ``path`` holds byte for byte (``layer_mapping/llama.yaml``), else None.

    The same file gets the same verdict whether it is named ``llama`` or given by path.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(1 << 20)
    except OSError:
        return None
    root = resources.files(PACKAGE)
    for name in bundled_names():
        if root.joinpath(name + SUFFIX).read_bytes() == data:
            return name
    return None
