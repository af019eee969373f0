"""StreamRec test fixtures: tiny files written under tmp_path and the demo data generator."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def demo() -> ModuleType:
    """`data/make_streamrec_demo.py` as a module (data/ is a folder of scripts, not a package)."""
    name = "make_streamrec_demo"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "data" / "make_streamrec_demo.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the file executes
        spec.loader.exec_module(module)
    return sys.modules[name]


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
