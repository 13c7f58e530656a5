"""Authentication in front of every route: ASGI middleware that asks the configured `Authenticator`
(`threadline.core.auth`: the project's `langgraph_sdk.Auth`, or built-in API keys) who is calling, before
any route runs. HTTP and the WebSocket handshake alike: a refused request never reaches a route, so a
refused WebSocket never subscribes. `/ok` and CORS preflights are always open; `settings.public_paths`
opens some of `/info`, `/metrics`, `/docs`, `/openapi.json`."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

import orjson
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.routing import Match, compile_path

from threadline.api.errors import deny_handshake, error_response
from threadline.api.http_config import META_PATHS
from threadline.api.user_app import _route_path
from threadline.config import ProjectConfig
from threadline.core.auth import (
    ApiKeys,
    Authenticator,
    CustomAuth,
    load_auth,
    reset_current_user,
    set_current_user,
)
from threadline.core.auth_cache import AuthCache
from threadline.errors import AmbiguousCredentials, ConfigError, ThreadlineError, Unauthorized
from threadline.settings import Settings

log = logging.getLogger("threadline.auth")

ALWAYS_OPEN = frozenset({"/ok"})
# The console's pages and files (threadline/ui) hold no data of their own: every page reads through this API
# in-process, passing on the browser's credentials, so each read meets this middleware again. Left open here,
# a page asked for without credentials answers with the API's 401 as a sign-in page instead of bare JSON.
CONSOLE = "/console"
# Generative UI bundles' files (`api/generative_ui.py`): loaded by a `<script src>`, which sends no credentials, and
# holding only the project's component code; open as on LangGraph's server. `POST /ui/{graph}` is authenticated.
UI_ASSETS = "/ui/"
AUTHENTICATED = "threadline.auth_user"  # scope key: the caller, once a layer has authenticated the request
REFUSED = "threadline.auth_refused"  # scope key: set when a layer refused the request's credentials
LOOPBACK = "threadline.loopback"  # scope key: a request of this process's own `get_client()` (api/loopback.py)


def load_authenticator(project: ProjectConfig, settings: Settings) -> Authenticator | None:
    """langgraph.json `auth.path` (a `langgraph_sdk.Auth` instance), else the built-in API keys, else None."""
    auth = load_auth(project)
    if auth is not None and project.auth is not None:
        if settings.api_keys or settings.api_keys_file:
            log.warning("langgraph.json has 'auth': THREADLINE_API_KEYS / api_keys_file are ignored")
        cache = project.auth.cache
        return CustomAuth(auth, project.auth.path, None if cache is None or not cache.cache_keys else AuthCache(
            cache.cache_keys, ttl=cache.ttl_seconds, max_size=cache.max_size))
    return ApiKeys.from_settings(settings.api_keys, settings.api_keys_file)


def open_paths(settings: Settings) -> frozenset[str]:
    """`/ok`, and what `settings.public_paths` names (only meta paths may be named)."""
    named = {p.strip().rstrip("/") for p in settings.public_paths.split(",") if p.strip()}
    wrong = sorted(named - META_PATHS)
    if wrong:
        raise ConfigError(f"public_paths may name {', '.join(sorted(META_PATHS))}; not {', '.join(wrong)}")
    if "/docs" in named:  # the page is useless without its assets and its document
        named |= {"/docs/oauth2-redirect", "/redoc"}
    return ALWAYS_OPEN | named


class Authenticate:
    """ASGI middleware: every HTTP request and WebSocket handshake not open (`open_paths`) is authenticated,
    and the caller is the request's `current_user()` while it is served. `router` resolves `path_params`
    for a handler that asks for them (a route is matched only then)."""

    def __init__(self, app: Any, authenticator: Authenticator, open_paths: Iterable[str],
                 router: Any = None, unguarded: Any = None) -> None:
        self.app = app
        self.unguarded = unguarded  # the project's router, whose routes stay open (no enable_custom_route_auth)
        self.authenticator = authenticator
        self.open = frozenset(open_paths)
        self.docs_open = "/docs" in self.open
        self.router = router
        self._patterns: list[re.Pattern[str]] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope["type"]
        # An agent's own in-process call (`api/loopback.py`) shows no credentials: it runs as its run's caller.
        if kind not in ("http", "websocket") or AUTHENTICATED in scope or LOOPBACK in scope or self._is_open(scope):
            await self.app(scope, receive, send)
            return
        if _ambiguous(scope):
            scope[REFUSED] = True
            await _refuse(scope, receive, send, AmbiguousCredentials())
            return
        facts, receive = await self._facts(scope, receive)
        try:
            user = await self.authenticator.authenticate(facts)
        except Unauthorized as exc:
            scope[REFUSED] = True  # counted against the client's address (`api/ratelimit.py: AuthFailures`)
            await _refuse(scope, receive, send, exc)
            return
        scope[AUTHENTICATED] = user
        token = set_current_user(user)
        try:
            await self.app(scope, receive, send)
        finally:
            reset_current_user(token)

    def _is_open(self, scope: Any) -> bool:
        path = _route_path(scope)
        if path in self.open or (self.docs_open and path.startswith("/docs/")):
            return True
        if scope["type"] == "http" and scope["method"] == "GET" and (
                path == CONSOLE or path.startswith((CONSOLE + "/", UI_ASSETS))):
            return True
        if self.unguarded is not None and any(r.matches(scope)[0] == Match.FULL for r in self.unguarded.routes):
            return True
        if scope["type"] == "http" and scope["method"] == "OPTIONS":  # a CORS preflight carries no credentials
            return any(name == b"access-control-request-method" for name, _ in scope.get("headers") or [])
        return False

    async def _facts(self, scope: Any, receive: Any) -> tuple[dict[str, Any], Any]:
        """What the authenticator asked for, by name, as LangGraph's server gives it."""
        wants = self.authenticator.wants
        facts: dict[str, Any] = {}
        if "headers" in wants or "authorization" in wants:
            headers = {name.lower(): value for name, value in scope.get("headers") or []}
            facts["headers"] = headers
            auth = headers.get(b"authorization")
            facts["authorization"] = auth.decode("latin-1") if auth is not None else None
        if "path" in wants:
            facts["path"] = scope.get("path", "")
        if "method" in wants:
            facts["method"] = scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET"
        if "query_params" in wants:
            facts["query_params"] = QueryParams(scope.get("query_string", b""))
        if "scope" in wants:
            facts["scope"] = scope
        if "path_params" in wants:
            facts["path_params"] = self._path_params(scope)
        if scope["type"] != "http":
            facts.update(body=None, request=_handshake(scope))
        elif "body" in wants or "request" in wants:
            # The body is read once, up front (the body limit bounds it); the handler's `request` and the route
            # each get their own replay of it, so whatever the handler reads, the route still reads it all.
            messages, facts["body"] = await _read_body(receive)
            facts["request"] = Request(scope, _replay(messages, receive))
            receive = _replay(messages, receive)
        return facts, receive

    def _path_params(self, scope: Any) -> dict[str, str]:
        """The parameters of the route the request is for (matched here only when a handler asks)."""
        if self._patterns is None:
            self._patterns = list(_patterns(getattr(self.router, "routes", None) or [], ""))
        path = _route_path(scope)
        for pattern in self._patterns:
            found = pattern.match(path)
            if found:
                return found.groupdict()
        return {}


