"""Every exception mf_celldump defines derives from ``CellDumpError``, so "anything the package refused"
is one ``except`` away; every exception that leaves its module is defined in, and imported from,
``mf_celldump.errors`` (no module passes another's exceptions on)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil

import mf_celldump
from mf_celldump import errors
from tests.support.import_graph import module_of, package_files, read


def _modules():
    """Every module of the package, the analysis tools and the command line included."""
    yield "mf_celldump"
    yield from (info.name for info in pkgutil.walk_packages(mf_celldump.__path__, "mf_celldump."))


def _exception_classes(name):
    if name.endswith(".__main__"):  # runs the command when imported: read its classes instead
        spec = importlib.util.find_spec(name)
        with open(spec.origin, encoding="utf-8") as handle:
            assert not [n for n in ast.walk(ast.parse(handle.read())) if isinstance(n, ast.ClassDef)], name
        return []
    module = importlib.import_module(name)
    return [obj for _, obj in inspect.getmembers(module, inspect.isclass)
            if obj.__module__ == name and issubclass(obj, BaseException)]


def test_every_exception_of_the_package_derives_from_cell_dump_error():
    found = {f"{cls.__module__}.{cls.__qualname__}": cls for name in _modules() for cls in _exception_classes(name)}
    assert len(found) > 20 and "mf_celldump.errors.TensorFileError" in found
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, errors.CellDumpError))
    assert outside == []


def test_exception_names_are_defined_once():
    found = [cls.__name__ for name in _modules() for cls in _exception_classes(name)]
    assert sorted(n for n in set(found) if found.count(n) > 1) == []


def test_public_exceptions_are_the_classes_of_errors():
    from mf_celldump.errors import AttachError, ConfigError, MappingError, ProcessingError, StepError

    assert (AttachError, StepError, ConfigError, MappingError, ProcessingError) == (
        mf_celldump.AttachError, mf_celldump.StepError, mf_celldump.ConfigError, mf_celldump.MappingError,
        mf_celldump.ProcessingError)
    assert issubclass(ConfigError, ValueError) and issubclass(AttachError, RuntimeError)
    assert issubclass(errors.ManifestError, errors.ProcessingError) and issubclass(errors.ManifestError, ValueError)


def _sources():
    """(dotted module name, path, parsed source) of every module of the package, read as text."""
    for path in package_files():
        yield module_of(path)[0], path, ast.parse(read(path), filename=path)


def _exception_names():
    names = set()
    for module in _modules():
        names.update(cls.__name__ for cls in _exception_classes(module))
    return names


def test_exceptions_are_imported_from_errors_only():
    """``from somewhere import SomeError`` (relative or absolute, in a function too) names ``errors``; the
    package's public API (``from mf_celldump import ConfigError``) is for users, not for its own modules."""
    exceptions = _exception_names()
    found = []
    for _, path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("mf_celldump")):
                if node.module in ("errors", "mf_celldump.errors"):
                    continue
                found += [f"{path}:{node.lineno}: {alias.name}" for alias in node.names if alias.name in exceptions]
    assert found == []


def test_an_exception_defined_outside_errors_stays_in_its_module():
    """A module may keep an error it raises and catches itself; one named by another module is in errors.py."""
    exceptions = _exception_names()
    local = {}
    for module, _, tree in _sources():
        if module != "mf_celldump.errors":
            local.update({node.name: module for node in tree.body if isinstance(node, ast.ClassDef)
                          and node.name in exceptions})
    assert local.get("StepProblem") == "mf_celldump.processing.step_transaction", local
    named_elsewhere = []
    for module, path, tree in _sources():
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        named_elsewhere += [f"{path}: {name}" for name, home in local.items() if home != module and name in names]
    assert named_elsewhere == []
