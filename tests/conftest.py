"""Generic fixtures shared by the whole suite (keep this file small)."""

from __future__ import annotations

import pytest


@pytest.fixture
def tmp_dump_dir(tmp_path):
    """An empty directory to use as a ``dump_path``; removed with pytest's tmp_path."""
    path = tmp_path / "celldump"
    path.mkdir()
    return path
