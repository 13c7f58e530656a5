"""The web console at `/ui`: server-rendered pages over the HTTP API, with their assets in the package."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from threadline.ui.pages import router

STATIC = Path(__file__).parent / "static"


def mount(app: FastAPI) -> None:
    """Serve the console's pages at `/ui` and its files at `/ui/static`."""
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
