"""Read layer-mapping files (MindFormers' ``layer_mapping`` format) into :class:`LayerMapping`.

The YAML is composed (not constructed) with PyYAML's SafeLoader so every entry keeps
its line number for error messages and duplicate keys can be caught; nothing beyond
plain scalars and mappings is ever built. Entries are parsed by a small hand-written
scanner, so lists of any length parse fully and errors can point at a column.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Dict, List, Optional, Tuple

import yaml

from mf_celldump.errors import EntryError, MappingError, RuleError
from mf_celldump.mapping.compare_rules import RULE_SYNTAX, RuleValue, check_rule
from mf_celldump.mapping.modes import MODES, TOP_LAYER, ArgModes, LayerMapping
from mf_celldump.userinput import read_yaml_text, yaml_events

ENTRY_SYNTAX = (
    "benchName([input modes], [output modes]) with modes in, out or _ (e.g. linear_q([in], [out])), "
    "optionally followed by compare rules (e.g. linear_qkv([in], [out], layout=sbh, split=qkv:q))"
)

_NAME_RE = re.compile(r"[^\s()\[\],]+")
_TOKEN_RE = re.compile(r"[^\s()\[\],=]+")
_RULE_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STR_TAG = "tag:yaml.org,2002:str"
_INT_TAG = "tag:yaml.org,2002:int"
_NULL_TAG = "tag:yaml.org,2002:null"


class _Scanner:
    """Cursor over one entry string."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def fail(self, reason: str) -> EntryError:
        return EntryError(reason, self.pos + 1)

    def take(self, pattern: re.Pattern) -> Optional[str]:
        match = pattern.match(self.text, self.pos)
        if not match:
            return None
        self.pos = match.end()
        return match.group(0)

    def separator(self, close: str, where: str) -> bool:
        """After an item of a list: True when ``close`` ends the list, False after a comma (both are
        consumed); anything else fails, naming what was expected ``where`` (e.g. "in a mode list")."""
        self.skip_ws()
        char = self.peek()
        if char in (",", close):
            self.pos += 1
            if char == ",":
                self.skip_ws()
            return char == close
        if not char:
            raise self.fail(f"unbalanced brackets: missing '{close}' at the end")
        if char == ")":  # a mode list's ']' forgotten before the entry's ')'
            raise self.fail(f"unbalanced brackets: missing '{close}' before ')'")
        raise self.fail(f"unexpected {self.text[self.pos :]!r} {where}; expected ',' or '{close}'")


EntryParts = Tuple[str, Tuple[str, ...], Tuple[str, ...], Tuple[Tuple[str, RuleValue], ...]]


def parse_entry_parts(text: str) -> EntryParts:
    """Split ``bench([..], [..], key=value, ...)`` into (bench name, input modes, output modes, rules).

    A bare ``bench`` (msprobe compare's plain rename) and ``bench()`` give no modes.
    Rules (see :mod:`mf_celldump.mapping.compare_rules`) come after the mode lists.
    Raises :class:`EntryError` naming the first thing that is wrong.
    """
    scan = _Scanner(text)
    scan.skip_ws()
    name = scan.take(_NAME_RE)
    if name is None:
        if not scan.peek():
            raise scan.fail("empty entry")
        raise scan.fail(f"expected a baseline name before {scan.text[scan.pos :]!r}")
    scan.skip_ws()
    if not scan.peek():
        return name, (), (), ()
    if scan.peek() == "(" and scan.text[scan.pos - 1].isspace():
        # msprobe keeps the text before "(" verbatim, space included: the name would never match.
        raise scan.fail(f"space between the name {name!r} and '('; msprobe compare would read {name + ' '!r}")
    if scan.peek() != "(":
        raise scan.fail(f"unexpected {scan.text[scan.pos :]!r} after the name {name!r}; expected '('")
    scan.pos += 1
    lists: List[Tuple[str, ...]] = []
    rules: List[Tuple[str, RuleValue]] = []
    scan.skip_ws()
    if scan.peek() == ")":
        scan.pos += 1
    else:
        while True:
            _parse_item(scan, lists, rules)
            if scan.separator(")", "after a mode list"):
                break
    scan.skip_ws()
    if scan.peek():
        raise scan.fail(f"unexpected text {scan.text[scan.pos :]!r} after the closing ')'")
    while len(lists) < 2:
        lists.append(())
    return name, lists[0], lists[1], tuple(rules)


