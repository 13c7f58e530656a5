"""`GET /docs` (Swagger UI) and `GET /redoc`, with their JavaScript and CSS served from here, not a CDN.

The files come from the `fastapi-offline` package, so the pages work on a machine without internet access.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

from threadline.api.common import Router

ASSETS = "/docs/assets"
router = Router(include_in_schema=False)


def mount_assets(app: FastAPI) -> None:
    app.mount(ASSETS, StaticFiles(directory=str(files("fastapi_offline") / "static")), name="docs-assets")


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "").rstrip("/")
    app = request.app
    return get_swagger_ui_html(
        openapi_url=root + app.openapi_url, title=f"{app.title} - Swagger UI",
        oauth2_redirect_url=root + "/docs/oauth2-redirect",
        swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
    )


@router.get("/docs/oauth2-redirect")
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "").rstrip("/")
    app = request.app
    return get_redoc_html(
        openapi_url=root + app.openapi_url, title=f"{app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS}/redoc.standalone.js", redoc_favicon_url=f"{root}{ASSETS}/favicon.png",
        with_google_fonts=False,
    )
