"""`create_app(settings)`: a pure factory. Everything live is wired in the lifespan."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from threadline import __version__
from threadline.api import (
    a2a, agents, assistants, docs, errors, mcp, metrics, protocol, runs, store, system, threads,
)
from threadline.api.limits import BodyLimit
from threadline.core.runtime import Runtime
from threadline.loader import load_object
from threadline.settings import Settings

log = logging.getLogger("threadline")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.resolve()
    project, graphs = Runtime.load_project(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await Runtime.open(settings, project, graphs)
        app.state.runtime = runtime
        try:
            await runtime.start()
            yield
        finally:
            await runtime.close()

    app = FastAPI(
        title="Threadline", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
        description="An open-source Agent Protocol server for LangGraph agents.",
    )
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    # As LangGraph's server: any origin, so browser clients (LangGraph Studio, web apps) can call it.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"],
                       expose_headers=["x-pagination-total", "x-pagination-next", "content-location", "location"])
    app.add_middleware(metrics.RequestMetrics)  # outermost: counts every request, 413s and preflights included
    app.state.project = project
    errors.install(app)
    for module in (runs, threads, protocol, assistants, store, system, metrics, agents, mcp, a2a, docs):
        app.include_router(module.router)
    docs.mount_assets(app)
    if project.http_app:
        _mount_user_app(app, project)
    metrics.label_plain_routes(app)
    return app


def _mount_user_app(app: FastAPI, project: Any) -> None:
    """The project's own Starlette/FastAPI app (`http.app`), served for paths we do not."""
    user_app = load_object(project.http_app, project.root, what="http.app")
    app.mount("/", user_app)
