"""Shared setup for the core tests: the same random state and one intra-op thread per test."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_single_thread() -> Iterator[None]:
    # Tests draw their own tensors; a fixed seed makes every failure reproducible.
    torch.manual_seed(0)
    # The tensors are tiny: extra intra-op threads only add synchronisation, and on a busy
    # 2-core machine an OpenMP barrier waiting for a preempted thread makes a forward pass many
    # times slower. Restored afterwards so other test directories keep their setting.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
