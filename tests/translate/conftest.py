"""Fixtures for the Translate tests: one torch thread, the demo generator module and small corpora on disk."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

DEMO_SCRIPT = Path(__file__).resolve().parents[2] / "data" / "make_translate_demo.py"


def _load_demo() -> ModuleType:
    # data/ is not a package: load the script by path (registered so dataclasses can resolve the module).
    spec = importlib.util.spec_from_file_location("make_translate_demo", DEMO_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One intra-op thread: tensors are tiny, and on a busy 2-core machine an OpenMP barrier waiting for a
    preempted second thread made training steps ~10x slower (measured). Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def demo() -> ModuleType:
    """The `data/make_translate_demo.py` module."""
    return _load_demo()


@pytest.fixture(scope="session")
def demo_dir(demo: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small demo corpus (300/30/30 pairs) written once per session."""
    out = tmp_path_factory.mktemp("translate_demo")
    demo.write_corpus(demo.generate(train_size=300, val_size=30, test_size=30, seed=0), out)
    return out

