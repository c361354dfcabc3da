"""The training core imports nothing of the analysis tools, their plotting stack, or the command line.

Training installs only the core's dependencies (pandas and matplotlib are the ``compare`` extra),
so one import of ``mf_celldump.analysis`` from the core, even a lazy one inside a function,
breaks a training run the day that path is taken. Read from the sources with ``ast`` (nothing is
imported, MindSpore least of all): every ``import``, ``from ... import`` (relative ones resolved),
``importlib.import_module``/``__import__`` with a constant name, and the module names of the
package's lazy attribute table ``_LAZY``.
"""

from __future__ import annotations

import os
from typing import List, Tuple

import pytest

from tests.support.import_graph import PACKAGE_DIR, imported_modules, package_files

NOT_CORE = ("analysis", "cli")  # the subpackages over the core, which may import it and each other
ENTRY = "__main__.py"  # `python -m mf_celldump`: the command line itself, over cli/
ANALYSIS = ("mf_celldump.analysis", "pandas", "matplotlib")
CLI = ("mf_celldump.cli",)


def core_files() -> List[str]:
    """Paths, relative to the repository, of every .py file of the core."""
    return [path for path in package_files()
            if path.split(os.sep)[1] not in NOT_CORE and path != os.path.join("mf_celldump", ENTRY)]


def forbidden_imports(source: str, path: str, roots: Tuple[str, ...]) -> List[str]:
    """``path:line: module`` for each import of a module under one of ``roots``."""
    return sorted({f"{path}:{line}: {name}" for name, line in imported_modules(source, path)
                   if any(name == root or name.startswith(root + ".") for root in roots)})


def forbidden_in_core(roots: Tuple[str, ...]) -> List[str]:
    found = []
    for path in core_files():
        with open(os.path.join(os.path.dirname(PACKAGE_DIR), path), encoding="utf-8") as handle:
            found.extend(forbidden_imports(handle.read(), path, roots))
    return found


def test_the_training_core_imports_neither_the_analysis_tools_nor_pandas_nor_matplotlib():
    assert forbidden_in_core(ANALYSIS) == []


def test_the_training_core_imports_nothing_of_the_command_line():
    assert forbidden_in_core(CLI) == []


def test_the_core_is_every_module_but_analysis_and_cli_and_its_lazy_names_are_read():
    files = core_files()
    assert os.path.join("mf_celldump", "config.py") in files
    assert os.path.join("mf_celldump", "capture", "backends", "host.py") in files
    assert not [path for path in files if path.split(os.sep)[1] in NOT_CORE]
    init = os.path.join("mf_celldump", "__init__.py")
    with open(os.path.join(os.path.dirname(PACKAGE_DIR), init), encoding="utf-8") as handle:
        names = {name for name, _ in imported_modules(handle.read(), init)}
    assert "mf_celldump.capture.session" in names  # from _LAZY


WAYS_TO_IMPORT = {
    "import": "import mf_celldump.analysis.replica_report\n",
    "from import": "from mf_celldump.analysis.compare import engine\n",
    "submodule by from": "from mf_celldump import analysis\n",
    "relative": "from ..analysis import ranks\n",
    "relative submodule": "from .. import analysis\n",
    "import_module": "import importlib\nimportlib.import_module('mf_celldump.analysis.compare')\n",
    "__import__": "__import__('pandas')\n",
    "lazy table": "_LAZY = {'x': ('mf_celldump.analysis.replica_report', 'summarize')}\n",
    "inside a function": "def plot():\n    import matplotlib.pyplot as plt\n",
}


@pytest.mark.parametrize("way", sorted(WAYS_TO_IMPORT))
def test_each_way_of_importing_the_analysis_side_is_found_with_its_file_and_line(way):
    source = WAYS_TO_IMPORT[way]
    line = len(source.splitlines())
    path = os.path.join("mf_celldump", "mapping", "planted.py")
    found = forbidden_imports(source, path, ANALYSIS)
    assert found and all(entry.startswith(f"{path}:{line}: ") for entry in found), found


def test_sibling_and_same_package_relative_imports_stay_in_the_core():
    path = os.path.join("mf_celldump", "mapping", "__init__.py")
    source = "from .parser import load_mapping_file\nfrom ..config import ConfigError\n"
    assert {name for name, _ in imported_modules(source, path)} == {
        "mf_celldump.mapping.parser", "mf_celldump.mapping.parser.load_mapping_file",
        "mf_celldump.config", "mf_celldump.config.ConfigError"}
