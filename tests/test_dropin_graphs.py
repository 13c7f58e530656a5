"""Graphs written as users write them for `langgraph dev` behave here as there (issue 13, "Runs and graphs"):
a `Runtime[Context]` graph run without a context, factories of every shape LangGraph's server accepts,
`typing.TypedDict` state on Python 3.11, static breakpoints, state updates of a factory graph."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.runtime import ServerRuntime

from tests.project.userstyle import FACTORY_CALLS, greeter
from tests.sdk_shapes import one_state
from tests.shared_app import shared_app
from tests.waits import logged, until
from threadline.core.graphs import GraphEntry, GraphRegistry

# The module's tests share one started app per backend (tests/conftest.py, `module_served`): each reads what it
# made, under ids and tags of its own. They run in the app's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http = shared_app()


@pytest.fixture(autouse=True)
def _no_factory_calls() -> None:
    FACTORY_CALLS.clear()


async def test_runtime_context_without_context_gets_the_schema_defaults(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    out = await sdk.runs.wait(tid, "greeter", input={"text": "bob"})
    assert out == {"text": "hello bob!"}
    # A context given in part fills the rest from the defaults; the assistant's context is under the run's.
    out = await sdk.runs.wait(tid, "greeter", input={"text": "ann"}, context={"greeting": "hi"})
    assert out == {"text": "hi ann!"}
    mine = await sdk.assistants.create("greeter", context={"greeting": "hey", "punctuation": "?"})
    out = await sdk.runs.wait(None, mine["assistant_id"], input={"text": "al"}, context={"greeting": "yo"})
    assert out == {"text": "yo al?"}


FACTORIES = ["config_runtime", "runtime_only", "config_only", "bare", "managed"]
# Which factories build their nodes from the assistant's config (the others ignore it).
READS_CONFIG = {"config_runtime", "config_only", "managed"}


@pytest.mark.parametrize("graph_id", FACTORIES)
async def test_every_factory_shape_runs_draws_and_describes(sdk: LangGraphClient, graph_id: str) -> None:
    mine = await sdk.assistants.create(graph_id, config={"configurable": {"prefix": "p"}})
    prefix = "p" if graph_id in READS_CONFIG else "step"
    tid = (await sdk.threads.create())["thread_id"]
    out = await sdk.runs.wait(tid, mine["assistant_id"], input={"text": "x"})
    assert out == {"text": "x", "trail": [f"{prefix}_one", f"{prefix}_two"]}
    assert (await sdk.threads.get_state(tid))["values"] == out
    drawn = await sdk.assistants.get_graph(mine["assistant_id"])
    assert [n["id"] for n in drawn["nodes"]] == ["__start__", f"{prefix}_one", f"{prefix}_two", "__end__"]
    schemas = await sdk.assistants.get_schemas(mine["assistant_id"])
    assert set(schemas["state_schema"]["properties"]) == {"text", "trail"}
    assert set(schemas["input_schema"]["properties"]) == {"text", "trail"}
    calls = [call for call in FACTORY_CALLS if call[0] == graph_id]
    assert calls, "the factory was not called"
    if graph_id in ("config_runtime", "runtime_only", "managed"):
        # The runtime tells the factory why it is called, as LangGraph's ServerRuntime does.
        assert {access for _, access, _ in calls} >= {"threads.create_run", "assistants.read", "threads.read"}
    if graph_id in READS_CONFIG:
        assert all(configurable.get("prefix") == "p" for _, _, configurable in calls)


async def test_a_runs_context_is_in_its_configurable_too(sdk: LangGraphClient) -> None:
    """As on LangGraph's server, a factory (and a node) finds the request's context in `configurable`."""
    mine = await sdk.assistants.create("config_runtime", context={"prefix": "p", "team": "a"})
    await sdk.runs.wait(None, mine["assistant_id"], input={"text": "x"}, context={"team": "b", "extra": 1})
    [(_, _, configurable)] = [c for c in FACTORY_CALLS if c[1] == "threads.create_run"]
    assert configurable["prefix"] == "p" and configurable["team"] == "b" and configurable["extra"] == 1


async def test_factory_runtime_carries_the_run_context_and_the_store() -> None:
    seen: list[ServerRuntime[Any]] = []

    def factory(config: dict[str, Any], runtime: ServerRuntime[Any]) -> Any:
        seen.append(runtime)
        return greeter

    registry = GraphRegistry({"g": GraphEntry("g", "spec", factory)})
    store = object()
    async with registry.graph("g", {}, access="threads.create_run", store=store, context={"greeting": "a"}):
        pass
    async with registry.graph("g", {}, access="threads.read", store=store):
        pass
    run_rt, read_rt = seen
    execution = run_rt.execution_runtime  # how a factory reads the run's context (the SDK's typed narrowing)
    assert run_rt.access_context == "threads.create_run" and execution is run_rt
    assert execution.context == {"greeting": "a"} and run_rt.store is store
    assert read_rt.access_context == "threads.read" and read_rt.execution_runtime is None


async def test_update_state_of_a_factory_graph_uses_the_assistants_config(sdk: LangGraphClient) -> None:
    mine = await sdk.assistants.create("config_runtime", config={"configurable": {"prefix": "p"}})
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, mine["assistant_id"], input={"text": "x"})
    await sdk.threads.update_state(tid, {"text": "y"}, as_node="p_two")
    state = await sdk.threads.get_state(tid)
    assert state["values"] == {"text": "y", "trail": ["p_one", "p_two"]} and state["next"] == []
    # As a node with a successor: the thread now waits for that node.
    await sdk.threads.update_state(tid, {"text": "z"}, as_node="p_one")
    state = await sdk.threads.get_state(tid)
    assert state["next"] == ["p_two"]
    history = await sdk.threads.get_history(tid, limit=2)
    assert history[0]["next"] == ["p_two"]
    assert all(configurable.get("prefix") == "p" for g, _, configurable in FACTORY_CALLS if g == "config_runtime")
    assert {access for g, access, _ in FACTORY_CALLS if g == "config_runtime"} >= {"threads.update", "threads.read"}


async def test_typing_typeddict_state_has_schemas(sdk: LangGraphClient) -> None:
    schemas = await sdk.assistants.get_schemas("greeter")
    for key in ("input_schema", "output_schema", "state_schema"):
        assert set(schemas[key]["properties"]) == {"text", "trail"}, key
    assert schemas["context_schema"]["properties"]["greeting"]["default"] == "hello"
    sub = await sdk.assistants.get_subgraphs("greeter")
    assert sub == {}


@pytest.mark.parametrize("breakpoint", [{"interrupt_before": ["child"]}, {"interrupt_after": ["parent_step"]}])
async def test_static_breakpoint_leaves_the_thread_interrupted(sdk: LangGraphClient, breakpoint: dict) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    out = await sdk.runs.wait(tid, "nested", input={"items": []}, **breakpoint)
    assert out == {"items": ["parent"]}  # no `__interrupt__`: nothing asked a question
    thread = await sdk.threads.get(tid)
    assert thread["status"] == "interrupted" and thread["interrupts"] == {}
    assert (await sdk.threads.get_state(tid))["next"] == ["child"]
    [run] = await sdk.runs.list(tid)
    assert run["status"] == "success"  # as on LangGraph's server: the run itself succeeded
    out = await sdk.runs.wait(tid, "nested", input=None)
    assert out == await sdk.runs.wait(None, "nested", input={"items": []})  # as if it had never stopped
    assert (await sdk.threads.get(tid))["status"] == "idle"


async def test_state_update_as_a_node_with_successors_interrupts_the_thread(http: httpx.AsyncClient,
                                                                            sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "nested", input={"items": []})
    assert (await sdk.threads.get(tid))["status"] == "idle"
    await sdk.threads.update_state(tid, {"items": ["x"]}, as_node="parent_step")
    assert (await sdk.threads.get(tid))["status"] == "interrupted"


async def test_typing_typeddict_chat_is_an_mcp_tool_and_takes_a2a_text(http: httpx.AsyncClient) -> None:
    listed = await http.post("/mcp", headers={"Accept": "application/json, text/event-stream"},
                             json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    tools = {t["name"]: t for t in listed.json()["result"]["tools"]}
    assert tools["chat"]["inputSchema"]["properties"]["messages"]["type"] == "string"
    called = await http.post("/mcp", headers={"Accept": "application/json, text/event-stream"}, json={
        "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "chat", "arguments": {"messages": "hi"}}})
    assert called.json()["result"]["structuredContent"]["messages"][-1]["content"] == "Heard: hi"

    chat = (await http.get("/assistants/chat")).json()["assistant_id"]
    sent = await http.post(f"/a2a/{chat}", headers={"Accept": "application/json"}, json={
        "jsonrpc": "2.0", "id": "1", "method": "message/send", "params": {"message": {
            "kind": "message", "role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hello"}]}}})
    task = sent.json()["result"]
    assert task["status"]["state"] == "completed", sent.json()
    assert task["artifacts"][0]["parts"] == [{"kind": "text", "text": "Heard: hello"}]


async def test_prune_delete_deletes_the_threads(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    done = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(done, "counter", input={"tag": "a"})
    busy = (await sdk.threads.create())["thread_id"]
    run = await sdk.runs.create(busy, "slow", input={"tag": "prune", "steps": 200, "delay": 0.02})
    kept = (await sdk.threads.create())["thread_id"]
    r = await http.post("/threads/prune", json={"thread_ids": [done, busy, str(uuid.uuid4())]})
    assert r.status_code == 200 and r.json() == {"pruned_count": 2}
    for gone in (done, busy):
        assert (await http.get(f"/threads/{gone}")).status_code == 404
        assert (await http.post("/threads/search", json={"ids": [gone]})).json() == []
    assert (await http.get(f"/threads/{kept}")).status_code == 200
    assert (await http.get(f"/runs/{run['run_id']}")).status_code == 404  # with its runs
    # keep_latest (ours) keeps the thread.
    await sdk.runs.wait(kept, "counter", input={"tag": "b"})
    r = await http.post("/threads/prune", json={"thread_ids": [kept], "strategy": "keep_latest"})
    assert r.json() == {"pruned_count": 1} and (await http.get(f"/threads/{kept}")).status_code == 200


async def test_state_update_while_a_run_is_active_is_409(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "slow", input={"tag": "first", "steps": 1})
    before = await sdk.threads.get_history(tid, limit=100)
    running = await sdk.runs.create(tid, "slow", input={"tag": "busy", "steps": 200, "delay": 0.02})
    pending = await sdk.runs.create(tid, "slow", input={"tag": "next", "steps": 1})
    for body in ({"values": {"tag": "x"}}, {"values": {"tag": "x"}, "as_node": "work"}):
        r = await http.post(f"/threads/{tid}/state", json=body)
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert detail.startswith(f"Thread {tid} has in-flight runs: ") and running["run_id"] in detail
    await sdk.runs.cancel(tid, running["run_id"], wait=True)
    r = await http.post(f"/threads/{tid}/state", json={"values": {"tag": "x"}})  # the pending one still counts
    assert r.status_code == 409 and pending["run_id"] in r.json()["detail"]
    await sdk.runs.join(tid, pending["run_id"])
    history = await sdk.threads.get_history(tid, limit=100)
    assert not any(one_state(c["values"]).get("tag") == "x" for c in history) and len(history) > len(before)
    r = await http.post(f"/threads/{tid}/state", json={"values": {"tag": "x"}})
    assert r.status_code == 200 and one_state((await sdk.threads.get_state(tid))["values"])["tag"] == "x"


async def test_an_agent_calls_its_own_server_with_get_client(sdk: LangGraphClient) -> None:
    """`langgraph_sdk.get_client()` without a URL, in a node, reaches this server in-process."""
    tid = (await sdk.threads.create())["thread_id"]
    out = one_state(await sdk.runs.wait(tid, "caller", input={"text": "ping"}))
    assert "error" not in out and "__error__" not in out, out
    assert {"caller", "echo", "greeter"} <= set(out["assistants"])
    assert out["answer"]["messages"][-1]["content"] == "You said: ping"
    # The run it started is a run of this server, on a thread of its own, not a part of the caller's run.
    threads = await sdk.threads.search(metadata={"graph_id": "echo"}, limit=100)
    assert threads and all(t["thread_id"] != tid for t in threads)
    [run] = await sdk.runs.list(threads[0]["thread_id"])
    assert run["status"] == "success" and run["assistant_id"] == (await sdk.assistants.get("echo"))["assistant_id"]


async def _working(tag: str) -> None:
    from tests.project.agents import WORK_LOG

    await until(logged(WORK_LOG, f"{tag}:"))


async def test_cancel_answers_once_the_status_has_changed(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    """As on LangGraph's server: when the 202 of a cancel arrives, a GET already shows the run stopped."""
    for i in range(5):
        tid = (await sdk.threads.create())["thread_id"]
        run = await sdk.runs.create(tid, "slow", input={"tag": f"c{i}", "steps": 500, "delay": 0.01})
        await _working(f"c{i}")
        r = await http.post(f"/threads/{tid}/runs/{run['run_id']}/cancel")
        assert r.status_code == 202
        assert (await sdk.runs.get(tid, run["run_id"]))["status"] == "interrupted"
        assert (await sdk.threads.get(tid))["status"] == "interrupted"
    # The Agent Protocol's cancel, and cancelling many, too.
    tid = (await sdk.threads.create())["thread_id"]
    run = await sdk.runs.create(tid, "slow", input={"tag": "ap", "steps": 500, "delay": 0.01})
    await _working("ap")
    assert (await http.post(f"/runs/{run['run_id']}/cancel")).status_code == 204
    assert (await sdk.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    tid = (await sdk.threads.create())["thread_id"]
    run = await sdk.runs.create(tid, "slow", input={"tag": "many", "steps": 500, "delay": 0.01})
    await _working("many")
    assert (await http.post("/runs/cancel", json={"run_ids": [run["run_id"]]})).status_code == 204
    assert (await sdk.runs.get(tid, run["run_id"]))["status"] == "interrupted"


async def test_deleting_an_assistant_cancels_its_runs(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    from tests.project.agents import WORK_LOG

    mine = await sdk.assistants.create("slow")
    tid = (await sdk.threads.create())["thread_id"]
    running = await sdk.runs.create(tid, mine["assistant_id"], input={"tag": "doomed", "steps": 500, "delay": 0.01})
    queued = await sdk.runs.create(tid, mine["assistant_id"], input={"tag": "queued", "steps": 1})
    later = await sdk.runs.create(None, mine["assistant_id"], input={"tag": "later", "steps": 1}, after_seconds=1,
                                  on_completion="keep")
    other = await sdk.runs.create(None, "slow", input={"tag": "other", "steps": 3}, on_completion="keep")
    await _working("doomed")
    assert (await http.delete(f"/assistants/{mine['assistant_id']}")).status_code == 204
    for run in (running, queued, later):
        assert (await http.get(f"/runs/{run['run_id']}")).json()["status"] == "interrupted"
    done = sum(w.startswith("doomed:") for w in WORK_LOG)
    await asyncio.sleep(1.3)  # past `later`'s start: nothing of the assistant runs, nor fails
    assert sum(w.startswith("doomed:") for w in WORK_LOG) == done
    assert not any(w.startswith(("queued:", "later:")) for w in WORK_LOG)
    for run in (running, queued, later):
        assert (await http.get(f"/runs/{run['run_id']}")).json()["status"] == "interrupted"
    assert (await http.get(f"/runs/{other['run_id']}/wait")).json()["run"]["status"] == "success"
    assert (await sdk.threads.get(tid))["status"] != "busy"


async def test_a_run_whose_assistant_is_gone_when_it_starts_ends_interrupted(sdk: LangGraphClient,
                                                                             http: httpx.AsyncClient,
                                                                             runtime: Any) -> None:
    """The window of `DELETE /assistants/{id}` between the delete and its runs' cancel: a run claimed there
    (here: due after the assistant's row went, and never cancelled) ends as the cancel would have ended it."""
    mine = await sdk.assistants.create("slow")
    run = await sdk.runs.create(None, mine["assistant_id"], input={"tag": "orphan", "steps": 1}, after_seconds=1,
                                on_completion="keep")
    assert await runtime.storage.delete_assistant(mine["assistant_id"])  # the row only: no cancel is sent
    ended = (await http.get(f"/runs/{run['run_id']}/wait")).json()
    assert ended["run"]["status"] == "interrupted", ended


async def test_deleting_an_assistant_with_delete_threads(sdk: LangGraphClient, http: httpx.AsyncClient) -> None:
    mine = (await sdk.assistants.create("counter"))["assistant_id"]
    last_ran = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(last_ran, "counter", input={"increment": 1})
    await sdk.runs.wait(last_ran, mine, input={"increment": 1})
    ran_before_another = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(ran_before_another, mine, input={"increment": 1})
    await sdk.runs.wait(ran_before_another, "counter", input={"increment": 1})
    only_named = (await sdk.threads.create(metadata={"graph_id": "counter", "assistant_id": mine}))["thread_id"]
    busy = (await sdk.threads.create())["thread_id"]
    slow = (await sdk.assistants.create("slow"))["assistant_id"]
    run = await sdk.runs.create(busy, slow, input={"tag": "busy", "steps": 500, "delay": 0.01})
    await _working("busy")

    r = await http.delete(f"/assistants/{mine}", params={"delete_threads": "true"})
    assert r.status_code == 204
    assert (await http.get(f"/threads/{last_ran}")).status_code == 404
    assert (await http.get(f"/threads/{ran_before_another}")).status_code == 200
    assert (await http.get(f"/threads/{only_named}")).status_code == 200
    assert (await http.delete(f"/assistants/{mine}")).status_code == 404
    # A thread whose run is still going: the run is stopped and the thread deleted with it.
    assert (await http.delete(f"/assistants/{slow}?delete_threads=true")).status_code == 204
    assert (await http.get(f"/threads/{busy}")).status_code == 404
    assert (await http.get(f"/runs/{run['run_id']}")).status_code == 404
    # Without it, the threads stay.
    keep = (await sdk.assistants.create("counter"))["assistant_id"]
    kept = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(kept, keep, input={"increment": 1})
    assert (await http.delete(f"/assistants/{keep}")).status_code == 204
    assert (await http.get(f"/threads/{kept}")).status_code == 200


async def test_a_remote_subgraph_is_described_without_schemas() -> None:
    """A node that is a `RemoteGraph` is a subgraph to LangGraph but has no local schemas: it is listed with
    null schemas (before, `describe_schemas` called a method RemoteGraph lacks, and the request failed)."""
    from langgraph.graph import START, StateGraph
    from langgraph.pregel.remote import RemoteGraph
    from typing_extensions import TypedDict

    from threadline.core.graphs import subgraph_schemas

    class State(TypedDict):
        text: str

    remote = RemoteGraph("elsewhere", url="http://127.0.0.1:9")  # never called: describing it sends nothing
    graph = StateGraph(State).add_node("far", remote).add_edge(START, "far").compile()
    assert subgraph_schemas(graph, None, recurse=False) == {"far": {
        "input_schema": None, "output_schema": None, "state_schema": None, "config_schema": None,
        "context_schema": None}}
