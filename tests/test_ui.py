"""The web console's pages, in-process on every backend: each page shows what the API holds, bad input gets
a clear 4xx page, the setting turns the console off. (In a real browser: tests/test_ui_browser.py.)

The pages' tests share one started app per backend and look only at what they made (`tests/shared_app.py`);
a test that needs other settings or another project starts its own app on `own_backend`."""

from __future__ import annotations

import html
import json
import re
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager

from tests.conftest import PROJECT
from tests.services import Backend
from tests.shared_app import shared_app
from threadline.api.app import create_app
from threadline.settings import Settings
from threadline.ui import graph as layout
from threadline.ui.views import chat_messages, namespace_tree

STORE_PROJECT = Path(__file__).parent / "project" / "store_index" / "langgraph.json"

pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # the mark above reaches the module's plain functions too, which run as such
              pytest.mark.filterwarnings("ignore:.*is marked with '@pytest.mark.asyncio' but it is not an async")]
backend, served, http = shared_app()


@pytest.fixture
def own_settings(own_backend: Backend) -> Settings:
    """The module's settings on a database of its own, for a test that starts an app with other settings."""
    return Settings(config=str(PROJECT), workers=4, heartbeat_seconds=5.0, **own_backend.settings())


def text(page: httpx.Response) -> str:
    """The page's visible text, roughly: tags dropped, whitespace squeezed."""
    assert page.headers["content-type"].startswith("text/html"), page.headers
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.text)))


async def thread_with(http: httpx.AsyncClient, graph: str, payload: dict[str, Any], **metadata: Any) -> str:
    thread = (await http.post("/threads", json={"metadata": metadata})).json()["thread_id"]
    done = await http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": graph, **payload})
    assert done.status_code == 200, done.text
    return str(thread)


async def test_threads_are_searched_by_status_and_metadata_and_paged(http: httpx.AsyncClient) -> None:
    for i in range(30):
        await http.post("/threads", json={"metadata": {"team": "a" if i < 27 else "b", "n": i}})
    page = await http.get("/console/threads", params={"metadata": '{"team": "a"}'})
    assert page.status_code == 200 and "27 threads · page 1 of 2" in text(page)
    assert text(page).count('"team": "a"') == 25
    second = await http.get("/console/threads", params={"metadata": '{"team": "a"}', "page": 2})
    assert text(second).count('"team": "a"') == 2 and "Newer" in text(second) and "Older" not in text(second)
    busy = await http.get("/console/threads", params={"status": "busy"})
    assert "0 threads" in text(busy) and "No threads match." in text(busy)


async def test_a_bad_filter_or_an_unknown_thread_is_a_4xx_page(http: httpx.AsyncClient) -> None:
    bad = await http.get("/console/threads", params={"metadata": "{team"})
    assert bad.status_code == 400 and "metadata is not valid JSON" in text(bad)
    listed = await http.get("/console/threads", params={"metadata": "[1]"})
    assert listed.status_code == 400 and "must be a JSON object" in text(listed)
    missing = await http.get("/console/threads/00000000-0000-0000-0000-000000000000")
    assert missing.status_code == 404 and "The API answered 404" in text(missing)


async def test_the_thread_page_shows_the_chat_state_history_and_runs(http: httpx.AsyncClient) -> None:
    thread = await thread_with(http, "echo", {"input": {"messages": [{"role": "user", "content": "hi there"}]}})
    page = await http.get(f"/console/threads/{thread}")
    shown = text(page)
    assert page.status_code == 200
    assert re.search(r"You hi there .*AI You said: hi there", shown), shown
    assert 'class="msg msg-human"' in page.text and 'class="msg msg-ai"' in page.text
    runs = (await http.get(f"/threads/{thread}/runs")).json()
    assert f"/console/threads/{thread}/runs/{runs[0]['run_id']}" in page.text
    history = (await http.post(f"/threads/{thread}/history", json={})).json()
    oldest = history[-1]["checkpoint"]["checkpoint_id"]
    assert f"?checkpoint={oldest}" in page.text
    then = await http.get(f"/console/threads/{thread}", params={"checkpoint": oldest})
    assert "Showing the state at checkpoint" in text(then) and "You said" not in text(then)
    run = await http.get(f"/console/threads/{thread}/runs/{runs[0]['run_id']}")
    assert run.status_code == 200 and f"/threads/{thread}/runs/{runs[0]['run_id']}/stream" in run.text


