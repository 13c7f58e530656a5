"""Authentication (`langgraph.json` `auth`, built-in API keys) on every route, over both backends.

The module's tests share one started app per backend (tests/shared_app.py), each on threads and crons of its own;
a test that needs other settings or another project starts its own app on `own_backend`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager
from langgraph_sdk import get_client

from tests.conftest import serving
from tests.processes import stop
from tests.sdk_shapes import one_state
from tests.services import Backend
from tests.shared_app import shared_app
from threadline import __version__
from threadline.api.app import create_app
from threadline.errors import ConfigError
from threadline.settings import Settings

AUTH_PROJECT = Path(__file__).parent / "auth_project" / "langgraph.json"
ALICE = {"authorization": "Bearer user-alice"}
KEY = "sk-test-0123456789abcdef"


pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # the mark above reaches the module's plain functions too, which run as such
              pytest.mark.filterwarnings("ignore:.*is marked with '@pytest.mark.asyncio' but it is not an async")]

backend, served, http = shared_app()


def auth_settings(backend: Backend) -> Settings:
    # No budget of refused credentials: the route walk below is hundreds of refusals from one address
    # (the budget has its own tests in test_rate_limits.py).
    return Settings(config=str(AUTH_PROJECT), workers=2, heartbeat_seconds=5.0, rate_limit_auth_failures="",
                    **backend.settings())


@pytest.fixture(scope="module")
def module_settings(module_backend: Backend) -> Settings:
    return auth_settings(module_backend)


def _auth_module() -> Any:
    import sys

    # The auth_project's own module: other test projects' `auth.py` load under the same prefix.
    return next(m for name, m in sys.modules.items() if name.startswith("threadline_project.auth_")
                and Path(m.__file__ or "").parent == AUTH_PROJECT.parent)


def our_routes(app: Any) -> Iterator[tuple[str, str]]:
    """(method, path) of every route the app serves: FastAPI's included routers, mounts and WebSockets."""
    from starlette.routing import Mount, WebSocketRoute

    def walk(routes: Any, prefix: str) -> Iterator[tuple[str, str]]:
        for route in routes:
            context = getattr(route, "include_context", None)
            if context is not None:  # FastAPI keeps an included router as one route
                yield from walk(context.included_router.routes, prefix + context.prefix)
            elif isinstance(route, Mount):
                yield "GET", prefix + route.path + "/x"
            elif isinstance(route, WebSocketRoute) or type(route).__name__ == "APIWebSocketRoute":
                yield "WEBSOCKET", prefix + route.path
            else:
                for method in sorted(route.methods or {"GET"}):
                    if method != "HEAD":
                        yield method, prefix + route.path

    yield from walk(app.routes, "")


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", str(uuid.uuid4()), path)


async def websocket_handshake(app: Any, path: str, headers: list[tuple[bytes, bytes]] | None = None,
                              query: bytes = b"") -> list[dict[str, Any]]:
    """What an app sends back to a WebSocket handshake (the denial-response extension offered), and whether
    it accepted; the client then goes away."""
    sent: list[dict[str, Any]] = []
    inbox = [{"type": "websocket.connect"}]

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop()
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "websocket", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": query,
             "headers": headers or [], "scheme": "ws", "server": ("test", 80), "client": ("127.0.0.1", 1),
             "subprotocols": [], "asgi": {"version": "3.0"}, "extensions": {"websocket.http.response": {}}}
    await app(scope, receive, send)
    return sent


# --- every route, every surface ----------------------------------------------------------------------------


async def test_every_route_refuses_a_request_without_credentials(served: tuple[Any, Any],
                                                                 http: httpx.AsyncClient) -> None:
    application, app = served
    routes = list(our_routes(application))
    kinds = {path for _, path in routes}
    # The surfaces the walk must see, so a router that moves out of the table cannot hide from it.
    for surface in ("/threads/{thread_id}/stream/events", "/threads/{thread_id}/commands", "/mcp", "/store/items",
                    "/info", "/metrics", "/openapi.json", "/docs", "/runs/wait", "/threads/{thread_id}/stream"):
        assert surface in kinds, surface
    assert any(p.startswith("/a2a/") for p in kinds) and any(p.startswith("/docs/assets") for p in kinds)
    checked = 0
    for method, path in routes:
        url = concrete(path)
        if method == "WEBSOCKET":
            sent = await websocket_handshake(app, url)
            assert sent[0]["type"] == "websocket.http.response.start" and sent[0]["status"] == 401, path
            assert not any(m["type"] == "websocket.accept" for m in sent), path
        else:
            response = await http.request(method, url, json={} if method in ("POST", "PUT", "PATCH") else None)
            if path == "/ok":
                assert response.status_code == 200
                continue
            if path == "/console" or path.startswith("/console/"):
                # The console's pages are open at the door but read through the API with the caller's
                # credentials: without any, a data page is the API's 401 as a sign-in page, with no data.
                if path in ("/console", "/console/login") or path.startswith("/console/static"):
                    assert response.status_code in (200, 307, 404), (path, response.status_code)
                else:
                    assert response.status_code == 401, (method, path, response.status_code)
                    assert "Sign in needed" in response.text and "data-unauthorized" in response.text, path
                assert __version__ not in response.text, path
                checked += 1
                continue
            if method in ("GET", "HEAD") and path == "/ui/{graph_id}/{asset}":
                # A generative UI bundle's files, open as on LangGraph's server (a <script src> sends no
                # credentials); they hold the project's component code only. This project has none: 404.
                assert response.status_code == 404, (method, path, response.status_code)
                checked += 1
                continue
            assert response.status_code == 401, (method, path, response.status_code, response.text)
            assert response.json()["detail"] == "Missing or bad token"
            assert response.headers["www-authenticate"] == "Bearer"
        checked += 1
    assert checked > 40
    # A path no route serves is refused too (as LangGraph's server): nothing is learnt without credentials.
    assert (await http.get("/no/such/route")).status_code == 401


