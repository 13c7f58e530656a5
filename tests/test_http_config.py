"""langgraph.json's `http` section: the project's own app (`http.app`), CORS, configurable headers, route
families and the URL prefix, each as LangGraph's server (`langgraph dev`, langgraph-api 0.16.7) behaves.

The tests of a project with `http.app` and nothing else share one started app per backend, on ids of their own
(`tests/shared_app.py`); a test of other `http` settings starts its own app on `own_backend`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from langgraph_sdk.client import LangGraphClient

from tests.conftest import serving_asgi
from tests.services import Backend
from tests.shared_app import shared_app
from tests.waits import until
from threadline.api.app import create_app
from threadline.config import load_config
from threadline.errors import Unavailable
from threadline.settings import Settings

WEBAPP = "tests.project.http.webapp:app"
GRAPHS = {"agent": "tests.project.http.agent:graph"}
UUID = "00000000-0000-0000-0000-000000000001"

pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # the mark above reaches the module's plain functions too, which run as such
              pytest.mark.filterwarnings("ignore:.*is marked with '@pytest.mark.asyncio' but it is not an async")]
backend, served, http = shared_app()


@pytest.fixture(scope="module")
def module_settings(module_backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """The shared app's: a project whose `http` section is `{"app": WEBAPP}` alone."""
    path = tmp_path_factory.mktemp("http-app") / "langgraph.json"
    path.write_text(json.dumps({"graphs": GRAPHS, "http": {"app": WEBAPP}}))
    return Settings(config=str(path), workers=2, **module_backend.settings())


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, backend: Backend,
                  http: dict[str, Any]) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """Threadline on a project whose langgraph.json has this `http` section, in-process: the app and a client."""
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": GRAPHS, "http": http}))
    app = create_app(Settings(config=str(path), workers=2, **backend.settings()))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as client:
            yield app, client


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, backend: Backend, http: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(tmp_path, backend, http) as (_, client):
        yield client


def received(run_id: str) -> list[dict[str, Any]]:
    from tests.project.http.webapp import RECEIVED

    return [r for r in RECEIVED if r["body"].get("run_id") == run_id]


async def wait_received(run_id: str) -> list[dict[str, Any]]:
    return await until(lambda: received(run_id), timeout=10, what="the webhook")


# --- http.app --------------------------------------------------------------------------------------------


async def test_project_routes_are_served_first(http: httpx.AsyncClient) -> None:
    # /runs/{run_id} would answer 422 (not a UUID): the project's route is tried first, as LangGraph's.
    fake = await http.get("/runs/afakeroute")
    assert (fake.status_code, fake.json()) == (200, {"user": "route"})
    assert (await http.get("/custom/hello")).json() == {"hello": "from the project"}
    assert (await http.post("/assistants/search", json={})).json()[0]["graph_id"] == "agent"
    assert (await http.get("/runs/not-a-uuid")).status_code == 422  # ours, when the project has none


async def test_project_middleware_wraps_the_built_in_routes(http: httpx.AsyncClient) -> None:
    info = await http.get("/info")
    assert info.status_code == 200 and info.headers["x-acme"] == "stamped"
    thread = await http.post("/threads", json={})
    assert thread.status_code == 200 and thread.headers["x-acme"] == "stamped"
    missing = await http.get(f"/threads/{UUID}")
    assert missing.status_code == 404 and missing.headers["x-acme"] == "stamped"
    assert missing.json()["code"] == "not_found"  # still our error body
    assert (await http.get("/custom/hello")).headers["x-acme"] == "stamped"


async def test_project_lifespan_runs_and_its_state_reaches_its_routes(http: httpx.AsyncClient) -> None:
    answer = await http.get("/custom/greeting")
    assert (answer.status_code, answer.json()) == (200, {"greeting": "hello from the lifespan"})