async def test_a_pending_interrupt_gets_a_resume_form(http: httpx.AsyncClient) -> None:
    thread = await thread_with(http, "approval", {"input": {"request": "ship it"}})
    shown = text(await http.get(f"/console/threads/{thread}"))
    assert "Waiting for you" in shown and "Approve 'ship it'?" in shown and "Resume with (JSON)" in shown
    await http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "approval", "command": {"resume": True}})
    assert "Waiting for you" not in text(await http.get(f"/console/threads/{thread}"))


async def test_assistant_pages_show_versions_schemas_and_the_graph_with_subgraphs(http: httpx.AsyncClient) -> None:
    listed = text(await http.get("/console/assistants"))
    assert "nested" in listed and "approval" in listed
    nested = (await http.post("/assistants/search", json={"graph_id": "nested"})).json()[0]
    page = await http.get(f"/console/assistants/{nested['assistant_id']}")
    assert page.status_code == 200
    drawn = (await http.get(f"/assistants/{nested['assistant_id']}/graph", params={"xray": "true"})).json()
    for node in drawn["nodes"]:
        assert f'data-node="{node["id"]}"' in page.text
    assert any(":" in n["id"] for n in drawn["nodes"]) and 'class="frame"' in page.text  # xray: a framed subgraph
    assert f'data-schemas="/assistants/{nested["assistant_id"]}/schemas"' in page.text  # fetched when opened
    assert "Input schema" in page.text and "version 1" in text(page)


async def test_the_store_page_shows_the_namespace_tree_and_items(http: httpx.AsyncClient) -> None:
    for ns, key in ((["a", "b"], "k1"), (["a", "c"], "k2"), (["z"], "k3")):
        await http.put("/store/items", json={"namespace": ns, "key": key, "value": {"text": key}})
    page = await http.get("/console/store")
    assert 'href="?ns=a"' in page.text and 'href="?ns=a&amp;ns=b"' in page.text and 'href="?ns=z"' in page.text
    assert all(k in text(page) for k in ("k1", "k2", "k3"))
    under_a = text(await http.get("/console/store", params=[("ns", "a")]))
    assert "k1" in under_a and "k2" in under_a and "k3" not in under_a
    assert "Semantic search" not in under_a  # no store.index in this project


async def test_the_queue_page_shows_the_metrics_figures_and_recent_failures(http: httpx.AsyncClient) -> None:
    thread = (await http.post("/threads", json={})).json()["thread_id"]
    await http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "failing", "input": {"reason": "no"}})
    figures = (await http.get("/metrics", params={"format": "json"})).json()
    page = await http.get("/console/queue")
    assert page.status_code == 200
    assert re.search(rf'id="fig-pending">\s*{figures["queue"]["n_pending"]:d}<', page.text)
    saturation = f"{figures['workers']['active']} / {figures['workers']['max']}"
    assert "Worker saturation" in page.text and saturation in page.text
    failures = page.text.split("Recent failures", 1)[1]
    assert f"/console/threads/{thread}" in failures and "status-error" in failures


async def test_the_console_can_be_turned_off(own_settings: Settings) -> None:
    for ui, status in (("on", 200), ("off", 404)):
        app = create_app(replace(own_settings, ui=ui))
        async with LifespanManager(app) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                assert (await http.get("/console/threads")).status_code == status
                assert (await http.get("/console/static/console.js")).status_code == status
    assert Settings.resolve(environ={"THREADLINE_UI": "off"}).ui == "off"
    with pytest.raises(SystemExit):
        Settings.resolve(environ={"THREADLINE_UI": "maybe"})


