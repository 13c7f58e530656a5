"""`create_app(settings)`: a pure factory. Everything live is wired in the lifespan."""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from threadline import __version__, bundler
from threadline.api import (
    a2a,
    agents,
    assistants,
    auth,
    crons,
    docs,
    errors,
    generative_ui,
    http_config,
    mcp,
    metrics,
    protocol,
    routing,
    runs,
    store,
    system,
    threads,
    user_app,
)
from threadline.api.encryption import EncryptionContext
from threadline.api.limits import BodyLimit
from threadline.api.loopback import serving_loopback
from threadline.api.ratelimit import AuthFailures, RateLimit, RateLimiter
from threadline.api.request_ids import RequestIds
from threadline.api.sse import StreamSlots
from threadline.bundler import Bundle
from threadline.config import HttpConfig, ProjectConfig
from threadline.core.access import Access
from threadline.core.auth import CustomAuth
from threadline.core.encryption import load_encryption
from threadline.core.runtime import Runtime
from threadline.errors import ConfigError
from threadline.heap import startup_frozen
from threadline.loader import load_object, missing_package
from threadline.settings import Settings
from threadline.tracing import tracer

log = logging.getLogger("threadline")

# Each router with its family, as `http.disable_<family>` in langgraph.json names them (None: always on).
# As LangGraph's server: thread-scoped runs and Protocol v2 belong to `runs`, the Agent Protocol's
# /agents to `assistants`.
ROUTERS = (
    ("runs", crons.router), ("runs", runs.router), ("threads", threads.router), ("runs", protocol.router),
    ("assistants", assistants.router), ("store", store.router), (None, system.router), ("meta", metrics.router),
    ("assistants", agents.router), ("mcp", mcp.router), ("a2a", a2a.router), ("meta", docs.router),
    ("ui", generative_ui.router),
)


class App(FastAPI):
    """FastAPI with layers outside even its own error handling (`front`): the project's app, whose
    middleware wraps every request, configured CORS and the URL prefix (`threadline.api.user_app`); and
    outermost, `errors.Contained`, so an unexpected error leaves the connection usable."""

    front: Callable[[Any], Any] | None = None

    def build_middleware_stack(self) -> Any:
        stack = super().build_middleware_stack()
        # Built at the first request, once every route is in: the routes tried once (`threadline.api.routing`).
        if self.router.middleware_stack == self.router.app:  # (a router with middleware of its own: as it is)
            self.router.middleware_stack = routing.RouteIndex(self.router)
        routing.remember_matches(self.router)
        return errors.Contained(self.front(stack) if self.front is not None else stack)


def create_app(settings: Settings | None = None, *, watch_ui: bool = False) -> FastAPI:
    """The app. `watch_ui` (`threadline dev`): the generative UI is rebundled when its sources change."""
    settings = settings or Settings.resolve()
    project, graphs = Runtime.load_project(settings)
    http = project.http
    project_app = _load_user_app(project)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
        async with (user_app.lifespan(project_app) if project_app is not None else contextlib.nullcontext() as state,
                    contextlib.AsyncExitStack() as stack):
            if project.ui and "ui" not in http.disabled:  # before the first request: LangGraph's `/ui/{graph}`
                folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="threadline-ui-"))
                app.state.ui_bundle = await _bundle_ui(app, project, settings, Path(folder))
                if watch_ui and app.state.ui_bundle is not None:
                    await stack.enter_async_context(bundler.watching(project, settings.ui_bundler, Path(folder)))

            def prepare(runtime: Runtime) -> None:  # before its workers start: relative webhooks reach the app
                client, runtime.webhooks.local = user_app.local_webhooks(app, http)
                stack.push_async_callback(client.aclose)

            app.state.runtime = await _start(app, settings, project, graphs, prepare, access)
            stack.push_async_callback(app.state.runtime.close)
            stack.push_async_callback(app.state.stream_slots.close)  # (first: before the broker closes)
            with serving_loopback(app), startup_frozen():  # `get_client()` in an agent reaches this app
                yield state

    app = App(
        title="Threadline", version=__version__, lifespan=lifespan,
        **{"docs_url": None, "redoc_url": None, **http_config.fastapi_urls(http)},  # /docs: api/docs.py
        description="An open-source Agent Protocol server for LangGraph agents.",
        # FastAPI's own HTTP server spans (reading the client's traceparent), when tracing is on (threadline.otel)
        telemetry={"tracer_provider": provider} if (provider := tracer().http_provider()) is not None else None,
    )
    _quiet_startup_failure(app)
    authenticator = auth.load_authenticator(project, settings)
    auth.refuse_exposed(settings, authenticator)
    # The same Auth object's `@auth.on…` handlers authorize each operation in the core (`core/access.py`).
    access = Access.of(authenticator.auth if isinstance(authenticator, CustomAuth) else None)
    limiter = RateLimiter.of(settings)
    # Added first, so innermost: rate limits by the authenticated identity (`identity_of`), before any route
    # reads the body; requests that fail authentication are counted by address outside it (`AuthFailures`).
    # No budget set (the default): no layer, nothing done per request.
    if limiter.enabled:
        app.add_middleware(RateLimit, limiter=limiter)
    encryption = load_encryption(project)
    if encryption is not None:  # inside authentication: `@encryption.context` sees the caller
        app.add_middleware(EncryptionContext, encryption=encryption)
    if authenticator is not None:  # inside CORS and the body limit
        app.add_middleware(auth.Authenticate, authenticator=authenticator, open_paths=auth.open_paths(settings),
                           router=app.router)
    if http.configurable_headers is not None:
        app.add_middleware(http_config.RunHeaders, rules=http_config.HeaderRules(http.configurable_headers))
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if authenticator is not None:  # outside BodyLimit: an address that spent its budget is refused before a read
        app.add_middleware(AuthFailures, limiter=limiter)
    if http.cors is None:  # configured CORS stands in front of the project's app instead
        app.add_middleware(http_config.cors_middleware, http=http)
    app.state.project = project
    app.state.stream_slots = StreamSlots(settings.max_streams_per_identity, settings.stream_lease_seconds)
    app.state.settings = settings
    errors.install(app)
    for router in http_config.served(ROUTERS, http):
        app.include_router(router)
    if "meta" not in http.disabled:
        docs.mount_assets(app)
    if settings.ui == "on":
        from threadline import ui  # the console: pages over this same API (threadline/ui)

        ui.mount(app)
    metrics.label_plain_routes(app)
    app.front = _front(app, http, project_app, _counting_failures(
        auth.outer_layer(app, http, project_app, authenticator, settings), limiter))
    auth.install_security(app, auth.security(project, authenticator))
    return app


