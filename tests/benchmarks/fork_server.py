"""A stand-in for `python3` whose every run forks from one process that has already imported torch, lightning and
the other third-party modules the apps import.

The benchmark scripts under test start fresh interpreters on purpose (hot_path.py's child per tree, run_all.sh's
stages), and each would import torch and lightning again: seconds of CPU that the smoke tests do not check. Here
`python fork_server.py ADDRESS` imports those once and serves a Unix socket; `write_shim` writes a `python3` that
sends its argv, working directory, environment and stdin/stdout/stderr there and exits with the forked run's
status. The run is otherwise what the interpreter does with `-c CODE`, `-m MODULE` or `SCRIPT` (its own
`__main__`, `sys.argv`, `sys.path`, exit status); nothing of the apps or of benchmarks/ is imported beforehand, so
each run imports core, streamrec and translate from the path it sets. What the preloaded modules read from the
environment at import (OMP_NUM_THREADS, CUDA_VISIBLE_DEVICES) is the server's: the test process's environment.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import runpy
import socket
import sys
import traceback
from pathlib import Path

# Third-party modules the apps import, the costly ones; none of core, streamrec, translate or benchmarks/.
PRELOAD = ("torch", "torch._functorch.aot_autograd", "torch._inductor.codecache", "lightning.pytorch", "torchmetrics",
           "pyarrow.compute", "sacrebleu", "sentencepiece", "filelock", "rich.console", "pytest")

SHIM = """#!{python} -IS
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect({address!r})
msg = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(s, [len(msg).to_bytes(8, "big")], [0, 1, 2])
s.sendall(msg)
status = b""
while len(status) < 4 and (part := s.recv(4 - len(status))):
    status += part
code = int.from_bytes(status, "big", signed=True) if len(status) == 4 else 1
sys.exit(code if code >= 0 else 128 - code)
"""


def write_shim(folder: Path, address: str) -> Path:
    """`folder/python3`, an executable that runs its command line in the server at `address`."""
    shim = folder / "python3"
    shim.write_text(SHIM.format(python=sys.executable, address=address))
    shim.chmod(0o755)
    return shim


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(conn, 8, 3)
    size, data = int.from_bytes(header, "big"), b""
    while len(data) < size:
        data += conn.recv(size - len(data))
    return json.loads(data), fds


def _run(request: dict, fds: list[int]) -> None:
    """In the forked child: take the caller's stdio, directory and environment, then run its command line."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if os.environ.get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(line_buffering=True)
    sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    argv = request["argv"]
    if argv[:1] == ["-c"] and len(argv) > 1:
        sys.argv = ["-c", *argv[2:]]
        sys.path.insert(0, "")
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    elif argv[:1] == ["-m"] and len(argv) > 1:
        sys.argv = [argv[1], *argv[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv and not argv[0].startswith("-"):
        sys.argv = list(argv)
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")
    else:
        sys.exit(f"fork_server: only `-c CODE`, `-m MODULE` or `SCRIPT` with arguments, got {argv}")


def _child(request: dict, fds: list[int]) -> int:
    """The run's exit status as the interpreter would give it. Then the atexit functions, but no teardown of the
    inherited heap: freeing it would copy every page the fork shared, which costs more than most runs."""
    try:
        _run(request, fds)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, int | None):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def serve(address: str) -> None:
    sys.path.pop(0)  # this folder: a run sees the path its own command line gives it
    for name in PRELOAD:
        __import__(name)
    gc.freeze()  # the children's collections leave the preloaded objects, and the pages they share, alone
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    listener.listen()
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        with conn:
            request, fds = _receive(conn)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                os._exit(_child(request, fds))
            for fd in fds:
                os.close(fd)
            _, status = os.waitpid(pid, 0)
            conn.sendall(os.waitstatus_to_exitcode(status).to_bytes(4, "big", signed=True))


if __name__ == "__main__":
    serve(sys.argv[1])