async def test_store_search_is_semantic_with_a_store_index(own_settings: Settings, backend: Backend) -> None:
    if backend.kind == "sqlite" and not hasattr(sqlite3.Connection, "enable_load_extension"):
        pytest.skip("this Python's sqlite3 cannot load sqlite-vec, which the SQLite store's semantic search needs")
    app = create_app(replace(own_settings, config=str(STORE_PROJECT)))
    async with LifespanManager(app, startup_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            for key, words in (("fruit", "banana apple"), ("car", "xyz quick vroom")):
                await http.put("/store/items", json={"namespace": ["notes"], "key": key, "value": {"text": words}})
            page = await http.get("/console/store", params={"q": "bananas"})
            shown = text(page)
            assert "Semantic search" in shown and "score" in shown
            assert shown.index("fruit") < shown.index("car")


def test_layout_layers_follow_the_edges_and_loops_draw_back() -> None:
    drawn = layout.layout({"nodes": [{"id": i} for i in ("__start__", "model", "tools", "__end__")], "edges": [
        {"source": "__start__", "target": "model"}, {"source": "model", "target": "tools", "conditional": True},
        {"source": "tools", "target": "model"}, {"source": "model", "target": "__end__", "conditional": True}]})
    y = {b.id: b.y for b in drawn.boxes}
    assert y["__start__"] < y["model"] < y["tools"] and y["model"] < y["__end__"]
    back = [(line.source, line.target) for line in drawn.lines if line.back]
    assert back == [("tools", "model")]
    assert {b.kind for b in drawn.boxes} == {"start", "node", "end"}


def test_messages_become_chat_bubbles_and_namespaces_a_tree() -> None:
    bubbles = chat_messages({"messages": [
        {"type": "human", "content": "hi"},
        {"type": "ai", "content": [{"type": "text", "text": "let me look"}],
         "tool_calls": [{"name": "search", "args": {"q": "x"}, "id": "c1"}]},
        {"type": "tool", "content": "found", "name": "search", "tool_call_id": "c1"}]})
    assert [(b.role, b.text) for b in bubbles] == [("human", "hi"), ("ai", "let me look"), ("tool", "found")]
    assert bubbles[1].tool_calls == [{"name": "search", "id": "c1", "args": '{"q": "x"}'}]
    assert chat_messages({"count": 1}) == []
    tree = namespace_tree([["a", "b"], ["a", "c", "d"], ["z"]])
    assert [n.label for n in tree] == ["a", "z"]
    assert [c.path for c in tree[0].children] == [["a", "b"], ["a", "c"]]
    assert tree[0].children[1].children[0].path == ["a", "c", "d"]


async def test_under_a_mount_prefix_the_console_and_its_links_carry_it(own_settings: Settings,
                                                                       tmp_path: Path) -> None:
    project = tmp_path / "langgraph.json"
    project.write_text(json.dumps({"graphs": {"echo": "threadline.example.agents:echo"},
                                   "http": {"mount_prefix": "/api"}}))
    app = create_app(replace(own_settings, config=str(project)))
    async with LifespanManager(app, startup_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            thread = (await http.post("/api/threads", json={})).json()["thread_id"]
            page = await http.get("/api/console/threads")
            assert page.status_code == 200 and f'href="/api/console/threads/{thread}"' in page.text
            assert 'href="/api/console/static/console.css"' in page.text
            assert (await http.get("/api/console/static/console.css")).status_code == 200
            assert (await http.get(f"/api/console/threads/{thread}")).status_code == 200
            assert (await http.get("/console/threads")).status_code == 404


async def test_every_console_answer_carries_security_headers_and_the_api_none(http: httpx.AsyncClient) -> None:
    """A content security policy allowing the console's own files only, no framing, no referrer to other
    origins, no sniffing: on pages, error pages, files and redirects; the API's JSON is left as it was."""
    for path in ("/console/threads", "/console/threads/00000000-0000-0000-0000-000000000000",
                 "/console/static/console.js", "/console/static/console.css", "/console/login", "/console"):
        page = await http.get(path, follow_redirects=False)
        policy = page.headers.get("content-security-policy", "")
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy, (path, page.headers)
        assert "'unsafe-inline'" not in policy
        assert page.headers["x-frame-options"] == "DENY"
        assert page.headers["referrer-policy"] == "same-origin"
        assert page.headers["x-content-type-options"] == "nosniff"
    assert "content-security-policy" not in (await http.post("/threads/search", json={})).headers
