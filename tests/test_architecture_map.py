"""docs/architecture.md is the map a reader trusts first: this holds it to the code.

The map's table gives each room (a top-level module or package of ``mf_celldump``) a floor,
the modules it holds and the rooms it imports; its drawing shows the same rooms on the same
floors. The package's real imports are read from its sources (``tests/support/import_graph``:
relative imports, ``importlib`` with a constant name and the lazy table of ``__init__``
included). A module the map does not name, an import the table does not list (or one it lists
that the code no longer makes), an import of a room on the same or a higher floor, or a circle
between rooms fails here, naming the file and line. Run as a script, it prints the rooms'
imports as the code has them.
"""

from __future__ import annotations

import ast
import os
import re
import sys
from typing import Dict, List, Set, Tuple

if __name__ == "__main__":  # run as a script: the repository's tests package is importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.support.import_graph import REPO, from_base, imported_modules, module_of, package_files, read

MAP = os.path.join(REPO, "docs", "architecture.md")
PACKAGE = "mf_celldump"
VERSION = "__version__"  # read from __init__.py by any module: a room of its own, on the ground floor
API = "__init__.py"
MAX_MODULES = 141  # the cap the project keeps on its module count


def room_of_path(path: str) -> str:
    """The room of a file: ``capture/`` for mf_celldump/capture/x.py, ``config.py``, ``__init__.py``."""
    parts = path.split(os.sep)[1:]
    return parts[0] + "/" if len(parts) > 1 else parts[0]


