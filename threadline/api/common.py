"""What every route module shares: the runtime, JSON responses, and the public shape of each resource."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from starlette.responses import Response

from threadline.core.runtime import Runtime
from threadline.shapes import run_out
from threadline.serde import dumps


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def no_content() -> Response:
    return Response(status_code=204)


def select(row: dict[str, Any], fields: list[str] | None) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k in fields} if fields else row


def spec_run_out(row: dict[str, Any]) -> dict[str, Any]:
    """The Agent Protocol's Run: LangGraph's fields plus `agent_id` and the request's fields at the top level."""
    out = run_out(row)
    kwargs = row.get("kwargs") or {}
    out["agent_id"] = row.get("assistant_id")
    for key in ("input", "config", "webhook", "on_completion", "on_disconnect", "stream_mode"):
        if key in kwargs:
            out[key] = kwargs[key]
    return out


def paginated(rows: list[dict[str, Any]], limit: int, offset: int) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Trim a page fetched with `limit + 1` rows and give the headers LangGraph's server sends with it."""
    more = len(rows) > limit
    page = rows[:limit]
    headers = {"X-Pagination-Total": str(offset + limit + 1 if more else offset + len(page))}
    if more:
        headers["X-Pagination-Next"] = str(offset + limit)
    return page, headers
