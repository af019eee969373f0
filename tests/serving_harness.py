"""`local_server`: a `python -m APP.serve` process on a free local port, ready, for the serving tests.

Shared by tests/streamrec/test_serve.py and tests/translate/test_serve.py, which load it by path (the tests
are not a package).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path


@contextmanager
def local_server(module: str, args: Sequence[str], log: str | os.PathLike | None = None,
                 ready_s: float = 90.0) -> Iterator[str]:
    """`python -m MODULE ARGS` on a free port of 127.0.0.1, ready; yields its base URL and stops it after.

    The server runs in its own session, so stopping it reaches every process it started: SIGTERM
    first (LitServe's clean shutdown), SIGKILL to the whole group if it is still there after 20 s.

    Args:
        module: "streamrec.serve" or "translate.serve".
        args: its options, without --host and --port.
        log: the file that gets the server's output (None: discarded).
        ready_s: seconds to wait for `GET /health` to answer 200.

    Raises:
        RuntimeError: the server exited, or was not ready in time (with the end of its log).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a port nothing listens on now: the OS's pick
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", module, *args, "--host", "127.0.0.1", "--port", str(port)]
    root = Path(__file__).resolve().parents[1]  # the repository: tests/serving_harness.py
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    with open(log if log is not None else os.devnull, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=root, env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, proc, ready_s, log)
            yield url
        finally:
            _stop(proc)


def _wait_ready(url: str, proc: subprocess.Popen, ready_s: float, log: str | os.PathLike | None) -> None:
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}: {_tail(log)}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (OSError, http.client.HTTPException):  # not listening yet, or 503 while the worker loads
            pass
        time.sleep(0.25)
    raise RuntimeError(f"the server was not ready after {ready_s:g} s: {_tail(log)}")


def _tail(log: str | os.PathLike | None) -> str:
    if log is None:
        return "(no log kept)"
    return " | ".join(Path(log).read_text(errors="replace").strip().splitlines()[-5:])


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    with suppress(ProcessLookupError, PermissionError):  # the group is gone: everything ended cleanly
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
