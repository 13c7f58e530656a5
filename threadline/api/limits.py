"""Refusing oversized request bodies with 413 before they are read into memory."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.exceptions import HTTPException


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` (declared or streamed) gets 413 with a JSON error."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope.get("headers") or ():
            if name == b"content-length":
                declared = value  # (the last one, as a dict of the headers would hold)
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                await self._refuse(send)
                return
            # Within the limit: nothing to count, since an HTTP server hands the app no more body than the
            # request declares (h11 and httptools frame it by `Content-Length`). Only a body of unknown length
            # (chunked) is counted as it streams in.
            await self.app(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Any) -> None:
        message = _TooLarge(self.max_bytes).detail
        body = orjson.dumps({"detail": message, "code": "payload_too_large", "message": message})
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(HTTPException):
    """A body found too large while it streams in (no `Content-Length`: chunked). An HTTPException, which
    FastAPI lets through its body parsing as it is (any other error there becomes a 400 "There was an error
    parsing the body"), to `threadline.api.errors`, which answers it 413; and a route reading the body
    itself gets the same answer."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"Request body exceeds {max_bytes} bytes")
