"""Turn the ``layer_mapping`` config value into one mapping, and a mapping into per-cell modes.

A value names the mapping files shipped with the package (``layer_mapping/*.yaml``,
"bundled"), user files, or ``auto`` (the bundled files with a section for a class of
the network).

Everything here works on (cell name, class name) pairs so it runs without MindSpore;
``(name, cell)`` pairs as from ``Cell.cells_and_names()`` are accepted too.
"""

from __future__ import annotations

import logging
import os
from importlib import resources
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from mf_celldump.errors import MappingError
from mf_celldump.mapping.modes import ArgModes, LayerMapping, merge
from mf_celldump.mapping.parser import load_mapping_file, parse_mapping_text

logger = logging.getLogger(__name__)

AUTO = "auto"
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


def resolve_mapping(specs: Tuple[str, ...], class_names: Optional[Set[str]] = None) -> LayerMapping:
    """Load and layer the mappings named by ``specs`` (``auto``, bundled names, file paths).

    ``auto`` picks every bundled file with a section for a class in ``class_names``.
    Bundled mappings are layered first (in spec order), user files over them (in spec
    order), so a user entry wins per class and child and per TopLayer name.
    """
    if isinstance(specs, str):
        specs = (specs,)
    known = bundled_names()
    bundled_order: List[str] = []
    user_files: List[str] = []
    for spec in specs:
        if not isinstance(spec, str) or not spec.strip():
            raise MappingError(
                f"layer_mapping: invalid entry {spec!r}; use 'auto', a bundled name ({', '.join(known)}) "
                "or the path of a YAML file"
            )
        spec = spec.strip()
        if spec == AUTO:
            present = set(class_names or ())
            picked = [name for name in known if bundled_classes(name) & present]
            logger.info("layer_mapping auto: picked %s", ", ".join(picked) or "no bundled mapping")
            bundled_order.extend(picked)
        elif spec in known:
            bundled_order.append(spec)
        elif os.path.exists(spec):
            same = bundled_name_of(spec)
            if same is not None:
                logger.info("layer_mapping: %s is the bundled mapping %r", spec, same)
                bundled_order.append(same)
            else:
                user_files.append(spec)
        else:
            raise MappingError(
                f"layer_mapping: {spec!r} is neither a bundled mapping nor an existing file; bundled names: "
                f"{', '.join(known)} (or 'auto'); a file path must exist (looked at {os.path.abspath(spec)})"
            )
    result = LayerMapping()
    for name in dict.fromkeys(bundled_order):
        result = merge(result, load_bundled(name))
    for path in dict.fromkeys(user_files):
        result = merge(result, load_mapping_file(path))
    return result


def load_one(spec: str) -> LayerMapping:
    """One mapping by bundled name or file path, as ``mapping show`` reads it.

    A bundled name wins, as in ``resolve_mapping``, whatever the current folder holds
    (a folder ``llama/`` beside you does not shadow the bundled ``llama``; ``./llama``
    names a file of yours).
    """
    if spec in bundled_names():
        return load_bundled(spec)
    if not os.path.isfile(spec):
        what = "a folder" if os.path.isdir(spec) else "not found"
        raise MappingError(
            f"{spec!r} is neither a bundled mapping ({', '.join(bundled_names())}) nor a mapping file ({what})"
        )
    same = bundled_name_of(spec)
    return load_bundled(same) if same is not None else load_mapping_file(spec)


def named_classes(named_cells: Iterable[Tuple[str, Any]]) -> List[Tuple[str, str]]:
    """(name, class name) pairs from (name, cell) or (name, class name) pairs."""
    return [(name, item if isinstance(item, str) else type(item).__name__) for name, item in named_cells]


def child_name(parent: str, key: str) -> str:
    """Full name of the child ``key`` of the cell ``parent`` (``""`` is the cell itself)."""
    if not key:
        return parent
    return f"{parent}.{key}" if parent else key


def modes_for_network(mapping: LayerMapping, named_cells: Iterable[Tuple[str, Any]]) -> Dict[str, ArgModes]:
    """Which cells get which modes: cell name -> :class:`ArgModes`.

    For every cell of a mapped class, each child key names a cell relative to it. When
    several mapped ancestors name the same cell, the nearest one wins; TopLayer entries
    (full names) win over all class entries. Cells not in the result use ``out``.
    """
    pairs = named_classes(named_cells)
    present = {name for name, _ in pairs}
    result: Dict[str, ArgModes] = {}
    mapped = [(name, cls) for name, cls in pairs if mapping.classes.get(cls)]
    for parent, cls in sorted(mapped, key=lambda pair: _depth(pair[0])):
        for key, modes in mapping.classes[cls].items():
            target = child_name(parent, key)
            if target in present:
                result[target] = modes
    for name, modes in mapping.top_layer.items():
        if name in present:
            result[name] = modes
    return result


def _depth(name: str) -> int:
    return name.count(".") + 1 if name else 0
