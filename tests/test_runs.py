from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import StreamMode

from tests.sdk_shapes import one_state, user_says, wire
from tests.shared_app import shared_app
from tests.waits import agent_stopped, logged, until

# The module's tests share one started app per backend (tests/conftest.py, `module_served`): each makes what it
# reads, under ids of its own. They run in the app's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http = shared_app()


async def test_background_run_join_get_list(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    run = await sdk.runs.create(tid, "echo", input=user_says("hi"),
                                metadata={"m": 1})
    assert run["status"] == "pending" and run["thread_id"] == tid
    # As the reference: the assistant's metadata, then the thread's (tagged with the graph), then the request's.
    assert run["metadata"] == {"created_by": "system", "graph_id": "echo", "assistant_id": run["assistant_id"], "m": 1}
    assert run["multitask_strategy"] == "enqueue"  # the reference server's default
    out = await sdk.runs.join(tid, run["run_id"])
    assert out["messages"][-1]["content"] == "You said: hi"
    assert out["messages"][-1]["type"] == "ai"
    got = await sdk.runs.get(tid, run["run_id"])
    assert got["status"] == "success"
    listed = await sdk.runs.list(tid)
    assert [r["run_id"] for r in listed] == [run["run_id"]]
    assert (await sdk.threads.get(tid))["status"] == "idle"


async def test_wait_returns_values(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    out = one_state(await sdk.runs.wait(tid, "counter", input={"increment": 4, "tag": "x"}))
    assert out["count"] == 4 and out["log"] == ["x"]


async def test_durability_decides_which_checkpoints_are_kept(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    """`durability` is LangGraph's: "exit" keeps only the final checkpoint; the legacy `checkpoint_during: false`
    means "exit"; the default ("async") and "sync" keep every step's."""
    kept = {}
    bodies: dict[str, dict[str, Any]] = {"default": {}, "sync": {"durability": "sync"},
                                         "exit": {"durability": "exit"}, "legacy": {"checkpoint_during": False}}
    for name, fields in bodies.items():
        tid = (await sdk.threads.create())["thread_id"]
        r = await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "counter",
                                                                "input": {"increment": 2}, **fields})
        assert r.status_code == 200 and r.json()["count"] == 2, r.text
        kept[name] = len(await sdk.threads.get_history(tid, limit=100))
        assert one_state((await sdk.threads.get_state(tid))["values"])["count"] == 2
    assert kept["exit"] == kept["legacy"] == 1
    assert kept["default"] == kept["sync"] > 1


async def test_default_assistant_when_omitted(http: httpx.AsyncClient) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    r = await http.post(f"/threads/{tid}/runs/wait", json={"input": {"message": "yo"}})
    assert r.status_code == 200 and r.json()["messages"][-1]["content"] == "You said: yo"


async def test_stateless_wait_and_stream(sdk: LangGraphClient) -> None:
    threads = await sdk.threads.count()  # the module's app is shared: what earlier tests made stays
    out = one_state(await sdk.runs.wait(None, "counter", input={"increment": 2}))
    assert out["count"] == 2
    parts = [p async for p in sdk.runs.stream(None, "counter", input={"increment": 1}, stream_mode="updates")]
    assert parts[0].event == "metadata"
    assert any(p.event == "updates" and p.data == {"count": {"count": 1, "log": [""]}} for p in parts)
    assert await sdk.threads.count() == threads  # temporary threads are gone


async def test_stream_modes(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    modes: list[StreamMode] = ["values", "updates", "custom", "debug", "tasks", "checkpoints", "messages-tuple"]
    parts = [p async for p in sdk.runs.stream(tid, "counter", input={"increment": 1, "steps": 2, "tag": "t"},
                                              stream_mode=modes)]
    events = [p.event for p in parts]
    assert events[0] == "metadata" and "run_id" in parts[0].data
    for mode in ("values", "updates", "custom", "debug", "tasks", "checkpoints"):
        assert mode in events, mode
    custom = [p.data for p in parts if p.event == "custom"]
    assert custom == [{"step": 0, "tag": "t"}, {"step": 1, "tag": "t"}]
    assert [p.data for p in parts if p.event == "values"][-1]["count"] == 1


async def test_stream_messages(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    parts = [p async for p in sdk.runs.stream(tid, "echo", input={"message": "hello world"},
                                              stream_mode="messages-tuple")]
    chunks = [p.data for p in parts if p.event == "messages"]
    assert chunks and all(isinstance(c, list) and len(c) == 2 for c in chunks)
    text = "".join(c[0]["content"] for c in chunks if c[0]["type"] == "AIMessageChunk")
    assert text == "You said: hello world"
    assert chunks[0][1]["langgraph_node"] in ("incoming", "reply")
    legacy = [p async for p in sdk.runs.stream(tid, "echo", input={"message": "again"}, stream_mode="messages")]
    kinds = {p.event for p in legacy}
    assert "messages/metadata" in kinds and "messages/partial" in kinds


async def test_stream_subgraphs(sdk: LangGraphClient) -> None:
    parts = [p async for p in sdk.runs.stream(None, "nested", input={}, stream_mode="updates",
                                              stream_subgraphs=True)]
    names = [p.event for p in parts]
    assert "updates" in names
    assert any(n.startswith("updates|child:") for n in names), names


async def test_stream_events_mode(sdk: LangGraphClient) -> None:
    parts = [p async for p in sdk.runs.stream(None, "counter", input={}, stream_mode="events")]
    events = [(p.data["event"], p.data["name"]) for p in parts if p.event == "events"]
    # As LangGraph's server streams them: the graph's run around its node's, and no `on_chain_stream` of the
    # graph itself (its chunks are the run's other stream modes).
    assert events == [("on_chain_start", "counter"), ("on_chain_start", "count"), ("on_chain_stream", "count"),
                      ("on_chain_end", "count"), ("on_chain_end", "counter")], events
    root = next(p.data for p in parts if p.event == "events")
    assert "checkpoint_ns" not in root["metadata"] and root["metadata"]["graph_id"] == "counter"


async def test_stream_events_mode_beside_other_modes(sdk: LangGraphClient) -> None:
    """`events` with `values` and `updates`: each mode's events, interleaved as the graph runs."""
    parts = [p async for p in sdk.runs.stream(None, "counter", input={"increment": 2}, stream_mode=[
        "events", "values", "updates"])]
    names = [p.event if p.event != "events" else f"{p.data['event']}:{p.data['name']}" for p in parts]
    assert names == ["metadata", "on_chain_start:counter", "values", "on_chain_start:count", "on_chain_stream:count",
                     "on_chain_end:count", "updates", "values", "on_chain_end:counter"], names
    assert [p.data for p in parts if p.event == "updates"] == [{"count": {"count": 2, "log": [""]}}]


async def test_error_run(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    parts = [p async for p in sdk.runs.stream(tid, "failing", input={"reason": "kaput"})]
    err = [p for p in parts if p.event == "error"]
    assert err and err[0].data["error"] == "ValueError" and err[0].data["message"] == "kaput"
    runs = await sdk.runs.list(tid)
    assert runs[0]["status"] == "error"
    assert (await sdk.threads.get(tid))["status"] == "error"


async def test_interrupt_and_resume(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    out = one_state(await sdk.runs.wait(tid, "approval", input={"request": "deploy"}))
    assert out["__interrupt__"][0]["value"] == {"question": "Approve 'deploy'?"}
    thread = await sdk.threads.get(tid)
    assert thread["status"] == "interrupted"
    assert list(thread["interrupts"].values())[0][0]["value"]["question"] == "Approve 'deploy'?"
    state = await sdk.threads.get_state(tid)
    assert state["next"] == ["ask"] and state["tasks"][0]["interrupts"]
    streamed = [p async for p in sdk.runs.stream(tid, "approval", input={"request": "again"},
                                                 stream_mode="updates")]
    marker = [p.data["__interrupt__"] for p in streamed if p.event == "updates" and "__interrupt__" in p.data]
    assert marker and marker[0][0]["value"] == {"question": "Approve 'again'?"} and marker[0][0]["id"]
    out = one_state(await sdk.runs.wait(tid, "approval", command={"resume": True}))
    assert out["outcome"] == "done: again"
    assert (await sdk.threads.get(tid))["status"] == "idle"


async def test_interrupt_before(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "counter", input={"increment": 1}, interrupt_before=["count"])
    state = await sdk.threads.get_state(tid)
    assert state["next"] == ["count"]
    out = one_state(await sdk.runs.wait(tid, "counter", input=None))
    assert out["count"] == 1


async def test_unknown_assistant_and_thread(http: httpx.AsyncClient) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    r = await http.post(f"/threads/{tid}/runs", json={"assistant_id": "nope", "input": {}})
    assert r.status_code == 422 and "echo" in r.json()["detail"]
    r = await http.post(f"/threads/{tid}/runs", json={"assistant_id": str(uuid.uuid4()), "input": {}})
    assert r.status_code == 404
    missing = uuid.uuid4()
    r = await http.post(f"/threads/{missing}/runs", json={"assistant_id": "echo", "input": {}})
    assert r.status_code == 404
    r = await http.post(f"/threads/{missing}/runs/wait", json={"assistant_id": "counter", "input": {},
                                                               "if_not_exists": "create"})
    assert r.status_code == 200 and r.json()["count"] == 1
    r = await http.post(f"/threads/{tid}/runs", json={"assistant_id": "echo", "stream_mode": "bogus"})
    assert r.status_code == 422 and "stream_mode" in r.json()["detail"]
    r = await http.post(f"/threads/{tid}/runs", json={"assistant_id": "echo", "langsmith_tracer": "project"})
    assert r.status_code == 422 and "langsmith_tracer" in r.json()["detail"]  # an object: project_name, example_id
    r = await http.post(f"/threads/{tid}/runs/{uuid.uuid4()}/cancel")
    assert r.status_code == 404


async def test_cancel_really_stops_the_agent(sdk: LangGraphClient) -> None:
    from tests.project.agents import WORK_LOG

    tid = (await sdk.threads.create())["thread_id"]
    tag = uuid.uuid4().hex
    run = await sdk.runs.create(tid, "slow", input={"tag": tag, "steps": 100, "delay": 0.02})
    await until(logged(WORK_LOG, tag))
    await sdk.runs.cancel(tid, run["run_id"], wait=True)
    done_at_cancel = len([w for w in WORK_LOG if w.startswith(tag)])
    assert (await sdk.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    await agent_stopped(tag)
    assert len([w for w in WORK_LOG if w.startswith(tag)]) == done_at_cancel < 100
    thread = await sdk.threads.get(tid)
    assert thread["status"] == "interrupted" and wire(thread)["error"]["error"] == "UserInterrupt"


async def test_cancelling_a_synchronous_node_ends_the_run_when_the_node_returns(sdk: LangGraphClient) -> None:
    """A thread cannot be stopped: the run is `interrupted` once its node has returned, not before, so the
    thread's next run never overlaps the node's work, and a cancel with wait returns after it."""
    from tests.project.agents import WORK_LOG

    tid = (await sdk.threads.create())["thread_id"]
    tag, steps = uuid.uuid4().hex, 15
    run = await sdk.runs.create(tid, "slow_sync", input={"tag": tag, "steps": steps, "delay": 0.05})
    await until(logged(WORK_LOG, tag))
    await sdk.runs.cancel(tid, run["run_id"], wait=True)
    assert len([w for w in WORK_LOG if w.startswith(tag)]) == steps  # it had returned
    assert (await sdk.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    await sdk.runs.wait(tid, "slow_sync", input={"tag": "next", "steps": 1, "delay": 0})
    assert WORK_LOG.index("next:0") > WORK_LOG.index(f"{tag}:{steps - 1}")
    # The cancelled node's result was not kept.
    assert one_state((await sdk.threads.get_state(tid))["values"])["done"] == ["next"]


async def test_cancel_between_claim_and_start_stops_the_run_and_keeps_the_worker(runtime: Any,
                                                                                sdk: LangGraphClient) -> None:
    """A cancel that reaches the worker after it created the run's task but before that task first ran."""
    from tests.project.agents import WORK_LOG

    broker = runtime.broker
    registered = broker.on_cancel

    async def cancel_right_after_registration(run_id: str, callback: Any) -> Any:
        unregister = await registered(run_id, callback)
        asyncio.get_running_loop().call_soon(callback, "interrupt")  # runs before the task's first step
        return unregister

    broker.on_cancel = cancel_right_after_registration
    try:
        tid = (await sdk.threads.create())["thread_id"]
        run = await sdk.runs.create(tid, "slow", input={"tag": "early", "steps": 50, "delay": 0.02})
        await asyncio.wait_for(sdk.runs.join(tid, run["run_id"]), 20)  # a lost cancel leaves it running
        assert (await sdk.runs.get(tid, run["run_id"]))["status"] == "interrupted"
        assert not [w for w in WORK_LOG if w.startswith("early:")]
    finally:
        broker.on_cancel = registered
    # Every worker slot is still claiming: the early cancel did not kill the slot that held the run.
    assert all(not loop.done() for loop in runtime.workers._loops)
    after = one_state(await sdk.runs.wait(tid, "slow", input={"tag": "later", "steps": 1, "delay": 0}))
    assert after["done"] == ["later"]


async def test_cancel_pending_run_never_starts(sdk: LangGraphClient) -> None:
    from tests.project.agents import WORK_LOG

    tid = (await sdk.threads.create())["thread_id"]
    tag = uuid.uuid4().hex
    run = await sdk.runs.create(tid, "slow", input={"tag": tag, "steps": 1}, after_seconds=5)
    await sdk.runs.cancel(tid, run["run_id"])
    assert (await sdk.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    assert not any(w.startswith(tag) for w in WORK_LOG)
    assert (await sdk.threads.get(tid))["status"] == "idle"


async def test_cancel_rollback_deletes_run_and_checkpoints(sdk: LangGraphClient) -> None:
    from tests.project.agents import WORK_LOG

    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "slow", input={"tag": "first", "steps": 1})
    before = await sdk.threads.get_history(tid, limit=100)
    tag = uuid.uuid4().hex
    run = await sdk.runs.create(tid, "slow", input={"tag": tag, "steps": 100, "delay": 0.02})
    await until(logged(WORK_LOG, tag))  # running: a rollback deletes what it wrote
    await sdk.runs.cancel(tid, run["run_id"], wait=True, action="rollback")
    with pytest.raises(httpx.HTTPStatusError):
        await sdk.runs.get(tid, run["run_id"])
    after = await sdk.threads.get_history(tid, limit=100)
    assert [h["checkpoint"]["checkpoint_id"] for h in after] == [h["checkpoint"]["checkpoint_id"] for h in before]
    assert one_state((await sdk.threads.get_state(tid))["values"])["done"] == ["first"]
    assert (await sdk.threads.get(tid))["status"] == "idle"


async def test_delete_run(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    run = await sdk.runs.create(tid, "slow", input={"steps": 50, "delay": 0.02})
    r = await http.delete(f"/threads/{tid}/runs/{run['run_id']}")
    assert r.status_code == 409
    await sdk.runs.cancel(tid, run["run_id"], wait=True)
    await sdk.runs.delete(tid, run["run_id"])
    assert await sdk.runs.list(tid) == []


async def test_deleting_a_finished_run_leaves_its_threads_status(sdk: LangGraphClient) -> None:
    """A thread waiting on an interrupt stays `interrupted` when a finished run of it is deleted: only a thread
    left `busy` with no active run becomes idle."""
    tid = (await sdk.threads.create())["thread_id"]
    first = await sdk.runs.create(tid, "counter", input={"increment": 1})
    await sdk.runs.join(tid, first["run_id"])
    await sdk.runs.wait(tid, "approval", input={"request": "deploy"})
    assert (await sdk.threads.get(tid))["status"] == "interrupted"
    await sdk.runs.delete(tid, first["run_id"])
    assert (await sdk.threads.get(tid))["status"] == "interrupted"


async def test_a_thread_created_by_a_run_carries_the_run_metadata(sdk: LangGraphClient) -> None:
    """As the reference (probed): the new thread gets the graph, the assistant and the run's metadata; the run
    gets the assistant's metadata and its own (no thread existed to inherit from)."""
    tid = str(uuid.uuid4())
    run = await sdk.runs.create(tid, "echo", input=user_says("hi"),
                                metadata={"m": 3}, if_not_exists="create")
    assert run["metadata"] == {"created_by": "system", "m": 3, "assistant_id": run["assistant_id"]}
    await sdk.runs.join(tid, run["run_id"])
    thread = await sdk.threads.get(tid)
    assert thread["metadata"] == {"graph_id": "echo", "assistant_id": run["assistant_id"], "m": 3}


async def test_bulk_cancel_goes_on_when_one_run_finishes_meanwhile(runtime: Any, sdk: LangGraphClient) -> None:
    """`/runs/cancel` picks the active runs, then stops each: one finishing in between must not stop the rest."""
    done_tid = (await sdk.threads.create())["thread_id"]
    done = await sdk.runs.create(done_tid, "slow", input={"tag": "d", "steps": 1, "delay": 0})
    await sdk.runs.join(done_tid, done["run_id"])
    busy_tid = (await sdk.threads.create())["thread_id"]
    busy = await sdk.runs.create(busy_tid, "slow", input={"tag": "b", "steps": 500, "delay": 0.02})
    real = runtime.storage.get_run
    seen: set[str] = set()

    async def stale_once(run_id: str, **kwargs: Any) -> Any:  # the picking step saw `done` before it finished
        row = await real(run_id, **kwargs)
        if run_id == done["run_id"] and run_id not in seen:
            seen.add(run_id)
            return {**row, "status": "running"}
        return row

    runtime.storage.get_run = stale_once
    try:
        await runtime.runs.cancel_many(run_ids=[done["run_id"], busy["run_id"]])
    finally:
        runtime.storage.get_run = real
    await asyncio.wait_for(sdk.runs.join(busy_tid, busy["run_id"]), 20)
    assert (await sdk.runs.get(busy_tid, busy["run_id"]))["status"] == "interrupted"
    assert (await sdk.runs.get(done_tid, done["run_id"]))["status"] == "success"


async def test_a_finished_run_has_its_checkpoints_committed(sdk: LangGraphClient, database_url: str) -> None:
    """On SQLite an `async`-durability run's checkpoints are committed in groups: by the time the run is
    reported finished they are committed, as another connection sees."""
    if not database_url.startswith("sqlite"):
        pytest.skip("group commit is the embedded backend's")
    import sqlite3

    tid = (await sdk.threads.create())["thread_id"]
    out = one_state(await sdk.runs.wait(tid, "counter", input={"increment": 2}))
    assert out["count"] == 2
    other = sqlite3.connect(database_url.removeprefix("sqlite:///"))
    try:
        kept = other.execute("SELECT count(*) FROM checkpoints WHERE thread_id = ?", (tid,)).fetchone()[0]
    finally:
        other.close()
    assert kept == len(await sdk.threads.get_history(tid, limit=100)) > 1
