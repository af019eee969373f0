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
import runpy
from multiprocessing.process import BaseProcess
from pathlib import Path

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


_PROGRAM = """
import os, runpy, signal, sys, tempfile

# What `python -m PACKAGE ARGV` does, started in CWD with ENV and PATH first on sys.path; its output in LOGS.*
os.chdir(CWD)
os.environ.update(ENV)
tempfile.tempdir = None  # the server may have cached its own $TMPDIR
sys.path[:0] = PATH
for fd, suffix in ((1, ".out"), (2, ".err")):
    os.dup2(os.open(LOGS + suffix, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal: an xdist worker ignores SIGINT
sys.argv = [PACKAGE, *ARGV]
runpy.run_module(PACKAGE, run_name="__main__", alter_sys=True)
"""


def start_program(
    package: str,
    cwd: Path,
    args: list[str],
    logs: Path,
    env: dict[str, str] | None = None,
) -> BaseProcess:
    """`python -m PACKAGE ARGS` in `cwd`, as a process of its own with `cwd.parent` on its path (the tests'
    callbacks) and its stdout and stderr in `logs`.out and `logs`.err; its caller `preload`s the program's CLI
    module. Its `exitcode`: the status `main`'s SystemExit gives, as the interpreter's; minus the number of the
    signal that ended it."""
    script = logs.parent / f"{logs.name}_child.py"
    script.write_text(_PROGRAM)
    names = {
        "PACKAGE": package,
        "CWD": str(cwd),
        "ARGV": args,
        "ENV": env or {},
        "PATH": [str(cwd.parent)],
        "LOGS": str(logs),
    }
    child = FORKS.Process(
        target=runpy.run_path, args=(str(script),), kwargs={"run_name": "__main__", "init_globals": names}
    )
    child.start()
    return child
