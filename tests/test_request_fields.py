"""What a request may carry, as LangGraph's server takes it (probed on langgraph-api 0.16.7, `langgraph dev`):
unknown fields are ignored, a field it honours and Threadline cannot is refused, and a `command` beside an
`input` wins (Agent Chat UI answers an interrupt with `{"input": {}, "command": {"resume": …}}`)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import httpx
import pytest

from tests.shared_app import shared_app
from threadline.core.assistants import system_assistant_id

# The module's tests share one started app per backend (tests/conftest.py, `module_served`): each makes what it
# reads, under ids of its own. They run in the app's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http = shared_app()

EXTRA = {"order_by": "created_at", "not_a_field": {"x": 1}}


async def _thread(http: httpx.AsyncClient, **body: Any) -> str:
    r = await http.post("/threads", json=body)
    assert r.status_code == 200, r.text
    return str(r.json()["thread_id"])


async def test_thread_search_ignores_order_by(http: httpx.AsyncClient) -> None:
    """Aegra's e2e suite sends `order_by` to thread search; LangGraph's server ignores it."""
    tid = await _thread(http, metadata={"suite": "aegra"})
    r = await http.post("/threads/search", json={"metadata": {"suite": "aegra"}, "order_by": "created_at DESC"})
    assert r.status_code == 200, r.text
    assert [t["thread_id"] for t in r.json()] == [tid]


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/assistants", {"graph_id": "echo"}),
    ("POST", "/assistants/search", {"graph_id": "echo"}),
    ("POST", "/assistants/count", {}),
    ("POST", "/threads", {}),
    ("POST", "/threads/count", {}),
    ("POST", "/threads/prune", {"thread_ids": []}),
    ("POST", "/runs/search", {}),
    ("POST", "/runs/crons/search", {}),
    ("POST", "/runs/crons/count", {}),
    ("PUT", "/store/items", {"namespace": ["fields"], "key": "k", "value": {"v": 1}}),
    ("POST", "/store/items/search", {"namespace_prefix": ["fields"]}),
    ("POST", "/store/namespaces", {}),
    ("DELETE", "/store/items", {"namespace": ["fields"], "key": "k"}),
    ("POST", "/agents/search", {}),
], ids=lambda v: v if isinstance(v, str) and v.startswith("/") else None)
async def test_every_body_ignores_unknown_fields(http: httpx.AsyncClient, method: str, path: str,
                                                 body: dict[str, Any]) -> None:
    plain = await http.request(method, path, json=body)
    extra = await http.request(method, path, json={**body, **EXTRA})
    assert (extra.status_code, plain.status_code) == (plain.status_code, extra.status_code) and plain.is_success, (
        plain.text, extra.text)


async def test_unknown_fields_on_a_run_and_its_thread_change_nothing(http: httpx.AsyncClient) -> None:
    tid = await _thread(http, metadata={"n": 1}, **EXTRA)
    r = await http.patch(f"/threads/{tid}", json={"metadata": {"n": 2}, **EXTRA})
    assert r.status_code == 200 and r.json()["metadata"]["n"] == 2
    r = await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "counter", "input": {"increment": 3},
                                                          **EXTRA})
    assert r.status_code == 200 and r.json()["count"] == 3
    r = await http.post(f"/threads/{tid}/state", json={"values": {"count": 10}, **EXTRA})
    assert r.status_code == 200, r.text
    r = await http.post(f"/threads/{tid}/history", json={"limit": 1, **EXTRA})
    assert r.status_code == 200 and r.json()[0]["values"]["count"] == 13  # counted, as every update
    run = (await http.post("/runs", json={"thread_id": tid, "agent_id": "counter", "input": {"increment": 1},
                                          **EXTRA})).json()  # the Agent Protocol's path family
    r = await http.get(f"/runs/{run['run_id']}/wait")
    assert r.status_code == 200 and r.json()["values"]["count"] == 14
    r = await http.post("/runs/batch", json=[{"assistant_id": "echo", "input": {"messages": []}, **EXTRA}])
    assert r.status_code == 200 and len(r.json()) == 1


async def test_unknown_fields_on_crons_and_assistants_change_nothing(http: httpx.AsyncClient) -> None:
    made = await http.post("/assistants", json={"graph_id": "echo", "name": "a", **EXTRA})
    assert made.status_code == 200 and made.json()["name"] == "a"
    aid = made.json()["assistant_id"]
    r = await http.patch(f"/assistants/{aid}", json={"name": "b", **EXTRA})
    assert r.status_code == 200 and r.json()["name"] == "b"
    assert (await http.post(f"/assistants/{aid}/versions", json=EXTRA)).status_code == 200
    assert (await http.post(f"/assistants/{aid}/latest", json={"version": 1, **EXTRA})).status_code == 200
    cron = await http.post("/runs/crons", json={"assistant_id": "counter", "schedule": "0 0 1 1 *",
                                                "enabled": False, **EXTRA})
    assert cron.status_code == 200, cron.text
    r = await http.patch(f"/runs/crons/{cron.json()['cron_id']}", json={"schedule": "0 0 2 1 *", **EXTRA})
    assert r.status_code == 200 and r.json()["schedule"] == "0 0 2 1 *"


async def test_wrong_types_and_values_are_still_refused(http: httpx.AsyncClient) -> None:
    r = await http.post("/threads/search", json={"limit": "many", "order_by": "x"})
    assert r.status_code == 422 and "limit" in r.json()["detail"]
    r = await http.post("/threads/search", json={"status": "sleeping"})
    assert r.status_code == 422 and "status" in r.json()["detail"]
    r = await http.post("/runs", json={"assistant_id": "echo", "stream_mode": "bogus", "order_by": "x"})
    assert r.status_code == 422 and "stream_mode" in r.json()["detail"]


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/threads/search", {"extract": {"topic": "values.topic"}}, "extract"),
    ("/threads", {"graph_id": "counter", "supersteps": [{"updates": [
        {"values": {"count": 1}, "as_node": "__input__", "command": {"goto": "add"}}]}]}, "command"),
])
async def test_a_field_the_reference_honours_and_threadline_cannot_is_refused(
        http: httpx.AsyncClient, path: str, body: dict[str, Any], field: str) -> None:
    r = await http.post(path, json=body)
    assert r.status_code == 422 and f"{field}: not supported by Threadline" in r.json()["detail"], r.text
    none = await http.post(path, json={**body, field: None} if field != "command" else {"graph_id": "counter"})
    assert none.status_code == 200, none.text  # null is as if absent


async def test_an_ignored_field_is_logged_once_at_debug(http: httpx.AsyncClient,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="threadline.api")
    name = f"field_{uuid.uuid4().hex}"  # once per process: a name no other test sent
    for path in ("/threads/count", "/threads/count", "/assistants/count"):
        assert (await http.post(path, json={name: 1})).status_code == 200
    said = [r for r in caplog.records if name in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.DEBUG


async def test_an_empty_thread_id_makes_a_new_thread(http: httpx.AsyncClient) -> None:
    r = await http.post("/threads", json={"thread_id": ""})
    assert r.status_code == 200 and r.json()["thread_id"]
    assert (await http.post("/threads", json={"thread_id": "abc"})).status_code == 422


# --- a command beside an input -------------------------------------------------------------------------
async def _interrupted(http: httpx.AsyncClient) -> str:
    tid = await _thread(http)
    r = await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "approval", "input": {"request": "deploy"}})
    assert r.status_code == 200, r.text
    assert (await http.get(f"/threads/{tid}")).json()["status"] == "interrupted"
    return tid


@pytest.mark.parametrize("given", [{}, None], ids=["input empty", "input null"])
async def test_agent_chat_ui_resume_streams_and_resumes(http: httpx.AsyncClient, given: Any) -> None:
    """Agent Chat UI, approving an interrupt: `POST /threads/{id}/runs/stream` with `input: {}` (or null, as
    other versions of `useStream` send it) and the command. In a browser: tests/test_frontend_browser.py."""
    tid = await _interrupted(http)
    async with http.stream("POST", f"/threads/{tid}/runs/stream", json={
            "assistant_id": "approval", "input": given, "command": {"resume": True},
            "stream_mode": ["values"]}) as r:
        assert r.status_code == 200, await r.aread()
        text = (await r.aread()).decode()
    assert "done: deploy" in text
    thread = (await http.get(f"/threads/{tid}")).json()
    assert thread["status"] == "idle" and thread["values"]["outcome"] == "done: deploy"


@pytest.mark.parametrize("given", [{}, None, {"request": "something else"}],
                         ids=["input empty", "input null", "input given"])
async def test_a_command_wins_over_any_input(http: httpx.AsyncClient, given: Any) -> None:
    """As LangGraph's server: whatever the input beside it, the command is what the run does."""
    tid = await _interrupted(http)
    r = await http.post(f"/threads/{tid}/runs/wait", json={
        "assistant_id": "approval", "input": given, "command": {"resume": False}})
    assert r.status_code == 200 and r.json()["outcome"] == "refused: deploy", r.text
    other = await _thread(http)
    run = (await http.post(f"/threads/{other}/runs", json={
        "assistant_id": "counter", "input": {"increment": 5}, "command": {}})).json()  # an empty command: input
    out = await http.get(f"/threads/{other}/runs/{run['run_id']}/join")
    assert out.json()["count"] == 5