async def test_openapi_shows_the_project_routes_beside_ours(http: httpx.AsyncClient) -> None:
    doc = (await http.get("/openapi.json")).json()
    assert {"/custom/hello", "/custom/webhook", "/runs/afakeroute"} <= set(doc["paths"])
    assert {"/threads", "/runs/wait", "/info"} <= set(doc["paths"])
    assert doc["info"] == {"title": "Acme API", "version": "2.3.0"}  # as LangGraph's: the project's info
    assert doc["paths"]["/custom/hello"]["get"]["tags"] == ["Custom"]
    assert doc["paths"]["/threads"]["post"]["tags"] == ["Threads"]
    refs = {v.split("/")[-1] for v in _refs(doc)}
    assert refs <= set(doc["components"]["schemas"])  # every $ref still resolves
    # /docs stays ours (the project's FastAPI has its own): it loads the merged document.
    docs = await http.get("/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "$ref" and isinstance(v, str)] + \
            [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


async def test_relative_webhook_is_delivered_to_the_project_app(http: httpx.AsyncClient) -> None:
    sdk = LangGraphClient(http)
    run = await sdk.runs.create(None, "agent", input={}, webhook="/custom/webhook")
    [delivery] = await wait_received(run["run_id"])
    assert delivery["path"] == "/custom/webhook"
    assert delivery["body"]["status"] == "success" and delivery["body"]["values"] == {"headers": {}}


async def test_disable_webhooks_runs_but_sends_nothing(tmp_path: Path, own_backend: Backend) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    outside: list[dict[str, Any]] = []

    async def hook(request: Request) -> Response:
        outside.append(await request.json())
        return Response(status_code=204)

    async with serving_asgi(Starlette(routes=[Route("/hook", hook, methods=["POST"])])) as receiver:
        async with serve(tmp_path, own_backend, {"app": WEBAPP, "disable_webhooks": True}) as client:
            sdk = LangGraphClient(client)
            thread = await sdk.threads.create()
            runs = [await sdk.runs.create(thread["thread_id"], "agent", input={}, webhook=hook_url)
                    for hook_url in ("/custom/webhook", f"{receiver}/hook")]
            for run in runs:
                await sdk.runs.join(thread["thread_id"], run["run_id"])
                assert (await sdk.runs.get(thread["thread_id"], run["run_id"]))["status"] == "success"
    # Shutdown waits for webhooks in flight: none was sent, relative or absolute.
    assert received(runs[0]["run_id"]) == [] and outside == []


# --- configuration ---------------------------------------------------------------------------------------


def test_http_keys_are_parsed_and_unknown_ones_reported(tmp_path: Path) -> None:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": GRAPHS, "http": {
        "app": WEBAPP, "enable_custom_route_auth": True, "middleware_order": "auth_first",
        "logging_headers": {"excludes": ["authorization"]}, "mount_prefix": "/api/",
        "configurable_headers": {"include": ["x-*"], "exclude": ["x-secret"]},
        "cors": {"allow_origins": ["https://a.example"], "max_age": 60, "allow_private_network": True},
        "disable_store": True, "disable_meta": False, "streaming": {"x": 1},
    }}))
    cfg = load_config(path)
    assert cfg.http.enable_custom_route_auth is True and cfg.http.middleware_order == "auth_first"
    assert cfg.http.mount_prefix == "/api" and cfg.http.disabled == {"store"}
    assert cfg.http.configurable_headers is not None
    assert (cfg.http.configurable_headers.includes, cfg.http.configurable_headers.excludes) == (("x-*",), ("x-secret",))
    assert cfg.http.cors is not None
    assert cfg.http.cors.options() == {"allow_origins": ["https://a.example"], "max_age": 60}
    assert sorted(k for k in cfg.unsupported if k.startswith("http")) == ["http.cors.allow_private_network",
                                                                          "http.streaming"]


