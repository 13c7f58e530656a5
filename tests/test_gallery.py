"""The gallery (tests/gallery/): every graph style LangGraph's docs teach, served by Threadline on each backend
and driven through every surface: REST with langgraph-sdk (wait, background + join, state, history), stream
modes, schemas, MCP (the official client), A2A `message/send`, and Protocol v2 (`client.threads.stream`).

Every graph passes on every surface; a difference from LangGraph's server is the differential suite's business
(tests/differential/accepted.py).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from langgraph_sdk import get_client
from langgraph_sdk.schema import Command
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent

from tests.conftest import serving
from tests.sdk_shapes import one_state
from tests.services import Backend
from threadline.settings import Settings

GALLERY = Path(__file__).parent / "gallery" / "langgraph.json"
Check = Callable[[dict[str, Any]], None]


def _last_message(text: str) -> Check:
    def check(values: dict[str, Any]) -> None:
        assert values["messages"][-1]["type"] == "ai" and values["messages"][-1]["content"] == text, values
    return check


def _equals(expected: dict[str, Any]) -> Check:
    def check(values: dict[str, Any]) -> None:
        assert {k: v for k, v in values.items() if k != "__interrupt__"} == expected
    return check


_WEATHER = "The weather: sunny in Paris."
#: graph id -> (input, check of the final values)
CASES: dict[str, tuple[dict[str, Any], Check]] = {
    "typed": ({"topic": "owls"}, _equals({"topic": "owls", "notes": ["draft about owls", "reviewed 1 note(s)"]})),
    "typed_ext": ({"topic": "owls"}, _equals({"topic": "owls", "notes": ["draft about owls", "reviewed 1 note(s)"]})),
    "pydantic_state": ({"item": "tea", "quantity": 3},
                       _equals({"item": "tea", "quantity": 3, "total": 7.5, "status": "confirmed 3 x tea"})),
    "dataclass_state": ({"word": "hello"}, _equals({"word": "hello", "letters": 5, "seen": ["hello"]})),
    "messages": ({"messages": [{"role": "user", "content": "hi"}]}, _last_message("Answer to: hi")),
    "react": ({"messages": [{"role": "user", "content": "Paris"}]}, _last_message(_WEATHER)),
    "agent": ({"messages": [{"role": "user", "content": "Paris"}]}, _last_message(_WEATHER)),
    "context": ({"name": "Ada"}, _equals({"name": "Ada", "reply": "Hello, Ada!"})),
    "functional": ({"numbers": [1, 2, 3]}, _equals({"squares": [1, 4, 9]})),
    "subgraphs": ({"path": "start"}, _equals({"path": "start > parent > child"})),
    "command": ({"amount": 5}, _equals({"amount": 5, "route": "triage->approve->approved"})),
    "send": ({"subjects": ["cats", "dogs"]}, _equals({"subjects": ["cats", "dogs"],
                                                      "jokes": ["a joke about cats", "a joke about dogs"]})),
    "static_interrupt": ({"task": "deploy"}, _equals({"task": "deploy", "log": ["planned deploy"]})),
    "dynamic_interrupt": ({"task": "deploy"}, _equals({"task": "deploy", "log": ["planned deploy"]})),
    "factory_config": ({"text": "Hi There"}, _equals({"text": "hi there"})),
    "factory_runtime": ({"text": "Hi There"}, _equals({"text": "hi there"})),
    "progress": ({"steps": 2, "delay": 0.01}, _equals({"steps": 2, "delay": 0.01, "done": [0, 1]})),
    "loopback": ({"graph_id": "typed_ext"}, _equals({"graph_id": "typed_ext", "found": 1})),
}
# One server per backend for the module: each test makes threads and runs of its own, and reads only those
# (it used to be one server per test: 126 of them). The tests run in the server's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def url(module_backend: Backend) -> AsyncIterator[str]:
    settings = Settings(config=str(GALLERY), workers=4, heartbeat_seconds=5.0, **module_backend.settings())
    async with serving(settings) as base:
        yield base


# --- REST: wait, background + join, state, history ----------------------------------------------------
@pytest.mark.parametrize("graph", list(CASES))
async def test_rest(url: str, graph: str) -> None:
    client = get_client(url=url)
    given, check = CASES[graph]
    thread = await client.threads.create()
    tid = thread["thread_id"]
    waited = one_state(await client.runs.wait(tid, graph, input=given))
    assert "__error__" not in waited, waited
    check(waited)
    state = await client.threads.get_state(tid)
    check(one_state(state["values"]))
    history = await client.threads.get_history(tid, limit=100)
    assert history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert history[-1]["metadata"]["source"] == "input"

    other = (await client.threads.create())["thread_id"]
    run = await client.runs.create(other, graph, input=given)
    joined = await client.runs.join(other, run["run_id"])
    check(joined)
    assert (await client.runs.get(other, run["run_id"]))["status"] == "success"
    check(one_state(await client.runs.wait(None, graph, input=given)))  # stateless


# --- stream modes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("graph", list(CASES))
async def test_stream_modes(url: str, graph: str) -> None:
    client = get_client(url=url)
    given, check = CASES[graph]
    tid = (await client.threads.create())["thread_id"]
    parts = [p async for p in client.runs.stream(tid, graph, input=given, stream_subgraphs=graph == "subgraphs",
                                                  stream_mode=["values", "updates", "messages-tuple", "custom",
                                                               "debug"])]
    events = [p.event.split("|")[0] for p in parts]
    assert events[0] == "metadata" and "error" not in events, parts
    check([p.data for p in parts if p.event == "values"][-1])
    assert "updates" in events and "debug" in events
    if graph in ("messages", "react", "agent"):
        chunks = [p.data[0] for p in parts if p.event == "messages"]
        assert chunks and all(isinstance(c, dict) and "content" in c for c in chunks)
        text = "".join(c["content"] for c in chunks if c.get("type", "").startswith("AIMessage") or c["type"] == "ai")
        assert text.endswith(("Answer to: hi", _WEATHER)), chunks
    if graph in ("subgraphs", "progress"):
        custom = [p.data for p in parts if p.event.startswith("custom")]
        assert custom == ([{"progress": "before the child"}, {"progress": "inside the child"}]
                          if graph == "subgraphs" else [{"step": 0}, {"step": 1}])
    if graph == "subgraphs":
        assert any(p.event.startswith("updates|child:") for p in parts)


@pytest.mark.parametrize("graph", list(CASES))
async def test_schemas(url: str, graph: str) -> None:
    client = get_client(url=url)
    assistant = (await client.assistants.search(graph_id=graph))[0]["assistant_id"]
    drawn = await client.assistants.get_graph(assistant)
    assert {n["id"] for n in drawn["nodes"]} >= {"__start__", "__end__"}, drawn
    schemas = await client.assistants.get_schemas(assistant)
    assert schemas["graph_id"] == graph
    if graph == "functional":  # an entrypoint taking a plain `dict`: an object schema without properties
        assert schemas["input_schema"]["type"] == "object"
        return
    given = CASES[graph][0]
    assert set(given) <= set(schemas["state_schema"]["properties"]), schemas["state_schema"]
    assert set(given) <= set(schemas["input_schema"]["properties"]), schemas["input_schema"]


# --- context, interrupts ----------------------------------------------------------------------------------
async def test_runtime_context_given_and_from_an_assistant(url: str) -> None:
    client = get_client(url=url)
    given = one_state(await client.runs.wait(None, "context", input={"name": "Ada"}, context={"greeting": "Bonjour"}))
    assert given["reply"] == "Bonjour, Ada!"
    assistant = await client.assistants.create("context", context={"greeting": "Hi", "punctuation": "?"})
    from_assistant = one_state(await client.runs.wait(None, assistant["assistant_id"], input={"name": "Ada"}))
    assert from_assistant["reply"] == "Hi, Ada?"


async def test_dynamic_interrupt_resumed_with_command(url: str) -> None:
    client = get_client(url=url)
    tid = (await client.threads.create())["thread_id"]
    first = one_state(await client.runs.wait(tid, "dynamic_interrupt", input={"task": "ship"}))
    assert first["__interrupt__"][0]["value"] == {"question": "May I ship?"}
    thread = await client.threads.get(tid)
    assert thread["status"] == "interrupted"
    done = one_state(await client.runs.wait(tid, "dynamic_interrupt", command=Command(resume="yes")))
    assert done["log"] == ["planned ship", "human said yes", "did ship"]
    assert (await client.threads.get(tid))["status"] == "idle"


async def test_static_breakpoint_resumed_with_no_input(url: str) -> None:
    client = get_client(url=url)
    tid = (await client.threads.create())["thread_id"]
    await client.runs.wait(tid, "static_interrupt", input={"task": "ship"})
    assert (await client.threads.get_state(tid))["next"] == ["act"]
    assert (await client.threads.get(tid))["status"] == "interrupted"
    done = one_state(await client.runs.wait(tid, "static_interrupt", input=None))
    assert done["log"] == ["planned ship", "did ship"]


async def test_functional_interrupt_resumed(url: str) -> None:
    client = get_client(url=url)
    tid = (await client.threads.create())["thread_id"]
    review: dict[str, Any] = {"numbers": [2, 3], "review": True}
    await client.runs.wait(tid, "functional", input=review)
    assert (await client.threads.get(tid))["status"] == "interrupted"
    done = await client.runs.wait(tid, "functional", command=Command(resume="keep"))
    assert done == {"squares": [4, 9], "verdict": "keep"}


# --- MCP, A2A, Protocol v2 ------------------------------------------------------------------------------------
async def _mcp_tools(url: str) -> dict[str, Any]:
    async with streamable_http_client(f"{url}/mcp") as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        return {t.name: t for t in (await session.list_tools()).tools}


async def test_mcp_lists_and_calls_gallery_graphs(url: str) -> None:
    tools = await _mcp_tools(url)
    assert set(CASES) <= set(tools)
    assert set(tools["typed_ext"].input_schema["properties"]) >= {"topic"}
    async with streamable_http_client(f"{url}/mcp") as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for graph in ("typed_ext", "pydantic_state", "dataclass_state", "functional", "messages"):
            given = {"messages": "hi"} if graph == "messages" else CASES[graph][0]
            done = await session.call_tool(graph, given)
            assert not done.is_error, (graph, done.content)
            text = done.content[0]
            assert isinstance(text, TextContent), done.content
            CASES[graph][1](json.loads(text.text))


@pytest.mark.parametrize("graph", ["messages", "react", "agent"])
async def test_a2a_message_send_with_text(url: str, graph: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assistant = (await http.post("/assistants/search", json={"graph_id": graph})).json()[0]["assistant_id"]
        message = {"kind": "message", "role": "user", "messageId": str(uuid.uuid4()),
                   "parts": [{"kind": "text", "text": "hi" if graph == "messages" else "Paris"}]}
        r = await http.post(f"/a2a/{assistant}", json={"jsonrpc": "2.0", "id": "1", "method": "message/send",
                                                        "params": {"message": message}})
    task = r.json()["result"]
    assert task["status"]["state"] == "completed", task
    expected = "Answer to: hi" if graph == "messages" else _WEATHER
    assert task["artifacts"][0]["parts"] == [{"kind": "text", "text": expected}]


async def test_protocol_v2_streams_messages_and_answers_an_interrupt(url: str) -> None:
    client = get_client(url=url)
    async with client.threads.stream(assistant_id="react") as thread:
        await thread.run.start(input={"messages": [{"role": "user", "content": "Paris"}]})
        out = await thread.output.with_timeout(30)
    assert out["messages"][-1]["content"] in (_WEATHER, [{"type": "text", "text": _WEATHER}]) or \
        "sunny in Paris" in json.dumps(out["messages"][-1]["content"])
    async with client.threads.stream(assistant_id="dynamic_interrupt") as thread:
        await thread.run.start(input={"task": "ship"})
        for _ in range(600):
            if thread.interrupted:
                break
            await asyncio.sleep(0.05)
        assert thread.interrupts[0]["value"] == {"question": "May I ship?"}
        await thread.run.respond("yes")
        out = await thread.output.with_timeout(30)
    assert out["log"] == ["planned ship", "human said yes", "did ship"]
