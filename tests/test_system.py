from __future__ import annotations

from typing import Any

import httpx

from tests.services import Backend


async def test_ok_and_readiness(http: httpx.AsyncClient) -> None:
    assert (await http.get("/ok")).json() == {"ok": True}
    r = await http.get("/ok", params={"check_db": 1})
    assert r.status_code == 200 and r.json() == {"ok": True}


async def test_info_lists_graphs_and_storage(http: httpx.AsyncClient, database_url: str, backend: Backend) -> None:
    info = (await http.get("/info")).json()
    assert "echo" in info["graphs"] and info["default_agent"] == "echo"
    assert info["storage"]["backend"] == database_url.split(":", 1)[0]
    assert info["storage"]["multi_process"] is database_url.startswith("postgresql")
    # PostgreSQL without Redis is its own broker.
    shared = "redis" if backend.redis_url else "postgres"
    assert info["broker"] == (shared if database_url.startswith("postgresql") else "memory")
    assert info["flags"]["assistants"] is True


async def test_openapi_describes_routes(http: httpx.AsyncClient) -> None:
    spec = (await http.get("/openapi.json")).json()
    for path in ("/threads", "/threads/{thread_id}/runs/wait", "/runs/search", "/store/items", "/agents/search",
                 "/assistants/search"):
        assert path in spec["paths"], path
    docs = await http.get("/docs")
    assert docs.status_code == 200 and "text/html" in docs.headers["content-type"]


async def test_docs_pages_load_their_assets_from_this_server(http: httpx.AsyncClient) -> None:
    """Swagger UI and ReDoc work offline: every script and stylesheet they load is served here."""
    import re

    for page in ("/docs", "/redoc"):
        html = (await http.get(page)).text
        assets = re.findall(r'(?:src|href)=["\']([^"\']+)["\']', html)
        assert assets and not [a for a in assets if "://" in a], (page, assets)  # nothing from a CDN
        for asset in assets:
            r = await http.get(asset)
            assert r.status_code == 200 and len(r.content) > 500, asset
    js = await http.get("/docs/assets/swagger-ui-bundle.js")
    assert "javascript" in js.headers["content-type"]


async def test_invalid_json_body_names_line_and_column(http: httpx.AsyncClient) -> None:
    """As LangGraph's server: 422 and `Invalid JSON in request body`; then where, as a person counts it."""
    r = await http.post("/threads", content=b'{"metadata": {"a": 1},\n "x": }',
                        headers={"content-type": "application/json"})
    assert r.status_code == 422
    body = r.json()
    assert body["detail"] == "Invalid JSON in request body: Expecting value at line 2, column 7 (character 30)"
    assert body["code"] == "invalid_json" and "errors" not in body  # no field named after a character offset
    r = await http.post("/runs/search", content=b"{bad", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("Invalid JSON in request body: ")


async def test_unknown_route_is_json_404(http: httpx.AsyncClient) -> None:
    r = await http.get("/nope")
    assert r.status_code == 404
    assert r.json()["detail"]


async def test_oversized_body_is_413(http: httpx.AsyncClient) -> None:
    r = await http.post("/threads", content=b"{" + b" " * (11 * 1024 * 1024) + b"}",
                        headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "exceeds" in r.json()["detail"]


async def test_cors_allows_browsers(http: httpx.AsyncClient) -> None:
    r = await http.options("/threads", headers={"Origin": "https://studio.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] in ("*", "https://studio.example")


async def test_readiness_is_503_when_redis_cannot_answer(runtime: Any, http: httpx.AsyncClient) -> None:
    """A real Redis client to a port nothing listens on: readiness fails with a JSON body, liveness stays up."""
    from threadline.broker.redis import RedisBroker

    dead = RedisBroker("redis://127.0.0.1:1/0")
    real, runtime.broker = runtime.broker, dead
    try:
        r = await http.get("/ok", params={"check_db": 1})
        assert r.status_code == 503 and "Redis" in r.json()["detail"]
        assert (await http.get("/ok")).status_code == 200
    finally:
        runtime.broker = real
        await dead.close()
