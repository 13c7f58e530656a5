"""The project's own app (`http.app`) in front of ours, and the whole API under `http.mount_prefix`.

As LangGraph's server: the project's routes are tried first and its middleware wraps every request (the
built-in routes included); a request none of its routes takes goes on to ours. Only `/ok`, `/metrics`,
`/docs` and `/openapi.json` are ours first (a FastAPI app brings its own `/docs` and `/openapi.json`; ours
show both apps' routes). Its lifespan runs inside ours, and its routes join `/openapi.json`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
from starlette.exceptions import HTTPException
from starlette.routing import Router

from threadline.config import HttpConfig
from threadline.errors import ConfigError

ASGI = Callable[[Any, Any, Any], Awaitable[None]]
_FALLBACK = "threadline.fallback"  # scope key: where the project's router sends what it does not route


def check(user_app: Any, spec: str) -> Router:
    """The project app's router (a Starlette or FastAPI app has one); anything else is a startup error."""
    router = getattr(user_app, "router", None)
    if not isinstance(router, Router) or not callable(user_app):
        raise ConfigError(f"http.app '{spec}' must be a Starlette or FastAPI app, got {type(user_app).__name__}")
    return router


class UserFirst:
    """ASGI: a request goes to the project's app; what its router does not match comes back to `ours`.

    The hand-back is the project router's `default` (Starlette calls it when no route matches), set to
    `_fall_through`, which finds `ours` in the request's scope: several servers may share one project app
    (one module object), each with its own `ours`.
    """

    def __init__(self, user_app: Any, ours: ASGI, app: Any, ours_first: frozenset[str]) -> None:
        user_app.router.default = _fall_through
        self.user_app = user_app
        self.ours = ours
        self.app = app
        self.ours_first = ours_first

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or _route_path(scope) in self.ours_first:
            await self.ours(scope, receive, send)
            return
        scope[_FALLBACK] = (self.app, self.ours)
        await self.user_app(scope, receive, send)


async def _fall_through(scope: Any, receive: Any, send: Any) -> None:
    if _FALLBACK not in scope:  # the project's app served on its own (its tests, say): its usual 404
        raise HTTPException(status_code=404)
    app, ours = scope.pop(_FALLBACK)
    scope["app"] = app  # the project's app put itself there; our routes find the runtime on ours
    await ours(scope, receive, send)


class MountPrefix:
    """ASGI: the API under `prefix` (the ASGI `root_path`, so links and `/openapi.json`'s server carry it).
    `/ok` and `/metrics` also answer at the root, for health checks and scrapers (as LangGraph's server)."""

    def __init__(self, app: ASGI, prefix: str) -> None:
        self.app = app
        self.prefix = prefix

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = _route_path(scope)
        if path == self.prefix or path.startswith(self.prefix + "/"):
            scope = {**scope, "root_path": scope.get("root_path", "") + self.prefix}
        elif path not in ("/ok", "/metrics"):
            await _not_found(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _not_found(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1000})
        return
    body = orjson.dumps({"detail": "Not Found", "code": "not_found", "message": "Not Found"})
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _route_path(scope: Any) -> str:
    path: str = scope.get("path", "")  # an ASGI scope's, a str
    root: str = scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


@contextlib.asynccontextmanager
async def lifespan(user_app: Any) -> AsyncIterator[Any]:
    """The project app's own lifespan (a FastAPI `lifespan=`, or Starlette's startup/shutdown handlers);
    what it yields becomes the requests' `state`, as when it is served alone."""
    async with user_app.router.lifespan_context(user_app) as state:
        yield state


def merge_openapi(ours: dict[str, Any], theirs: dict[str, Any] | None) -> dict[str, Any]:
    """Our OpenAPI document with the project's routes added, as LangGraph's server shows them: its `info`
    (title, version) and its paths after ours; one of its operations replaces ours on the same path and
    method (its route answers first). Component names we define keep ours, which our paths refer to."""
    if not theirs:
        return ours
    merged = {**ours, "info": theirs.get("info") or ours.get("info"), "paths": dict(ours.get("paths") or {})}
    for path, operations in (theirs.get("paths") or {}).items():
        merged["paths"][path] = {**merged["paths"].get(path, {}), **operations}
    components = {k: dict(v) for k, v in (ours.get("components") or {}).items()}
    for section, entries in (theirs.get("components") or {}).items():
        components[section] = {**entries, **components.get(section, {})}
    if components:
        merged["components"] = components
    known = {tag.get("name") for tag in ours.get("tags") or []}
    tags = [*(ours.get("tags") or []), *(t for t in theirs.get("tags") or [] if t.get("name") not in known)]
    if tags:
        merged["tags"] = tags
    return merged


def local_webhooks(app: Any, http: HttpConfig,
                   ) -> tuple[httpx.AsyncClient, Callable[[str, bytes, dict[str, str]], Awaitable[int]]]:
    """A client that POSTs to this server's own app in-process (a relative `webhook`), and the poster.

    The request enters at the top, as any request: the project's middleware and routes see it, under
    `http.mount_prefix` (a relative webhook is relative to the API, as in LangGraph's server)."""
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")

    async def post(path: str, body: bytes, headers: dict[str, str]) -> int:
        response = await client.post(http.mount_prefix + path, content=body,
                                     headers={**headers, "content-type": "application/json"})
        return response.status_code

    return client, post