def _patterns(routes: Any, prefix: str) -> Iterable[re.Pattern[str]]:
    """The path patterns of every route, FastAPI's included routers flattened."""
    for route in routes:
        context = getattr(route, "include_context", None)
        if context is not None:
            yield from _patterns(context.included_router.routes, prefix + context.prefix)
        elif isinstance(getattr(route, "path", None), str) and "{" in route.path:
            yield compile_path(prefix + route.path)[0]


def _handshake(scope: Any) -> Any:
    from starlette.websockets import WebSocket

    async def never() -> Any:  # the handshake is all the authenticator may look at
        return {"type": "websocket.disconnect", "code": 1000}

    async def nowhere(message: Any) -> None:
        raise RuntimeError("an authenticator cannot answer on the WebSocket")

    return WebSocket(scope, never, nowhere)


async def _read_body(receive: Any) -> tuple[list[Any], Any]:
    """The request's body messages, and its JSON (None when there is none, or it is not JSON)."""
    messages, chunks = [], []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    raw = b"".join(chunks)
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    return messages, body


def _replay(messages: list[Any], receive: Any) -> Any:
    """A `receive` that gives `messages` first, then what the connection sends (a disconnect)."""
    pending = iter(messages)

    async def replay() -> Any:
        for message in pending:
            return message
        return await receive()

    return replay


