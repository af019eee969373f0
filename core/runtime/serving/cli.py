"""The server command line every app shares: `serve_parser`, `ServerOptions` and `run_server`."""

from __future__ import annotations

import argparse
import os
import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException

from core.runtime.errors import InputError, exit_on_error
from core.runtime.serving.gate import MAX_BODY_BYTES, JSONGate, Validate, error_response
from core.runtime.serving.litserver import BatchedAPI, PipeLitServer, no_auth
from core.runtime.threads import available_cpus

HOSTS = ("127.0.0.1", "0.0.0.0", "::")  # what LitServer.run accepts; 127.0.0.1: reachable from this machine only


def serve_parser(prog: str, description: str, port: int, ckpt_help: str) -> argparse.ArgumentParser:
    """The options every server `prog` takes (`description`: its --help text; `port`: the default port;
    `ckpt_help`: what its `--ckpt` takes); an app adds its own."""
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, nargs="+", metavar="CKPT",
                   help=f"{ckpt_help}; several (one vocabulary): an ensemble, the mean of their probabilities")
    p.add_argument("--host", default="127.0.0.1", choices=HOSTS,
                   help="interface to listen on (default 127.0.0.1: this machine only; 0.0.0.0: every interface)")
    p.add_argument("--port", type=_number(int, 1024, 65535), default=port,  # LitServer.run refuses the privileged ones
                   help=f"TCP port, 1024-65535 (default {port})")
    p.add_argument("--max-batch-size", type=_number(int, 1), default=32,
                   help="the most requests answered in one model call (default 32; 1: no dynamic batching)")
    # 2 ms, short: under load requests queue while the model runs, so batches fill without waiting, and a long wait
    # only idles the worker (docs/results.md, "HTTP serving"). 0 would spin the worker when idle (LitServe).
    p.add_argument("--batch-timeout", type=_number(float, 0), default=0.002,
                   help="seconds the worker waits for a batch to fill (default 0.002)")
    p.add_argument("--workers", type=_number(int, 1), default=1,
                   help="model worker processes, each with its own copy of the model (default 1)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads per worker (default: the CPU cores but one, shared among the workers)")
    p.add_argument("--max-body-bytes", type=_number(int, 1), default=MAX_BODY_BYTES,
                   help=f"largest request body accepted; larger ones get 413 (default {MAX_BODY_BYTES})")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds a request may wait for a worker before it gets 504 (default 30)")
    p.add_argument("--accelerator", default="cpu", choices=("cpu", "cuda", "auto"), help="where the model runs")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                   help="server log level (info logs every request)")
    return p


@dataclass(frozen=True)
class ServerOptions:
    """What `serve_parser`'s options ask of the server, built once from the command line and handed down."""

    ckpt: str
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch_size: int = 32
    batch_timeout: float = 0.002
    workers: int = 1
    threads: int = 0
    max_body_bytes: int = MAX_BODY_BYTES
    timeout: float = 30.0
    accelerator: str = "cpu"
    log_level: str = "info"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerOptions:
        """The options of a parsed `serve_parser` (an app's own extra options stay in `args`)."""
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})

    @property
    def threads_per_worker(self) -> int:
        """`--threads`, or the CPUs this process may use but one, shared out among the workers: a worker with as
        many torch threads as cores competes with the HTTP process, and the two preempt each other."""
        return self.threads or max(1, (available_cpus() - 1) // self.workers)


def run_server(api: BatchedAPI, validate: Validate, options: ServerOptions, metadata: dict | None = None) -> None:
    """Serve `api` on `POST /predict` (and LitServe's `GET /health`, `GET /info`) until SIGINT or SIGTERM. `api` is
    pickled into each worker process, so it holds paths, not models; `validate` (parsed JSON -> the checked request)
    runs in the HTTP process (`JSONGate`); `metadata` is what `GET /info` reports as "model"."""
    o = options
    if o.batch_timeout >= o.timeout:
        raise InputError(f"--batch-timeout ({o.batch_timeout}) must be less than --timeout ({o.timeout})")
    _check_port(o.host, o.port)
    gate = (JSONGate, {"path": api.api_path, "max_body_bytes": o.max_body_bytes, "validate": validate})
    if not os.environ.get("LIT_SERVER_API_KEY") and not hasattr(api, "authorize"):  # keep LitServe's key check
        api.authorize = no_auth
    server = PipeLitServer(api, accelerator=o.accelerator, workers_per_device=o.workers, timeout=o.timeout,
                           model_metadata=metadata, middlewares=[gate])
    server.app.add_exception_handler(StarletteHTTPException, error_response)
    _stop_on_sigterm()
    # LitServer.run would write a client.py into the working directory unless told not to.
    server.run(host=o.host, port=o.port, log_level=o.log_level, generate_client_file=False)


def _check_port(host: str, port: int) -> None:
    """Refuse a port in use before any worker loads (uvicorn would print Errno 98 only after that)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a closing socket is no conflict
        try:
            s.bind((host, port))
        except OSError as err:
            raise InputError(f"--port {port}: cannot listen on {host}:{port} ({err.strerror}); pick another port "
                             "or stop the server that uses it") from None


def _stop_on_sigterm() -> None:
    """SIGTERM stops the server as Ctrl-C does: LitServe's graceful shutdown (the HTTP processes finish the
    requests they hold, then the workers stop) follows KeyboardInterrupt only. The processes forked from this
    one (the Manager, the HTTP processes around uvicorn's own handlers) leave a signal sent to the whole group
    (Ctrl-C, systemd, `kill -- -PGID`) to this process, which stops them in that order."""
    main_pid = os.getpid()

    def stop(signum: int, frame: object) -> None:
        if os.getpid() == main_pid:
            raise KeyboardInterrupt(f"signal {signum}")

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A bad checkpoint, option or file ends the command with one line on stderr and exit status 1."""
    with exit_on_error():
        try:
            yield
        # InputError, UnsafeCheckpointError; RuntimeError: LitServe's "One or more workers failed to start" (the
        # log above says why) or an unsupported litserve (PipeLitServer)
        except (ValueError, FileNotFoundError, RuntimeError) as err:
            raise InputError(" ".join(str(err).split())) from None


def _number(kind: type, lo: int, hi: int | None = None) -> Callable[[str], Any]:
    """An argparse type: `kind(text)`, at least `lo` and at most `hi` (NaN is refused)."""

    def parse(text: str) -> Any:
        value = kind(text)
        if not (lo <= value and (hi is None or value <= hi)):
            limit = f">= {lo}" if hi is None else f"between {lo} and {hi}"
            raise argparse.ArgumentTypeError(f"{value} must be {limit}")
        return value

    return parse
