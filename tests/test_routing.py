"""`api.common.Router`: a router declines a request whose first path segment none of its routes has, without
trying its routes; whatever its routes match is still matched, with the usual 404 and 405."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from threadline.api.common import Router
from threadline.api.routing import RouteIndex, remember_matches


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


def _record_matches(route: BaseRoute, paths: list[str]) -> None:
    """`route.matches` appends the path it is asked about to `paths`, then answers as before."""
    original = route.matches

    def matches(scope: Scope) -> tuple[Match, Scope]:
        paths.append(scope["path"])
        return original(scope)

    route.matches = matches  # type: ignore[method-assign]  # this one route's method, wrapped by instance

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
        _record_matches(route, tried)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.get("/c/d")).status_code == 200
        assert tried == []  # `/c/…` is not under `/a`: declined before any of its routes was tried
        assert (await http.get("/a/2")).status_code == 200
        assert tried and set(tried) == {"/a/2"}
    assert open_ended._route_heads() is None  # `/{name}/b` could match anything: never declined up front


def _indexed(app: FastAPI) -> FastAPI:
    """`app` routed as Threadline's app routes (`api/app.py: App.build_middleware_stack`)."""
    app.router.middleware_stack = RouteIndex(app.router)
    remember_matches(app.router)
    return app


async def test_the_route_index_answers_as_the_full_scan() -> None:
    """Only the routers for the path's first segment are tried, each matched once; what they answer (a route,
    405, the trailing-slash redirect, 404) is what trying them all answers, and a route added later is found."""
    app, fixed, open_ended = _app()
    plain, _, _ = _app()
    _indexed(app)
    calls: list[str] = []
    for route in fixed.routes:
        _record_matches(route, calls)
    asked: list[str] = []  # the branches the app's router asked
    for branch in app.router.routes:
        if getattr(branch, "original_router", None) is fixed:
            _record_matches(branch, asked)
    async with (httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http,
                httpx.AsyncClient(transport=httpx.ASGITransport(app=plain), base_url="http://t") as full):
        for method, path in (("GET", "/a/1"), ("GET", "/c/d"), ("GET", "/z/b"), ("GET", "/a"), ("POST", "/a/1"),
                             ("GET", "/nowhere/at/all"), ("GET", "/c/d/"), ("GET", "/"), ("GET", "//"),
                             ("GET", "/{x}")):
            got, want = await http.request(method, path), await full.request(method, path)
            assert (got.status_code, got.headers.get("location"), got.content) == (
                want.status_code, want.headers.get("location"), want.content), (method, path)
        calls.clear()
        assert (await http.get("/a/2")).json() == {"a": "2"}
        assert calls == ["/a/2"]  # matched once: the branch's second match is its first one's answer
        asked.clear()
        assert (await http.get("/c/d")).status_code == 200
        assert asked == []  # a router for another first segment is never asked

        @app.get("/later/{n}")
        async def later(n: str) -> dict[str, str]:
            return {"later": n}

        assert (await http.get("/later/1")).json() == {"later": "1"}


async def test_a_request_without_origin_gets_the_vary_cors_gives_it() -> None:
    """`http_config.Cors`'s way for a request without `Origin`: the same headers as Starlette's CORSMiddleware."""
    from starlette.middleware.cors import CORSMiddleware
    from starlette.responses import Response

    from threadline.api.http_config import DEFAULT_CORS, Cors

    async def answer(scope: object, receive: object, send: object) -> None:
        path = scope["path"]  # type: ignore[index]
        headers = {"/one": [(b"vary", b"Accept")], "/two": [(b"vary", b"Accept"), (b"x", b"1"), (b"vary", b"Cookie")]}
        response = Response(b"hi")
        response.raw_headers = [*response.raw_headers, *headers.get(path, [])]
        await response(scope, receive, send)  # type: ignore[arg-type]

    for path in ("/none", "/one", "/two"):
        seen = []
        for layer in (Cors(answer, **DEFAULT_CORS), CORSMiddleware(answer, **DEFAULT_CORS)):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=layer), base_url="http://t") as http:
                seen.append((await http.get(path)).headers.multi_items())
        assert seen[0] == seen[1] and ("vary", "Origin") in [(k, v.split(", ")[-1]) for k, v in seen[0]], path
