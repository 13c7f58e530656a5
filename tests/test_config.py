"""`threadline/config.py`: langgraph.json parsed by the models mirroring LangGraph's CLI schema, the
environment variables LangGraph's server reads its configuration from, and the keys read since issue 26
(`webhooks.headers`, `webhooks.env_prefix`, `auth.cache`, `checkpointer.serde`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from tests.conftest import serving_asgi
from tests.services import Backend
from threadline.config import EXAMPLE_CONFIG, ProjectConfig, find_config, load_config
from threadline.errors import ConfigError, Unauthorized
from threadline.settings import Settings

GRAPHS = {"agent": "tests.project.http.agent:graph"}


def load(tmp_path: Path, config: dict[str, Any], environ: dict[str, str] | None = None) -> ProjectConfig:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": GRAPHS, **config}))
    return load_config(path, environ={} if environ is None else environ)


# --- the schema ------------------------------------------------------------------------------------------


def test_every_unknown_key_is_reported_by_its_path_and_build_keys_are_ignored(tmp_path: Path) -> None:
    cfg = load(tmp_path, {
        "python_version": "3.12", "dockerfile_lines": ["RUN true"], "image_distro": "wolfi", "pip_config_file": "p",
        "future_key": 1, "store": {"index": None, "shards": 2}, "checkpointer": {"ttl": {"later": True}},
        "http": {"cors": {"allow_private_network": True}, "streaming": {}},
        "webhooks": {"url": {"ipv6_only": True}, "allowed_fields": ["run_id"]},  # allowed_fields is known
        "auth": {"path": "./auth.py:auth", "cache": {"cache_keys": ["x-user"], "shards": 1}},
        "threadline": {"default_agent": "agent", "colour": "blue"},
    })
    assert cfg.unsupported == ["auth.cache.shards", "checkpointer.ttl.later", "future_key",
                               "http.cors.allow_private_network", "http.streaming", "store.shards", "threadline.colour",
                               "webhooks.url.ipv6_only"]
    assert cfg.ignored == ["dockerfile_lines", "image_distro", "pip_config_file", "python_version"]


def test_keys_parsed_for_other_layers_are_still_reported_until_they_act(tmp_path: Path) -> None:
    """`checkpointer.path`, `encryption`, `ui` and `ui_config` are typed settings the layers below use: not
    reported as having no effect."""
    cfg = load(tmp_path, {"checkpointer": {"path": "./saver.py:make_saver"}, "encryption": {"path": "./enc.py:enc"},
                          "ui": {"agent": "./ui.tsx"}, "ui_config": {"shared": ["react"]}})
    assert cfg.checkpointer_path == "./saver.py:make_saver"
    assert cfg.encryption is not None and cfg.encryption.path == "./enc.py:enc"
    assert cfg.ui == {"agent": "./ui.tsx"} and cfg.ui_config == {"shared": ["react"]}
    assert cfg.unsupported == []
    assert load(tmp_path, {}).unsupported == [] and load(tmp_path, {}).encryption is None


def test_null_means_absent(tmp_path: Path) -> None:
    cfg = load(tmp_path, {"store": None, "checkpointer": {"ttl": None}, "auth": None, "webhooks": {"url": None},
                          "http": {"cors": None, "mount_prefix": None, "configurable_headers": {"includes": None}}})
    assert cfg.store_index is None and cfg.checkpointer_ttl is None and cfg.auth is None
    assert cfg.http.cors is None and cfg.http.mount_prefix == "" and cfg.webhooks.url.require_https is False
    assert cfg.http.configurable_headers is not None and cfg.http.configurable_headers.includes == ()
    assert cfg.unsupported == []


@pytest.mark.parametrize("config, message", [
    ({"graphs": {}}, "'graphs' must map graph ids to 'path.py:attr' or 'module:attr'"),
    ({"graphs": {"a": {"path": "nocolon"}}}, "graph 'a' must be 'path.py:attr' or 'module:attr', got 'nocolon'"),
    ({"env": 3}, "'env' must be a path to a .env file or a mapping, got 3"),
    ({"http": []}, "'http' must be an object, got []"),
    ({"http": {"cors": {"max_age": "long"}}}, "http.cors.max_age must be an integer, got 'long'"),
    ({"http": {"configurable_headers": {"inclde": ["x"]}}}, "'inclde', not a known key; use 'includes'"),
    ({"auth": {"openapi": {"security": []}}}, "auth.path is required"),
    ({"auth": {"path": "./a.py:auth", "cache": {"ttl_seconds": 0}}}, "auth.cache.ttl_seconds must be a positive"),
    ({"auth": {"path": "./a.py:auth", "cache": {"cache_keys": "x-user"}}}, "cache_keys must be a list of str"),
    ({"webhooks": {"url": {"allowed_ports": ["443"]}}}, "webhooks.url.allowed_ports must be a list of ints"),
    ({"webhooks": {"env_prefix": None}}, "webhooks.env_prefix must be a string, got None"),
    ({"webhooks": {"allowed_fields": ["run_id", "secret"]}}, "allowed_fields must be null or a list of run_id"),
    ({"webhooks": {"headers": {"x-n": 1}}}, "webhooks.headers must be an object of header names to strings"),
    ({"checkpointer": {"serde": {"pickle_fallback": "no"}}}, "serde.pickle_fallback must be true or false"),
    ({"checkpointer": {"serde": {"allowed_json_modules": ["my_agent"]}}}, "checkpointer.serde.allowed_json_modules"),
    ({"checkpointer": {"path": "saver"}}, "checkpointer.path must be 'path.py:attr' or 'module:attr'"),
    ({"threadline": {"default_agent": "zzz"}}, "threadline.default_agent 'zzz' is not one of the graphs ['agent']"),
])
def test_a_wrong_value_names_its_key(tmp_path: Path, config: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, config)
    assert message in str(err.value) and str(err.value).startswith(str(tmp_path / "langgraph.json"))


def test_a_file_that_is_not_an_object_or_not_json(tmp_path: Path) -> None:
    path = tmp_path / "langgraph.json"
    for text, message in (("[1]", "'graphs' must map"), ("{", "cannot read"), ('{"graphs": {"a": 1}}', "graph 'a'")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_config(path, environ={})


# --- the environment LangGraph's server reads ------------------------------------------------------------


def test_an_image_built_by_langgraph_build_is_served_from_its_environment(tmp_path: Path) -> None:
    """No langgraph.json, `LANGSERVE_GRAPHS` and the other sections in the environment (as `langgraph build`
    writes them into the image): they are the configuration, relative paths read from the working folder."""
    environ = {
        "LANGSERVE_GRAPHS": json.dumps({"agent": {"path": "./agent.py:graph", "description": "d"}}),
        "LANGGRAPH_HTTP": json.dumps({"disable_store": True, "mount_prefix": "/api"}),
        "LANGGRAPH_AUTH": json.dumps({"path": "./auth.py:auth", "cache": {"cache_keys": ["x-user"]}}),
        "LANGGRAPH_STORE": json.dumps({"ttl": {"default_ttl": 10}}),
        "LANGGRAPH_CHECKPOINTER": json.dumps({"serde": {"pickle_fallback": False}}),
        "LANGGRAPH_WEBHOOKS": json.dumps({"url": {"require_https": True}}),
        "LANGGRAPH_ENCRYPTION": json.dumps({"path": "./enc.py:encryption"}),
        "LANGGRAPH_UI": json.dumps({"agent": "./ui.tsx"}),
    }
    assert find_config(None, cwd=tmp_path, environ={}) == EXAMPLE_CONFIG
    path = find_config(None, cwd=tmp_path, environ=environ)
    assert path == (tmp_path / "langgraph.json").resolve() and not path.exists()
    # `threadline dev` hands its child the path it found: it stays valid while the environment holds the graphs.
    assert find_config(str(path), environ=environ) == path
    with pytest.raises(ConfigError, match="config file not found"):
        find_config(str(path), environ={})
    cfg = load_config(path, environ=environ)
    assert cfg.graphs == {"agent": "./agent.py:graph"} and cfg.root == tmp_path.resolve()
    assert cfg.http.disabled == {"store"} and cfg.http.mount_prefix == "/api"
    assert cfg.auth is not None and cfg.auth.cache is not None and cfg.auth.cache.cache_keys == ("x-user",)
    assert cfg.store_ttl == {"default_ttl": 10} and cfg.serde is not None and cfg.serde.pickle_fallback is False
    assert cfg.webhooks.url.require_https is True
    assert cfg.encryption is not None and cfg.ui == {"agent": "./ui.tsx"}


async def test_a_server_starts_from_the_environment_alone(tmp_path: Path, backend: Backend,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from threadline.api.app import create_app

    monkeypatch.chdir(tmp_path)  # no langgraph.json here
    monkeypatch.setenv("LANGSERVE_GRAPHS", json.dumps(GRAPHS))
    monkeypatch.setenv("LANGGRAPH_HTTP", json.dumps({"disable_store": True}))
    app = create_app(Settings(workers=0, **backend.settings()))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as client:
            assert [a["graph_id"] for a in (await client.post("/assistants/search", json={})).json()] == ["agent"]
            assert (await client.post("/store/items/search", json={})).status_code == 404


def test_the_environment_wins_over_the_file_section_by_section(tmp_path: Path) -> None:
    cfg = load(tmp_path, {"http": {"disable_runs": True}, "store": {"ttl": {"default_ttl": 5}}},
               environ={"LANGGRAPH_HTTP": json.dumps({"disable_meta": True}), "LANGGRAPH_THREAD_TTL": "60",
                        "MOUNT_PREFIX": "/lg"})
    assert cfg.http.disabled == {"meta"} and cfg.http.mount_prefix == "/lg"  # the whole section replaced
    assert cfg.store_ttl == {"default_ttl": 5}  # not in the environment: the file's
    assert cfg.checkpointer_ttl is not None and cfg.checkpointer_ttl.default_ttl == 60.0
    as_object = load(tmp_path, {"checkpointer": {"ttl": {"default_ttl": 1}}},
                     environ={"LANGGRAPH_THREAD_TTL": '{"default_ttl": 30, "sweep_limit": 7}'})
    assert as_object.checkpointer_ttl is not None
    assert (as_object.checkpointer_ttl.default_ttl, as_object.checkpointer_ttl.sweep_limit) == (30.0, 7)


def test_a_section_in_the_environment_that_is_not_json_stops_startup(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="LANGGRAPH_HTTP must hold JSON"):
        load(tmp_path, {}, environ={"LANGGRAPH_HTTP": "{disable_store: true}"})
    with pytest.raises(ConfigError, match="http.disable_store must be true or false"):
        load(tmp_path, {}, environ={"LANGGRAPH_HTTP": '{"disable_store": "yes"}'})
    with pytest.raises(ConfigError, match="LANGGRAPH_THREAD_TTL"):
        load(tmp_path, {}, environ={"LANGGRAPH_THREAD_TTL": "an hour"})


# --- webhooks.headers, webhooks.env_prefix ---------------------------------------------------------------


def test_webhook_headers_take_values_from_the_environment(tmp_path: Path) -> None:
    headers = {"authorization": "Bearer ${{ env.LG_WEBHOOK_TOKEN }}",
               "x-pair": "${{env.LG_WEBHOOK_A}}-${{ env.LG_WEBHOOK_B }}", "x-static": "plain"}
    cfg = load(tmp_path, {"webhooks": {"headers": headers}},
               environ={"LG_WEBHOOK_TOKEN": "t0k", "LG_WEBHOOK_A": "a", "LG_WEBHOOK_B": "b"})
    assert cfg.webhooks.headers == {"authorization": "Bearer t0k", "x-pair": "a-b", "x-static": "plain"}
    # The project's own `env` counts, as it is the container's environment on LangGraph's platform.
    from_env = load(tmp_path, {"env": {"LG_WEBHOOK_TOKEN": "from-file"},
                               "webhooks": {"headers": {"x-t": "${{ env.LG_WEBHOOK_TOKEN }}"}}})
    assert from_env.webhooks.headers == {"x-t": "from-file"}


@pytest.mark.parametrize("webhooks, environ, message", [
    ({"headers": {"x": "${{ env.SECRET_KEY }}"}}, {"SECRET_KEY": "s"},
     "SECRET_KEY does not start with webhooks.env_prefix 'LG_WEBHOOK_'"),
    ({"headers": {"x": "${{ env.LG_WEBHOOK_GONE }}"}}, {}, "LG_WEBHOOK_GONE is not set"),
    ({"headers": {"x": "${{ secrets.LG_WEBHOOK_X }}"}}, {"LG_WEBHOOK_X": "x"}, "is not an environment reference"),
    ({"headers": {"x": "${{ env.LG_WEBHOOK_A.B }}"}}, {"LG_WEBHOOK_A.B": "x"}, "is not an environment reference"),
    ({"env_prefix": "HOOK_", "headers": {"x": "${{ env.LG_WEBHOOK_X }}"}}, {"LG_WEBHOOK_X": "x"},
     "does not start with webhooks.env_prefix 'HOOK_'"),
])
def test_webhook_headers_may_only_read_variables_under_the_prefix(tmp_path: Path, webhooks: dict[str, Any],
                                                                  environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, {"webhooks": webhooks}, environ=environ)


def test_env_prefix_chooses_the_variables_and_empty_allows_any(tmp_path: Path) -> None:
    own = load(tmp_path, {"webhooks": {"env_prefix": "HOOK_", "headers": {"x": "${{ env.HOOK_X }}"}}},
               environ={"HOOK_X": "1"})
    assert own.webhooks.headers == {"x": "1"} and own.webhooks.env_prefix == "HOOK_"
    anything = load(tmp_path, {"webhooks": {"env_prefix": "", "headers": {"x": "${{ env.HOME_X }}"}}},
                    environ={"HOME_X": "2"})
    assert anything.webhooks.headers == {"x": "2"}


async def test_webhook_headers_go_with_every_webhook(tmp_path: Path, backend: Backend,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative (the project's own app) and absolute webhooks both carry the configured headers."""
    from langgraph_sdk.client import LangGraphClient
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from tests.test_http_config import wait_received
    from threadline.api.app import create_app

    monkeypatch.setenv("LG_WEBHOOK_TOKEN", "s3cret")
    outside: asyncio.Queue[dict[str, str]] = asyncio.Queue()

    async def hook(request: Request) -> Response:
        outside.put_nowait(dict(request.headers))
        return Response(status_code=204)

    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": GRAPHS, "http": {"app": "tests.project.http.webapp:app"},
                                "webhooks": {"headers": {"x-token": "${{ env.LG_WEBHOOK_TOKEN }}", "x-from": "tl"}}}))
    app = create_app(Settings(config=str(path), workers=2, **backend.settings()))
    async with serving_asgi(Starlette(routes=[Route("/hook", hook, methods=["POST"])])) as receiver, \
            LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as client:
            sdk = LangGraphClient(client)
            local = await sdk.runs.create(None, "agent", input={}, webhook="/custom/webhook")
            await sdk.runs.create(None, "agent", input={}, webhook=f"{receiver}/hook")
            sent = await asyncio.wait_for(outside.get(), timeout=30)
            [delivered] = await wait_received(local["run_id"])
    assert (sent["x-token"], sent["x-from"], sent["content-type"]) == ("s3cret", "tl", "application/json")
    assert (delivered["headers"]["x-token"], delivered["headers"]["x-from"]) == ("s3cret", "tl")


