"""Wire details clients read, each checked against LangGraph's server (langgraph-api 0.16.7, `langgraph dev`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import StreamMode

from tests.sdk_shapes import copy_thread, wire
from tests.shared_app import shared_app

# The module's tests share one started app per backend (tests/conftest.py, `module_served`): each makes what it
# reads, under ids of its own. They run in the app's event loop.
pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # the one synchronous test of the module runs as before, without a loop
              pytest.mark.filterwarnings("ignore:The test <Function .* is marked with '@pytest.mark.asyncio'")]

backend, served, http = shared_app()

QUICK = {"assistant_id": "slow", "input": {"tag": "w", "steps": 1, "delay": 0}}


async def test_run_creating_endpoints_say_where_the_run_is(http: httpx.AsyncClient) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]

    r = await http.post(f"/threads/{tid}/runs", json=QUICK)
    rid = r.json()["run_id"]
    assert r.headers["content-location"] == f"/threads/{tid}/runs/{rid}" and "location" not in r.headers
    r = await http.get(f"/threads/{tid}/runs/{rid}/join")
    assert (r.headers["content-location"], r.headers["location"]) == (
        f"/threads/{tid}/runs/{rid}", f"/threads/{tid}/runs/{rid}/join")

    r = await http.post(f"/threads/{tid}/runs/wait", json=QUICK)
    rid = r.headers["content-location"].rsplit("/", 1)[1]
    assert r.headers["content-location"] == f"/threads/{tid}/runs/{rid}"
    assert r.headers["location"] == f"/threads/{tid}/runs/{rid}/join"

    async with http.stream("POST", f"/threads/{tid}/runs/stream", json=QUICK) as r:
        rid = r.headers["content-location"].rsplit("/", 1)[1]
        assert r.headers["content-location"] == f"/threads/{tid}/runs/{rid}"
        assert r.headers["location"] == f"/threads/{tid}/runs/{rid}/stream"

    # Stateless: a background run and a stream are named by the run alone, a wait by its (temporary) thread.
    r = await http.post("/runs", json=QUICK)
    assert r.headers["content-location"] == f"/runs/{r.json()['run_id']}"
    async with http.stream("POST", "/runs/stream", json=QUICK) as r:
        rid = r.headers["content-location"].rsplit("/", 1)[1]
        assert r.headers["content-location"] == f"/runs/{rid}"
        assert r.headers["location"] == f"/runs/{rid}/stream"
    r = await http.post("/runs/wait", json=QUICK)
    head, _, rid = r.headers["content-location"].rpartition("/runs/")
    assert head.startswith("/threads/") and head != f"/threads/{tid}"
    assert r.headers["location"] == f"{head}/runs/{rid}/join"


async def test_root_answers_ok(http: httpx.AsyncClient) -> None:
    r = await http.get("/")
    assert (r.status_code, r.json()) == (200, {"ok": True})


async def test_store_refuses_bad_namespaces_and_keys_with_422(http: httpx.AsyncClient) -> None:
    """Labels LangGraph's store refuses, and NUL bytes PostgreSQL cannot keep, are the client's mistake."""
    for query in ("namespace=a.&key=k", "namespace=&key=k", "namespace=a%00b&key=k", "namespace=a&key=k%00"):
        r = await http.get(f"/store/items?{query}")
        assert r.status_code == 422 and r.json()["detail"], (query, r.text)
    for body in ({"namespace": ["a", ""], "key": "k", "value": {}}, {"namespace": ["a\x00"], "key": "k", "value": {}},
                 {"namespace": ["a"], "key": "k\x00", "value": {}},
                 {"namespace": ["langgraph"], "key": "k", "value": {}}):
        r = await http.put("/store/items", json=body)
        assert r.status_code == 422 and r.json()["detail"], (body, r.text)
    r = await http.request("DELETE", "/store/items", json={"namespace": ["a"], "key": "k\x00"})
    assert r.status_code == 422
    assert (await http.put("/store/items", json={"namespace": ["a"], "key": "k", "value": {"v": 1}})).status_code == 204
    assert (await http.get("/store/items?namespace=a&key=k")).json()["value"] == {"v": 1}


async def _finished_resumable(sdk: LangGraphClient, tid: str, assistant: str, inp: dict[str, Any],
                              modes: list[StreamMode], **kw: Any) -> str:
    run = await sdk.runs.create(tid, assistant, input=inp, stream_mode=modes, stream_resumable=True, **kw)
    await sdk.runs.join(tid, run["run_id"])
    return str(run["run_id"])


async def test_replay_from_minus_one_starts_with_metadata(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    rid = await _finished_resumable(sdk, tid, "slow", {"tag": "r", "steps": 2, "delay": 0}, ["values", "custom"])
    events = [p.event async for p in sdk.runs.join_stream(tid, rid, last_event_id="-1")]
    assert events == ["metadata", "values", "custom", "custom", "values"], events


async def test_join_stream_sends_only_the_modes_asked_for(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    rid = await _finished_resumable(sdk, tid, "slow", {"tag": "r", "steps": 2, "delay": 0},
                                    ["values", "updates", "custom"])

    async def replay(mode: Any, run_id: str = rid) -> list[str]:
        return [p.event async for p in sdk.runs.join_stream(tid, run_id, last_event_id="-1", stream_mode=mode)]

    assert await replay("custom") == ["custom", "custom"]
    assert await replay(["updates", "metadata"]) == ["metadata", "updates"]
    rid = await _finished_resumable(sdk, tid, "nested", {}, ["updates"], stream_subgraphs=True)
    updates = await replay("updates", rid)
    assert updates[0] == "updates" and any(e.startswith("updates|child:") for e in updates), updates
    rid = await _finished_resumable(sdk, tid, "echo", {"message": "hi"}, ["messages", "values"])
    assert {e.split("/")[0] for e in await replay("messages", rid)} == {"messages"}
    # A failed run's error still reaches a client that asked for values only.
    rid = await _finished_resumable(sdk, tid, "failing", {"reason": "x"}, ["values", "updates"])
    assert await replay("values", rid) == ["values", "error"]
    # Live, too: a join before the run ends.
    run = await sdk.runs.create(tid, "slow", input={"tag": "l", "steps": 3, "delay": 0.05},
                                stream_mode=["values", "custom"])
    assert [p.event async for p in sdk.runs.join_stream(tid, run["run_id"], stream_mode="custom")] == ["custom"] * 3


async def test_partial_messages_are_whole_messages(sdk: LangGraphClient) -> None:
    """`messages/partial` carries the message so far typed as a message (`ai`), not as a chunk; the
    `messages-tuple` mode keeps the chunks (`AIMessageChunk`), as the reference does."""
    tid = (await sdk.threads.create())["thread_id"]
    parts = [p async for p in sdk.runs.stream(tid, "echo", input={"message": "hello world"}, stream_mode="messages")]
    partial = [p.data[0] for p in parts if p.event == "messages/partial"]
    assert partial and {m["type"] for m in partial} == {"ai"}, {m["type"] for m in partial}
    assert partial[-1]["content"] == "You said: hello world"
    assert "tool_call_chunks" not in partial[-1] and "chunk_position" not in partial[-1]
    tuples = [p.data[0] async for p in sdk.runs.stream(tid, "echo", input={"message": "hi"},
                                                       stream_mode="messages-tuple") if p.event == "messages"]
    assert "AIMessageChunk" in {m["type"] for m in tuples}


async def test_state_and_history_name_their_checkpoints(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "counter", input={"increment": 1})
    state = wire(await sdk.threads.get_state(tid))
    assert state["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert state["parent_checkpoint_id"] == state["parent_checkpoint"]["checkpoint_id"]
    assert set(state["checkpoint"]) == {"checkpoint_id", "thread_id", "checkpoint_ns"}  # no null checkpoint_map
    history = [wire(h) for h in await sdk.threads.get_history(tid)]
    assert [h["checkpoint_id"] for h in history] == [h["checkpoint"]["checkpoint_id"] for h in history]
    assert history[0]["checkpoint_id"] == state["checkpoint_id"]
    assert [h["parent_checkpoint_id"] for h in history[:-1]] == [h["checkpoint_id"] for h in history[1:]]
    assert history[-1]["parent_checkpoint_id"] is None
    updated = wire(await sdk.threads.update_state(tid, {"count": 1}))
    assert (updated["checkpoint_id"] == updated["checkpoint"]["checkpoint_id"]
            == updated["configurable"]["checkpoint_id"])
    assert wire(await sdk.threads.get_state(tid))["checkpoint_id"] == updated["checkpoint_id"]


async def test_checkpoint_metadata_names_its_thread_also_in_a_copy(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "nested", input={"items": []})
    assert {h["metadata"]["thread_id"] for h in await sdk.threads.get_history(tid)} == {tid}
    copy = (await copy_thread(sdk, tid))["thread_id"]
    history = await sdk.threads.get_history(copy)
    assert history and {h["metadata"]["thread_id"] for h in history} == {copy}
    assert {h["checkpoint"]["thread_id"] for h in history} == {copy}


async def test_debug_checkpoint_events_name_their_checkpoints(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    payloads = [p.data["payload"] async for p in sdk.runs.stream(tid, "nested", input={"items": []},
                                                                 stream_mode="debug")
                if p.event == "debug" and p.data["type"] == "checkpoint"]
    assert len(payloads) >= 3
    for p in payloads:
        assert p["checkpoint"] == {"checkpoint_id": p["config"]["configurable"]["checkpoint_id"],
                                   "thread_id": tid, "checkpoint_ns": ""}
    assert payloads[0]["parent_checkpoint"] is None
    assert [p["parent_checkpoint"]["checkpoint_id"] for p in payloads[1:]] == [
        p["checkpoint"]["checkpoint_id"] for p in payloads[:-1]]
    child = next(t for p in payloads for t in p["tasks"] if t["name"] == "child")
    assert "state" not in child and child["checkpoint"] == {"thread_id": tid, "checkpoint_ns": f"child:{child['id']}"}


async def test_a_pending_subgraph_task_names_only_its_namespace(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "nested", input={"items": []}, interrupt_after=["parent_step"])
    task = (await sdk.threads.get_state(tid))["tasks"][0]
    assert task["name"] == "child"
    assert task["checkpoint"] == {"thread_id": tid, "checkpoint_ns": f"child:{task['id']}"}


async def test_config_schema_is_the_configurable_schema(sdk: LangGraphClient) -> None:
    echo = (await sdk.assistants.search(graph_id="echo"))[0]["assistant_id"]
    assert (await sdk.assistants.get_schemas(echo))["config_schema"] == {}  # no configurable: as the reference


def test_config_schema_of_a_graph_with_a_context_schema() -> None:
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    from threadline.core.graphs import describe_schemas

    class State(TypedDict, total=False):
        x: int

    class Context(TypedDict, total=False):
        model: str

    builder = StateGraph(State, context_schema=Context)
    builder.add_node("node", lambda state: {"x": 1})
    builder.add_edge(START, "node")
    builder.add_edge("node", END)
    schemas = describe_schemas(builder.compile(), "g")
    expected = {"properties": {"model": {"title": "Model", "type": "string"}}, "title": "Context", "type": "object"}
    assert schemas["config_schema"] == expected  # as the reference gives it (probed on 0.16.7)
    assert schemas["context_schema"] == expected


async def test_a_store_re_put_advances_updated_at_and_keeps_created_at(http: httpx.AsyncClient) -> None:
    """Two puts of one item within a second: its `updated_at` still advances (the SQLite store kept whole
    seconds), and `created_at` stays the first put's (the SQLite store replaced the row), as on PostgreSQL."""
    item = {"namespace": ["wire", "ts"], "key": "k"}
    assert (await http.put("/store/items", json={**item, "value": {"v": 1}})).status_code == 204
    first = (await http.get("/store/items", params={"namespace": "wire.ts", "key": "k"})).json()
    for v in (2, 3):
        assert (await http.put("/store/items", json={**item, "value": {"v": v}})).status_code == 204
    last = (await http.get("/store/items", params={"namespace": "wire.ts", "key": "k"})).json()
    assert last["value"] == {"v": 3}
    assert last["created_at"] == first["created_at"]
    assert datetime.fromisoformat(last["updated_at"]) > datetime.fromisoformat(first["updated_at"]), (first, last)
    assert datetime.fromisoformat(last["updated_at"]) >= datetime.fromisoformat(last["created_at"])
    found = (await http.post("/store/items/search", json={"namespace_prefix": ["wire"]})).json()["items"]
    assert [(i["key"], i["updated_at"]) for i in found] == [("k", last["updated_at"])]