async def test_a_stateless_run_cannot_resume(http: httpx.AsyncClient) -> None:
    r = await http.post("/runs/wait", json={"assistant_id": "approval", "input": {}, "command": {"resume": True}})
    assert r.status_code == 400 and r.json()["detail"] == "You must provide a thread_id when resuming."
    r = await http.post("/runs/wait", json={"assistant_id": "counter", "input": {"increment": 2}, "command": {}})
    assert r.status_code == 200 and r.json()["count"] == 2


# --- JSON-RPC params and Protocol v2 commands: liberal too ------------------------------------------------------
async def test_jsonrpc_and_protocol_params_ignore_unknown_fields(http: httpx.AsyncClient) -> None:
    mcp = await http.post("/mcp", headers={"Accept": "application/json, text/event-stream"}, json={
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "counter", "arguments": {"increment": 2}, "not_a_field": 1}})
    assert mcp.status_code == 200 and "result" in mcp.json(), mcp.text
    message = {"kind": "message", "role": "user", "messageId": str(uuid.uuid4()), "not_a_field": 1,
               "parts": [{"kind": "text", "text": "hi"}]}
    a2a = await http.post(f"/a2a/{system_assistant_id('echo')}", headers={"Accept": "application/json"}, json={
        "jsonrpc": "2.0", "id": "1", "method": "message/send", "params": {"message": message, "not_a_field": 1}})
    assert a2a.json()["result"]["status"]["state"] == "completed", a2a.text
    tid = await _thread(http)
    started = await http.post(f"/threads/{tid}/commands", json={"id": 1, "method": "run.start", "params": {
        "assistant_id": "counter", "input": {"increment": 1}, "not_a_field": 1}})
    assert started.json()["type"] == "success", started.text