async def test_the_console_reads_with_the_callers_credentials(http: httpx.AsyncClient) -> None:
    thread = (await http.post("/threads", json={"metadata": {"who": "alice"}}, headers=ALICE)).json()
    refused = await http.get(f"/console/threads/{thread['thread_id']}")
    assert refused.status_code == 401 and thread["thread_id"] not in refused.text
    shown = await http.get(f"/console/threads/{thread['thread_id']}", headers=ALICE)
    assert shown.status_code == 200 and thread["thread_id"] in shown.text
    assert (await http.get("/console/login")).status_code == 200


async def test_the_same_routes_answer_with_credentials(http: httpx.AsyncClient) -> None:
    for path in ("/info", "/openapi.json", "/docs", "/metrics"):
        assert (await http.get(path, headers=ALICE)).status_code == 200, path
    assert (await http.post("/assistants/search", json={}, headers=ALICE)).status_code == 200
    assert (await http.post("/store/namespaces", json={}, headers=ALICE)).status_code == 200


async def test_openapi_shows_the_configured_security_schemes(http: httpx.AsyncClient) -> None:
    schema = (await http.get("/openapi.json", headers=ALICE)).json()
    assert schema["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert schema["security"] == [{"bearer": []}]
    assert "/threads" in schema["paths"]


# --- the authenticator's parameters and outcomes -------------------------------------------------------------


async def test_handler_parameters_are_injected_by_name(http: httpx.AsyncClient) -> None:
    thread_id = str(uuid.uuid4())
    response = await http.post(f"/threads/{thread_id}/history?limit=3&x=1&x=2", json={"limit": 2},
                               headers={**ALICE, "x-extra": "yes"})
    assert response.status_code == 404  # authenticated; the thread does not exist
    last = _auth_module().LAST
    assert last["authorization"] == "Bearer user-alice" and last["method"] == "POST"
    assert last["path"] == f"/threads/{thread_id}/history"
    assert last["path_params"] == {"thread_id": thread_id}
    assert last["query_params"]["limit"] == "3" and last["query_params"].getlist("x") == ["1", "2"]
    assert last["headers"][b"x-extra"] == b"yes"
    assert last["body"] == {"limit": 2}  # and the route still read the body (it answered, not 422)
    assert last["request"].url.path == f"/threads/{thread_id}/history"


async def test_http_exception_gives_its_status_detail_and_headers(http: httpx.AsyncClient) -> None:
    response = await http.post("/threads", json={}, headers={"authorization": "Bearer teapot"})
    assert response.status_code == 418
    assert response.json()["detail"] == "short and stout" and response.headers["x-why"] == "tea"


@pytest.mark.parametrize("token", ["boom", "none"])
async def test_a_failing_authenticator_is_a_401_that_says_nothing(http: httpx.AsyncClient, token: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    response = await http.post("/threads", json={}, headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert response.json()["detail"] == "Unauthorized"
    assert "secret" not in response.text and "Traceback" not in response.text and "auth.py" not in response.text
    if token == "boom":
        assert "secret internals xyz" in caplog.text  # the operator sees it in the log


async def test_websocket_handshake_is_authenticated(app: Any) -> None:
    thread_id = str(uuid.uuid4())
    refused = await websocket_handshake(app, f"/threads/{thread_id}/stream/events",
                                        [(b"authorization", b"Bearer nobody")])
    assert refused[0]["status"] == 401 and not any(m["type"] == "websocket.accept" for m in refused)
    body = json.loads(refused[1]["body"])
    assert body["detail"] == "Missing or bad token"
    accepted = await websocket_handshake(app, f"/threads/{thread_id}/stream/events", query=b"token=user-alice")
    assert accepted[0]["type"] == "websocket.accept"


# --- the identity reaches the agent --------------------------------------------------------------------------


EXPECTED_USER = {"identity": "alice", "is_authenticated": True, "display_name": "Alice",
                 "permissions": ["threads:read", "runs:create"], "team": "blue"}


def _seen(user: dict[str, Any], identity: str, permissions: list[str]) -> dict[str, Any]:
    return {"user": user, "identity_attr": identity, "user_id": identity, "permissions": permissions}


async def test_the_identity_reaches_the_graph(http: httpx.AsyncClient) -> None:
    thread = (await http.post("/threads", json={}, headers=ALICE)).json()
    # A client cannot claim to be someone else: the server's keys win over the body's.
    spoof = {"configurable": {"langgraph_auth_user_id": "mallory", "langgraph_auth_user": {"identity": "mallory"}}}
    out = (await http.post(f"/threads/{thread['thread_id']}/runs/wait", headers=ALICE,
                           json={"assistant_id": "whoami", "input": {}, "config": spoof})).json()
    assert out["seen"] == _seen(EXPECTED_USER, "alice", ["threads:read", "runs:create"])
    plain = (await http.post("/runs/wait", json={"assistant_id": "whoami", "input": {}},
                             headers={"authorization": "Bearer alice"})).json()
    assert plain["seen"] == _seen({"identity": "alice", "is_authenticated": True, "display_name": "alice"},
                                  "alice", [])
    runs = (await http.get(f"/threads/{thread['thread_id']}/runs", headers=ALICE)).json()
    assert runs[0]["kwargs"]["config"]["configurable"]["langgraph_auth_user_id"] == "alice"


async def test_the_identity_reaches_mcp_and_a2a_runs(http: httpx.AsyncClient) -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "whoami", "arguments": {}}}
    mcp = await http.post("/mcp", json=call, headers={**ALICE, "accept": "application/json, text/event-stream"})
    assert mcp.status_code == 200, mcp.text
    result = mcp.json()["result"]
    seen = (result.get("structuredContent") or json.loads(result["content"][0]["text"]))["seen"]
    assert seen == _seen(EXPECTED_USER, "alice", ["threads:read", "runs:create"])
    assistant = (await http.post("/assistants/search", json={"graph_id": "echo"}, headers=ALICE)).json()[0]
    send = {"jsonrpc": "2.0", "id": 2, "method": "message/send", "params": {"message": {
        "kind": "message", "role": "user", "messageId": str(uuid.uuid4()), "parts": [{"kind": "text", "text": "hi"}]}}}
    a2a = await http.post(f"/a2a/{assistant['assistant_id']}", json=send, headers=ALICE)
    assert a2a.status_code == 200 and "result" in a2a.json(), a2a.text
    context_id = a2a.json()["result"]["contextId"]
    runs = (await http.get(f"/threads/{context_id}/runs", headers=ALICE)).json()
    assert runs[0]["kwargs"]["config"]["configurable"]["langgraph_auth_user_id"] == "alice"


# --- a real client, API keys -----------------------------------------------------------------------------------


@pytest.fixture
def key_settings(own_backend: Backend, tmp_path: Path) -> Settings:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps([{"key": "sk-file-0123456789abcdef", "identity": "scraper",
                                 "permissions": ["metrics:read"]}]))
    return Settings(config=str(Path(__file__).parent / "project" / "langgraph.json"), workers=2,
                    api_keys=f"bob={KEY}", api_keys_file=str(keys), public_paths="/metrics",
                    **own_backend.settings())


