"""The web console at `/console`: server-rendered pages over the HTTP API, with their assets in the package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from threadline.api.user_app import _route_path
from threadline.ui.pages import PATH, router

STATIC = Path(__file__).parent / "static"

#: Every console answer's security headers. The console is its own files only (`static/`, no inline script or
#: style, no other origin), so the policy allows nothing else; `connect-src 'self'` is its API calls.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"x-content-type-options", b"nosniff"),
]


def mount(app: FastAPI) -> None:
    """Serve the console's pages at `/console` and its files at `/console/static`, each with `SECURITY_HEADERS`."""
    app.include_router(router)
    app.mount(PATH + "/static", StaticFiles(directory=STATIC), name="ui-static")
    app.add_middleware(ConsoleHeaders)


class ConsoleHeaders:
    """ASGI middleware: `SECURITY_HEADERS` on every answer under `/console` (pages, files, redirects, errors)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = _route_path(scope) if scope["type"] == "http" else ""
        if not (path == PATH or path.startswith(PATH + "/")):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                names = {name.lower() for name, _ in message.get("headers") or []}
                extra = [(name, value) for name, value in SECURITY_HEADERS if name not in names]
                message = {**message, "headers": [*(message.get("headers") or []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
