"""`GET /metrics` (Prometheus text, or JSON with `?format=json`) and the middleware counting requests."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from starlette.responses import Response

from threadline.api.common import JSON, Router, runtime
from threadline.core.metrics import CONTENT_TYPE, Metrics, Snapshot

router = Router(tags=["System"])


def metrics_of(scope: Any) -> Metrics | None:
    """The app's Metrics, once its lifespan has started (None before, or for an app without a runtime)."""
    app = scope.get("app")
    rt = getattr(getattr(app, "state", None), "runtime", None)
    return getattr(rt, "metrics", None)


class RequestMetrics:
    """ASGI middleware: counts every HTTP request by method, route template and status, and times it.

    The route is the template the router matched (`/threads/{thread_id}`), read after routing; a request
    no route matched (a 404, a CORS preflight) is labelled `unmatched`, so label values stay bounded.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        metrics = metrics_of(scope) if scope["type"] == "http" else None
        if metrics is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client gets if the app raises before answering

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            metrics.request_finished(scope["method"], _template(scope), status, time.perf_counter() - started)


def label_plain_routes(app: Any) -> None:
    """Make the routes that are not FastAPI's own (`/openapi.json`, mounts such as `/docs/assets`) name
    themselves in the scope as FastAPI's routes do, so their requests are counted under their path rather
    than `unmatched`. Call once every route is added."""
    from fastapi.routing import APIRoute
    from starlette.routing import Mount, Route

    for route in app.routes:
        if isinstance(route, (Route, Mount)) and not isinstance(route, APIRoute):
            route.app = _naming(route, route.app)


def _naming(route: Any, inner: Any) -> Any:
    async def named(scope: Any, receive: Any, send: Any) -> None:
        scope["route"] = route
        await inner(scope, receive, send)

    return named


def _template(scope: Any) -> str:
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) and path else "unmatched"


@router.get("/metrics")
async def metrics(request: Request, format: str = "prometheus") -> Response:
    """Prometheus text exposition by default; `?format=json` for JSON. Any other format is Prometheus."""
    rt = runtime(request)
    stats = await rt.storage.queue_stats()
    workers = rt.workers
    snapshot = Snapshot.read(stats, workers.size if workers else None, workers.busy if workers else 0)
    if format == "json":
        return JSON(rt.metrics.as_json(snapshot))
    return Response(rt.metrics.prometheus(snapshot), media_type=CONTENT_TYPE)