async def _start(app: FastAPI, settings: Settings, project: Any, graphs: Any,
                 prepare: Callable[[Runtime], None], access: Access) -> Runtime:
    """Open and start the runtime. A failure is logged as one message and a hint (its traceback at debug
    level only), and uvicorn is told startup failed without the traceback (`_quiet_startup_failure`)."""
    runtime = None
    try:
        runtime = await Runtime.open(settings, project, graphs, access)
        prepare(runtime)
        await runtime.start()
        return runtime
    except Exception as exc:
        if runtime is not None:
            with contextlib.suppress(Exception):
                await runtime.close()
        log.error("cannot start: %s", startup_message(exc, project.root))
        log.debug("the startup failure's traceback:", exc_info=exc)
        app.state.startup_failure_logged = True
        raise


async def _bundle_ui(app: FastAPI, project: ProjectConfig, settings: Settings, folder: Path) -> Bundle | None:
    """The project's generative UI bundled (`threadline.bundler`); a failure stops startup with its message."""
    try:
        return await bundler.bundle(project, settings.ui_bundler, folder)
    except ConfigError as exc:
        log.error("cannot start: %s", exc.message)
        app.state.startup_failure_logged = True
        raise


def startup_message(exc: BaseException, root: Any) -> str:
    """What a person needs to read when startup fails: the error in a sentence, and what to do about it."""
    missing = missing_package(exc, root)
    if missing:
        return missing
    if isinstance(exc, ConfigError):
        return exc.message
    return f"{type(exc).__name__}: {exc}\n  hint: run with --log-level debug to see where it was raised"


def _quiet_startup_failure(app: FastAPI) -> None:
    """A startup failure the lifespan has logged reaches uvicorn without its traceback: Starlette sends
    `traceback.format_exc()` as the failure message, and uvicorn logs it as an error. Wraps the router's
    lifespan handler, so requests pay nothing for it."""
    handle = app.router.lifespan

    async def lifespan(scope: Any, receive: Any, send: Any) -> None:
        async def quiet_send(message: Any) -> None:
            if message["type"] == "lifespan.startup.failed" and getattr(app.state, "startup_failure_logged", False):
                message = {**message, "message": ""}
            await send(message)

        await handle(scope, receive, quiet_send)

    app.router.lifespan = lifespan  # type: ignore[method-assign]


def _load_user_app(project: ProjectConfig) -> Any:
    if not project.http.app:
        return None
    loaded = load_object(project.http.app, project.root, what="http.app")
    user_app.check(loaded, project.http.app)
    return loaded


def _counting_failures(guard: Callable[[Any], Any] | None, limiter: RateLimiter) -> Callable[[Any], Any] | None:
    """Authentication in front of the project's app, with its refusals counted by address (`AuthFailures`)."""
    if guard is None:
        return None
    outer = guard
    return lambda served: AuthFailures(outer(served), limiter)


def _front(app: FastAPI, http: HttpConfig, project_app: Any,
           guard: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    """The layers in front of our middleware stack, outermost last; `/openapi.json` merged with the project's."""
    if project_app is not None and callable(getattr(project_app, "openapi", None)) and app.openapi_url:
        ours = app.openapi

        def openapi() -> dict[str, Any]:
            if app.openapi_schema is None:
                app.openapi_schema = user_app.merge_openapi(ours(), project_app.openapi())
            return app.openapi_schema

        app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend its schema
    ours_first = frozenset({"/ok"} if "meta" in http.disabled else
                           {"/ok", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})

    def front(stack: Any) -> Any:
        served = user_app.UserFirst(project_app, stack, app, ours_first) if project_app is not None else stack
        if guard is not None:  # authentication before the project's middleware (`threadline.api.auth`)
            served = guard(served)
        if http.cors is not None:
            served = http_config.cors_middleware(served, http)
        if http.mount_prefix:
            served = user_app.MountPrefix(served, http.mount_prefix)
        # Outermost: counts every request, the project's routes, 413s and preflights included; each with its id.
        return RequestIds(metrics.RequestMetrics(served))

    return front