#: The headers that carry credentials: a request may carry each at most once.
CREDENTIAL_HEADERS = (b"authorization", b"x-api-key")


def _ambiguous(scope: Any) -> bool:
    """Whether a credential header comes twice. Proxies and Starlette's `headers.get` take the first,
    a dict of the headers the last: refused (400) rather than served as whichever one a layer picks."""
    names = [name.lower() for name, _ in scope.get("headers") or []]
    return any(names.count(header) > 1 for header in CREDENTIAL_HEADERS)


async def _refuse(scope: Any, receive: Any, send: Any, exc: ThreadlineError) -> None:
    response = error_response(exc)
    if scope["type"] == "http":
        await response(scope, receive, send)
        return
    await deny_handshake(scope, send, exc, response)


API_KEY_SECURITY = {"securitySchemes": {"apiKeyAuth": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
                    "security": [{"apiKeyAuth": []}]}


def security(project: ProjectConfig, authenticator: Authenticator | None) -> dict[str, Any] | None:
    """The security schemes `/openapi.json` shows: langgraph.json `auth.openapi`, or the API keys'."""
    if project.auth is not None:
        return project.auth.openapi
    return API_KEY_SECURITY if isinstance(authenticator, ApiKeys) else None


def merge_security(schema: dict[str, Any], openapi: dict[str, Any] | None) -> dict[str, Any]:
    """`security()`'s `securitySchemes` join `components`, its `security` is the whole API's requirement, so
    `/docs` offers the "Authorize" button."""
    if not openapi:
        return schema
    merged = dict(schema)
    if openapi.get("securitySchemes"):
        components = dict(merged.get("components") or {})
        components["securitySchemes"] = {**(components.get("securitySchemes") or {}), **openapi["securitySchemes"]}
        merged["components"] = components
    if openapi.get("security") is not None:
        merged["security"] = openapi["security"]
    return merged


def install_security(app: Any, openapi: dict[str, Any] | None) -> None:
    """`/openapi.json` (and so `/docs`) with `security()`'s schemes merged in."""
    if not openapi or not app.openapi_url:
        return
    inner = app.openapi
    merged: list[dict[str, Any]] = []

    def schema() -> dict[str, Any]:
        if not merged:
            merged.append(merge_security(inner(), openapi))
            app.openapi_schema = merged[0]
        return merged[0]

    app.openapi = schema  # FastAPI's documented way to extend its schema


def outer_layer(app: Any, http: Any, project_app: Any, authenticator: Authenticator | None,
                settings: Settings) -> Any:
    """With the project's `http.app`: `http.enable_custom_route_auth` (its routes need credentials too) or
    `http.middleware_order: auth_first` (authentication before its middleware) put the check in front of the
    project's app; its own routes stay open without `enable_custom_route_auth`. None otherwise."""
    if authenticator is None or project_app is None or not (
            http.enable_custom_route_auth or http.middleware_order == "auth_first"):
        return None
    unguarded = None if http.enable_custom_route_auth else project_app.router
    paths = open_paths(settings)

    def wrap(served: Any) -> Any:
        return Authenticate(served, authenticator, paths, router=app.router, unguarded=unguarded)

    return wrap


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def refuse_exposed(settings: Settings, authenticator: Authenticator | None) -> None:
    """Fail closed: a server reachable from other machines (a non-loopback `--host`) needs authentication,
    unless the operator accepts the risk by name (`--allow-unauthenticated`)."""
    if authenticator is None and not settings.allow_unauthenticated and not is_loopback(settings.host):
        raise ConfigError(
            f"refusing to serve on {settings.host} without authentication: anyone who can reach this port could "
            "run your agents and read every thread.\n  hint: add \"auth\" to langgraph.json or set "
            "THREADLINE_API_KEYS (docs/auth.md), or, if the network in front of this server does the checking, "
            "pass --allow-unauthenticated (THREADLINE_ALLOW_UNAUTHENTICATED=1)")
