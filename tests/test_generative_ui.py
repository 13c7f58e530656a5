"""Generative UI end to end, on every backend: a project whose langgraph.json has `ui` (tests/frontend/project) is
bundled at startup by LangGraph's bundler, the bundle is served where LangGraph's server serves it, and a graph's
`push_ui_message` reaches the stream as LangGraph's server streams it (the `custom` channel, and the `ui` key of
the values). Bundling needs the front-end build (tests/environments.py); the startup checks do not."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient

from tests.environments import frontend_build, frontend_missing, in_ci
from tests.processes import clean_env, serving, threadline_cmd
from tests.sdk_shapes import one_state
from tests.services import Backend
from tests.waits import until_sync
from threadline.config import load_config
from threadline.errors import ConfigError
from threadline.settings import Settings

PROJECT = Path(__file__).parent / "frontend" / "project" / "langgraph.json"
BUNDLER = frontend_build() / "node_modules" / ".bin" / "langgraphjs-ui"
WHY = frontend_missing()


@pytest.fixture
def settings(backend: Backend) -> Settings:
    if WHY is not None:  # under CI=true the build must be there: fail, saying why
        if in_ci():
            pytest.fail(WHY)
        pytest.skip(WHY)
    return Settings(config=str(PROJECT), workers=2, ui_bundler=str(BUNDLER), trusted_proxies="127.0.0.1",
                    **backend.settings())


@pytest.mark.slow  # the app bundles at startup: LangGraph's bundler is a node process
async def test_the_bundle_is_served_where_langgraph_serves_it(http: httpx.AsyncClient) -> None:
    tags = await http.post("/ui/agent", json={"name": "weather"})
    assert tags.status_code == 200, tags.text
    assert tags.headers["content-type"].startswith("text/html")
    # What the SDK's LoadExternalComponent does with it: replace the placeholder, then add the tags to a shadow root.
    # As LangGraph.js's server writes it (its API suite expects this): this server's absolute URL, whatever the
    # page's origin (a front-end is usually served from another one), and the component's name as JSON.
    assert tags.text == ('<script src="http://threadline/ui/agent/entrypoint.js" '
                         """onload='__LGUI_agent.render("weather", "{{shadowRootId}}")'></script>""")
    bundle = await http.get("http://threadline/ui/agent/entrypoint.js")  # no credentials: a <script src> sends none
    assert bundle.status_code == 200
    assert bundle.headers["content-type"].split(";")[0] in ("text/javascript", "application/javascript")
    assert "var __LGUI_agent =" in bundle.text and "Weather card: " in bundle.text
    assert (await http.head("http://threadline/ui/agent/entrypoint.js")).status_code == 200
    # Behind a proxy that terminated TLS (a trusted one: the test client's address is in `trusted_proxies`).
    proxied = await http.post("/ui/agent", json={"name": "weather"}, headers={"x-forwarded-proto": "https"})
    assert '<script src="https://threadline/ui/agent/entrypoint.js"' in proxied.text
    quoted = await http.post("/ui/agent", json={"name": "it's <b>"})  # a name that could break out: escaped
    assert """render("it&#x27;s &lt;b&gt;", """ in quoted.text
    # React is the page's, not the bundle's: the bundler leaves it out and reads the page's through this symbol.
    assert 'Symbol.for("LGUI_REQUIRE")' in bundle.text and "react-dom.production" not in bundle.text


@pytest.mark.slow  # the app bundles at startup: LangGraph's bundler is a node process
async def test_what_is_not_in_the_bundle_is_a_json_404_and_bad_input_a_422(http: httpx.AsyncClient) -> None:
    for response in (await http.post("/ui/nothing", json={"name": "weather"}),
                     await http.get("/ui/nothing/entrypoint.js"), await http.get("/ui/agent/schemas.json"),
                     await http.get("/ui/agent/..%2Fschemas.json")):
        assert response.status_code == 404 and "detail" in response.json(), response.text
    body: object
    for body in ({}, {"name": 3}, [], "weather"):
        refused = await http.post("/ui/agent", json=body)
        assert refused.status_code == 422 and "name" in refused.json()["detail"], refused.text
    garbled = await http.post("/ui/agent", content=b"{", headers={"content-type": "application/json"})
    assert garbled.status_code == 422 and "JSON" in garbled.json()["detail"]


@pytest.mark.slow  # the app bundles at startup: LangGraph's bundler is a node process
async def test_push_ui_message_streams_in_custom_and_in_the_values(sdk: LangGraphClient) -> None:
    thread = await sdk.threads.create()
    asked: dict[str, Any] = {"messages": [{"role": "human", "content": "weather in Paris"}]}
    parts = [part async for part in sdk.runs.stream(
        thread["thread_id"], "agent", input=asked,
        stream_mode=["values", "custom"])]
    custom = [p.data for p in parts if p.event == "custom"]
    assert len(custom) == 1, [p.event for p in parts]
    card: dict[str, Any] = custom[0]
    assert card["type"] == "ui" and card["name"] == "weather"
    assert card["props"] == {"city": "Paris", "forecast": "sunny", "celsius": 21}
    final = [p.data for p in parts if p.event == "values"][-1]
    answer = final["messages"][-1]
    assert answer["content"] == "It is sunny in Paris, 21 degrees."
    assert card["metadata"]["message_id"] == answer["id"]  # how a front-end places the card beside its message
    assert final["ui"] == [card]  # `values.ui`, which useStream shows after the run and on reload
    state = await sdk.threads.get_state(thread["thread_id"])
    assert one_state(state["values"])["ui"] == [card]


@pytest.mark.slow  # `threadline dev` and LangGraph's bundler in watch mode: node processes
def test_dev_rebundles_a_changed_component_without_a_restart(tmp_path: Path) -> None:
    """As `langgraph dev` (which runs the bundler's `watch` beside the server): a change to ui.tsx is served
    by the same server process, and a change that does not compile keeps the last good bundle."""
    if WHY is not None:
        pytest.fail(WHY) if in_ci() else pytest.skip(WHY)
    folder = tmp_path / "project"
    shutil.copytree(PROJECT.parent, folder, ignore=shutil.ignore_patterns("__pycache__"))
    source = folder / "ui.tsx"

    def served() -> str:
        return httpx.get(f"{url}/ui/agent/entrypoint.js", timeout=10).text

    with serving(folder, "--config", str(folder / "langgraph.json"), "--ui-bundler", str(BUNDLER),
                 "--database-url", f"sqlite:///{tmp_path / 'db'}", command="dev") as (url, _):
        assert "Weather card: " in served()
        source.write_text(source.read_text().replace("Weather card: ", "Forecast card: "))
        until_sync(lambda: "Forecast card: " in served(), timeout=60, what="the changed component to be served")
        source.write_text(source.read_text() + "\nconst broken = (<div>;\n")  # a typo: the last bundle stays
        until_sync(lambda: "ui bundler: " in (folder / "server.log").read_text(), timeout=60,
                   what="the bundler's error in the server's log")
        assert "Forecast card: " in served()
    log = (folder / "server.log").read_text()
    assert log.count("bundling the generative UI of agent") == 1, log  # rebundled by the watcher, not a restart
    assert "[ERROR]" in log, log  # esbuild's message, relayed to the log


# --- startup, with no front-end build needed ------------------------------------------------------------------


def test_the_config_takes_ui_and_ui_config(tmp_path: Path) -> None:
    path = tmp_path / "langgraph.json"
    path.write_text(json.dumps({"graphs": {"a": "./a.py:g"}, "ui": {"a": "./ui.tsx"}, "ui_config": {"shared": ["x"]}}))
    project = load_config(path)
    assert project.ui == {"a": "./ui.tsx"} and project.ui_config == {"shared": ["x"]}
    assert "ui" not in project.unsupported and "ui_config" not in project.unsupported
    wrong: Mapping[str, object]
    for wrong in ({"ui": ["./ui.tsx"]}, {"ui": {"a": 1}}, {"ui_config": {"shared": "x"}}, {"ui_config": []}):
        path.write_text(json.dumps({"graphs": {"a": "./a.py:g"}, **wrong}))
        with pytest.raises(ConfigError, match="ui"):
            load_config(path)


@pytest.mark.slow
def test_a_bundler_that_fails_stops_startup_with_its_message(tmp_path: Path) -> None:
    failing = tmp_path / "bundler"
    failing.write_text("#!/bin/sh\necho 'ui.tsx: Expected \">\" but found \"}\"' >&2\nexit 3\n")
    failing.chmod(0o755)
    done = subprocess.run(threadline_cmd("serve", "--port", "0", "--config", str(PROJECT), "--ui-bundler", str(failing),
                                         "--database-url", f"sqlite:///{tmp_path / 'db'}"),
                          cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=90)
    assert done.returncode != 0
    assert "the UI bundler failed (exit 3)" in done.stderr and 'Expected ">" but found "}"' in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


async def test_with_the_bundler_off_there_is_no_bundle(backend: Backend) -> None:
    from asgi_lifespan import LifespanManager

    from threadline.api.app import create_app

    app = create_app(Settings(config=str(PROJECT), workers=1, ui_bundler="off", **backend.settings()))
    async with LifespanManager(app, startup_timeout=30) as manager, httpx.AsyncClient(
            transport=httpx.ASGITransport(manager.app), base_url="http://t") as http:
        missing = await http.post("/ui/agent", json={"name": "weather"})
        assert missing.status_code == 404 and "no generative UI" in missing.json()["detail"]


async def test_disable_ui_serves_no_generative_ui_and_bundles_nothing(backend: Backend, tmp_path: Path) -> None:
    from asgi_lifespan import LifespanManager

    from threadline.api.app import create_app

    config = tmp_path / "langgraph.json"
    config.write_text(json.dumps({"graphs": {"agent": f"{PROJECT.parent / 'agent.py'}:graph"},
                                  "ui": {"agent": str(PROJECT.parent / "ui.tsx")}, "http": {"disable_ui": True}}))
    # A bundler that would fail: startup succeeds only because it is never run.
    app = create_app(Settings(config=str(config), workers=1, ui_bundler="false", **backend.settings()))
    async with LifespanManager(app, startup_timeout=30) as manager, httpx.AsyncClient(
            transport=httpx.ASGITransport(manager.app), base_url="http://t") as http:
        assert (await http.post("/ui/agent", json={"name": "weather"})).status_code == 404
        assert (await http.get("/ui/agent/entrypoint.js")).status_code == 404
        assert (await http.get("/console")).status_code == 307  # the console is another thing


# --- a bundle rewritten while it is served ------------------------------------------------------------------
async def test_an_asset_rewritten_while_served_is_sent_whole(tmp_path: Path) -> None:
    """`threadline dev`'s bundler rewrites the bundle's files in place: each answer is a whole file, its body as
    long as its Content-Length (sized from one file and read from another, it was shorter, and a client saw the
    connection close mid-body)."""
    import threading

    from fastapi import FastAPI

    from threadline.api.generative_ui import router
    from threadline.bundler import Bundle

    (tmp_path / "public" / "agent").mkdir(parents=True)
    (tmp_path / "schemas.json").write_text(json.dumps({"agent": {"assets": ["entrypoint.js"]}}))
    asset = tmp_path / "public" / "agent" / "entrypoint.js"
    versions = [b"// a\n" + b"x" * 200_000, b"// b\n" + b"y" * 100]
    asset.write_bytes(versions[0])
    app = FastAPI()
    app.include_router(router)
    app.state.ui_bundle = Bundle(tmp_path)
    stop = threading.Event()

    def rewrite() -> None:  # as a bundler does: truncate, then write
        i = 0
        while not stop.is_set():
            with asset.open("wb") as out:
                out.write(versions[i % 2][:10])
                out.flush()
                out.write(versions[i % 2][10:])
            i += 1

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            for _ in range(200):
                response = await client.get("/ui/agent/entrypoint.js")
                assert response.status_code == 200
                assert len(response.content) == int(response.headers["content-length"])
                assert response.headers["content-type"].startswith("text/javascript")
    finally:
        stop.set()
        writer.join()
