"""Each request's id, for the log lines written while it is served (and by the runs it creates)."""

from __future__ import annotations

from typing import Any

from threadline.tracing import REQUEST_HEADER, REQUEST_ID, request_id, tracer

_HEADER = REQUEST_HEADER.encode()


class RequestIds:
    """ASGI middleware, outermost: the request's `x-request-id` (a proxy's, a client's), else a new id, in the
    context every log line of the request reads (`threadline.logs`) and on its span when tracing is on. A run the
    request creates stores it, so the worker's lines for that run carry it too (`threadline.tracing`)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers") or () if k == _HEADER), None)
        rid = request_id(given.decode("latin-1") if given is not None else None)
        token = REQUEST_ID.set(rid)
        tracer().annotate({"http.request.header.x-request-id": rid})
        try:
            await self.app(scope, receive, send)
        finally:
            REQUEST_ID.reset(token)