@pytest_asyncio.fixture(loop_scope="module")
async def key_http(key_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    application = create_app(key_settings)
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://threadline", timeout=30) as client:
            yield client


async def test_api_keys_without_an_auth_py(key_http: httpx.AsyncClient) -> None:
    assert (await key_http.post("/threads", json={})).status_code == 401
    assert (await key_http.post("/threads", json={}, headers={"x-api-key": KEY + "x"})).status_code == 401
    assert (await key_http.post("/threads", json={}, headers={"authorization": "Basic " + KEY})).status_code == 401
    assert (await key_http.post("/threads", json={}, headers={"x-api-key": KEY})).status_code == 200
    assert (await key_http.post("/threads", json={}, headers={"authorization": f"Bearer {KEY}"})).status_code == 200
    assert (await key_http.get("/metrics")).status_code == 200  # public_paths
    assert (await key_http.get("/info")).status_code == 401
    schema = (await key_http.get("/openapi.json", headers={"x-api-key": KEY})).json()
    assert schema["security"] == [{"apiKeyAuth": []}]
    out = (await key_http.post("/runs/wait", json={"assistant_id": "echo", "input": {"message": "x"}},
                               headers={"x-api-key": "sk-file-0123456789abcdef"}))
    assert out.status_code == 200
    thread = (await key_http.post("/threads", json={}, headers={"x-api-key": "sk-file-0123456789abcdef"})).json()
    await key_http.post(f"/threads/{thread['thread_id']}/runs/wait", json={"assistant_id": "echo", "input": {}},
                        headers={"x-api-key": "sk-file-0123456789abcdef"})
    runs = (await key_http.get(f"/threads/{thread['thread_id']}/runs",
                               headers={"x-api-key": "sk-file-0123456789abcdef"})).json()
    configurable = runs[0]["kwargs"]["config"]["configurable"]
    assert configurable["langgraph_auth_user_id"] == "scraper"
    assert configurable["langgraph_auth_permissions"] == ["metrics:read"]


async def test_two_credential_headers_are_refused(http: httpx.AsyncClient) -> None:
    """Proxies and Starlette's `headers.get` take the first of two headers, a dict of them the last: a request
    with two was served as the second user. Now neither: 400, whichever layer reads them."""
    two = [("authorization", "Bearer user-alice"), ("authorization", "Bearer user-bob")]
    refused = await http.post("/threads", json={"metadata": {"by": "two"}}, headers=two)
    assert refused.status_code == 400, refused.text
    assert refused.json()["code"] == "ambiguous_credentials"
    assert refused.json()["detail"] == "A request may carry at most one Authorization header and one X-API-Key header."
    assert (await http.post("/threads/search", json={"metadata": {"by": "two"}}, headers=ALICE)).json() == []


async def test_two_api_key_headers_are_refused(key_http: httpx.AsyncClient) -> None:
    two_keys = [("x-api-key", KEY), ("x-api-key", "sk-file-0123456789abcdef")]
    assert (await key_http.post("/threads", json={}, headers=two_keys)).status_code == 400
    # One of each is no ambiguity: the API keys read `x-api-key` first.
    one_each = [("x-api-key", KEY), ("authorization", "Bearer whatever")]
    assert (await key_http.post("/threads", json={}, headers=one_each)).status_code == 200


@pytest.mark.slow
async def test_a_real_sdk_client_with_an_api_key(key_settings: Settings) -> None:
    async with serving(key_settings) as url:
        anonymous = get_client(url=url, api_key=None)
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await anonymous.threads.create()
        assert refused.value.response.status_code == 401
        client = get_client(url=url, api_key=KEY)  # the SDK sends it as `x-api-key`
        bearer = get_client(url=url, api_key=None, headers={"authorization": f"Bearer {KEY}"})
        assert (await bearer.assistants.search())[0]["graph_id"]
        thread = await client.threads.create()
        out = one_state(await client.runs.wait(thread["thread_id"], "echo", input={"message": "hi"}))
        assert out["messages"][-1]["content"]
        chunks = [c async for c in client.runs.stream(thread["thread_id"], "echo", input={"message": "again"})]
        assert chunks[-1].event in ("values", "end")


def test_bad_api_key_configuration_stops_startup(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 16"):
        create_app(Settings(config=str(AUTH_PROJECT.parent.parent / "project" / "langgraph.json"),
                            api_keys="bob=short"))
    with pytest.raises(ConfigError, match="public_paths"):
        create_app(Settings(config=str(AUTH_PROJECT), public_paths="/threads"))


# --- fail closed -----------------------------------------------------------------------------------------------


def test_no_auth_on_a_public_interface_refuses_to_start() -> None:
    project = str(Path(__file__).parent / "project" / "langgraph.json")
    with pytest.raises(ConfigError, match="refusing to serve on 0.0.0.0 without authentication"):
        create_app(Settings(config=project, host="0.0.0.0"))
    create_app(Settings(config=project, host="0.0.0.0", allow_unauthenticated=True))
    create_app(Settings(config=project, host="0.0.0.0", api_keys=f"bob={KEY}"))
    create_app(Settings(config=str(AUTH_PROJECT), host="0.0.0.0"))
    create_app(Settings(config=project, host="::1"))


@pytest.mark.e2e  # the `threadline serve` command
def test_threadline_serve_on_0000_without_auth_exits(tmp_path: Path) -> None:
    import subprocess
    import sys

    project = str(Path(__file__).parent / "project" / "langgraph.json")
    done = subprocess.run([sys.executable, "-m", "threadline", "serve", "--config", project, "--host", "0.0.0.0",
                           "--port", "0", "--database-url", f"sqlite:///{tmp_path / 'x.db'}"],
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1])
    assert done.returncode == 2
    assert "--allow-unauthenticated" in done.stderr and "refusing to serve on 0.0.0.0" in done.stderr


# --- webhooks, CORS, the project's own routes ---------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/hook", "http://169.254.169.254/latest/meta-data/",
                                 "http://[::1]/hook", "http://10.0.0.8/hook", "http://localhost:9/hook",
                                 "http://[::ffff:169.254.169.254]/x"])