async def test_allowed_fields_keep_only_those_keys_of_the_webhook_payload(tmp_path: Path) -> None:
    from threadline.core.webhooks import Webhooks

    cfg = load(tmp_path, {"webhooks": {"allowed_fields": ["run_id", "status"], "headers": {"x-a": "1"}}})
    assert cfg.webhooks.allowed_fields == ("run_id", "status")
    sent: list[tuple[str, bytes, dict[str, str]]] = []

    async def local(path: str, body: bytes, headers: dict[str, str]) -> int:
        sent.append((path, body, headers))
        return 200

    for fields, expected in ((cfg.webhooks.allowed_fields, {"run_id": "r", "status": "success"}),
                             (None, {"run_id": "r", "status": "success", "values": {"x": 1}, "kwargs": {}})):
        webhooks = Webhooks(headers=cfg.webhooks.headers, fields=fields)
        webhooks.local = local
        webhooks.send("/hook", {"run_id": "r", "status": "success", "values": {"x": 1}, "kwargs": {}})
        await webhooks.close()
        path, body, headers = sent.pop()
        assert (path, json.loads(body), headers) == ("/hook", expected, {"x-a": "1"})


# --- auth.cache ------------------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_auth_cache_keeps_answers_for_their_ttl_and_its_size() -> None:
    from threadline.core.auth_cache import AuthCache

    clock = Clock()
    cache = AuthCache(["X-User", "x-org"], ttl=60, max_size=2, clock=clock)
    assert cache.key({b"authorization": b"Bearer t"}) is None  # none of the headers: never cached
    alice = cache.key({b"x-user": b"alice", b"x-other": b"1"})
    assert alice == ((b"x-user", b"alice"),)
    assert cache.key({b"x-user": b"alice", b"x-org": b"o"}) != alice
    assert alice is not None and cache.get(alice) is None
    cache.put(alice, "ALICE")
    clock.now = 59.9
    assert cache.get(alice) == "ALICE"
    clock.now = 60.0
    assert cache.get(alice) is None  # expired
    cache.put(alice, "ALICE")
    cache.put(((b"x-user", b"bob"),), "BOB")
    assert cache.get(alice) == "ALICE"  # alice is now the most recently used
    cache.put(((b"x-user", b"carol"),), "CAROL")
    assert cache.get(((b"x-user", b"bob"),)) is None and cache.get(alice) == "ALICE"


