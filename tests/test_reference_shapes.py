"""Shapes clients read that the differential suite found different from LangGraph's server (langgraph-api
0.16.7), each fixed here and checked on the gallery's graphs (tests/gallery/), served in-process on each backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from langgraph.types import Interrupt
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import StreamMode
from pydantic import BaseModel

from tests.sdk_shapes import batch_entry, copy_thread, one_state, user_says, wire
from tests.services import Backend
from tests.shared_app import shared_app
from threadline.core.state import interrupt_json, run_output
from threadline.settings import Settings

GALLERY = Path(__file__).parent / "gallery" / "langgraph.json"


# The module's tests share one started app per backend (tests/conftest.py, `module_served`), on the gallery's
# project: each reads what it made. They run in the app's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http = shared_app()


@pytest.fixture(scope="module")
def module_settings(module_backend: Backend) -> Settings:
    return Settings(config=str(GALLERY), workers=4, heartbeat_seconds=5.0, **module_backend.settings())


# --- /wait outputs -------------------------------------------------------------------------------------------
async def test_wait_output_of_an_interrupt_has_response_schema(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    out = one_state(await sdk.runs.wait(tid, "dynamic_interrupt", input={"task": "ship"}))
    assert out["__interrupt__"] == [{"value": {"question": "May I ship?"}, "id": out["__interrupt__"][0]["id"],
                                     "response_schema": None}]
    # The thread and its state show the interrupt without the null schema, as the reference does.
    assert "response_schema" not in (await sdk.threads.get_state(tid))["tasks"][0]["interrupts"][0]


async def test_wait_output_of_an_entrypoint_stopped_at_interrupt(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    given: dict[str, Any] = {"numbers": [2, 3], "review": True}
    out = one_state(await sdk.runs.wait(tid, "functional", input=given))
    assert list(out) == ["__interrupt__"]
    assert out["__interrupt__"][0]["value"] == {"question": "Keep these squares?", "squares": [4, 9]}
    joined = await sdk.runs.join(tid, (await sdk.runs.list(tid))[0]["run_id"])
    assert joined == out


class Answer(BaseModel):
    approved: bool


async def test_an_interrupts_response_schema_is_json_schema() -> None:
    given = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    assert interrupt_json(Interrupt(value=1, id="a", response_schema=given))["response_schema"] == given
    typed = interrupt_json(Interrupt(value=1, id="b", response_schema=Answer))["response_schema"]
    assert typed["properties"] == {"approved": {"title": "Approved", "type": "boolean"}}
    state = {"values": {"x": 1}, "tasks": [{"id": "t", "interrupts": [interrupt_json(Interrupt(value=1, id="c"))]}]}
    assert run_output(state) == {"x": 1, "__interrupt__": [{"value": 1, "id": "c", "response_schema": None}]}


# --- stream events ---------------------------------------------------------------------------------------------
async def test_messages_with_messages_tuple_sends_the_tuples_alone(sdk: LangGraphClient) -> None:
    parts = [p async for p in sdk.runs.stream(None, "messages", input=user_says("hi"),
                                              stream_mode=["messages", "messages-tuple"])]
    events = {p.event for p in parts}
    assert "messages" in events and not {e for e in events if e.startswith("messages/")}, events
    alone = [p async for p in sdk.runs.stream(None, "messages", input=user_says("hi"), stream_mode="messages")]
    assert {"messages/metadata", "messages/partial"} <= {p.event for p in alone}


async def test_a_stateless_run_streams_no_checkpoints(sdk: LangGraphClient) -> None:
    modes: list[StreamMode] = ["checkpoints", "debug", "values"]
    parts = [p async for p in sdk.runs.stream(None, "typed", input={"topic": "owls"}, stream_mode=modes)]
    assert "checkpoints" not in {p.event for p in parts}
    debug = [p.data["type"] for p in parts if p.event == "debug"]
    assert debug == ["task", "task_result", "task", "task_result"], debug
    assert [p.data for p in parts if p.event == "values"][-1]["notes"] == ["draft about owls", "reviewed 1 note(s)"]
    # On a thread (and on a stateless run whose thread is kept) the checkpoints are there to read: sent.
    tid = (await sdk.threads.create())["thread_id"]
    parts = [p async for p in sdk.runs.stream(tid, "typed", input={"topic": "owls"}, stream_mode=modes)]
    assert len([p for p in parts if p.event == "checkpoints"]) == 4
    assert [p.data["type"] for p in parts if p.event == "debug"].count("checkpoint") == 4
    parts = [p async for p in sdk.runs.stream(None, "typed", input={"topic": "owls"}, stream_mode=modes,
                                              on_completion="keep")]
    assert len([p for p in parts if p.event == "checkpoints"]) == 4


# --- run objects ---------------------------------------------------------------------------------------------
async def test_a_runs_kwargs_are_the_run_resolved(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    await sdk.runs.wait(tid, "typed", input={"topic": "a"})
    run = wire((await sdk.runs.list(tid))[0])
    assert run["langsmith_session_name"] is None
    kwargs = run["kwargs"]
    assert {k: v for k, v in kwargs.items() if k != "config"} == {
        "input": {"topic": "a"}, "command": None, "context": {}, "interrupt_before": None, "interrupt_after": None,
        "webhook": None, "feedback_keys": None, "checkpoint_during": True, "stream_mode": ["values"],
        "subgraphs": False, "resumable": False, "temporary": False, "durability": "async"}
    assert kwargs["config"]["configurable"] == {"assistant_id": run["assistant_id"], "graph_id": "typed",
                                                "run_id": run["run_id"], "thread_id": tid}
    assert kwargs["config"]["metadata"] == run["metadata"]

    made = wire(await sdk.runs.create(tid, "typed", input={"topic": "b"}, stream_mode=["updates", "messages-tuple"],
                                      config={"tags": ["t"]}, context={"c": 2}, interrupt_before=["draft"],
                                      stream_subgraphs=True, stream_resumable=True, durability="exit"))
    kwargs = made["kwargs"]
    assert (kwargs["stream_mode"], kwargs["subgraphs"], kwargs["resumable"], kwargs["durability"]) == (
        ["updates", "messages-tuple"], True, True, "exit")
    assert (kwargs["context"], kwargs["interrupt_before"], kwargs["config"]["tags"]) == ({"c": 2}, ["draft"], ["t"])
    assert kwargs["config"]["configurable"]["c"] == 2 and "stream_subgraphs" not in kwargs
    await sdk.runs.join(tid, made["run_id"])
    assert wire(await sdk.runs.get(tid, made["run_id"]))["kwargs"] == kwargs


async def test_a_batch_answers_langgraph_run_objects(sdk: LangGraphClient) -> None:
    made = [wire(r) for r in await sdk.runs.create_batch([batch_entry("typed", input={"topic": "a"}),
                                                          batch_entry("typed", input={"topic": "b"})])]
    assert [r["kwargs"]["input"] for r in made] == [{"topic": "a"}, {"topic": "b"}]
    assert all(r["kwargs"]["temporary"] and "agent_id" not in r and "input" not in r for r in made)


# --- thread objects ------------------------------------------------------------------------------------------
async def test_thread_state_updated_at_follows_its_state(sdk: LangGraphClient) -> None:
    thread = wire(await sdk.threads.create())
    tid = thread["thread_id"]
    assert thread["state_updated_at"] == thread["created_at"]
    await sdk.runs.wait(tid, "typed", input={"topic": "a"})
    ran = wire(await sdk.threads.get(tid))
    assert ran["state_updated_at"] > thread["state_updated_at"]
    patched = wire(await sdk.threads.update(tid, metadata={"tag": "x"}))
    assert patched["updated_at"] > ran["updated_at"] and patched["state_updated_at"] == ran["state_updated_at"]
    await sdk.threads.update_state(tid, {"topic": "b"})
    updated = wire(await sdk.threads.get(tid))
    assert updated["state_updated_at"] > ran["state_updated_at"]
    copied = wire(await copy_thread(sdk, tid))
    assert copied["state_updated_at"] >= copied["created_at"]
    await sdk.threads.create()
    for order in ("asc", "desc"):
        found = await sdk.threads.search(sort_by="state_updated_at", sort_order=order, limit=100)
        stamps = [wire(t)["state_updated_at"] for t in found]
        assert len(stamps) >= 3 and stamps == sorted(stamps, reverse=order == "desc"), stamps


async def test_state_metadata_of_an_empty_thread_and_of_an_update(sdk: LangGraphClient) -> None:
    tid = (await sdk.threads.create())["thread_id"]
    assert (await sdk.threads.get_state(tid))["metadata"] is None
    await sdk.runs.wait(tid, "typed", input={"topic": "a"})
    await sdk.threads.update_state(tid, {"topic": "b"})
    metadata = (await sdk.threads.get_state(tid))["metadata"]
    assert (metadata["source"], metadata["graph_id"], metadata["thread_id"]) == ("update", "typed", tid)


async def test_a_waited_cancel_names_the_run(http: httpx.AsyncClient) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    run = (await http.post(f"/threads/{tid}/runs", json={"assistant_id": "progress",
                                                          "input": {"steps": 50, "delay": 0.1}})).json()
    r = await http.post(f"/threads/{tid}/runs/{run['run_id']}/cancel?wait=1")
    assert r.status_code == 200 and r.headers["content-location"] == f"/threads/{tid}/runs/{run['run_id']}"


async def test_protocol_unknown_command_text(http: httpx.AsyncClient) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    r = await http.post(f"/threads/{tid}/commands", json={"id": 2, "method": "no.such", "params": {}})
    assert r.json()["message"] == "Unknown protocol command: no.such", r.text
