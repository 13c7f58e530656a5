"""A project's own FastAPI app, named by langgraph.json's `http.app`, as users write one."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from starlette.middleware.base import BaseHTTPMiddleware

#: Webhook deliveries received, in order: what a test reads to see that a run's webhook arrived.
RECEIVED: list[dict[str, Any]] = []


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
    yield {"greeting": "hello from the lifespan"}


app = FastAPI(title="Acme API", version="2.3.0", lifespan=lifespan)


@app.get("/custom/hello", tags=["Custom"])
async def hello() -> dict[str, str]:
    return {"hello": "from the project"}


@app.get("/runs/afakeroute")
async def fake_route() -> dict[str, str]:
    """A path under a built-in prefix: the project's route answers, not the built-in /runs/{run_id}."""
    return {"user": "route"}


@app.get("/custom/greeting")
async def greeting(request: Request) -> dict[str, str]:
    return {"greeting": request.state.greeting}


@app.post("/custom/webhook")
async def webhook(request: Request) -> dict[str, bool]:
    RECEIVED.append({"path": request.url.path, "body": await request.json(), "headers": dict(request.headers)})
    return {"ok": True}


class Stamp(BaseHTTPMiddleware):
    """Marks every response it sees, so a test can tell which requests went through the project's middleware."""

    async def dispatch(self, request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        response.headers["x-acme"] = "stamped"
        return response


app.add_middleware(Stamp)


async def bare_asgi(scope: Any, receive: Any, send: Any) -> None:
    """Not a Starlette app: Threadline cannot put its routes behind this one's."""