def _parse_item(scan: _Scanner, lists: List[Tuple[str, ...]], rules: List[Tuple[str, RuleValue]]) -> None:
    """One item inside the parentheses: a mode list (at most two, first) or a ``key=value`` rule."""
    if scan.peek() == "[" or not scan.peek():
        if rules:
            raise scan.fail("mode lists must come before the key=value rules")
        if len(lists) == 2:
            raise scan.fail("more than two mode lists; give at most [input modes], [output modes]")
        lists.append(_parse_list(scan))
        return
    column = scan.pos + 1
    key = scan.take(_RULE_KEY_RE)
    scan.skip_ws()
    if key is None or scan.peek() != "=":
        raise scan.fail(
            f"expected '[' to open a mode list or a key=value rule, found {scan.text[scan.pos :]!r}"
        )
    scan.pos += 1
    scan.skip_ws()
    if scan.peek() == "[":
        value: RuleValue = _parse_tokens(scan)
    else:
        value = scan.take(_TOKEN_RE) or ""
        if not value:
            raise scan.fail(f"rule {key!r} has no value; expected {RULE_SYNTAX}")
    try:
        check_rule(key, value)
    except RuleError as err:
        raise EntryError(str(err), column) from None
    rules.append((key, value))


def _parse_list(scan: _Scanner) -> Tuple[str, ...]:
    if scan.peek() != "[":
        if not scan.peek():
            raise scan.fail("unbalanced brackets: missing ')' at the end")
        raise scan.fail(f"expected '[' to open a mode list, found {scan.text[scan.pos :]!r}")
    modes = []
    for token, column in _bracket_tokens(scan):
        if token not in MODES:
            close = difflib.get_close_matches(token.lower(), MODES, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise EntryError(f"unknown mode {token!r}{hint}; valid modes: {', '.join(MODES)}", column)
        modes.append(token)
    return tuple(modes)


def _parse_tokens(scan: _Scanner) -> Tuple[str, ...]:
    return tuple(token for token, _ in _bracket_tokens(scan))


def _bracket_tokens(scan: _Scanner) -> List[Tuple[str, int]]:
    """The comma-separated tokens of ``[a, b]`` with their columns; the cursor ends after ``]``."""
    scan.pos += 1
    scan.skip_ws()
    tokens: List[Tuple[str, int]] = []
    if scan.peek() == "]":
        scan.pos += 1
        return tokens
    while True:
        column = scan.pos + 1
        token = scan.take(_TOKEN_RE)
        if token is None:
            if not scan.peek():
                raise scan.fail("unbalanced brackets: missing ']' at the end")
            raise scan.fail(f"expected a mode ({', '.join(MODES)}), found {scan.text[scan.pos :]!r}")
        tokens.append((token, column))
        if scan.separator("]", "in a mode list"):
            return tokens


def parse_entry(text: str, source: str = "", line: int = 0, bundled: bool = False) -> ArgModes:
    """Parse one entry string into :class:`ArgModes`; raises :class:`MappingError`."""
    try:
        name, inputs, outputs, rules = parse_entry_parts(text)
    except EntryError as err:
        where = f"{source}:{line}: " if source else ""
        raise MappingError(f"{where}bad entry {text!r}: {err}; expected {ENTRY_SYNTAX}") from None
    return ArgModes(name, inputs, outputs, rules, source=source, line=line, bundled=bundled)


# A mapping file is two levels of mappings (class -> child -> entry text); its size in entries is
# bounded so that attach stays bounded in time and memory whatever file it is given.
MAX_DEPTH = 8
MAX_ENTRIES = 100_000
MAX_FILE_BYTES = 64 << 20  # beyond the entries above by far; larger files are not read at all
# libyaml when PyYAML has it: the same nodes and line numbers, composed about ten times faster.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_outline(text: str, source: str) -> None:
    """Refuse, before anything is built, a text nested deeper or holding more entries than a mapping can.

    Walks the parser's events, which keep their own stack (no recursion), counting values; an alias
    inside the collection it names is refused there too.
    """
    depth, values = 0, 0
    for event in yaml_events(text, source, MappingError):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise MappingError(f"{source}:{event.start_mark.line + 1}: nested more than {MAX_DEPTH} levels "
                                   f"deep; a layer mapping maps class names to child names to entries like "
                                   f"{ENTRY_SYNTAX}")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.ScalarEvent):
            values += 1
            if values > 2 * MAX_ENTRIES + 2 * MAX_DEPTH:
                raise MappingError(f"{source}:{event.start_mark.line + 1}: more than {MAX_ENTRIES} entries; a layer "
                                   "mapping names the children of a few classes (tens of entries each): split "
                                   "it by model, or give the entries of the classes your model has")


def parse_mapping_text(text: str, source: str = "<string>", bundled: bool = False) -> LayerMapping:
    """Parse the text of a layer-mapping file; ``source`` names it in messages."""
    try:
        _check_outline(text, source)
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as err:
        raise MappingError(f"{source}{_syntax_error_text(err)}") from None
    except yaml.YAMLError as err:
        raise MappingError(f"{source}: YAML error: {err}") from None
    except RecursionError:
        raise MappingError(f"{source}: nested too deeply to be a layer mapping") from None
    if root is None or (isinstance(root, yaml.ScalarNode) and root.tag == _NULL_TAG):
        return LayerMapping(sources=(source,))
    if not isinstance(root, yaml.MappingNode):
        raise MappingError(
            f"{source}:{_line(root)}: the top level must be a mapping of cell class names (or {TOP_LAYER}) "
            f"to child entries, found {_kind(root)}"
        )
    classes: Dict[str, Dict[str, ArgModes]] = {}
    top_layer: Dict[str, ArgModes] = {}
    seen: Dict[str, int] = {}
    for key_node, value_node in root.value:
        section = _key(key_node, source, "a class name")
        _no_duplicate(seen, section, key_node, source, "class section")
        entries = _section(section, value_node, source, bundled)
        if section == TOP_LAYER:
            top_layer = entries
        else:
            classes[section] = entries
    return LayerMapping(classes=classes, top_layer=top_layer, sources=(source,))