async def test_webhooks_into_the_servers_own_network_are_refused(http: httpx.AsyncClient, url: str) -> None:
    response = await http.post("/runs", json={"assistant_id": "echo", "input": {}, "webhook": url}, headers=ALICE)
    assert response.status_code == 422, response.text
    assert "webhook" in response.json()["detail"]


async def test_a_crons_webhook_is_under_the_same_policy(http: httpx.AsyncClient) -> None:
    url = "http://127.0.0.1:9/hook"
    created = await http.post("/runs/crons", json={"assistant_id": "echo", "schedule": "0 0 * * *",
                                                   "webhook": url}, headers=ALICE)
    assert created.status_code == 422 and "webhook" in created.json()["detail"], created.text
    crons = (await http.post("/runs/crons/count", json={}, headers=ALICE)).json()
    thread = (await http.post("/threads", json={}, headers=ALICE)).json()["thread_id"]
    created = await http.post(f"/threads/{thread}/runs/crons", json={"assistant_id": "echo", "schedule": "0 0 * * *",
                                                                    "webhook": url}, headers=ALICE)
    assert created.status_code == 422 and "webhook" in created.json()["detail"], created.text
    assert (await http.post("/runs/crons/count", json={}, headers=ALICE)).json() == crons  # none made
    cron = (await http.post("/runs/crons", json={"assistant_id": "echo", "schedule": "0 0 * * *"},
                            headers=ALICE)).json()
    patched = await http.patch(f"/runs/crons/{cron['cron_id']}", json={"webhook": url}, headers=ALICE)
    assert patched.status_code == 422 and "webhook" in patched.json()["detail"], patched.text
    kept = (await http.get(f"/runs/crons/{cron['cron_id']}", headers=ALICE)).json()
    assert "webhook" not in kept["payload"]


