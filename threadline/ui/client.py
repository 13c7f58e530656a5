"""The console's way to the data: the HTTP API itself, called in-process.

Every figure a console page shows comes from the same routes any client calls, through the whole app (its
middleware, error mapping and, once it exists, authentication), with the caller's credentials passed on. The
console so never sees more than its user may, and never holds a second copy of the API's rules. The calls are
made as the page's caller (its address too, for limits) and marked as made on its behalf (`ON_BEHALF`): the
page spent one unit of its caller's request budget, and its API calls spend none (a run created from a page
still spends the run-creation budget).
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
from starlette.requests import Request

from threadline.api.ratelimit import ON_BEHALF

BASE = "http://console"


class _Quiet(logging.Filter):
    """httpx logs each request at info: the console's own, one request per page, would double the access log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return BASE not in str(record.args)


logging.getLogger("httpx").addFilter(_Quiet())

# Headers that carry a caller's identity: passed on to the API as the browser sent them (`X-Forwarded-For`: its
# address, read when the page came through a trusted proxy).
CREDENTIALS = ("x-api-key", "authorization", "cookie", "x-forwarded-for")


def _on_behalf_of(request: Request) -> Any:
    """The app, called with the page request's client address and the `ON_BEHALF` mark in each scope."""
    app, client = request.app, request.scope.get("client")

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        await app({**scope, "client": client, ON_BEHALF: True}, receive, send)

    return asgi


class ApiError(Exception):
    """The API answered with an error status; `detail` is its message."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class Api:
    """A client for one console request: the app's own API, in-process, with the request's credentials."""

    def __init__(self, request: Request) -> None:
        headers = {name: request.headers[name] for name in CREDENTIALS if name in request.headers}
        # root_path: under `http.mount_prefix` the API's routes are reached through the same prefix.
        base = BASE + str(request.scope.get("root_path", ""))
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=_on_behalf_of(request)), base_url=base,
                                         headers=headers)

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def call(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        response = await self._client.request(method, path, json=body, params=params)
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, detail)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    async def get(self, path: str, **params: Any) -> Any:
        return await self.call("GET", path, params={k: v for k, v in params.items() if v is not None} or None)

    async def post(self, path: str, body: Any = None) -> Any:
        return await self.call("POST", path, body if body is not None else {})
