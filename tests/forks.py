"""The fork server that starts the tests' program runs, and the exit status of one run.

A run is a child of multiprocessing's fork server (a fresh interpreter that has imported the programs), not of
the test process: a fork of a pytest worker would inherit what earlier tests left running there (inductor's
compile workers, Ray's threads) and hang or crash at exit for that reason alone, and a `python -m PROG` child
would only import torch and Lightning again. One server serves a test process, started at its first run, so every
file asks for its modules (`preload`) before it starts a child, and what each asked for is kept.

The test files import it by name (tests/ on sys.path), so that one module, and one list of modules, serves them
all; under `--import-mode=importlib` a file loaded by path would be a module of its own.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing.process import BaseProcess

import pytest

FORKS = multiprocessing.get_context("forkserver")
_PRELOAD: list[str] = []


def preload(*modules: str) -> None:
    """Add `modules` (in this order, after those asked for before) to what the fork server imports at its start."""
    _PRELOAD.extend(m for m in modules if m not in _PRELOAD)
    FORKS.set_forkserver_preload(list(_PRELOAD))


def exit_status(child: BaseProcess, seconds: float) -> int:
    """The exit status of `child` as a shell reports it (128 + N for signal N); a hang fails the test."""
    child.join(seconds)
    if child.exitcode is None:
        child.kill()
        child.join()
        pytest.fail(f"child {child.pid} hung")
    return 128 - child.exitcode if child.exitcode < 0 else child.exitcode