async def test_the_webhook_policy_of_langgraph_json(tmp_path: Path) -> None:
    from threadline.config import WebhookPolicy
    from threadline.core.webhook_policy import WebhookGuard, WebhookRefused

    open_guard = WebhookGuard(WebhookPolicy(), authenticated=False)
    await open_guard.check("http://127.0.0.1:9/hook")  # no authentication: a local server may call itself
    strict = WebhookGuard(WebhookPolicy(require_https=True, allowed_domains=("*.corp.example",),
                                        allowed_ports=(443,), disable_loopback=True), authenticated=False)
    for bad in ("http://a.corp.example/x", "https://corp.example/x", "https://a.corp.example:8443/x", "/hooks/x",
                "ftp://a.corp.example/x"):
        with pytest.raises(WebhookRefused):
            await strict.check(bad)
    allowed = WebhookGuard(WebhookPolicy(allow_private_networks=True), authenticated=True)
    await allowed.check("http://10.0.0.8/hook")
    await WebhookGuard(WebhookPolicy(), authenticated=True).check("/hooks/relative")  # this server's own app


async def test_a_cors_preflight_needs_no_credentials_and_a_refusal_carries_cors(http: httpx.AsyncClient) -> None:
    preflight = await http.options("/threads", headers={"origin": "https://app.example",
                                                        "access-control-request-method": "POST",
                                                        "access-control-request-headers": "authorization"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] in ("*", "https://app.example")
    refused = await http.post("/threads", json={}, headers={"origin": "https://app.example"})
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == "*"  # the browser may read why


async def test_a_configured_cors_preflight_with_authentication(tmp_path: Path, own_backend: Backend) -> None:
    project = json.loads(AUTH_PROJECT.read_text())
    project["http"] = {"cors": {"allow_origins": ["https://app.example"], "allow_methods": ["GET", "POST"],
                                "allow_headers": ["authorization"], "allow_credentials": True}}
    for name in ("auth.py", "whoami.py"):
        (tmp_path / name).write_text((AUTH_PROJECT.parent / name).read_text())
    (tmp_path / "langgraph.json").write_text(json.dumps(project))
    application = create_app(Settings(config=str(tmp_path / "langgraph.json"), **own_backend.settings()))
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                     base_url="http://threadline") as client:
            ok = await client.options("/threads", headers={"origin": "https://app.example",
                                                           "access-control-request-method": "POST",
                                                           "access-control-request-headers": "authorization"})
            assert ok.status_code == 200 and ok.headers["access-control-allow-credentials"] == "true"
            assert ok.headers["access-control-allow-origin"] == "https://app.example"
            bad = await client.options("/threads", headers={"origin": "https://evil.example",
                                                            "access-control-request-method": "POST"})
            assert bad.status_code == 400
            answered = await client.post("/threads", json={}, headers={"origin": "https://app.example", **ALICE})
            assert answered.status_code == 200
            assert answered.headers["access-control-allow-origin"] == "https://app.example"


@pytest.mark.parametrize("custom_route_auth", [False, True])
async def test_the_projects_own_routes_need_credentials_only_when_asked(tmp_path: Path, own_backend: Backend,
                                                                       custom_route_auth: bool) -> None:
    project = json.loads(AUTH_PROJECT.read_text())
    project["http"] = {"app": "./webapp.py:app", "enable_custom_route_auth": custom_route_auth}
    for name in ("auth.py", "whoami.py"):
        (tmp_path / name).write_text((AUTH_PROJECT.parent / name).read_text())
    (tmp_path / "webapp.py").write_text(
        "from starlette.applications import Starlette\n"
        "from starlette.responses import JSONResponse\n"
        "from starlette.routing import Route\n"
        "from threadline.core.auth import current_user\n\n"
        "async def hello(request):\n"
        "    user = current_user()\n"
        "    return JSONResponse({'hello': user.identity if user else None})\n\n"
        "app = Starlette(routes=[Route('/custom/hello', hello)])\n")
    (tmp_path / "langgraph.json").write_text(json.dumps(project))
    application = create_app(Settings(config=str(tmp_path / "langgraph.json"), **own_backend.settings()))
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                     base_url="http://threadline") as client:
            anonymous = await client.get("/custom/hello")
            assert anonymous.status_code == (401 if custom_route_auth else 200)
            if custom_route_auth:
                assert (await client.get("/custom/hello", headers=ALICE)).json() == {"hello": "alice"}
            assert (await client.post("/threads", json={})).status_code == 401  # ours: always
            assert (await client.post("/threads", json={}, headers=ALICE)).status_code == 200


