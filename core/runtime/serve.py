"""HTTP serving on LitServe, shared by `python -m streamrec.serve` and `python -m translate.serve` (docs/serving.md).

An app supplies a `BatchedAPI` (load the model in `setup`, answer many requests in one `predict_many`) and a
`validate` function (request JSON -> a checked dict with defaults filled in); this module supplies the rest.
Requests are checked in the HTTP process (`JSONGate`), never in LitServe's batched loop: that loop decodes a
whole batch together, and one request raising in `decode_request` fails every request batched with it.
`PipeLitServer` overrides private LitServer internals (no public API chooses the queues between its
processes), so it refuses any litserve but `LITSERVE_VERSION`; tests/core/runtime/test_serve_litserve.py
fails on an upgrade. Unlike `core.nn`, this module imports LitServe and FastAPI.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import math
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import litserve as ls
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from litserve.transport.process_transport import MPQueueTransport
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.runtime.errors import InputError, exit_on_error

log = logging.getLogger("core.runtime.serve")
LITSERVE_VERSION = "0.2.19"  # the one whose private `LitServer._init_manager` and `_transport` PipeLitServer replaces
HOSTS = ("127.0.0.1", "0.0.0.0", "::")  # what LitServer.run accepts; 127.0.0.1: reachable from this machine only
MAX_BODY_BYTES = 1 << 20  # 1 MiB: thousands of sentences or a 50,000-item allow-list
MAX_ERROR_CHARS = 300
REQUIRED = object()  # Field.default of a field the request must give

Validate = Callable[[object], dict]


class RequestError(InputError):
    """A request the server refuses, with its HTTP status (4xx) and a one-line reason.

    Args:
        message: what is wrong and how to fix it, one line.
        status: the HTTP status code to answer with.
    """

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


def one_line(message: str) -> str:
    """`message` on one line, at most MAX_ERROR_CHARS characters (a client may echo it into a log)."""
    text = " ".join(str(message).split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def error_body(message: str) -> bytes:
    """The body of every refusal: `{"error": "one line"}`."""
    return json.dumps({"error": one_line(message)}).encode()


# --- request checking -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One key of a request object: its JSON type, its default and its limits.

    Args:
        kind: the JSON type: bool, int, float (an integer is accepted), str or list.
        default: the value when the key is absent; REQUIRED: the key must be given; None: null is allowed.
        lo: numbers: the smallest value; str and list: the fewest characters or elements.
        hi: numbers: the largest value; str and list: the most characters or elements.
        item: lists: the type of every element (str or int).
        item_hi: lists of str: the most characters per element.
    """

    kind: type
    default: Any = REQUIRED
    lo: float | None = None
    hi: float | None = None
    item: type | None = None
    item_hi: int | None = None


_JSON_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}


def _is(value: object, kind: type) -> bool:
    """Whether a parsed JSON value has the JSON type `kind` (true is not an integer here, unlike in Python)."""
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _check_value(name: str, value: Any, field: Field) -> None:
    if not _is(value, field.kind):
        raise RequestError(f"`{name}` must be {_JSON_NAMES[field.kind]}, got {json.dumps(value)[:40]}")
    if field.kind is bool:
        return
    if field.kind in (int, float):
        size, shown, unit = value, f"`{name}` ({value})", ""
    else:
        size, unit = len(value), " characters" if field.kind is str else " elements"
        shown = f"`{name}` has {size}{unit};"
    if (field.lo is not None and size < field.lo) or (field.hi is not None and size > field.hi):
        if field.lo is not None and field.hi is not None:
            limits = f"between {_num(field.lo)} and {_num(field.hi)}"
        else:
            limits = f"at least {_num(field.lo)}" if field.lo is not None else f"at most {_num(field.hi)}"
        raise RequestError(f"{shown} must be {limits}{unit}")
    if field.kind is list and field.item is not None:
        if field.item is str and all(type(e) is str for e in value) and (  # the common case, without a Python loop
                field.item_hi is None or not value or max(map(len, value)) <= field.item_hi):
            return
        for i, element in enumerate(value):
            if not _is(element, field.item):
                raise RequestError(f"`{name}[{i}]` must be {_JSON_NAMES[field.item]}, got {json.dumps(element)[:40]}")
            if field.item_hi is not None and len(element) > field.item_hi:
                raise RequestError(f"`{name}[{i}]` has {len(element)} characters; must be at most {field.item_hi}")


