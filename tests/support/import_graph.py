"""The package's imports read from its sources with ``ast`` (nothing is imported, MindSpore least of all).

Every ``import``, ``from ... import`` (relative ones resolved against the file's package),
``importlib.import_module``/``__import__`` with a constant name, and the module names of the
package's lazy attribute table ``_LAZY``: each as the module it names, with its line.
"""

from __future__ import annotations

import ast
import os
from typing import Iterator, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_DIR = os.path.join(REPO, "mf_celldump")


def package_files() -> List[str]:
    """Paths, relative to the repository, of every .py file of the package."""
    out = []
    for folder, dirs, files in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(name for name in dirs if name != "__pycache__")
        out.extend(os.path.join(folder, name) for name in files if name.endswith(".py"))
    return sorted(os.path.relpath(path, REPO) for path in out)


def read(path: str) -> str:
    with open(os.path.join(REPO, path), encoding="utf-8") as handle:
        return handle.read()


def module_of(path: str) -> Tuple[str, bool]:
    """(dotted module name, whether it is a package's ``__init__``) of a path like ``mf_celldump/a/b.py``."""
    parts = path[: -len(".py")].split(os.sep)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imported_modules(source: str, path: str) -> Iterator[Tuple[str, int]]:
    """(module name, line) of every import ``source`` (the text of ``path``) makes or names.

    ``from a import b`` yields ``a`` and ``a.b`` (b may be a submodule); a relative import is
    resolved against ``path``'s package.
    """
    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = from_base(node, path)
            yield base, node.lineno
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno
        elif isinstance(node, ast.Call) and _is_import_call(node.func) and node.args:
            if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                yield node.args[0].value, node.lineno
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets):
            for item in ast.walk(node.value):
                if isinstance(item, ast.Tuple) and item.elts and isinstance(item.elts[0], ast.Constant):
                    yield str(item.elts[0].value), item.lineno


def from_base(node: ast.ImportFrom, path: str) -> str:
    """The module a ``from ... import`` reads from, relative levels resolved against ``path``."""
    module, is_package = module_of(path)
    package = module if is_package else module.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(parent + ([base] if base else []))
    return base


def _is_import_call(func: ast.expr) -> bool:
    """``importlib.import_module``, a bare ``import_module`` (from importlib) or ``__import__``."""
    if isinstance(func, ast.Attribute):
        return func.attr == "import_module"
    return isinstance(func, ast.Name) and func.id in ("import_module", "__import__")