# --- a worker in another process ------------------------------------------------------------------------------


@pytest.mark.e2e  # a worker process
async def test_a_worker_in_another_process_runs_the_agent_as_the_caller(own_backend: Backend, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    backend = own_backend  # a database of its own: the shared app's workers must not take the run
    if backend.kind != "postgres" or backend.redis_url is None:
        pytest.skip("a second process needs PostgreSQL and Redis")
    # SIM115/ASYNC230/ASYNC220: a second process started once, before the test's requests; the log is closed
    # when it is stopped, and the loop has nothing else to run while it starts.
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115, ASYNC230
    worker = subprocess.Popen(  # noqa: ASYNC220
        [sys.executable, "-m", "threadline", "worker", "--config", str(AUTH_PROJECT),
         "--workers", "2"], env={**os.environ, **backend.env()}, stdout=log,
        stderr=subprocess.STDOUT, cwd=Path(__file__).parents[1])
    try:
        application = create_app(Settings(config=str(AUTH_PROJECT), workers=0, **backend.settings()))
        async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                         base_url="http://threadline", timeout=60) as client:
                thread = (await client.post("/threads", json={}, headers=ALICE)).json()
                run = (await client.post(f"/threads/{thread['thread_id']}/runs", headers=ALICE,
                                         json={"assistant_id": "whoami", "input": {}})).json()
                out = (await client.get(f"/threads/{thread['thread_id']}/runs/{run['run_id']}/join",
                                        headers=ALICE)).json()
                assert out["seen"] == _seen(EXPECTED_USER, "alice", ["threads:read", "runs:create"])
                assert worker.poll() is None
    finally:
        stop(worker, timeout=30)
        log.close()
    assert "Threadline" in (tmp_path / "worker.log").read_text()


@pytest.mark.slow
async def test_a_refused_websocket_on_the_wire(own_backend: Backend) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    async with serving(auth_settings(own_backend)) as url:
        events = url.replace("http", "ws") + f"/threads/{uuid.uuid4()}/stream/events"
        with pytest.raises(InvalidStatus) as refused:
            async with connect(events, additional_headers={"authorization": "Bearer nobody"}):
                pass
        assert refused.value.response.status_code == 401
        assert b"Missing or bad token" in refused.value.response.body
        async with connect(events, additional_headers=ALICE) as ws:
            await ws.send(json.dumps({"id": 1, "method": "subscription.subscribe", "params": {"channels": ["values"]}}))
            assert json.loads(await ws.recv())["id"] == 1


# --- authorization handlers: the dispatch (applied on every surface: tests/test_authz.py) -----------------------


async def test_the_most_specific_authorization_handler_wins_and_may_change_the_value() -> None:
    from langgraph_sdk import Auth

    from threadline.core.auth import Authorizer, as_user
    from threadline.errors import Unauthorized

    auth = Auth()
    calls: list[str] = []

    @auth.on
    async def everything(ctx: Any, value: Any) -> bool:
        calls.append("global")
        return False

    @auth.on.threads
    async def threads(ctx: Any, value: Any) -> Any:
        calls.append(f"threads:{ctx.action}")
        return {"owner": ctx.user.identity}

    @auth.on.threads.create
    async def create(ctx: Any, value: Any) -> None:
        calls.append("threads.create")
        value.setdefault("metadata", {})["owner"] = ctx.user.identity

    @auth.on(actions=["search"])
    async def searches(ctx: Any, value: Any) -> bool:
        calls.append(f"search:{ctx.resource}:{ctx.permissions}")
        return True

    @auth.on.assistants.delete
    async def teapot(ctx: Any, value: Any) -> None:
        raise Auth.exceptions.HTTPException(status_code=418, detail="no")

    @auth.on.crons.read
    async def wrong(ctx: Any, value: Any) -> Any:
        return {"owner": {"$ne": "x"}}

    @auth.on.crons.delete
    async def broken(ctx: Any, value: Any) -> Any:
        assert value["owner"] == "someone", "internal detail 42"

    authorizer = Authorizer(auth)
    user = as_user({"identity": "alice", "permissions": ["p"]})
    value: dict[str, Any] = {"metadata": {"x": 1}}
    assert await authorizer.authorize(user, "threads", "create", value) is None
    assert value == {"metadata": {"x": 1, "owner": "alice"}}
    assert await authorizer.authorize(user, "threads", "read", {}) == {"owner": "alice"}
    assert await authorizer.authorize(user, "threads", "search", {}) == {"owner": "alice"}  # resource beats action
    assert await authorizer.authorize(user, "assistants", "search", {}) is None
    for resource, action, status in (("assistants", "read", 403), ("assistants", "delete", 418),
                                     ("crons", "read", 403), ("crons", "delete", 403), ("store", "put", 403)):
        with pytest.raises(Unauthorized) as refused:
            await authorizer.authorize(user, resource, action, {})
        assert refused.value.status == status
        assert "internal detail" not in str(refused.value)
    assert calls[:4] == ["threads.create", "threads:read", "threads:search", "search:assistants:['p']"]
    assert await Authorizer(Auth()).authorize(user, "threads", "read", {}) is None  # no handlers: allowed