def load_mapping_file(path: str, bundled: bool = False, source: Optional[str] = None) -> LayerMapping:
    """Read and parse a layer-mapping file; ``source`` overrides the name used in messages."""
    source = source or path
    if os.path.isdir(path):
        raise MappingError(f"layer mapping {path!r} is a directory; give a YAML file")
    if not os.path.exists(path):
        raise MappingError(
            f"layer mapping file not found: {path} (looked at {os.path.abspath(path)})"
        ) from None
    text = read_yaml_text(path, "layer mapping file", MappingError, MAX_FILE_BYTES)
    return parse_mapping_text(text, source=source, bundled=bundled)


def _syntax_error_text(err: yaml.MarkedYAMLError) -> str:
    problem, context = err.problem_mark, err.context_mark
    mark = problem or context
    text = f":{mark.line + 1}: YAML syntax error: " if mark is not None else ": YAML syntax error: "
    text += str(err.problem or err.context or err)
    if err.context and err.problem:
        where = f" at line {context.line + 1}" if context is not None and context is not mark else ""
        text += f" ({err.context}{where})"
    return text


def _section(section: str, node: yaml.Node, source: str, bundled: bool) -> Dict[str, ArgModes]:
    what = "full cell names" if section == TOP_LAYER else "child cell names"
    if isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG:
        return {}
    if not isinstance(node, yaml.MappingNode):
        raise MappingError(
            f"{source}:{_line(node)}: section {section!r} must be a mapping of {what} to entries like "
            f"{ENTRY_SYNTAX}, found {_kind(node)}"
        )
    entries: Dict[str, ArgModes] = {}
    seen: Dict[str, int] = {}
    for key_node, value_node in node.value:
        child = _key(key_node, source, "a cell name")
        _no_duplicate(seen, child, key_node, source, f"key in section {section!r}:")
        line = _line(value_node)
        if isinstance(value_node, yaml.ScalarNode) and value_node.tag == _NULL_TAG:
            raise MappingError(
                f"{source}:{line}: {section}: {child!r}: missing entry; expected {ENTRY_SYNTAX}"
            )
        if not (isinstance(value_node, yaml.ScalarNode) and value_node.tag == _STR_TAG):
            raise MappingError(
                f"{source}:{line}: {section}: {child!r}: bad entry {_text(value_node)}: expected a string "
                f"{ENTRY_SYNTAX}, found {_kind(value_node)}"
            )
        text = value_node.value
        try:
            name, inputs, outputs, rules = parse_entry_parts(text)
        except EntryError as err:
            raise MappingError(
                f"{source}:{line}: {section}: {child!r}: bad entry {text!r}: {err}; expected {ENTRY_SYNTAX}"
            ) from None
        entries[child] = ArgModes(name, inputs, outputs, rules, source=source, line=line, bundled=bundled)
    return entries


def _key(node: yaml.Node, source: str, what: str) -> str:
    if isinstance(node, yaml.ScalarNode) and node.tag == _STR_TAG:
        return node.value
    if isinstance(node, yaml.ScalarNode) and node.tag == _INT_TAG:
        return node.value.strip()
    raise MappingError(f"{source}:{_line(node)}: expected {what} as key, found {_kind(node)} {_text(node)}")


def _no_duplicate(seen: Dict[str, int], key: str, node: yaml.Node, source: str, what: str) -> None:
    line = _line(node)
    if key in seen:
        raise MappingError(
            f"{source}:{line}: duplicate {what} {key!r} (first at line {seen[key]}); "
            "YAML keeps only one of them, merge the two into one"
        )
    seen[key] = line


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    kind = node.tag.rsplit(":", 1)[-1]
    return "an empty value" if kind == "null" else f"a {kind}"


def _text(node: yaml.Node) -> str:
    """The node as short YAML flow text, quoted: ``'[in, out]'`` (libyaml's nodes keep no source text)."""
    text = _flow(node)
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _flow(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return node.value
    if isinstance(node, yaml.SequenceNode):
        return "[" + ", ".join(_flow(item) for item in node.value[:8]) + (", ...]" if len(node.value) > 8 else "]")
    pairs = [f"{_flow(key)}: {_flow(value)}" for key, value in node.value[:8]]
    return "{" + ", ".join(pairs) + (", ...}" if len(node.value) > 8 else "}")
