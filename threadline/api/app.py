"""`create_app(settings)`: a pure factory. Everything live is wired in the lifespan."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI

from threadline import __version__
from threadline.api import a2a, agents, assistants, errors, http_config, mcp, metrics, protocol, runs, store, system
from threadline.api import threads, user_app
from threadline.api.limits import BodyLimit
from threadline.config import HttpConfig, ProjectConfig
from threadline.core.runtime import Runtime
from threadline.loader import load_object
from threadline.settings import Settings

log = logging.getLogger("threadline")

# Each router with its family, as `http.disable_<family>` in langgraph.json names them (None: always on).
# As LangGraph's server: thread-scoped runs and Protocol v2 belong to `runs`, the Agent Protocol's
# /agents to `assistants`.
ROUTERS = (
    ("runs", runs.router), ("threads", threads.router), ("runs", protocol.router),
    ("assistants", assistants.router), ("store", store.router), (None, system.router), ("meta", metrics.router),
    ("assistants", agents.router), ("mcp", mcp.router), ("a2a", a2a.router),
)


class App(FastAPI):
    """FastAPI with layers outside even its own error handling (`front`): the project's app, whose
    middleware wraps every request, configured CORS and the URL prefix (`threadline.api.user_app`)."""

    front: Callable[[Any], Any] | None = None

    def build_middleware_stack(self) -> Any:
        stack = super().build_middleware_stack()
        return self.front(stack) if self.front is not None else stack


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.resolve()
    project, graphs = Runtime.load_project(settings)
    http = project.http
    project_app = _load_user_app(project)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
        async with user_app.lifespan(project_app) if project_app is not None else contextlib.nullcontext() as state:
            runtime = await Runtime.open(settings, project, graphs)
            app.state.runtime = runtime
            client, runtime.webhooks.local = user_app.local_webhooks(app, http)
            try:
                await runtime.start()
                yield state
            finally:
                await runtime.close()
                await client.aclose()

    app = App(
        title="Threadline", version=__version__, lifespan=lifespan,
        description="An open-source Agent Protocol server for LangGraph agents.",
        **http_config.fastapi_urls(http),
    )
    if http.configurable_headers is not None:
        app.add_middleware(http_config.RunHeaders, rules=http_config.HeaderRules(http.configurable_headers))
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    if http.cors is None:  # configured CORS stands in front of the project's app instead
        app.add_middleware(http_config.cors_middleware, http=http)
    app.state.project = project
    errors.install(app)
    for router in http_config.served(ROUTERS, http):
        app.include_router(router)
    app.front = _front(app, http, project_app)
    return app


def _load_user_app(project: ProjectConfig) -> Any:
    if not project.http.app:
        return None
    loaded = load_object(project.http.app, project.root, what="http.app")
    user_app.check(loaded, project.http.app)
    return loaded


def _front(app: FastAPI, http: HttpConfig, project_app: Any) -> Callable[[Any], Any]:
    """The layers in front of our middleware stack, outermost last; `/openapi.json` merged with the project's."""
    if project_app is not None and callable(getattr(project_app, "openapi", None)) and app.openapi_url:
        ours = app.openapi

        def openapi() -> dict[str, Any]:
            if app.openapi_schema is None:
                app.openapi_schema = user_app.merge_openapi(ours(), project_app.openapi())
            return app.openapi_schema

        app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend its schema
    ours_first = frozenset({"/ok"} if "meta" in http.disabled else
                           {"/ok", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect"})

    def front(stack: Any) -> Any:
        served = user_app.UserFirst(project_app, stack, app, ours_first) if project_app is not None else stack
        if http.cors is not None:
            served = http_config.cors_middleware(served, http)
        if http.mount_prefix:
            served = user_app.MountPrefix(served, http.mount_prefix)
        # Outermost: counts every request, the project's routes, 413s and preflights included.
        return metrics.RequestMetrics(served)

    return front
