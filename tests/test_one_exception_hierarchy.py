"""Every exception mf_celldump defines derives from ``CellDumpError``, so "anything the package refused"
is one ``except`` away, and each public kind is importable from ``mf_celldump.errors``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import pkgutil

import mf_celldump
from mf_celldump import errors


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
    assert len(found) > 20 and "mf_celldump.analysis.compare.tensors.TensorFileError" in found
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, errors.CellDumpError))
    assert outside == []


def test_exception_names_are_defined_once():
    found = [cls.__name__ for name in _modules() for cls in _exception_classes(name)]
    assert sorted(n for n in set(found) if found.count(n) > 1) == []


def test_public_exceptions_are_the_same_classes_wherever_they_are_imported_from():
    from mf_celldump.capture.session import AttachError, StepError
    from mf_celldump.config import ConfigError
    from mf_celldump.mapping.entries import MappingError
    from mf_celldump.processing.errors import ManifestError, ProcessingError
    from mf_celldump.rawformat.manifest import ManifestError as RawManifestError

    assert (AttachError, StepError, ConfigError, MappingError, ProcessingError) == (
        mf_celldump.AttachError, mf_celldump.StepError, mf_celldump.ConfigError, mf_celldump.MappingError,
        mf_celldump.ProcessingError)
    assert ManifestError is RawManifestError is errors.ManifestError
    assert issubclass(ConfigError, ValueError) and issubclass(AttachError, RuntimeError)
