"""The child of tests/test_exit_status.py: one program run, leaving as the program would.

It lives in its own module so that multiprocessing's fork server (a fresh interpreter that has imported the
programs and nothing else) can fork it: a child forked from a pytest worker would inherit whatever an earlier
test left there (inductor's compile workers, Ray's threads), and hang or crash at exit for that reason alone."""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable

LIBC = ctypes.CDLL(None)


def run(main: Callable[[list[str]], object], argv: list[str], logs: str, libc_exit: bool) -> None:
    """`main(argv)` with stdout and stderr in `logs`.out and `logs`.err, then Python's exit handlers and, with
    `libc_exit`, libc's `exit` (where a native thread still alive aborts the process, and the C++ destructors
    run); without it `os._exit`, which skips the destructors (torch's take a third of a second)."""
    code = 70
    try:
        for fd, suffix in ((1, ".out"), (2, ".err")):
            os.dup2(os.open(f"{logs}{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        # Ctrl-C as in a terminal: an xdist worker ignores SIGINT, and the fork server inherited that
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            main(argv)
            code = 0
        except SystemExit as stop:  # what the interpreter does with it: print a message, exit 1
            code = stop.code if isinstance(stop.code, int) else (stop.code is not None)
            if not isinstance(stop.code, int | None):
                print(stop.code, file=sys.stderr)
        except BaseException:  # a bug: the interpreter's traceback, and a status no refusal has
            traceback.print_exc()
        threading._shutdown()  # then as Py_Finalize would: join the threads, run the exit handlers
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if libc_exit:
            LIBC.exit(code)
        os._exit(code)