@pytest.mark.parametrize("http, message", [
    ({"disable_runs": "yes"}, "disable_runs must be true or false"),
    ({"mount_prefix": "api"}, "must be a path starting with '/'"),
    ({"cors": {"allow_origins": "*"}}, "allow_origins must be a list of strings"),
    ({"configurable_headers": {"includes": "x-*"}}, "must be a list of header names"),
    ({"middleware_order": "whenever"}, "'auth_first' or 'middleware_first'"),
    ({"app": "webapp"}, "'path.py:attr' or 'module:attr'"),
])
def test_bad_http_values_stop_startup(tmp_path: Path, http: dict[str, Any], message: str) -> None:
    from threadline.errors import ConfigError

    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": GRAPHS, "http": http}))
    with pytest.raises(ConfigError, match=message):
        load_config(path)


# --- http.cors -------------------------------------------------------------------------------------------


async def test_configured_cors(tmp_path: Path, own_backend: Backend) -> None:
    cors = {"allow_origins": ["https://a.example"], "allow_methods": ["GET", "POST"], "allow_headers": ["x-foo"],
            "allow_credentials": True, "expose_headers": ["x-bar"], "max_age": 123,
            "allow_origin_regex": r"^https://.*\.b\.example$"}
    async with serve(tmp_path, own_backend, {"cors": cors}) as client:
        preflight = {"Origin": "https://a.example", "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "x-foo"}
        ok = await client.options("/threads", headers=preflight)
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "https://a.example"
        assert ok.headers["access-control-allow-methods"] == "GET, POST"
        assert ok.headers["access-control-max-age"] == "123"
        assert ok.headers["access-control-allow-credentials"] == "true"
        assert "x-foo" in ok.headers["access-control-allow-headers"]
        regex = await client.options("/threads", headers={**preflight, "Origin": "https://z.b.example"})
        assert regex.headers["access-control-allow-origin"] == "https://z.b.example"
        evil = {**preflight, "Origin": "https://evil.example"}
        assert (await client.options("/threads", headers=evil)).status_code == 400
        assert (await client.options("/threads", headers={
            **preflight, "Access-Control-Request-Method": "DELETE"})).status_code == 400
        simple = await client.get("/info", headers={"Origin": "https://a.example"})
        assert simple.headers["access-control-allow-origin"] == "https://a.example"
        assert simple.headers["access-control-expose-headers"] == "x-bar"
        assert "access-control-allow-origin" not in (await client.get("/info", headers={"Origin": "https://evil.example"})).headers


async def test_default_cors_allows_any_origin(http: httpx.AsyncClient) -> None:
    # The shared app's project has no `http.cors`.
    preflight = await http.options("/threads", headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "DELETE"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "*"


# --- http.configurable_headers ---------------------------------------------------------------------------

HEADERS = {"x-foo": "bar", "x-api-key": "secret", "authorization": "Bearer t", "my-header": "mh",
           "my-secret-h": "s", "x-other": "o", "user-agent": "ua-test"}


async def test_configurable_headers_reach_the_graph(tmp_path: Path, own_backend: Backend) -> None:
    rules = {"includes": ["x-foo", "my-*", "x-api-key", "authorization", "user-agent"], "excludes": ["my-secret*"]}
    async with serve(tmp_path, own_backend, {"configurable_headers": rules}) as client:
        out = (await client.post("/runs/wait", headers=HEADERS, json={"assistant_id": "agent", "input": {}})).json()
        # x-api-key and authorization are never taken (LangGraph's server drops them too); x-other is not included.
        assert out == {"headers": {"x-foo": "bar", "my-header": "mh", "user-agent": "ua-test"}}
        # A header wins over the same key in the body's configurable, and is stored with the run.
        thread = (await client.post("/threads", json={})).json()["thread_id"]
        run = (await client.post(f"/threads/{thread}/runs", headers={"x-foo": "from-header"}, json={
            "assistant_id": "agent", "input": {},
            "config": {"configurable": {"x-foo": "from-body", "x-keep": "k"}}})).json()
        assert run["kwargs"]["config"]["configurable"]["x-foo"] == "from-header"
        joined = (await client.get(f"/threads/{thread}/runs/{run['run_id']}/join")).json()
        assert joined["headers"]["x-foo"] == "from-header" and joined["headers"]["x-keep"] == "k"


async def test_wildcard_headers_and_the_default_of_none(tmp_path: Path, own_backend: Backend,
                                                        http: httpx.AsyncClient) -> None:
    wildcard = {"configurable_headers": {"include": ["*"], "exclude": ["x-o*"]}}
    async with serve(tmp_path, own_backend, wildcard) as client:
        out = (await client.post("/runs/wait", headers=HEADERS, json={"assistant_id": "agent", "input": {}})).json()
        assert {"x-foo", "my-header", "my-secret-h", "user-agent", "content-type"} <= set(out["headers"])
        assert not {"x-api-key", "authorization", "x-other"} & set(out["headers"])
    # LangGraph 0.16: no configurable_headers (the shared app's project has none), no headers.
    out = (await http.post("/runs/wait", headers=HEADERS, json={"assistant_id": "agent", "input": {}})).json()
    assert out == {"headers": {}}


# --- http.disable_* --------------------------------------------------------------------------------------

PROBES = {
    "assistants": [("POST", "/assistants/search"), ("GET", "/agents/x")],
    "threads": [("POST", "/threads"), ("POST", "/threads/search"), ("GET", f"/threads/{UUID}/state"),
                ("GET", f"/threads/{UUID}/stream")],
    "runs": [("POST", "/runs/wait"), ("POST", "/runs/search"), ("POST", f"/threads/{UUID}/runs/wait"),
             ("GET", f"/threads/{UUID}/runs"), ("POST", f"/threads/{UUID}/commands")],
    "store": [("POST", "/store/items/search"), ("PUT", "/store/items")],
    "meta": [("GET", "/info"), ("GET", "/metrics"), ("GET", "/docs"), ("GET", "/openapi.json")],
    "mcp": [("POST", "/mcp")],
    "a2a": [("GET", "/.well-known/agent-card.json"), ("POST", "/a2a/x")],
}


@pytest.mark.parametrize("family", sorted(PROBES))
async def test_disable_a_route_family(tmp_path: Path, own_backend: Backend, family: str) -> None:
    async with serve(tmp_path, own_backend, {f"disable_{family}": True}) as client:
        for method, path in PROBES[family]:
            gone = await client.request(method, path, json={})
            assert gone.status_code == 404 and gone.json()["detail"] == "Not Found", (method, path)
        for other, probes in PROBES.items():
            for method, path in probes[:1] if other != family else []:
                assert (await client.request(method, path, json={})).status_code != 404, (other, method, path)
        assert (await client.get("/ok")).json() == {"ok": True}


async def test_disable_meta_keeps_ok_without_its_checks(tmp_path: Path, own_backend: Backend,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    async def unreachable() -> None:
        raise Unavailable("database unreachable")

    for http, expected in (({}, 503), ({"disable_meta": True}, 200)):
        async with serving(tmp_path, own_backend, http) as (app, client):
            monkeypatch.setattr(app.state.runtime.storage, "ping", unreachable)
            assert (await client.get("/ok", params={"check_db": 1})).status_code == expected, http


# --- http.mount_prefix -----------------------------------------------------------------------------------


async def test_mount_prefix_serves_the_api_under_it(tmp_path: Path, own_backend: Backend) -> None:
    async with serve(tmp_path, own_backend, {"app": WEBAPP, "mount_prefix": "/api"}) as client:
        for path in ("/info", "/threads/search", "/custom/hello", "/openapi.json", "/docs"):
            assert (await client.request("POST" if "search" in path else "GET", path, json={})).status_code == 404
        assert (await client.get("/api/info")).status_code == 200
        assert (await client.get("/api/custom/hello")).json() == {"hello": "from the project"}
        assert (await client.get("/api/runs/afakeroute")).json() == {"user": "route"}
        for path in ("/ok", "/api/ok", "/metrics", "/api/metrics"):  # health checks and scrapers at the root too
            assert (await client.get(path)).status_code == 200, path
        doc = (await client.get("/api/openapi.json")).json()
        assert doc["servers"] == [{"url": "/api"}] and "/threads" in doc["paths"]
        docs = await client.get("/api/docs")
        assert docs.status_code == 200 and "/api/openapi.json" in docs.text
        # langgraph-sdk given the prefixed URL works unchanged, and a relative webhook is relative to the API.
        sdk = LangGraphClient(httpx.AsyncClient(transport=client._transport, base_url="http://t/api", timeout=30))
        assert [a["graph_id"] for a in await sdk.assistants.search()] == ["agent"]
        thread = await sdk.threads.create()
        out = await sdk.runs.wait(thread["thread_id"], "agent", input={}, webhook="/custom/webhook")
        assert out == {"headers": {}}
        runs = await sdk.runs.list(thread["thread_id"])
        [delivery] = await wait_received(runs[0]["run_id"])
        assert delivery["path"] == "/api/custom/webhook"


@pytest.mark.parametrize("webhook", ["custom/webhook", "ftp://example.com/x", "http://", "http:///x", "mailto:a@b",
                                     "//elsewhere.example/x"])
async def test_a_webhook_that_is_neither_url_nor_path_is_refused(http: httpx.AsyncClient, webhook: str) -> None:
    refused = await http.post("/runs", json={"assistant_id": "agent", "input": {}, "webhook": webhook})
    assert refused.status_code == 422 and refused.json()["errors"][0]["field"] == "webhook", refused.text
    for fine in ("/custom/webhook", "https://hooks.example.com/done", "HTTP://127.0.0.1:9/x"):
        assert (await http.post("/runs", json={"assistant_id": "agent", "input": {}, "webhook": fine,
                                               "after_seconds": 3600})).status_code == 200


async def test_project_routes_are_counted_in_request_metrics(http: httpx.AsyncClient) -> None:
    hello = 'lg_api_http_requests_total{method="GET",path="/custom/hello",status="200"}'
    missing = 'lg_api_http_requests_total{method="GET",path="/threads/{thread_id}",status="404"}'
    before = _counters((await http.get("/metrics")).text)  # the shared app's other tests' requests
    for _ in range(2):
        assert (await http.get("/custom/hello")).status_code == 200
    await http.get(f"/threads/{UUID}")
    after = _counters((await http.get("/metrics")).text)
    assert (after[hello] - before.get(hello, 0.0), after[missing] - before.get(missing, 0.0)) == (2.0, 1.0)


def _counters(text: str) -> dict[str, float]:
    """The request counters of a /metrics page, by name and labels."""
    return {name: float(value) for name, _, value in
            (line.rpartition(" ") for line in text.splitlines() if line.startswith("lg_api_http_requests_total{"))}


def test_an_http_app_that_is_not_starlette_stops_startup(tmp_path: Path) -> None:
    from threadline.errors import ConfigError

    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": GRAPHS, "http": {"app": "tests.project.http.webapp:bare_asgi"}}))
    with pytest.raises(ConfigError, match="must be a Starlette or FastAPI app"):
        create_app(Settings(config=str(path), database_url=f"sqlite:///{tmp_path / 'db'}"))


async def test_unknown_http_keys_are_reported_at_startup(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    backend = Backend("sqlite", f"sqlite:///{tmp_path / 'db'}")
    async with serve(tmp_path, backend, {"enable_custom_route_auth": True, "streaming": 1}):
        pass
    said = caplog.text
    assert "enable_custom_route_auth" not in said  # it has an effect now (with authentication)
    assert "'http.streaming' is not supported" in said