async def test_auth_cache_answers_repeat_callers_without_the_handler(tmp_path: Path) -> None:
    from threadline.api.auth import load_authenticator

    (tmp_path / "auth.py").write_text(
        "from langgraph_sdk import Auth\n"
        "auth = Auth()\n"
        "CALLS = []\n"
        "@auth.authenticate\n"
        "async def who(authorization: str | None):\n"
        "    CALLS.append(authorization)\n"
        "    if authorization != 'Bearer good':\n"
        "        raise Auth.exceptions.HTTPException(status_code=401, detail='no')\n"
        "    return {'identity': 'alice'}\n")
    cfg = load(tmp_path, {"auth": {"path": "./auth.py:auth", "cache": {"cache_keys": ["Authorization"],
                                                                       "ttl_seconds": 600, "max_size": 10}}})
    authenticator = load_authenticator(cfg, Settings())
    assert authenticator is not None and "headers" in authenticator.wants
    good = {"headers": {b"authorization": b"Bearer good"}, "authorization": "Bearer good"}
    bad = {"headers": {b"authorization": b"Bearer bad"}, "authorization": "Bearer bad"}
    first, second = await authenticator.authenticate(good), await authenticator.authenticate(good)
    assert first.identity == second.identity == "alice"
    for _ in range(2):  # a refusal is never kept
        with pytest.raises(Unauthorized):
            await authenticator.authenticate(bad)
    calls = authenticator.auth._authenticate_handler.__globals__["CALLS"]  # type: ignore[attr-defined]
    assert calls == ["Bearer good", "Bearer bad", "Bearer bad"]
    # Without `auth.cache`, every request asks the handler.
    plain = load_authenticator(load(tmp_path, {"auth": {"path": "./auth.py:auth"}}), Settings())
    assert plain is not None and "headers" not in plain.wants