def _num(x: float | None) -> str:
    return str(int(x)) if x is not None and float(x).is_integer() else str(x)


def check_fields(payload: object, fields: Mapping[str, Field]) -> dict:
    """The request object checked against `fields`, with the defaults of absent optional fields filled in.

    Args:
        payload: the parsed JSON body.
        fields: every allowed key and its `Field`.

    Raises:
        RequestError: not an object, an unknown or missing key, a wrong type, a value out of range.
    """
    if not isinstance(payload, dict):
        raise RequestError(f"the body must be a JSON object such as {{\"{next(iter(fields))}\": ...}}, "
                           f"got {type(payload).__name__}", 400)
    unknown = [key for key in payload if key not in fields]
    if unknown:
        raise RequestError(f"unknown field `{unknown[0]}`; allowed fields: {', '.join(fields)}")
    checked = {}
    for name, field in fields.items():
        if name not in payload:
            if field.default is REQUIRED:
                raise RequestError(f"missing field `{name}`")
            checked[name] = list(field.default) if isinstance(field.default, list) else field.default
            continue
        value = payload[name]
        if not (value is None and field.default is None):
            _check_value(name, value, field)
        checked[name] = value
    return checked


def parse_json(body: bytes) -> object:
    """The JSON value of a request body; not JSON, NaN/Infinity or a repeated key -> RequestError (400)."""
    try:
        return json.loads(body, parse_constant=_no_constant, parse_float=_finite_float,
                          object_pairs_hook=_no_repeated_keys)
    except RequestError:
        raise
    except json.JSONDecodeError as err:
        reason = f"{err.msg} at line {err.lineno} column {err.colno}"
    except UnicodeDecodeError:
        reason = "not UTF-8 text"
    except (ValueError, RecursionError) as err:  # nesting too deep, an out-of-range number
        reason = type(err).__name__
    raise RequestError(f"the body is not valid JSON ({reason}); send one JSON object", 400)


def _no_constant(name: str) -> None:
    raise RequestError(f"the body holds {name}, which is not JSON; send finite numbers", 400)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 would parse as inf
        raise RequestError(f"the number {text[:20]} is too large; send finite numbers", 400)
    return value


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        repeated = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise RequestError(f"the field `{repeated}` is given twice; give it once", 400)
    return out


# --- the HTTP layer -----------------------------------------------------------------------------------------------


class JSONGate:
    """ASGI middleware: a size limit on every body; a parsed, checked JSON object for `POST path`.

    A refused request is answered here with `{"error": "one line"}` and never reaches LitServe's queue.
    An accepted one reaches LitServe as the checked object (defaults filled in) re-encoded as JSON.

    Args:
        app: the ASGI app behind it.
        path: the prediction route ("/predict").
        max_body_bytes: the largest body accepted (413 above it, before any of it is read when
            Content-Length says so).
        validate: parsed JSON -> the checked request; raises RequestError.
    """

    def __init__(self, app: Any, *, path: str, max_body_bytes: int, validate: Validate):
        self.app, self.path, self.max_body_bytes, self.validate = app, path, max_body_bytes, validate

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            length = _content_length(scope)
            if length is not None and length > self.max_body_bytes:
                raise RequestError(self._too_large(length), 413)
            if scope["path"] != self.path or scope["method"] != "POST":
                await self.app(scope, receive, send)
                return
            body = await self._read_body(receive)
            if body is None:
                return  # the client went away
            request = self.validate(parse_json(body))
        except RequestError as err:
            await _reply(send, err.status, error_body(str(err)))
            return
        except Exception:  # a bug in a validator: log it, answer this request, keep serving
            log.exception("checking a request failed")
            await _reply(send, 500, error_body("Internal server error"))
            return
        data = json.dumps(request).encode()
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-type", b"content-length",
                                                                    b"transfer-encoding")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        await self.app({**scope, "headers": headers}, _replay(data, receive), send)

    async def _read_body(self, receive: Callable) -> bytes | None:
        """The whole body, or None if the client disconnected; counts as it reads (no Content-Length needed)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise RequestError(self._too_large(size, more=True), 413)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self, size: int, more: bool = False) -> str:
        return (f"the body has {'more than ' if more else ''}{size} bytes; at most {self.max_body_bytes} are accepted "
                "(--max-body-bytes); split the request")


def _content_length(scope: dict) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                raise RequestError("the Content-Length header is not a number", 400) from None
    return None


def _replay(data: bytes, receive: Callable) -> Callable:
    """A `receive` that yields `data` as the whole body once, then waits for the client as the original does."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        return await receive()

    return replay


