"""Generic fixtures shared by the whole suite (keep this file small)."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture
def tmp_dump_dir(tmp_path):
    """An empty directory to use as a ``dump_path``; removed with pytest's tmp_path."""
    path = tmp_path / "celldump"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def captured_raw_dump(tmp_path_factory):
    """Two steps of tests/support/capture_net.py captured with attach (real MindSpore, PyNative, tensor
    task), kept raw; captured once for the suite, copied by ``raw_dump``."""
    from tests.support.hostile_dumps import capture_two_steps

    return capture_two_steps(str(tmp_path_factory.mktemp("captured") / "D"))


@pytest.fixture
def raw_dump(captured_raw_dump, tmp_path):
    """A copy of ``captured_raw_dump`` for one test to change."""
    dump = str(tmp_path / "D")
    shutil.copytree(captured_raw_dump, dump, symlinks=True)
    return dump