def room_of_module(name: str) -> str:
    """The room of a module name inside the package, or "" for a module outside it."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return ""
    if len(parts) == 1:
        return API
    path = os.path.join(REPO, PACKAGE, parts[1])
    if os.path.isdir(path):
        return parts[1] + "/"
    if os.path.isfile(path + ".py"):
        return parts[1] + ".py"
    return VERSION if parts[1] == VERSION else API  # a name __init__ defines (or loads lazily)


def rooms_imported(source: str, path: str) -> Set[Tuple[str, int]]:
    """(room, line) of each room ``source`` (the text of ``path``) imports, its own room left out.

    ``from mf_celldump import fsutil`` is an import of ``fsutil.py`` (not of ``__init__``'s API:
    Python runs a package's ``__init__`` for any submodule, so only the names taken from it
    count), ``from mf_celldump import __version__`` one of ``__version__``.
    """
    own = room_of_path(path)
    bases = {(node.lineno, from_base(node, path)) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.ImportFrom)}
    found = set()
    for name, line in imported_modules(source, path):
        if name == PACKAGE and (line, name) in bases:
            continue  # the base of ``from mf_celldump import x``: x decides the room
        room = room_of_module(name)
        if room and room != own:
            found.add((room, line))
    return found


def real_graph() -> Dict[str, Dict[str, List[str]]]:
    """room -> imported room -> the ``file:line`` places that import it."""
    graph: Dict[str, Dict[str, List[str]]] = {}
    for path in package_files():
        room = room_of_path(path)
        graph.setdefault(room, {})
        for target, line in sorted(rooms_imported(read(path), path)):
            graph[room].setdefault(target, []).append(f"{path}:{line}")
    return graph


# -- the map --------------------------------------------------------------------------------------

ROOM_RE = r"__init__\.py|__version__|[a-z_]+/|[a-z_]+\.py"


def _map_text() -> str:
    with open(MAP, encoding="utf-8") as handle:
        return handle.read()


def map_table() -> Dict[str, Tuple[int, Set[str], Set[str]]]:
    """room -> (floor, the module names its row holds, the rooms its row says it imports)."""
    rows = {}
    for line in _map_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].isdigit():
            continue
        floor, room, holds, imports = cells
        room = room.strip("`")
        named = set()
        for span in re.findall(r"`([^`]+)`", holds):
            lead = re.match(r"[\w/]+", span)
            if lead:
                named.update(part for part in lead.group(0).split("/") if part)
        rows[room] = (int(floor), named, set(re.findall(r"`([^`]+)`", imports)))
    return rows


def map_drawing() -> Dict[str, int]:
    """room -> floor, as the drawing (the map's first code block) places it."""
    block = _map_text().split("```")[1]
    placed: Dict[str, int] = {}
    for line in block.splitlines():
        match = re.match(r"^\s*(\d+)\s{2,}(.*)$", line)
        if match:
            for room in re.findall(rf"(?<![\w./])({ROOM_RE})(?![\w])", match.group(2)):
                placed.setdefault(room, int(match.group(1)))
    return placed


# -- the tests ------------------------------------------------------------------------------------

def test_every_room_of_the_package_has_a_row_and_every_row_a_room():
    rooms = {room_of_path(path) for path in package_files()} | {VERSION}
    assert sorted(rooms - set(map_table())) == []
    assert sorted(set(map_table()) - rooms) == []


def test_the_drawing_puts_every_room_on_its_floor():
    table, drawing = map_table(), map_drawing()
    assert {room: floor for room, (floor, _, _) in table.items()} == {room: drawing.get(room) for room in table}


def test_every_module_is_named_in_its_room():
    table = map_table()
    missing = []
    for path in package_files():
        room = room_of_path(path)
        if not room.endswith("/"):
            continue  # a module that is a room names itself
        module, is_package = module_of(path)
        inside = module.split(".")[2:]  # below the room: ["backends", "host"], or [] for the room's __init__
        needed = inside if not (is_package and not inside) else []
        missing += [f"{path}: {name}" for name in needed if name != "__main__" and name not in table[room][1]]
    assert missing == []


def test_each_room_imports_exactly_what_its_row_says():
    table, graph = map_table(), real_graph()
    wrong = []
    for room, (_, _, said) in sorted(table.items()):
        real = graph.get(room, {})
        wrong += [f"{room} imports {target} at {', '.join(real[target][:3])}: not in its row"
                  for target in sorted(set(real) - said)]
        wrong += [f"{room}: its row lists {target}, which it does not import" for target in sorted(said - set(real))]
    assert wrong == []


def test_no_room_imports_its_own_floor_or_one_above():
    table, graph = map_table(), real_graph()
    upward = [f"{room} (floor {table[room][0]}) imports {target} (floor {table[target][0]}) at {places[0]}"
              for room, targets in sorted(graph.items()) for target, places in sorted(targets.items())
              if room in table and target in table and table[target][0] >= table[room][0]]
    assert upward == []


def test_no_circle_between_rooms():
    graph = {room: set(targets) for room, targets in real_graph().items()}
    state: Dict[str, int] = {}

    def circle_from(room: str, trail: List[str]) -> List[str]:
        state[room] = 1
        for target in sorted(graph.get(room, ())):
            if state.get(target) == 1:
                return trail + [room, target]
            if target not in state:
                found = circle_from(target, trail + [room])
                if found:
                    return found
        state[room] = 2
        return []

    circles = [circle_from(room, []) for room in sorted(graph) if room not in state]
    assert [circle for circle in circles if circle] == []


def test_the_version_is_a_literal_set_before_the_package_imports_anything():
    """What makes ``__version__`` a ground-floor room of its own: every module may read it."""
    body = ast.parse(read(os.path.join(PACKAGE, API))).body
    first_import = next(index for index, node in enumerate(body) if isinstance(node, (ast.Import, ast.ImportFrom)))
    assigned = [node for node in body[:first_import] if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == VERSION for t in node.targets)]
    assert assigned and isinstance(assigned[0].value, ast.Constant) and isinstance(assigned[0].value.value, str)


def test_one_module_name_one_thing():
    """No two modules (or packages) share a name, but the command line's: one module per sub-command."""
    seen: Dict[str, List[str]] = {}
    for path in package_files():
        module, is_package = module_of(path)
        name = module.rpartition(".")[2]
        if name != "__main__" and module.split(".")[1:2] != ["cli"]:
            seen.setdefault(name, []).append(path)
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_the_module_count_stays_under_its_cap():
    assert len(package_files()) <= MAX_MODULES


def test_the_reader_finds_each_kind_of_import_in_its_room():
    """The map is only as good as the reader: planted imports, each in its room, with its line."""
    path = os.path.join(PACKAGE, "mapping", "planted.py")
    source = ("from ..config import DumpConfig\n"
              "from mf_celldump import fsutil, __version__\n"
              "import importlib\nimportlib.import_module('mf_celldump.capture.session')\n"
              "def late():\n    from . import parser\n    from .. import processing\n")
    assert rooms_imported(source, path) == {("config.py", 1), ("fsutil.py", 2), (VERSION, 2), ("capture/", 4),
                                           ("processing/", 7)}


if __name__ == "__main__":
    for room, targets in sorted(real_graph().items()):
        print(f"{room:16} imports {', '.join(sorted(targets)) or 'nothing'}")
