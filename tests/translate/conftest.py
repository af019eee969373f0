"""Fixtures for the Translate tests: one torch thread and the demo generator module (the demo corpus and tiny
checkpoints are tests/conftest.py's, which the Ray engines' tests share)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """One intra-op thread: tensors are tiny, and on a busy 2-core machine an OpenMP barrier waiting for a
    preempted second thread makes training steps many times slower. Restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def demo(data_script) -> ModuleType:
    """The `data/make_translate_demo.py` module."""
    return data_script("make_translate_demo")