@pytest.mark.slow
async def test_deepagents_async_subagents_reach_an_authenticated_server(key_settings: Settings) -> None:
    """deepagents' async-subagent tools send the key in their `headers` (langgraph-sdk reserves `x-api-key`
    for `api_key=`, so a `headers` key goes as `Authorization: Bearer`)."""
    from tests.test_deepagents import ParentAgent, _finished

    async with serving(key_settings) as url:
        parent = ParentAgent(url, headers={"authorization": f"Bearer {KEY}"})
        stranger = ParentAgent(url, headers={"authorization": "Bearer sk-wrong-0123456789abcdef"})
        try:
            task_id = await parent.start("summarize the Agent Protocol")
            checked = await parent.check_until(task_id, _finished)
            assert checked["status"] == "success" and checked["result"].startswith("Done: summarize")
            said = await stranger.call("start_async_task", description="anything", subagent_type="researcher")
            assert said == "Failed to launch async subagent 'researcher': Invalid API key"
        finally:
            await parent.aclose()
            await stranger.aclose()


async def test_a_handler_that_reads_the_request_body_leaves_it_to_the_route(tmp_path: Path,
                                                                            own_backend: Backend) -> None:
    (tmp_path / "auth.py").write_text(
        "from langgraph_sdk import Auth\n\nauth = Auth()\n\n\n@auth.authenticate\nasync def who(request):\n"
        "    data = await request.json()\n"
        "    return data.get('metadata', {}).get('as') or 'anonymous'\n")
    (tmp_path / "whoami.py").write_text((AUTH_PROJECT.parent / "whoami.py").read_text())
    (tmp_path / "langgraph.json").write_text(json.dumps({"graphs": {"whoami": "./whoami.py:graph"},
                                                         "auth": {"path": "./auth.py:auth"}}))
    application = create_app(Settings(config=str(tmp_path / "langgraph.json"), **own_backend.settings()))
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                     base_url="http://threadline") as client:
            created = await client.post("/threads", json={"metadata": {"as": "carol", "x": 1}})
            assert created.status_code == 200 and created.json()["metadata"] == {"as": "carol", "x": 1}


REFUSING_HANDLERS = '''

@auth.on.threads.create
async def stamp(ctx, value):
    value["metadata"]["owner"] = ctx.user.identity


@auth.on.threads.delete
async def no_deletes(ctx, value):
    return False


@auth.on.threads.update
async def teapot(ctx, value):
    raise Auth.exceptions.HTTPException(status_code=418, detail="short and stout", headers={"x-why": "tea"})


@auth.on.assistants.create
async def broken(ctx, value):
    raise RuntimeError("secret internals xyz")


@auth.on.crons.create
async def asserted(ctx, value):
    assert value["schedule"] != "* * * * *", "Not every minute, please"


@auth.on.assistants.read
async def own_assistants(ctx, value):
    return {"owner": ctx.user.identity}
'''


async def test_authorization_handlers_answer_over_http(tmp_path: Path, own_backend: Backend) -> None:
    """What each kind of `@auth.on` answer does to a request: a stamp lands, False is 403, an HTTPException
    keeps its status, detail and headers, a failed assert is 403 with its message, any other exception is a
    403 that says nothing of the handler; a graph's own assistant stays runnable by anyone."""
    (tmp_path / "auth.py").write_text((AUTH_PROJECT.parent / "auth.py").read_text() + REFUSING_HANDLERS)
    (tmp_path / "whoami.py").write_text((AUTH_PROJECT.parent / "whoami.py").read_text())
    (tmp_path / "langgraph.json").write_text(json.dumps({"graphs": {"whoami": "./whoami.py:graph"},
                                                         "auth": {"path": "./auth.py:auth"}}))
    application = create_app(Settings(config=str(tmp_path / "langgraph.json"), workers=1, **own_backend.settings()))
    bob = {"authorization": "Bearer user-bob"}
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                     base_url="http://threadline") as client:
            thread = (await client.post("/threads", json={"metadata": {"x": 1}}, headers=ALICE)).json()
            assert thread["metadata"] == {"x": 1, "owner": "alice"}
            tid = thread["thread_id"]
            refused = await client.delete(f"/threads/{tid}", headers=ALICE)
            assert (refused.status_code, refused.json()["detail"]) == (403, "Forbidden")
            assert (await client.get(f"/threads/{tid}", headers=ALICE)).status_code == 200  # still there
            tea = await client.patch(f"/threads/{tid}", json={"metadata": {"y": 2}}, headers=ALICE)
            assert (tea.status_code, tea.json()["detail"], tea.headers["x-why"]) == (418, "short and stout", "tea")
            crash = await client.post("/assistants", json={"graph_id": "whoami"}, headers=ALICE)
            assert crash.status_code == 403 and "secret" not in crash.text and "RuntimeError" not in crash.text
            every_minute = await client.post(f"/threads/{tid}/runs/crons", headers=ALICE,
                                             json={"assistant_id": "whoami", "schedule": "* * * * *"})
            assert (every_minute.status_code, every_minute.json()["detail"]) == (403, "Not every minute, please")
            # A graph's own assistant is everyone's to run; no handler stops bob running it on his thread.
            mine = (await client.post("/threads", json={}, headers=bob)).json()["thread_id"]
            ran = await client.post(f"/threads/{mine}/runs/wait", json={"assistant_id": "whoami", "input": {}},
                                    headers=bob)
            assert ran.status_code == 200 and ran.json()["seen"]["user_id"] == "bob"