# --- checkpointer.serde ----------------------------------------------------------------------------------


class Opaque:
    """A value msgpack cannot encode (a plain class): only the pickle fallback stores it."""

    def __init__(self, n: int) -> None:
        self.n = n


async def test_serde_settings_reach_langgraphs_serializer(tmp_path: Path, backend: Backend) -> None:
    from threadline.core.runtime import Runtime

    path = tmp_path / "langgraph.json"

    async def serializer(serde: dict[str, Any] | None) -> Any:
        section = {} if serde is None else {"checkpointer": {"serde": serde}}
        path.write_text(json.dumps({"graphs": GRAPHS, **section}))
        runtime = await Runtime.open(Settings(config=str(path), workers=0, **backend.settings()))
        try:
            return runtime.storage.checkpointer.serde
        finally:
            await runtime.close()

    pickling = await serializer({"pickle_fallback": True, "allowed_json_modules": [["tests", "test_config", "Opaque"]],
                                 "allowed_msgpack_modules": None})
    kind, blob = pickling.dumps_typed(Opaque(7))
    assert kind == "pickle" and pickling.loads_typed((kind, blob)).n == 7
    assert pickling._allowed_json_modules == {("tests", "test_config", "Opaque")}
    assert pickling._allowed_msgpack_modules is None  # null: only LangGraph's safe types
    strict = await serializer({"pickle_fallback": False})
    with pytest.raises(Exception, match="not serializable|Type is not"):
        strict.dumps_typed(Opaque(7))
    with pytest.raises(NotImplementedError):
        strict.loads_typed((kind, blob))  # a pickled value is not read back
    assert (await serializer({})).pickle_fallback is True  # serde given: LangGraph's server's default, on
    assert (await serializer(None)).pickle_fallback is False  # no serde: LangGraph's library default
