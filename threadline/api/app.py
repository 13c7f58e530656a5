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
from threadline.api.loopback import serving_loopback
from threadline.core.runtime import Runtime
from threadline.errors import ConfigError
from threadline.loader import load_object, missing_package
from threadline.settings import Settings

log = logging.getLogger("threadline")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.resolve()
    project, graphs = Runtime.load_project(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.runtime = await _start(app, settings, project, graphs)
        try:
            with serving_loopback(app):  # `langgraph_sdk.get_client()` in an agent reaches this app
                yield
        finally:
            await app.state.runtime.close()

    app = FastAPI(
        title="Threadline", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
        description="An open-source Agent Protocol server for LangGraph agents.",
    )
    _quiet_startup_failure(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    # As LangGraph's server: any origin, so browser clients (LangGraph Studio, web apps) can call it.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"],
                       expose_headers=["x-pagination-total", "x-pagination-next", "content-location", "location"])
    app.add_middleware(metrics.RequestMetrics)  # outermost: counts every request, 413s and preflights included
    app.state.project = project
    app.state.settings = settings
    errors.install(app)
    for module in (runs, threads, protocol, assistants, store, system, metrics, agents, mcp, a2a, docs):
        app.include_router(module.router)
    docs.mount_assets(app)
    if project.http_app:
        _mount_user_app(app, project)
    metrics.label_plain_routes(app)
    return app


async def _start(app: FastAPI, settings: Settings, project: Any, graphs: Any) -> Runtime:
    """Open and start the runtime. A failure is logged as one message and a hint (its traceback at debug
    level only), and uvicorn is told startup failed without the traceback (`_quiet_startup_failure`)."""
    runtime = None
    try:
        runtime = await Runtime.open(settings, project, graphs)
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


def _mount_user_app(app: FastAPI, project: Any) -> None:
    """The project's own Starlette/FastAPI app (`http.app`), served for paths we do not."""
    user_app = load_object(project.http_app, project.root, what="http.app")
    app.mount("/", user_app)
