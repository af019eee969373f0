"""LitServe glue: `BatchedAPI`, the LitAPI an app fills in, and `PipeLitServer`, a LitServer on pipe queues.

`PipeLitServer` overrides private LitServer internals (no public API chooses the queues between its processes),
so it refuses any litserve but `LITSERVE_VERSION`; tests/core/runtime/test_serve_litserve.py fails on an upgrade."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
from typing import Any

import litserve as ls
import torch
from fastapi.responses import JSONResponse, Response
from litserve.transport.process_transport import MPQueueTransport

log = logging.getLogger("core.runtime.serving")
LITSERVE_VERSION = "0.2.19"  # the one whose private `LitServer._init_manager` and `_transport` PipeLitServer replaces


class BatchedAPI(ls.LitAPI):
    """A LitAPI whose subclasses answer a list of checked requests at once (`predict_many`), batched or not.
    `encode_response` renders each answer to JSON bytes in the worker, so the HTTP process passes the response through
    instead of walking it with FastAPI's `jsonable_encoder`. `threads`: the worker's torch threads (0: torch's own)."""

    def __init__(self, threads: int = 0, *, max_batch_size: int = 1, batch_timeout: float = 0.0):
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.threads = threads

    def setup(self, device: str) -> None:
        """Load the model onto `device` (called once in each worker process). The worker leaves the server's process
        group, so a signal sent to the group (Ctrl-C, systemd) cannot stop it while the HTTP processes still wait on its
        answers: LitServe stops it after them. It ends with its parent instead, should that be killed outright."""
        parent = mp.parent_process()
        if parent is not None:
            os.setpgid(0, 0)
            threading.Thread(target=lambda: (parent.join(), os._exit(0)), daemon=True).start()
        if self.threads:
            torch.set_num_threads(self.threads)
        self.load(device)

    def load(self, device: str) -> None:
        raise NotImplementedError

    def predict(self, x: Any) -> Any:
        # LitServe passes a list only when batching (max_batch_size > 1).
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
    """A LitServer whose processes talk through pipes (`multiprocessing.Queue`), not Manager proxies. Through a
    Manager's queues each put and get is a round trip to the Manager's process. LitServe's `fast_queue=True` (ZeroMQ)
    never reaches the transport config, and wired by hand drops answers under load. No public API chooses the queues, so
    the private `_init_manager` is overridden to replace them."""

    def __init__(self, *args: Any, **kwargs: Any):
        if ls.__version__ != LITSERVE_VERSION:
            raise RuntimeError(f"litserve {ls.__version__} is installed, but core.runtime.serving.litserver replaces "
                               f"private LitServer queues of litserve {LITSERVE_VERSION} only; install that version: "
                               f"pip install -c constraints.txt litserve=={LITSERVE_VERSION}")
        super().__init__(*args, **kwargs)

    def _init_manager(self, num_api_servers: int) -> Any:
        manager = super()._init_manager(num_api_servers)
        for path in self.litapi_request_queues:
            self.litapi_request_queues[path] = _pipe_queue()
        self._transport = MPQueueTransport(manager, [_pipe_queue() for _ in range(num_api_servers)])
        return manager


def _pipe_queue() -> Any:
    """A `multiprocessing.Queue` for spawned workers and forked HTTP processes alike, whose feeder thread a
    process that ends does not wait for: at shutdown the reader may be gone."""
    queue = mp.get_context("spawn").Queue()
    queue.cancel_join_thread()
    return queue


async def no_auth() -> None:
    """Let every request in, on the event loop: LitServe's default is a sync FastAPI dependency, which
    FastAPI runs in a thread pool, a thread hand-off per request."""