async def test_error_details_are_langgraphs_texts(http: httpx.AsyncClient) -> None:
    """UIs show `detail` to users; the texts are the reference's (probed on 0.16.7), `code` and `message` stay."""
    missing = "00000000-0000-0000-0000-000000000001"
    for method, path in (("GET", f"/threads/{missing}"), ("DELETE", f"/threads/{missing}"),
                         ("GET", f"/threads/{missing}/state"), ("POST", f"/threads/{missing}/history")):
        r = await http.request(method, path, json={} if method == "POST" else None)
        assert (r.status_code, r.json()["detail"]) == (404, f"Thread with ID {missing} not found"), path
        assert r.json()["code"] == "not_found" and r.json()["message"] == r.json()["detail"]
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    r = await http.post("/threads", json={"thread_id": tid})
    assert (r.status_code, r.json()["detail"]) == (409, f"Thread with ID {tid} already exists")
    r = await http.post("/assistants", json={"graph_id": "nope"})
    assert r.status_code == 404 and r.json()["detail"].startswith("Graph 'nope' not found. Expected one of: ['")
    aid = (await http.post("/assistants", json={"graph_id": "echo"})).json()["assistant_id"]
    r = await http.post(f"/assistants/{aid}/latest", json={"version": 99})
    assert (r.status_code, r.json()["detail"]) == (404, f"Version 99 not found for assistant {aid}")
    for method, path in (("DELETE", f"/threads/{tid}/runs/{missing}"), ("GET", f"/threads/{tid}/runs/{missing}/join")):
        r = await http.request(method, path)
        assert (r.status_code, r.json()["detail"]) == (404, "Run not found"), path
