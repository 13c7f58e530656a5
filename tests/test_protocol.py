"""Protocol v2: `/threads/{id}/commands` and `/threads/{id}/stream/events` (SSE and WebSocket).

Driven by langgraph-sdk's own `client.threads.stream(...)` against a real server, and by raw HTTP for the
envelope rules. Every test runs on each backend (SQLite; PostgreSQL + Redis). The tests share one started
app per backend (tests/shared_app.py), each on threads of its own; the restart test starts its own apps.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Callable
from typing import Any, Literal

import httpx
import pytest
from langgraph_sdk import get_client
from websockets.asyncio.client import connect

from tests.conftest import PROJECT, serving
from tests.services import Backend
from tests.shared_app import shared_app
from threadline.settings import Settings

Frame = dict[str, Any]
Transport = Literal["sse", "websocket"]  # langgraph-sdk's `threads.stream(transport=...)`

pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http, base = shared_app(live_url=True)  # `base`: the shared app over uvicorn


async def read_sse(url: str, tid: str, body: dict[str, Any], until: Callable[[list[Frame]], bool]) -> list[Frame]:
    """Frames of `/stream/events` (event name, id, envelope) until `until(frames)` holds."""
    frames: list[Frame] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client, \
            client.stream("POST", f"/threads/{tid}/stream/events", json=body) as response:
        assert response.status_code == 200, await response.aread()
        current: Frame = {}
        async for line in response.aiter_lines():
            if line.startswith("event:"):
                current["event"] = line.split(":", 1)[1].strip()
            elif line.startswith("id:"):
                current["id"] = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                current["data"] = json.loads(line.split(":", 1)[1])
            elif not line and "data" in current:
                frames.append(current)
                current = {}
                if until(frames):
                    return frames
    raise AssertionError(f"stream ended early: {frames}")


def root_done(frames: list[Frame]) -> bool:
    last = frames[-1]["data"]
    return (last["method"] == "lifecycle" and last["params"]["namespace"] == []
            and last["params"]["data"]["event"] in ("completed", "failed", "interrupted"))


async def command(url: str, tid: str, method: str, params: dict[str, Any], cid: int = 1) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        response = await client.post(f"/threads/{tid}/commands", json={"id": cid, "method": method, "params": params})
    assert response.status_code == 200, response.text
    return response.json()


# --- the SDK, end to end -------------------------------------------------------------
@pytest.mark.parametrize("transport", ["sse", "websocket"])
async def test_sdk_run_to_completion_with_streamed_messages(base: str, transport: Transport) -> None:
    client = get_client(url=base)
    async with client.threads.stream(assistant_id="echo", transport=transport) as thread:
        await thread.run.start(input={"messages": [{"role": "user", "content": "hi"}]})
        # The projection ends at the run's root `completed`; each stream then holds its whole message.
        streams = [m async for m in thread.messages]
        texts = ["".join([token async for token in m.text]) for m in streams]
        out = await thread.output.with_timeout(30)
    assert texts == ["You said: hi"]
    assert out["messages"][-1]["type"] == "ai" and out["messages"][-1]["id"] == streams[0].message_id


@pytest.mark.parametrize("transport", ["sse", "websocket"])
async def test_sdk_interrupt_answered_with_respond(base: str, transport: Transport) -> None:
    client = get_client(url=base)
    async with client.threads.stream(assistant_id="approval", transport=transport) as thread:
        await thread.run.start(input={"request": "deploy"})
        for _ in range(600):
            if thread.interrupted:
                break
            await asyncio.sleep(0.05)
        assert thread.interrupts[0]["value"] == {"question": "Approve 'deploy'?"}
        await thread.run.respond(True)
        out = await thread.output.with_timeout(30)
    assert out["outcome"] == "done: deploy"


# --- the event stream ----------------------------------------------------------------
async def test_since_replays_exactly_the_missed_events(base: str) -> None:
    tid = str(uuid.uuid4())
    started = await command(base, tid, "run.start", {"assistant_id": "counter", "input": {"steps": 5, "tag": "s"}})
    assert started["type"] == "success" and started["meta"]["applied_through_seq"] == 0
    everything = await read_sse(base, tid, {"channels": ["values", "custom", "lifecycle"]}, root_done)
    seqs = [int(f["id"]) for f in everything]
    assert seqs == sorted(set(seqs)) and seqs == [f["data"]["seq"] for f in everything]
    assert all(f["event"] == f["data"]["method"] for f in everything)
    steps = [f["data"]["params"]["data"]["payload"]["step"] for f in everything if f["event"] == "custom"]
    assert steps == [0, 1, 2, 3, 4]
    # The root's lifecycle starts with `running`, as LangGraph's server's (a subgraph's with `started`).
    assert everything[0]["data"]["params"]["data"] == {"event": "running", "graph_name": "counter"}
    cut = seqs[len(seqs) // 2]
    rest = await read_sse(base, tid, {"channels": ["values", "custom", "lifecycle"], "since": cut}, root_done)
    assert [f["data"]["event_id"] for f in rest] == [f["data"]["event_id"] for f in everything if int(f["id"]) > cut]
    # The stream stays open across runs: the next run's events arrive on it, numbered on.
    follow = asyncio.create_task(read_sse(base, tid, {"channels": ["lifecycle"], "since": seqs[-1]},
                                          lambda fs: len(fs) == 2))
    await command(base, tid, "run.start", {"assistant_id": "counter", "input": {"tag": "again"}})
    second = await asyncio.wait_for(follow, 30)
    assert [f["data"]["params"]["data"]["event"] for f in second] == ["running", "completed"]
    assert int(second[0]["id"]) > seqs[-1]


async def test_channels_namespaces_and_named_custom(base: str) -> None:
    tid = str(uuid.uuid4())
    await command(base, tid, "run.start", {"assistant_id": "nested", "input": {"items": []}})
    frames = await read_sse(base, tid, {"channels": ["updates", "lifecycle"]}, root_done)
    child = [f["data"]["params"] for f in frames if f["data"]["params"]["namespace"]]
    assert child and all(p["namespace"][0].startswith("child:") for p in child)
    assert {"event": "completed", "graph_name": "child"} in [p["data"] for p in child]
    assert {"parent_step", "child"} <= {f["data"]["params"].get("node") for f in frames if f["event"] == "updates"}
    # A prefix segment without `:` matches `child:<task id>`; depth 0 keeps only that level.
    scoped = await read_sse(base, tid, {"channels": ["updates", "lifecycle"], "namespaces": [["child"]], "depth": 0},
                            lambda fs: fs[-1]["data"]["params"]["data"].get("event") == "completed")
    assert scoped and all(len(f["data"]["params"]["namespace"]) == 1 for f in scoped)
    assert [f["data"]["params"]["node"] for f in scoped if f["event"] == "updates"] == ["child_step"]


async def test_interrupt_events_and_input_respond_errors(base: str) -> None:
    tid = str(uuid.uuid4())
    await command(base, tid, "run.start", {"assistant_id": "approval", "input": {"request": "x"}})
    frames = await read_sse(base, tid, {"channels": ["input", "lifecycle", "values"]}, root_done)
    asked = [f["data"]["params"]["data"] for f in frames if f["event"] == "input.requested"]
    assert asked[0]["payload"] == asked[0]["value"] == {"question": "Approve 'x'?"}
    # As LangGraph's server streams a run stopping at `interrupt()`: its `input.requested`, the root's `interrupted`,
    # then the state at the interrupt (without `__interrupt__`), once.
    frames += await read_sse(base, tid, {"channels": ["input", "lifecycle", "values"], "since": int(frames[-1]["id"])},
                             lambda fs: fs[-1]["event"] == "values")
    assert [f["event"] for f in frames] == ["lifecycle", "values", "input.requested", "lifecycle", "values"], frames
    assert frames[1]["data"]["params"]["data"] == frames[-1]["data"]["params"]["data"] == {"request": "x"}
    assert frames[3]["data"]["params"]["data"]["event"] == "interrupted"
    wrong = await command(base, tid, "input.respond", {"interrupt_id": "nope", "response": True}, cid=7)
    assert wrong["type"] == "error" and wrong["id"] == 7 and wrong["error"] == "no_such_interrupt"
    tree = await command(base, tid, "agent.getTree", {})
    assert tree["result"]["tree"]["status"] == "interrupted" and tree["result"]["tree"]["graph_name"] == "approval"
    # run.start with input on a thread waiting for input answers the interrupt.
    await command(base, tid, "run.start", {"assistant_id": "approval", "input": False})
    after = await read_sse(base, tid, {"channels": ["values", "lifecycle"], "since": int(frames[-1]["id"])}, root_done)
    assert after[-1]["data"]["params"]["data"]["event"] == "completed"
    assert [f for f in after if f["event"] == "values"][-1]["data"]["params"]["data"]["outcome"] == "refused: x"


async def test_websocket_subscribe_commands_and_unsubscribe(base: str) -> None:
    tid = str(uuid.uuid4())
    async with connect(base.replace("http", "ws") + f"/threads/{tid}/stream/events") as ws:
        await ws.send("not json")
        assert json.loads(await ws.recv())["error"] == "invalid_argument"
        # Nested past what storage holds (threadline.api.bounds): named, and the socket stays open.
        await ws.send('{"id": 0, "method": "run.start", "params": {"input": ' + '[' * 200 + ']' * 200 + '}}')
        deep = json.loads(await ws.recv())
        assert deep["error"] == "invalid_argument" and deep["message"].startswith("params.input.0.0"), deep
        await ws.send(json.dumps({"id": 1, "method": "subscription.subscribe", "params": {"channels": ["lifecycle"]}}))
        subscribed = json.loads(await ws.recv())
        assert subscribed["type"] == "success" and subscribed["result"]["replayed_events"] == 0
        await ws.send(json.dumps({"id": 2, "method": "run.start", "params": {"assistant_id": "counter", "input": {}}}))
        frames = [json.loads(await ws.recv()) for _ in range(3)]
        assert frames[0] == {**frames[0], "type": "success", "id": 2}
        assert [f["params"]["data"]["event"] for f in frames[1:]] == ["running", "completed"]
        await ws.send(json.dumps({"id": 3, "method": "agent.getTree", "params": {}}))
        tree = json.loads(await ws.recv())["result"]["tree"]
        assert tree == {"namespace": [], "status": "completed", "graph_name": "counter"}
        await ws.send(json.dumps({"id": 4, "method": "subscription.reconnect",
                                  "params": {"channels": ["lifecycle"], "since": frames[1]["seq"]}}))
        again = json.loads(await ws.recv())
        assert again["result"]["replayed_events"] == 1
        assert json.loads(await ws.recv())["seq"] == frames[2]["seq"]
        await ws.send(json.dumps({"id": 5, "method": "subscription.unsubscribe",
                                  "params": {"subscription_id": subscribed["result"]["subscription_id"]}}))
        assert json.loads(await ws.recv())["type"] == "success"
        await ws.send(json.dumps({"id": 6, "method": "subscription.unsubscribe", "params": {"subscription_id": "x"}}))
        assert json.loads(await ws.recv())["error"] == "no_such_subscription"


async def test_runs_that_never_stream_still_end_their_lifecycle(base: str) -> None:
    """Runs cancelled while queued (by a client, by deleting their assistant), and one that fails before its
    graph runs (its factory raises), still get `started` and a terminal root lifecycle event: the SDK waits
    for that event."""
    tid = str(uuid.uuid4())
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        doomed = (await client.post("/assistants", json={"graph_id": "slow"})).json()["assistant_id"]
        broken = (await client.post("/assistants", json={"graph_id": "config_runtime",
                                                         "context": {"prefix": ""}})).json()["assistant_id"]
        first = await command(base, tid, "run.start", {"assistant_id": "slow", "input": {"tag": "a", "steps": 500,
                                                                                         "delay": 0.02}})
        queued = await command(base, tid, "run.start", {"assistant_id": "slow", "input": {"tag": "q"}}, cid=2)
        orphan = await command(base, tid, "run.start", {"assistant_id": doomed, "input": {"tag": "o"}}, cid=3)
        failing = await command(base, tid, "run.start", {"assistant_id": broken, "input": {}}, cid=4)
        assert (await client.delete(f"/assistants/{doomed}")).status_code == 204
        ids = [r["result"]["run_id"] for r in (first, queued, orphan, failing)]
        assert (await client.post(f"/threads/{tid}/runs/{ids[1]}/cancel")).status_code in (200, 202)
        assert (await client.post(f"/threads/{tid}/runs/{ids[0]}/cancel")).status_code in (200, 202)

    def terminal(frame: Frame) -> bool:
        data = frame["data"]["params"]
        return data["namespace"] == [] and data["data"]["event"] in ("completed", "failed", "interrupted")

    frames = await asyncio.wait_for(read_sse(base, tid, {"channels": ["lifecycle"], "since": 0},
                                             lambda fs: sum(terminal(f) for f in fs) == 4), 30)
    ends = {f["data"]["event_id"].split(":")[0]: f["data"]["params"]["data"] for f in frames if terminal(f)}
    assert ends[ids[0]]["event"] == "interrupted"
    assert ends[ids[1]]["event"] == "interrupted"  # cancelled while queued: it never ran
    assert ends[ids[2]]["event"] == "interrupted"  # its assistant was deleted while it was queued
    assert ends[ids[3]]["event"] == "failed" and "prefix must not be empty" in ends[ids[3]]["error"]
    starts = [f["data"]["event_id"].split(":")[0] for f in frames if f["data"]["params"]["data"]["event"] == "running"]
    assert sorted(starts) == sorted(ids)


async def test_since_survives_a_restart(own_backend: Backend) -> None:
    settings = Settings(config=str(PROJECT), workers=4, heartbeat_seconds=5.0, **own_backend.settings())
    tid = str(uuid.uuid4())
    async with serving(settings) as url:
        await command(url, tid, "run.start", {"assistant_id": "counter", "input": {"steps": 2}})
        before = await read_sse(url, tid, {"channels": ["custom", "lifecycle"]}, root_done)
    async with serving(settings) as url:
        after = await read_sse(url, tid, {"channels": ["custom", "lifecycle"], "since": int(before[0]["id"])},
                               root_done)
        assert [f["data"] for f in after] == [f["data"] for f in before[1:]]
        applied = await command(url, tid, "agent.getTree", {})
        assert applied["meta"]["applied_through_seq"] >= int(before[-1]["id"])


# --- envelope rules (in-process) -----------------------------------------------------
async def test_command_envelope_errors(http: httpx.AsyncClient) -> None:
    tid = str(uuid.uuid4())
    url = f"/threads/{tid}/commands"
    bad = await http.post(url, content=b"{nope", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["detail"] == "Invalid JSON body"
    for body, cid in (({"id": "x", "method": "run.start"}, None), ({"id": 3, "method": 5}, 3), ([], None)):
        response = await http.post(url, json=body)
        assert response.status_code == 400
        assert response.json() == {"type": "error", "id": cid, "error": "invalid_argument",
                                   "message": "Protocol commands must include an integer id and string method."}
    unknown = await http.post(url, json={"id": 2, "method": "state.get", "params": {}})
    assert unknown.status_code == 200 and unknown.json()["error"] == "unknown_command" and unknown.json()["id"] == 2
    for params in ({}, {"assistant_id": "echo", "config": "x"}, {"assistant_id": "echo", "multitask_strategy": "no"},
                   {"assistant_id": "echo", "config": {"configurable": {"checkpoint_id": "not-a-uuid"}}}):
        answer = (await http.post(url, json={"id": 4, "method": "run.start", "params": params})).json()
        assert answer["type"] == "error" and answer["error"] == "invalid_argument", answer
    no_run = (await http.post(url, json={"id": 5, "method": "input.respond",
                                         "params": {"interrupt_id": "i", "response": 1}})).json()
    assert no_run["error"] == "no_such_run"
    shape = (await http.post(url, json={"id": 6, "method": "input.respond", "params": {"response": 1}})).json()
    assert shape["error"] == "invalid_argument"
    sub = (await http.post(url, json={"id": 7, "method": "subscription.subscribe",
                                      "params": {"channels": ["values"]}})).json()
    assert sub["error"] == "not_supported"
    started = (await http.post(url, json={"id": 8, "method": "run.start",
                                          "params": {"assistantId": "echo", "input": {"message": "a"}}})).json()
    assert started["type"] == "success" and uuid.UUID(started["result"]["run_id"])
    no_such = (await http.post(url, json={"id": 9, "method": "input.respond",
                                          "params": {"interrupt_id": "i", "response": 1}})).json()
    assert no_such["error"] == "no_such_interrupt"


async def test_stream_request_errors(http: httpx.AsyncClient) -> None:
    tid = str(uuid.uuid4())
    missing = await http.post(f"/threads/{tid}/stream/events", json={"channels": ["values"]})
    assert missing.status_code == 404
    await http.post("/threads", json={"thread_id": tid})
    bodies: list[dict[str, list[str]]] = [{"channels": ["nope"]}, {"channels": []}, {}, {"channels": ["custom:"]}]
    for body in bodies:
        response = await http.post(f"/threads/{tid}/stream/events", json=body)
        assert response.status_code == 400, body
    assert "unsupported entries: nope" in (await http.post(f"/threads/{tid}/stream/events",
                                                           json={"channels": ["nope"]})).json()["detail"]


async def test_a_token_streams_events_share_transactions_and_a_quiet_spells_first_goes_at_once(
        own_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """A protocol run's events go into the thread's log in group-committed transactions; events that come
    within the coalescing window of the last write wait for it, so a graph streaming a token per loop pass
    writes far fewer transactions than events (without the window, about one per 4 events), every event in
    order. The first event after a quiet spell longer than the window is written without waiting."""
    from threadline.broker.memory import MemoryBroker
    from threadline.core.protocol_events import EventWriter, _Unleased
    from threadline.storage import open_storage

    storage = await open_storage(own_backend.database_url)
    try:
        tid = str(uuid.uuid4())
        await storage.create_thread({"thread_id": tid, "status": "idle", "metadata": {}, "config": {}, "values": None,
                                     "interrupts": {}, "created_at": "2024-01-01T00:00:00+00:00",
                                     "updated_at": "2024-01-01T00:00:00+00:00"}, if_exists="raise")
        writes, waits = [], []
        append, sleep = storage.append_thread_events, asyncio.sleep

        async def counted(*args: Any) -> Any:
            writes.append(len(args[2]))
            return await append(*args)

        async def noted(seconds: float) -> None:
            if sys._getframe(1).f_code is EventWriter._drain.__code__:  # the writer's own waits, no one else's
                waits.append(seconds)
            await sleep(seconds)

        monkeypatch.setattr(storage, "append_thread_events", counted)
        monkeypatch.setattr(asyncio, "sleep", noted)
        window = 0.05
        writer = EventWriter(storage, MemoryBroker(), tid, "r1", _Unleased(), window)  # type: ignore[arg-type]
        for i in range(400):  # a token per loop pass
            await writer.add([("custom", [], {"payload": i}, None)])
            await sleep(0)
        await writer.flush()
        assert sum(writes) == 400 and len(writes) < 40, writes
        rows = await storage.read_thread_events(tid, limit=1000)
        assert [r["seq"] for r in rows] == list(range(1, 401))
        assert [json.loads(r["params"])["data"]["payload"] for r in rows] == list(range(400))

        assert waits  # the writer waited within the stream
        await sleep(2 * window)  # a quiet spell
        writes.clear()
        waits.clear()
        await writer.add([("custom", [], {"payload": "after"}, None)])
        await writer.flush()
        assert writes == [1] and waits == []
    finally:
        await storage.close()


async def test_storage_numbers_events_per_thread_keeps_the_newest_and_deletes_with_the_thread(
        own_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    from threadline.storage import open_storage
    from threadline.storage.base import NewThreadEvent

    monkeypatch.setattr("threadline.storage.scripts.THREAD_EVENTS_KEPT", 50)  # the one append, for every backend
    storage = await open_storage(own_backend.database_url)
    try:
        tid, other = str(uuid.uuid4()), str(uuid.uuid4())
        await storage.create_thread({"thread_id": tid, "status": "idle", "metadata": {}, "config": {}, "values": None,
                                     "interrupts": {}, "created_at": "2024-01-01T00:00:00+00:00",
                                     "updated_at": "2024-01-01T00:00:00+00:00"}, if_exists="raise")
        event = NewThreadEvent("custom", "custom", "[]", '{"namespace":[],"timestamp":0,"data":{"payload":1}}')
        # Concurrent appenders on one thread never share a number and leave no gap.
        batches = await asyncio.gather(*(storage.append_thread_events(tid, f"r{i}", [event] * 4) for i in range(10)))
        assert sorted(s for b in batches for s in b) == list(range(1, 41))
        assert all(b == list(range(b[0], b[0] + 4)) for b in batches)
        assert await storage.append_thread_events(other, "r", [event]) == [1]  # numbered per thread
        await storage.append_thread_events(tid, "late", [event] * 20)
        assert await storage.thread_event_bounds(tid) == (11, 60)  # only the newest 50 are kept
        rows = await storage.read_thread_events(tid, after=55)
        assert [r["seq"] for r in rows] == [56, 57, 58, 59, 60] and rows[0]["run_id"] == "late"
        assert [r["seq"] for r in await storage.read_thread_events(tid, run_id="late", limit=2)] == [41, 42]
        assert await storage.delete_thread(tid)
        assert await storage.read_thread_events(tid) == [] and await storage.thread_event_bounds(tid) == (0, 0)
        assert await storage.thread_event_bounds(other) == (1, 1)
    finally:
        await storage.close()
