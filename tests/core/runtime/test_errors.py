"""`core.runtime.errors.exit_on_error` ends a program without the interpreter's last garbage collection: an object
left in a reference cycle at exit is not walked (its finalizer does not run), where a plain interpreter collects it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CHILD = """
import gc
import sys
from core.runtime.errors import exit_on_error

class InCycle:
    def __del__(self):
        print("collected", flush=True)

def leave_a_cycle():
    gc.collect()  # from here on too few allocations for an automatic collection before the exit
    item = InCycle()
    item.me = item  # only a collection frees it

if sys.argv[1] == "program":
    with exit_on_error():
        leave_a_cycle()
else:
    leave_a_cycle()
"""


@pytest.mark.parametrize(("kind", "printed"), [("program", ""), ("library", "collected\n")])
def test_a_program_skips_the_exit_collection_that_a_plain_interpreter_runs(kind, printed):
    done = subprocess.run([sys.executable, "-c", CHILD, kind], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed
