"""The parsed form of a layer-mapping file: per-cell dump modes plus baseline names.

A layer mapping tells the capture side, for chosen cells, whether each input and
output is dumped as the producer wrote it (``out``) or as the consumer reads it after
any redistribution (``in``), and tells compare tools which baseline (PyTorch/Megatron)
name a cell corresponds to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from mf_celldump.mapping.compare_rules import CompareRules, RuleValue, format_rules, parse_rules

MODE_IN = "in"
MODE_OUT = "out"
MODE_DEFAULT = "_"
MODES = (MODE_IN, MODE_OUT, MODE_DEFAULT)
TOP_LAYER = "TopLayer"


@dataclass(frozen=True)
class ArgModes:
    """Dump modes of one cell's positional inputs and outputs, its baseline name and compare rules.

    ``rules`` are the ``key=value`` items after the mode lists (see
    :mod:`mf_celldump.mapping.compare_rules`); only ``mf-celldump compare`` reads them.
    ``source``/``line``/``bundled`` record where the entry came from, for messages
    and for telling user entries from bundled ones; they do not take part in equality.
    """

    bench_name: str
    input_modes: Tuple[str, ...] = ()
    output_modes: Tuple[str, ...] = ()
    rules: Tuple[Tuple[str, RuleValue], ...] = ()
    source: str = field(default="", compare=False)
    line: int = field(default=0, compare=False)
    bundled: bool = field(default=False, compare=False)

    def input_mode(self, index: int) -> str:
        """``in`` or ``out`` for positional input ``index``; unlisted or ``_`` means ``out``."""
        return _effective(self.input_modes, index)

    def output_mode(self, index: int) -> str:
        """``in`` or ``out`` for output ``index``; unlisted or ``_`` means ``out``."""
        return _effective(self.output_modes, index)

    @property
    def where(self) -> str:
        """``file:line`` of the entry, for messages."""
        return f"{self.source}:{self.line}" if self.line else self.source

    @property
    def compare_rules(self) -> CompareRules:
        return parse_rules(self.rules)

    def format(self) -> str:
        """The entry in file syntax: ``bench([in, _], [out])``, rules after the lists."""
        rules = f", {format_rules(self.rules)}" if self.rules else ""
        return f"{self.bench_name}([{', '.join(self.input_modes)}], [{', '.join(self.output_modes)}]{rules})"


def _effective(modes: Tuple[str, ...], index: int) -> str:
    if 0 <= index < len(modes) and modes[index] == MODE_IN:
        return MODE_IN
    return MODE_OUT


@dataclass(frozen=True)
class LayerMapping:
    """Class sections (class -> relative child name -> modes) and TopLayer (full name -> modes).

    A child name ``""`` stands for the cell of that class itself. ``sources`` lists the
    files the mapping was built from, in the order they were layered.
    """

    classes: Dict[str, Dict[str, ArgModes]] = field(default_factory=dict)
    top_layer: Dict[str, ArgModes] = field(default_factory=dict)
    sources: Tuple[str, ...] = ()

    def entry_count(self) -> int:
        return len(self.top_layer) + sum(len(children) for children in self.classes.values())

    def bench_names(self) -> Dict[str, Dict[str, str]]:
        """The mapping as msprobe compare's layer mapping reads it: class -> child -> baseline name."""
        return self._render(lambda modes: modes.bench_name)

    def to_dict(self) -> Dict[str, Dict[str, str]]:
        """Plain data in file syntax (for manifests and ``mapping show``)."""
        return self._render(ArgModes.format)

    def _render(self, render: Callable[[ArgModes], str]) -> Dict[str, Dict[str, str]]:
        sections = dict(self.classes)
        if self.top_layer:
            sections[TOP_LAYER] = self.top_layer
        return {name: {key: render(m) for key, m in entries.items()} for name, entries in sections.items()}


def merge(base: LayerMapping, override: Optional[LayerMapping]) -> LayerMapping:
    """Layer ``override`` over ``base``: per class and child, and per TopLayer name, override wins."""
    if override is None:
        return base
    classes = {cls: dict(children) for cls, children in base.classes.items()}
    for cls, children in override.classes.items():
        classes.setdefault(cls, {}).update(children)
    top_layer = dict(base.top_layer)
    top_layer.update(override.top_layer)
    sources = base.sources + tuple(s for s in override.sources if s not in base.sources)
    return LayerMapping(classes=classes, top_layer=top_layer, sources=sources)


def format_mapping(mapping: LayerMapping) -> str:
    """Readable view: one line per entry with effective modes and where it came from."""
    lines = [f"# from: {', '.join(mapping.sources)}"]
    sections: List[Tuple[str, dict]] = list(mapping.classes.items())
    if mapping.top_layer:
        sections.append((TOP_LAYER, mapping.top_layer))
    for section, entries in sections:
        lines.append(f"{section}:")
        if not entries:
            lines.append("  (no entries)")
        for key, modes in entries.items():
            inputs = ", ".join(modes.input_modes) or "-"
            outputs = ", ".join(modes.output_modes) or "-"
            lines.append(
                f"  {key or '(the cell itself)'} -> {modes.bench_name}  inputs: {inputs}  outputs: {outputs}"
                f"  [{modes.where}]"
            )
    return "\n".join(lines)
