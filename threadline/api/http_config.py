"""langgraph.json's `http` section applied to the app: which route families are served, CORS, and which
request headers a run's `config["configurable"]` receives."""

from __future__ import annotations

import contextvars
import copy
import functools
import re
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter
from starlette.middleware.cors import CORSMiddleware

from threadline.config import HeaderPatterns, HttpConfig

# Paths of the `meta` family (`http.disable_meta`), as LangGraph's server: /ok stays, without its checks.
META_PATHS = frozenset({"/info", "/metrics", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
# As LangGraph's server, any origin, so browser clients (LangGraph Studio, web apps) can call it.
DEFAULT_CORS: dict[str, Any] = {
    "allow_origins": ["*"], "allow_methods": ["*"], "allow_headers": ["*"],
    "expose_headers": ["x-pagination-total", "x-pagination-next", "content-location", "location"],
}
# Never copied into a run's config, whatever `configurable_headers` includes (as LangGraph's server).
NEVER_CONFIGURABLE = ("authorization", "x-api-key", "x-tenant-id", "x-service-key")


def served(routers: Iterable[tuple[str | None, APIRouter]], http: HttpConfig) -> list[APIRouter]:
    """The routers of the families `http.disable_*` leaves on (family None: always served); with
    `disable_meta`, a router that also serves other paths (`/info` beside `/ok`) is copied without it."""
    kept = []
    for family, router in routers:
        if family is not None and family in http.disabled:
            continue
        if "meta" in http.disabled and any(getattr(r, "path", None) in META_PATHS for r in router.routes):
            router = copy.copy(router)
            router.routes = [r for r in router.routes if getattr(r, "path", None) not in META_PATHS]
        kept.append(router)
    return kept


def fastapi_urls(http: HttpConfig) -> dict[str, Any]:
    """FastAPI's own meta routes (`/docs`, `/openapi.json`), off with `disable_meta`."""
    return {"docs_url": None, "redoc_url": None, "openapi_url": None} if "meta" in http.disabled else {}


def cors_middleware(app: Any, http: HttpConfig) -> Any:
    """Starlette's CORSMiddleware (LangGraph's server uses it too) with `http.cors`, or our defaults."""
    return Cors(app, **(http.cors.options() if http.cors is not None else DEFAULT_CORS))


class Cors(CORSMiddleware):
    """Starlette's CORSMiddleware, but a request without `Origin` (any client but a browser's cross-origin
    call) is answered as it answers one, without parsing the request's headers or the response's: `Vary`
    gains `Origin` (its values joined into one field, where the first was)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not any(name == b"origin" for name, _ in scope.get("headers") or ()):
            await self.app(scope, receive, functools.partial(_vary_origin, send))
            return
        await super().__call__(scope, receive, send)


async def _vary_origin(send: Any, message: Any) -> None:
    if message["type"] == "http.response.start":
        headers = message["headers"] = list(message.get("headers") or ())
        found = [i for i, (name, _) in enumerate(headers) if name == b"vary"]
        value = b", ".join([*(headers[i][1] for i in found), b"Origin"])
        for i in reversed(found[1:]):
            del headers[i]
        if found:
            headers[found[0]] = (b"vary", value)
        else:
            headers.append((b"vary", value))
    await send(message)


class HeaderRules:
    """`http.configurable_headers`: which request headers (by lower-case name) a run receives in
    `config["configurable"]`. Patterns take `*` (any characters) and nothing else; an excluded name is never
    taken; with no `includes`, no header is (LangGraph 0.16's default)."""

    def __init__(self, patterns: HeaderPatterns) -> None:
        self.includes = [_pattern(p) for p in patterns.includes]
        self.excludes = [_pattern(p) for p in (*NEVER_CONFIGURABLE, *patterns.excludes)]

    def select(self, headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
        taken: dict[str, str] = {}
        for raw_name, raw_value in headers:  # a repeated header: the last one wins
            name = raw_name.decode("latin-1").lower()
            if any(p.fullmatch(name) for p in self.includes) and not any(p.fullmatch(name) for p in self.excludes):
                taken[name] = raw_value.decode("latin-1")
        return taken


def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in text.split("*")))


_run_headers: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("threadline_run_headers")


def run_headers() -> dict[str, str]:
    """The current request's headers chosen by `http.configurable_headers` (empty without it)."""
    return _run_headers.get({})


def with_run_headers(body: dict[str, Any]) -> dict[str, Any]:
    """A run request with the chosen headers in `config.configurable`; a header wins over the body's key,
    as in LangGraph's server, and is stored with the run (its `kwargs.config`)."""
    headers = run_headers()
    if not headers:
        return body
    config = dict(body.get("config") or {})
    config["configurable"] = {**(config.get("configurable") or {}), **headers}
    return {**body, "config": config}


class RunHeaders:
    """ASGI middleware: picks each HTTP request's configurable headers once, for `with_run_headers`."""

    def __init__(self, app: Any, rules: HeaderRules) -> None:
        self.app = app
        self.rules = rules

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _run_headers.set(self.rules.select(scope.get("headers") or []))
        try:
            await self.app(scope, receive, send)
        finally:
            _run_headers.reset(token)
