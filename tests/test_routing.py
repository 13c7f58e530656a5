"""`api.common.Router`: a router declines a request whose first path segment none of its routes has, without
trying its routes; whatever its routes match is still matched, with the usual 404 and 405."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from threadline.api.common import Router


def _app() -> tuple[FastAPI, Router, Router]:
    app = FastAPI()
    fixed = Router(prefix="/a")
    open_ended = Router()

    @fixed.get("/{x}")
    async def get_a(x: str) -> dict[str, str]:
        return {"a": x}

    @open_ended.get("/c/d")
    async def get_cd() -> dict[str, str]:
        return {"c": "d"}

    @open_ended.get("/{name}/b")
    async def get_b(name: str) -> dict[str, str]:
        return {"b": name}

    app.include_router(fixed)
    app.include_router(open_ended)
    return app, fixed, open_ended


async def test_routes_still_match_and_other_first_segments_are_declined() -> None:
    app, fixed, open_ended = _app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.get("/a/1")).json() == {"a": "1"}
        assert (await http.get("/c/d")).json() == {"c": "d"}
        assert (await http.get("/z/b")).json() == {"b": "z"}  # a route that begins with a parameter
        assert (await http.get("/a")).status_code == 404
        assert (await http.post("/a/1")).status_code == 405
        assert (await http.get("/nowhere/at/all")).status_code == 404

    tried: list[str] = []
    for route in fixed.routes:
        original = route.matches
        route.matches = lambda scope, original=original: (tried.append(scope["path"]), original(scope))[1]  # type: ignore[method-assign]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.get("/c/d")).status_code == 200
        assert tried == []  # `/c/…` is not under `/a`: declined before any of its routes was tried
        assert (await http.get("/a/2")).status_code == 200
        assert tried and set(tried) == {"/a/2"}
    assert open_ended._route_heads() is None  # `/{name}/b` could match anything: never declined up front
