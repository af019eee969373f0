"""A fit sent a signal in the middle of an epoch, for both apps' preemption tests: `python -m PACKAGE fit` as a
child of the tests' fork server (tests/forks.py), held at the step core/runtime/test_signals.py's WAITER marks.

A process of its own, since the signal and the exit status are what the tests check, but not a fresh
interpreter: that would only import torch and Lightning again. Imported by name, as forks is (tests/ on sys.path).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import forks
import pytest


def signalled_fit(package: str, cwd: Path, args: list[str], signum: int) -> tuple[int, str]:
    """`python -m PACKAGE ARGS` in `cwd` (`cwd.parent` on its path, for the WAITER callback; $TMPDIR
    `cwd.parent`/tmpdir), sent `signum` once its fit is held at the marked step; the exit status and stderr."""
    marker, logs = cwd / "at_step", cwd.parent / "signalled"
    env = {"PREEMPT_MARKER": str(marker), "TMPDIR": str(cwd.parent / "tmpdir")}
    child = forks.start_program(package, cwd, args, logs, env)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            if not child.is_alive():
                pytest.fail(
                    f"fit ended (status {child.exitcode}) before the marker:\n{Path(f'{logs}.err').read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"no {marker.name} after 300 s")
            time.sleep(0.05)
        os.kill(child.pid, signum)
        Path(f"{marker}.sent").touch()
        status = forks.exit_status(child, 300)
    finally:
        if child.is_alive():
            child.kill()
    return status, Path(f"{logs}.err").read_text()
