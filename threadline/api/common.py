"""What every route module shares: the runtime, JSON responses, and the public shape of each resource."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import Scope

from threadline.core.runtime import Runtime
from threadline.serde import dumps
from threadline.shapes import run_out

#: A page's rows: records of one table, or the dicts a route made of them.
R = TypeVar("R")


class Router(APIRouter):
    """An `APIRouter` that declines a request at once when none of its routes starts with the request path's
    first segment (`/threads`, `/runs`, ...).

    FastAPI (0.16x) matches an included router by trying each of its routes in turn, at about 6 µs a route
    on our 2-core machines, and the app tries its routers in turn: a request for the last routes paid for
    every route before them (`POST /threads/{id}/runs/wait`: 0.26 ms, measured in-process through ASGI).
    """

    _heads: tuple[int, frozenset[str] | None] | None = None

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        heads = self._route_heads()
        if heads is not None:
            path = scope.get("path", "")
            root = scope.get("root_path", "")
            if root and path.startswith(root):
                path = path[len(root):]
            if path.split("/", 2)[1 if path.startswith("/") else 0] not in heads:
                return Match.NONE, {}
        return super().matches(scope)

    def _route_heads(self) -> frozenset[str] | None:
        """The first path segments of this router's routes; None if one begins with a parameter."""
        if self._heads is None or self._heads[0] != len(self.routes):
            firsts = {str(getattr(route, "path", "/{}")).split("/", 2)[1] for route in self.routes}
            self._heads = (len(self.routes), None if any("{" in f for f in firsts) else frozenset(firsts))
        return self._heads[1]


def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime  # set by the app's lifespan (app.py); Starlette's state is untyped
    return rt


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def no_content() -> Response:
    return Response(status_code=204)


def select(row: dict[str, Any], fields: Sequence[str] | None) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k in fields} if fields else row


def spec_run_out(row: Mapping[str, Any]) -> dict[str, Any]:
    """The Agent Protocol's Run: LangGraph's fields plus `agent_id` and the request's fields at the top level."""
    out = run_out(row)
    kwargs = row.get("kwargs") or {}
    out["agent_id"] = row.get("assistant_id")
    for key in ("input", "config", "webhook", "on_completion", "on_disconnect", "stream_mode"):
        if key in kwargs:
            out[key] = kwargs[key]
    return out


def paginated(rows: list[R], limit: int, offset: int) -> tuple[list[R], dict[str, str]]:
    """Trim a page fetched with `limit + 1` rows and give the headers LangGraph's server sends with it."""
    more = len(rows) > limit
    page = rows[:limit]
    headers = {"X-Pagination-Total": str(offset + limit + 1 if more else offset + len(page))}
    if more:
        headers["X-Pagination-Next"] = str(offset + limit)
    return page, headers
