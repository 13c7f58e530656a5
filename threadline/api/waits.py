"""The answer of a request that waits for a run (`/runs/wait`, `…/join`), kept alive while the run goes on.

A proxy with an idle timeout cuts a response that sends nothing for longer than its limit. As LangGraph's
server does, a wait that lasts sends the status line and headers, then a newline every `heartbeat_seconds`
until the run ends, then the JSON: whitespace before a JSON value is valid JSON, so every client parses it
as it parsed the plain answer. A wait that ends before the first heartbeat is due is a plain JSON response.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from threadline.api.errors import late_error
from threadline.errors import ClientGone
from threadline.serde import dumps


class KeptAliveJSON(Response):
    """JSON of `work`'s result, with a newline every `interval` seconds until it is ready.

    Before anything is sent, a failure of `work` is raised to the app's error handlers (a 4xx/5xx as usual);
    after the 200 has gone out it is the body instead, `{"__error__": {"error", "message"}}`, the shape of a
    failed run's output that langgraph-sdk raises on."""

    media_type = "application/json"

    def __init__(self, work: Awaitable[Any], *, interval: float, headers: dict[str, str] | None = None) -> None:
        self.work = work
        self.interval = interval
        self.status_code = 200
        self.background = None
        self.body = b""
        self.init_headers(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.ensure_future(self.work)
        started = False
        try:
            while not task.done():
                await asyncio.wait([task], timeout=self.interval)
                if task.done():
                    break
                if not started:
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [(k, v) for k, v in self.raw_headers if k != b"content-length"]})
                    started = True
                await send({"type": "http.response.body", "body": b"\n", "more_body": True})
        finally:
            if not task.done():
                task.cancel()  # we were cancelled (the server is stopping): so is the wait
        if not started:
            content = dumps(task.result())  # a failure raises here, before any byte: the usual error response
            self.body = content
            self.headers["content-length"] = str(len(content))
            await super().__call__(scope, receive, send)
            return
        try:
            body = dumps(task.result())
        except ClientGone:
            body = b""  # nobody is there to read it
        except Exception as exc:  # noqa: BLE001 - the run's failure, sent as the late error body
            body = dumps(late_error(exc))
        await send({"type": "http.response.body", "body": body, "more_body": False})
