"""A project's own web app, mounted by `http.app`."""

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def hello(request: Request) -> JSONResponse:
    return JSONResponse({"hello": "from the project"})


app = Starlette(routes=[Route("/custom/hello", hello)])