async def _reply(send: Callable, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _as_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Every HTTP error FastAPI or LitServe raises (404, 405, 500, 504) answers `{"error": "one line"}`."""
    return JSONResponse({"error": one_line(str(exc.detail))}, status_code=exc.status_code, headers=exc.headers)


class BatchedAPI(ls.LitAPI):
    """A LitAPI whose subclasses answer a list of checked requests at once (`predict_many`).

    LitServe hands `predict` a list of requests when `max_batch_size` > 1 and a single request
    otherwise; both reach `predict_many` as a list. `decode_request`, `batch` and `unbatch` keep
    LitServe's defaults: the requests arrive as checked dicts (`JSONGate`). `encode_response` renders
    each answer to JSON bytes here, in the worker, so the HTTP process passes the response through
    instead of walking it with FastAPI's `jsonable_encoder`.

    Args:
        threads: torch intra-op threads of the worker process (0: leave PyTorch's default).
        max_batch_size: the most requests answered together.
        batch_timeout: seconds to wait for a batch to fill.
    """

    def __init__(self, threads: int = 0, *, max_batch_size: int = 1, batch_timeout: float = 0.0):
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.threads = threads

    def setup(self, device: str) -> None:
        """Load the model onto `device` (called once in each worker process)."""
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        self.load(device)

    def load(self, device: str) -> None:
        """Load the model onto `device`."""
        raise NotImplementedError

    def predict(self, x: Any) -> Any:
        """One answer per request: a list for a batch, a single answer otherwise."""
        return self.predict_many(x) if self.max_batch_size > 1 else self.predict_many([x])[0]

    def encode_response(self, output: dict) -> Response:
        """One answer as a rendered JSON response; a value JSON cannot hold (NaN) fails this request only."""
        try:
            return JSONResponse(output)
        except (TypeError, ValueError) as err:  # LitServe would fail the whole batch with a plain-text 500
            log.error("encoding an answer failed: %s", err)
            return JSONResponse({"error": "Internal server error: the answer could not be encoded as JSON"}, 500)

    def predict_many(self, requests: list[dict]) -> list[dict]:
        """One JSON-ready answer per checked request, in order."""
        raise NotImplementedError


class PipeLitServer(ls.LitServer):
    """A LitServer whose processes talk through pipes (`multiprocessing.Queue`), not Manager proxies.

    LitServe passes every request and every answer through queues of a `multiprocessing.Manager`: each
    put and each get is a round trip to the Manager's own process, and the worker fetches a batch one
    request at a time, so dynamic batching saves only the model's share of a request. Its public
    `fast_queue=True` (ZeroMQ) does not help: `LitServer.__init__` passes it as `transport_config=`, a
    field `TransportConfig` does not have, so the Manager queues stay; and when wired by hand its PUB/SUB
    sockets drop the first answers under load. Pipe queues are LitServe's own `MPQueueTransport` with
    `multiprocessing.Queue`s in it: the same interface, no third process, nothing dropped.

    No public API chooses the queues, so `_init_manager` (private) is overridden to replace the queues it
    built in `litapi_request_queues` and `_transport` (private). Only `LITSERVE_VERSION` is accepted.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        if ls.__version__ != LITSERVE_VERSION:
            raise RuntimeError(f"litserve {ls.__version__} is installed, but core.runtime.serve replaces private "
                               f"LitServer queues of litserve {LITSERVE_VERSION} only; install that version: "
                               f"pip install -c constraints.txt litserve=={LITSERVE_VERSION}")
        super().__init__(*args, **kwargs)

    def _init_manager(self, num_api_servers: int) -> Any:
        manager = super()._init_manager(num_api_servers)
        for path in self.litapi_request_queues:
            self.litapi_request_queues[path] = _pipe_queue()
        self._transport = MPQueueTransport(manager, [_pipe_queue() for _ in range(num_api_servers)])
        return manager


def _pipe_queue() -> Any:
    """A `multiprocessing.Queue` for spawned workers and forked HTTP processes alike.

    A process that ends does not wait for its queue's feeder thread: at shutdown the reader may be gone.
    """
    queue = mp.get_context("spawn").Queue()
    queue.cancel_join_thread()
    return queue


async def _no_auth() -> None:
    """Let every request in, on the event loop: LitServe's default is a sync FastAPI dependency, which
    FastAPI runs in a thread pool, a thread hand-off per request."""


# --- the command line ---------------------------------------------------------------------------------------------


def serve_parser(prog: str, description: str, port: int, ckpt_help: str) -> argparse.ArgumentParser:
    """The options every server `prog` takes (`description`: its --help text; `port`: the default port;
    `ckpt_help`: what its `--ckpt` takes); an app adds its own."""
    p = argparse.ArgumentParser(prog=prog, description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help=ckpt_help)
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
        """`--threads`, or the CPU cores but one (the HTTP process's) shared out among the workers.

        A worker with as many torch threads as cores answers far slower: the HTTP process and the worker's
        last thread preempt each other.
        """
        return self.threads or max(1, ((os.cpu_count() or 1) - 1) // self.workers)


def run_server(api: BatchedAPI, validate: Validate, options: ServerOptions, metadata: dict | None = None) -> None:
    """Serve `api` on `POST /predict` (and LitServe's `GET /health`, `GET /info`) until SIGINT or SIGTERM.

    Args:
        api: the app's LitAPI (pickled into each worker process, so it holds paths, not models).
        validate: parsed JSON -> the checked request (run in the HTTP process, see `JSONGate`).
        options: the server's options.
        metadata: what `GET /info` reports under "model" (JSON-ready).
    """
    o = options
    if o.batch_timeout >= o.timeout:
        raise InputError(f"--batch-timeout ({o.batch_timeout}) must be less than --timeout ({o.timeout})")
    _check_port(o.host, o.port)
    gate = (JSONGate, {"path": api.api_path, "max_body_bytes": o.max_body_bytes, "validate": validate})
    if not os.environ.get("LIT_SERVER_API_KEY") and not hasattr(api, "authorize"):  # keep LitServe's key check
        api.authorize = _no_auth
    server = PipeLitServer(api, accelerator=o.accelerator, workers_per_device=o.workers, timeout=o.timeout,
                           model_metadata=metadata, middlewares=[gate])
    server.app.add_exception_handler(StarletteHTTPException, _as_error)
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
    """SIGTERM stops the server as Ctrl-C does: LitServe shuts its worker processes down on KeyboardInterrupt only.

    The HTTP processes LitServe forks inherit this handler; uvicorn raises the signal again after its own
    clean shutdown, and there it just ends the process (no KeyboardInterrupt traceback).
    """
    main_pid = os.getpid()

    def stop(signum: int, frame: object) -> None:
        if os.getpid() == main_pid:
            raise KeyboardInterrupt(f"signal {signum}")
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A bad checkpoint, option or file ends the command with one line on stderr and exit status 1
    (`core.runtime.errors.exit_on_error`), its message on one line."""
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


# --- a local server for tests and benchmarks ------------------------------------------------------------------------


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
    root = Path(__file__).resolve().parents[2]  # the repository: core/runtime/serve.py
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
