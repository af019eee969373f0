"""StreamRec test fixtures: the demo data generator and tiny files written under tmp_path (the tiny log and
checkpoint many tests share are in tests/conftest.py, for the benchmark smoke tests too)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def demo(data_script) -> ModuleType:
    """`data/make_streamrec_demo.py` as a module."""
    return data_script("make_streamrec_demo")


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str | bytes], Path]:
    """Write text or bytes to tmp_path/name and return the path."""

    def _write(name: str, content: str | bytes) -> Path:
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    return _write
