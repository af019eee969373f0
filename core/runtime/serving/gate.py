"""ASGI middleware in the HTTP process: a size limit on every body, and the checked JSON of each prediction.

Requests are checked here, never in LitServe's batched loop: that loop decodes a whole batch together, and one
request raising in `decode_request` fails every request batched with it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.runtime.serving.schema import RequestError, error_body, one_line, parse_json

log = logging.getLogger("core.runtime.serving")
MAX_BODY_BYTES = 1 << 20  # 1 MiB: thousands of sentences or a 50,000-item allow-list

Validate = Callable[[object], dict]


class JSONGate:
    """ASGI middleware: a size limit on every body (413, before reading it when Content-Length says so); a parsed,
    checked JSON object for `POST path`, re-encoded for LitServe with the defaults filled in. A refused request is
    answered here with `{"error": "one line"}` and never reaches LitServe's queue."""

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
        """The whole body, or None if the client disconnected; counts as it reads (Content-Length may lie)."""
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
    body = [{"type": "http.request", "body": data, "more_body": False}]

    async def replay() -> dict:
        return body.pop() if body else await receive()

    return replay


async def _reply(send: Callable, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def error_response(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Every HTTP error FastAPI or LitServe raises (404, 405, 500, 504) answers `{"error": "one line"}`."""
    return JSONResponse({"error": one_line(str(exc.detail))}, status_code=exc.status_code, headers=exc.headers)