RECORDING_HANDLER = '''

import json as _json
from pathlib import Path as _Path


@auth.on
async def record(ctx, value):
    with open(_Path(__file__).with_name("seen.jsonl"), "a") as seen:
        seen.write(_json.dumps([ctx.resource, ctx.action, sorted(value)]) + "\\n")
'''


async def test_handlers_are_given_the_values_langgraph_gives(tmp_path: Path, own_backend: Backend) -> None:
    """A handler written against LangGraph's server reads the same keys of `value` here (probed on langgraph-api
    0.16.7): a run's creation, a cancel, a cron's creation."""
    (tmp_path / "auth.py").write_text((AUTH_PROJECT.parent / "auth.py").read_text() + RECORDING_HANDLER)
    (tmp_path / "whoami.py").write_text((AUTH_PROJECT.parent / "whoami.py").read_text())
    (tmp_path / "langgraph.json").write_text(json.dumps({"graphs": {"whoami": "./whoami.py:graph"},
                                                         "auth": {"path": "./auth.py:auth"}}))
    application = create_app(Settings(config=str(tmp_path / "langgraph.json"), workers=1, **own_backend.settings()))
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                     base_url="http://threadline") as client:
            tid = (await client.post("/threads", json={}, headers=ALICE)).json()["thread_id"]
            (tmp_path / "seen.jsonl").write_text("")
            run = (await client.post(f"/threads/{tid}/runs", headers=ALICE, json={
                "assistant_id": "whoami", "input": {}, "after_seconds": 3600})).json()
            assert (await client.post(f"/threads/{tid}/runs/{run['run_id']}/cancel", headers=ALICE)).status_code == 202
            cron = await client.post("/runs/crons", json={"assistant_id": "whoami", "schedule": "0 0 1 1 *"},
                                     headers=ALICE)
            assert cron.status_code == 200
    seen = [tuple(json.loads(line)[:2]) + (set(json.loads(line)[2]),)
            for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    asked = {(resource, action): keys for resource, action, keys in seen}
    assert asked[("threads", "create_run")] >= {
        "thread_id", "assistant_id", "run_id", "status", "metadata", "prevent_insert_if_inflight",
        "multitask_strategy", "if_not_exists", "after_seconds", "kwargs"}
    assert asked[("threads", "update")] >= {"thread_id", "action", "metadata"}
    assert asked[("crons", "create")] >= {"payload", "schedule", "cron_id", "thread_id", "user_id", "end_time",
                                          "metadata"}


async def test_a_store_handler_rewrites_or_refuses_but_never_filters() -> None:
    """The store has no metadata to filter on: a namespace rewrite is used, a filter is refused (LangGraph's
    server applies one to searches only, leaving gets and deletes open), and so is a namespace left invalid."""
    from langgraph_sdk import Auth

    from threadline.core.access import Access
    from threadline.core.auth import as_user, reset_current_user, set_current_user
    from threadline.errors import Unauthorized

    auth = Auth()

    @auth.on.store.put
    async def prefix(ctx: Any, value: Any) -> None:
        value["namespace"] = (ctx.user.identity, *value["namespace"])

    @auth.on.store.search
    async def filtering(ctx: Any, value: Any) -> Any:
        return {"owner": ctx.user.identity}

    @auth.on.store.delete
    async def emptying(ctx: Any, value: Any) -> None:
        value["namespace"] = ("", "x")

    access = Access.of(auth)
    token = set_current_user(as_user("alice"))
    try:
        assert await access.store("put", {"namespace": ("docs",), "key": "k"}) == ("alice", "docs")
        assert await access.store("get", {"namespace": ("docs",), "key": "k"}) == ("docs",)  # no handler: as given
        for action in ("search", "delete"):
            with pytest.raises(Unauthorized) as refused:
                await access.store(action, {"namespace": ("docs",)})
            assert refused.value.status == 403
    finally:
        reset_current_user(token)
    assert await access.store("search", {"namespace": ("docs",)}) == ("docs",)  # no caller: the server's own
