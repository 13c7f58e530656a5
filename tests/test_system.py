from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.services import Backend
from tests.shared_app import shared_app

# The module's tests share one started app per backend (tests/conftest.py, `module_served`): each makes what it
# reads, under ids of its own. They run in the app's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http = shared_app()


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


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_labelled_json_is_a_415_that_says_so(http: httpx.AsyncClient,
                                                              content_type: str | None) -> None:
    """Not parsed anyway (a browser sends such a body cross-site without a preflight); said clearly. It was a
    422 "Input should be a valid dictionary"."""
    headers = {"content-type": content_type} if content_type else {}
    r = await http.post("/threads", content=b'{"metadata": {"by": "unlabelled"}}', headers=headers)
    assert r.status_code == 415, r.text
    assert r.json()["detail"] == ("Send the body as JSON with Content-Type: application/json "
                                  f"(this request's: {content_type or 'none'})")
    assert (await http.post("/threads/search", json={"metadata": {"by": "unlabelled"}})).json() == []


async def test_an_id_in_the_path_that_is_no_uuid_is_named_as_langgraphs_server_names_it(
        http: httpx.AsyncClient) -> None:
    """One text on every deployment, LangGraph's; the field is still named in `errors`."""
    thread = (await http.post("/threads", json={})).json()["thread_id"]
    for method, path, text in [("GET", f"/threads/{thread}/runs/nope", "Invalid run ID: must be a UUID"),
                               ("POST", f"/threads/{thread}/runs/nope/cancel", "Invalid run ID: must be a UUID"),
                               ("GET", "/threads/nope", "Invalid thread ID: must be a UUID"),
                               ("DELETE", "/runs/crons/nope", "Invalid cron ID: must be a UUID")]:
        r = await http.request(method, path)
        assert r.status_code == 422 and r.json()["detail"] == text, (path, r.text)
        assert r.json()["errors"][0]["field"].startswith("path.")


async def test_unknown_route_is_json_404(http: httpx.AsyncClient) -> None:
    r = await http.get("/nope")
    assert r.status_code == 404
    assert r.json()["detail"]


async def test_oversized_body_is_413(http: httpx.AsyncClient) -> None:
    r = await http.post("/threads", content=b"{" + b" " * (11 * 1024 * 1024) + b"}",
                        headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert "exceeds" in r.json()["detail"]


@pytest.mark.parametrize("path", ["/threads", "/threads/00000000-0000-4000-8000-000000000000/commands"])
async def test_oversized_chunked_body_is_413_too(http: httpx.AsyncClient, path: str) -> None:
    """No Content-Length (chunked): the body is found too large as it streams in. It was a 400 "There was an
    error parsing the body" on the routes whose body FastAPI reads."""
    async def chunks() -> Any:
        yield b"{"
        for _ in range(11):
            yield b" " * (1024 * 1024)
        yield b"}"

    r = await http.post(path, content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == "Request body exceeds 10485760 bytes"


async def test_cors_allows_browsers(http: httpx.AsyncClient) -> None:
    r = await http.options("/threads",
                           headers={"Origin": "https://studio.example", "Access-Control-Request-Method": "POST"})
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
