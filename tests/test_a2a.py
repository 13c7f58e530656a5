"""A2A at `/a2a/{assistant_id}`: the real a2a-sdk 1.3 client on the 1.0 wire (live server), the 0.3 wire as
LangGraph documents it (raw JSON-RPC, in-process), agent cards, and JSON-RPC errors."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from a2a.client import ClientConfig, ClientFactory, create_client
from a2a.client.card_resolver import parse_agent_card
from a2a.compat.v0_3 import types as v03
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError, UnsupportedOperationError
from google.protobuf.json_format import MessageToDict, ParseDict

from tests.shared_app import shared_app
from tests.waits import logged, until
from threadline.core.assistants import system_assistant_id

ECHO, SLOW, APPROVAL = (system_assistant_id(g) for g in ("echo", "slow", "approval"))

# The module's tests share one started app per backend (tests/conftest.py, `module_served`), in-process and over
# a loopback port: each makes its own tasks and contexts and reads only those. They run in the app's event loop.
pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # the synchronous tests of the module run as before, without a loop
              pytest.mark.filterwarnings("ignore:The test <Function .* is marked with '@pytest.mark.asyncio'")]

backend, served, http, live_url = shared_app(live_url=True)


# --- the 1.0 wire, through the official client, against a live server --------------------------------------------



@pytest_asyncio.fixture(loop_scope="module")
async def client_http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as client:
        yield client


async def a2a_client(live_url: str, http: httpx.AsyncClient, assistant_id: str, *, streaming: bool) -> Any:
    client = await create_client(f"{live_url}/a2a/{assistant_id}",
                                 client_config=ClientConfig(streaming=streaming, httpx_client=http))
    # the card advertised 1.0 (the transport the factory chose is private: no public way to ask)
    assert type(client._transport).__name__ == "JsonRpcTransport"  # type: ignore[attr-defined]
    return client


def user_message(*parts: Part, context_id: str = "", task_id: str = "") -> Message:
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, context_id=context_id, task_id=task_id,
                   parts=list(parts))


def data(value: dict[str, Any]) -> Part:
    part = Part()
    ParseDict(value, part.data)
    return part


def struct(part: Part) -> Any:
    return MessageToDict(part.data)


async def test_v1_send_get_and_cancel_a_finished_task(live_url: str, client_http: httpx.AsyncClient) -> None:
    client = await a2a_client(live_url, client_http, ECHO, streaming=False)
    ctx = str(uuid.uuid4())
    events = [e async for e in client.send_message(SendMessageRequest(
        message=user_message(Part(text="hello"), context_id=ctx)))]
    assert [e.WhichOneof("payload") for e in events] == ["task"]
    task = events[0].task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert task.id == f"{ctx}:{task.id.split(':')[1]}" and task.context_id == ctx  # contextId is the thread
    assert task.artifacts[0].parts[0].text == "You said: hello"
    assert [(m.role, m.parts[0].text) for m in task.history] == [
        (Role.ROLE_USER, "hello"), (Role.ROLE_AGENT, "You said: hello")]
    assert [m.task_id for m in task.history] == [task.id] * 2
    got = await client.get_task(GetTaskRequest(id=task.id))
    assert got.status.state == TaskState.TASK_STATE_COMPLETED and got.artifacts[0].parts[0].text == "You said: hello"
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(CancelTaskRequest(id=task.id))
    with pytest.raises(TaskNotFoundError):
        await client.get_task(GetTaskRequest(id=f"{ctx}:{uuid.uuid4()}"))
    # The same context continues the conversation: the thread keeps both turns.
    again = [e async for e in client.send_message(SendMessageRequest(
        message=user_message(Part(text="more"), context_id=ctx)))][0].task
    assert again.id != task.id and again.context_id == ctx
    assert [m.parts[0].text for m in again.history][-2:] == ["more", "You said: more"] and len(again.history) == 4
    listed = await client.list_tasks(ListTasksRequest(context_id=ctx))
    assert [t.id for t in listed.tasks] == [again.id, task.id] and listed.total_size == 2


async def test_v1_stream(live_url: str, client_http: httpx.AsyncClient) -> None:
    client = await a2a_client(live_url, client_http, ECHO, streaming=True)
    events = [e async for e in client.send_message(SendMessageRequest(message=user_message(Part(text="hi there"))))]
    kinds = [e.WhichOneof("payload") for e in events]
    assert None not in kinds  # every frame is a wrapped StreamResponse
    assert kinds[0] == "task" and events[0].task.status.state == TaskState.TASK_STATE_SUBMITTED
    assert kinds[-2:] == ["artifact_update", "status_update"]
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert events[-2].artifact_update.artifact.parts[0].text == "You said: hi there"
    deltas = "".join(e.status_update.status.message.parts[0].text for e in events[1:-2]
                     if e.status_update.status.HasField("message"))
    assert deltas == "You said: hi there"  # the reply, streamed token by token as working updates
    task_id = events[0].task.id
    assert {e.status_update.task_id or e.artifact_update.task_id for e in events[1:]} == {task_id}
    got = await client.get_task(GetTaskRequest(id=task_id))
    assert got.status.state == TaskState.TASK_STATE_COMPLETED


async def test_v1_interrupt_is_input_required_and_the_next_message_answers_it(
        live_url: str, client_http: httpx.AsyncClient) -> None:
    client = await a2a_client(live_url, client_http, APPROVAL, streaming=False)
    first = [e async for e in client.send_message(SendMessageRequest(
        message=user_message(data({"request": "deploy"}))))][0].task
    assert first.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert struct(first.status.message.parts[0]) == {"question": "Approve 'deploy'?"}  # the interrupt's value
    assert first.artifacts[0].name == "Interrupt"
    assert struct(first.artifacts[0].parts[0])["value"] == {"question": "Approve 'deploy'?"}
    assert (await client.get_task(GetTaskRequest(id=first.id))).status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    answer = user_message(Part(text="yes"), context_id=first.context_id, task_id=first.id)
    done = [e async for e in client.send_message(SendMessageRequest(message=answer))][0].task
    assert done.id == first.id  # the same task, resumed with Command(resume="yes")
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert struct(done.artifacts[0].parts[0])["outcome"] == "done: deploy"
    assert (await client.get_task(GetTaskRequest(id=first.id))).status.state == TaskState.TASK_STATE_COMPLETED
    with pytest.raises(UnsupportedOperationError):  # a finished task takes no more messages
        [e async for e in client.send_message(SendMessageRequest(message=answer))]


async def test_v1_streamed_interrupt_then_answer_without_task_id(live_url: str,
                                                                 client_http: httpx.AsyncClient) -> None:
    client = await a2a_client(live_url, client_http, APPROVAL, streaming=True)
    events = [e async for e in client.send_message(SendMessageRequest(
        message=user_message(data({"request": "ship"}))))]
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert events[-2].artifact_update.artifact.name == "Interrupt"
    task_id, ctx = events[0].task.id, events[0].task.context_id
    # The next message on the context answers the waiting task even without its taskId; a data part
    # {"resume": X} resumes with X itself.
    events = [e async for e in client.send_message(SendMessageRequest(
        message=user_message(data({"resume": False}), context_id=ctx)))]
    assert events[0].task.id == task_id
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert struct(events[-2].artifact_update.artifact.parts[0])["outcome"] == "refused: ship"


async def test_v1_cancel_really_stops_the_run(live_url: str, client_http: httpx.AsyncClient) -> None:
    from tests.project.agents import WORK_LOG

    client = await a2a_client(live_url, client_http, SLOW, streaming=False)
    request = SendMessageRequest(message=user_message(data({"tag": "a2a-cancel", "steps": 500, "delay": 0.02})))
    request.configuration.return_immediately = True
    task = [e async for e in client.send_message(request)][0].task
    assert task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    await until(logged(WORK_LOG, "a2a-cancel:"))
    canceled = await client.cancel_task(CancelTaskRequest(id=task.id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    done = len([w for w in WORK_LOG if w.startswith("a2a-cancel:")])
    await asyncio.sleep(0.2)
    assert len([w for w in WORK_LOG if w.startswith("a2a-cancel:")]) == done < 500  # the agent stopped
    assert (await client.get_task(GetTaskRequest(id=task.id))).status.state == TaskState.TASK_STATE_CANCELED
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(CancelTaskRequest(id=task.id))


async def test_v1_subscribe_to_a_running_task_and_list_by_state(live_url: str,
                                                                client_http: httpx.AsyncClient) -> None:
    client = await a2a_client(live_url, client_http, SLOW, streaming=True)
    sender = await a2a_client(live_url, client_http, SLOW, streaming=False)
    request = SendMessageRequest(message=user_message(data({"tag": "a2a-sub", "steps": 500, "delay": 0.02})))
    request.configuration.return_immediately = True
    task = [e async for e in sender.send_message(request)][0].task
    events = []
    async for event in client.subscribe(SubscribeToTaskRequest(id=task.id)):
        events.append(event)
        if len(events) == 1:  # subscribed: now end the task from another client
            running = await client.list_tasks(ListTasksRequest(context_id=task.context_id))
            assert [t.id for t in running.tasks] == [task.id]
            assert running.tasks[0].status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
            await sender.cancel_task(CancelTaskRequest(id=task.id))
    assert events[0].WhichOneof("payload") == "task" and events[0].task.id == task.id
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
    for state, expected in ((TaskState.TASK_STATE_COMPLETED, []), (TaskState.TASK_STATE_CANCELED, [task.id])):
        listed = await client.list_tasks(ListTasksRequest(context_id=task.context_id, status=state))
        assert [t.id for t in listed.tasks] == expected


async def test_v1_a_streaming_client_that_leaves_does_not_cancel_the_task(
        live_url: str, client_http: httpx.AsyncClient) -> None:
    """A2A tasks outlive their streams (a client may resubscribe or poll): leaving cancels nothing."""
    from tests.project.agents import WORK_LOG

    streaming = await a2a_client(live_url, client_http, SLOW, streaming=True)
    poller = await a2a_client(live_url, client_http, SLOW, streaming=False)
    stream = streaming.send_message(SendMessageRequest(
        message=user_message(data({"tag": "a2a-left", "steps": 15, "delay": 0.02}))))
    first = await anext(stream)
    task_id = first.task.id if first.WhichOneof("payload") == "task" else first.status_update.task_id
    await stream.aclose()  # the client goes away after the first event
    for _ in range(300):
        task = await poller.get_task(GetTaskRequest(id=task_id))
        if task.status.state == TaskState.TASK_STATE_COMPLETED:
            break
        await asyncio.sleep(0.02)
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert len([w for w in WORK_LOG if w.startswith("a2a-left:")]) == 15


async def test_v1_cancel_a_task_waiting_for_input(live_url: str, client_http: httpx.AsyncClient) -> None:
    client = await a2a_client(live_url, client_http, APPROVAL, streaming=False)
    task = [e async for e in client.send_message(SendMessageRequest(
        message=user_message(data({"request": "x"}))))][0].task
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    canceled = await client.cancel_task(CancelTaskRequest(id=task.id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    assert (await client.get_task(GetTaskRequest(id=task.id))).status.state == TaskState.TASK_STATE_CANCELED
    thread = (await client_http.get(f"{live_url}/threads/{task.context_id}")).json()
    assert thread["interrupts"] == {} and thread["status"] == "idle"  # nothing waits on the thread any more
    with pytest.raises(UnsupportedOperationError):
        [e async for e in client.send_message(SendMessageRequest(
            message=user_message(Part(text="yes"), context_id=task.context_id, task_id=task.id)))]


async def test_compat_client_speaks_0_3_to_the_same_endpoint(live_url: str, client_http: httpx.AsyncClient) -> None:
    url = f"{live_url}/a2a/{ECHO}"
    card = AgentCard(name="echo", capabilities=AgentCapabilities(streaming=True), supported_interfaces=[
        AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="0.3")])
    for streaming in (False, True):
        client = ClientFactory(ClientConfig(streaming=streaming, httpx_client=client_http)).create(card)
        assert type(client._transport).__name__ == "CompatJsonRpcTransport"  # type: ignore[attr-defined]
        events = [e async for e in client.send_message(SendMessageRequest(message=user_message(Part(text="old"))))]
        last = events[-1]
        state = last.task.status.state if last.HasField("task") else last.status_update.status.state
        assert state == TaskState.TASK_STATE_COMPLETED
        got = await client.get_task(GetTaskRequest(id=events[0].task.id))
        assert got.artifacts[0].parts[0].text == "You said: old"


# --- the 0.3 wire (LangGraph's documented methods), raw JSON-RPC in-process --------------------------------------

async def rpc(http: httpx.AsyncClient, method: str, params: Any, *, assistant: str = ECHO,
              accept: str = "application/json") -> httpx.Response:
    return await http.post(f"/a2a/{assistant}", headers={"Accept": accept},
                           json={"jsonrpc": "2.0", "id": "1", "method": method, "params": params})


def result(response: httpx.Response) -> Any:
    body = response.json()
    assert response.status_code == 200 and "result" in body, body
    return body["result"]


def text_message(text: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "message", "role": "user", "messageId": str(uuid.uuid4()),
            "parts": [{"kind": "text", "text": text}], **extra}


async def stream_frames(http: httpx.AsyncClient, params: dict[str, Any], *, assistant: str = ECHO,
                        method: str = "message/stream") -> list[dict[str, Any]]:
    async with http.stream("POST", f"/a2a/{assistant}", headers={"Accept": "text/event-stream"},
                           json={"jsonrpc": "2.0", "id": 2, "method": method, "params": params}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        return [json.loads(line[5:]) async for line in response.aiter_lines() if line.startswith("data:")]


async def test_v03_send_and_get(http: httpx.AsyncClient) -> None:
    r = await rpc(http, "message/send", {"message": text_message("hi")})
    assert r.status_code == 200
    task = r.json()["result"]
    v03.Task.model_validate(task)
    assert task["kind"] == "task" and task["status"]["state"] == "completed"
    assert task["artifacts"][0]["parts"] == [{"kind": "text", "text": "You said: hi"}]
    assert [(m["kind"], m["role"]) for m in task["history"]] == [("message", "user"), ("message", "agent")]
    assert [m["taskId"] for m in task["history"]] == [task["id"]] * 2  # as LangGraph's server
    # A blocking send only waits for the end: its run streams no message deltas (as LangGraph's server runs it).
    (run,) = (await http.get(f"/threads/{task['contextId']}/runs")).json()
    assert "messages-tuple" not in (run["kwargs"].get("stream_mode") or []), run["kwargs"]
    got = (await rpc(http, "tasks/get", {"id": task["id"], "historyLength": 1})).json()["result"]
    assert got["status"]["state"] == "completed" and len(got["history"]) == 1
    assert "history" not in (await rpc(http, "tasks/get", {"id": task["id"], "historyLength": 0})).json()["result"]
    # A bare run id with its contextId is accepted too (LangGraph's form).
    ctx, run_id = task["id"].split(":")
    bare = (await rpc(http, "tasks/get", {"id": run_id, "contextId": ctx})).json()["result"]
    assert bare["id"] == task["id"]
    # The 1.0 name answers the same task in proto-JSON.
    v1 = (await rpc(http, "GetTask", {"id": task["id"]})).json()["result"]
    assert v1["status"]["state"] == "TASK_STATE_COMPLETED" and "kind" not in v1


async def test_v03_stream(http: httpx.AsyncClient) -> None:
    frames = [f["result"] for f in await stream_frames(http, {"message": text_message("hey you")})]
    assert frames[0]["kind"] == "task" and frames[0]["status"]["state"] == "submitted"
    assert [f["kind"] for f in frames[-2:]] == ["artifact-update", "status-update"]
    assert frames[-1]["final"] is True and frames[-1]["status"]["state"] == "completed"
    assert all(f["final"] is False and f["status"]["state"] == "working" for f in frames[1:-2])
    assert frames[-2]["artifact"]["parts"] == [{"kind": "text", "text": "You said: hey you"}]
    for frame in frames[1:]:
        v03.SendStreamingMessageSuccessResponse.model_validate({"jsonrpc": "2.0", "id": 2, "result": frame})


async def test_v03_cancel(http: httpx.AsyncClient) -> None:
    r = await rpc(http, "message/send", {"message": {
        "role": "user", "messageId": "m1", "parts": [{"kind": "data", "data": {"tag": "v03", "steps": 500}}]},
        "configuration": {"blocking": False}}, assistant=SLOW)
    task = result(r)
    assert task["status"]["state"] in ("submitted", "working")
    canceled = result(await rpc(http, "tasks/cancel", {"id": task["id"]}, assistant=SLOW))
    assert canceled["status"]["state"] == "canceled"
    assert canceled["status"]["message"]["parts"][0]["text"] == "Task was canceled"
    got = result(await rpc(http, "tasks/get", {"id": task["id"]}, assistant=SLOW))
    assert got["status"]["state"] == "canceled"
    again = (await rpc(http, "tasks/cancel", {"id": task["id"]}, assistant=SLOW)).json()
    assert again["error"]["code"] == -32002


async def test_parts_map_to_one_human_message_and_input_fields(http: httpx.AsyncClient) -> None:
    ctx = str(uuid.uuid4())
    png = base64.b64encode(b"\x89PNG").decode()
    message = {"role": "user", "messageId": "m-parts", "contextId": ctx, "parts": [
        {"kind": "text", "text": "line one"}, {"text": "line two"},  # both part forms, in one message
        {"kind": "file", "file": {"bytes": png, "mimeType": "image/png", "name": "dot.png"}},
        {"url": "https://example.com/a.pdf", "mediaType": "application/pdf"},
        {"kind": "data", "data": {"prompt": "", "count": 2}}]}
    r = await rpc(http, "message/send", {"message": message})
    assert r.json()["result"]["status"]["state"] == "completed", r.json()
    state = (await http.get(f"/threads/{ctx}/state")).json()
    human = state["values"]["messages"][0]
    assert human["type"] == "human" and human["id"] == "m-parts"
    assert human["content"] == [
        {"type": "text", "text": "line one\nline two"},
        {"type": "image", "mime_type": "image/png", "base64": png, "extras": {"filename": "dot.png"}},
        {"type": "file", "mime_type": "application/pdf", "url": "https://example.com/a.pdf"}]
    # Data parts set top-level input fields of a graph without messages (numbers stay integers).
    r = await rpc(http, "SendMessage", {"message": {"role": "ROLE_USER", "messageId": "m", "parts": [
        {"data": {"increment": 3}}]}}, assistant=system_assistant_id("counter"))
    answer = r.json()["result"]["task"]["artifacts"][0]["parts"][0]["data"]
    assert answer["count"] == 3 and isinstance(answer["count"], int)
    # Text cannot become input for a graph without messages: a clear -32602.
    r = await rpc(http, "message/send", {"message": text_message("hi")}, assistant=system_assistant_id("counter"))
    assert r.json()["error"]["code"] == -32602 and "messages" in r.json()["error"]["message"]


def test_interrupt_prompt_and_resume_values() -> None:
    from threadline.core.a2a import interrupt_artifact, resume_value

    run: Any = {"run_id": "r", "thread_id": "t", "output": {"__interrupt__": [{"id": "i1", "value": "Sure?"}]}}
    artifact, prompt = interrupt_artifact(run, "t:r")
    assert prompt.parts[0].text == "Sure?" and prompt.role == Role.ROLE_AGENT and prompt.task_id == "t:r"
    assert struct(artifact.parts[0]) == {"id": "i1", "value": "Sure?"}
    assert resume_value(user_message(Part(text="a"), Part(text="b"))) == "a\nb"
    assert resume_value(user_message(data({"resume": {"n": 1}}), Part(text="ignored"))) == {"n": 1}
    assert resume_value(user_message(data({"approved": True}))) == {"approved": True}


async def test_failed_run_is_a_failed_task(http: httpx.AsyncClient) -> None:
    r = await rpc(http, "message/send", {"message": {"role": "user", "messageId": "f", "parts": [
        {"kind": "data", "data": {"reason": "broken"}}]}}, assistant=system_assistant_id("failing"))
    status = r.json()["result"]["status"]
    assert status["state"] == "failed" and "broken" in status["message"]["parts"][0]["text"]


async def test_agent_card_and_aliases(http: httpx.AsyncClient) -> None:
    paths = [f"/a2a/{ECHO}/.well-known/agent-card.json", f"/a2a/{ECHO}/.well-known/agent.json", f"/a2a/{ECHO}",
             f"/.well-known/agent-card.json?assistant_id={ECHO}", "/.well-known/agent-card.json",  # default agent
             "/a2a/echo/.well-known/agent-card.json"]  # a graph id names its assistant, as in the REST API
    for path in paths:
        r = await http.get(path)
        assert r.status_code == 200, path
        card = r.json()
        url = f"http://threadline/a2a/{ECHO}"
        assert card["url"] == url and card["name"] == "echo"
        assert {(i["protocolVersion"], i["url"]) for i in card["supportedInterfaces"]} == {("1.0", url), ("0.3", url)}
        assert card["capabilities"]["streaming"] is True and card["capabilities"]["pushNotifications"] is False
        v03.AgentCard.model_validate(card)  # a 0.3 client reads it
        assert parse_agent_card(dict(card)).supported_interfaces[0].protocol_version == "1.0"  # and a 1.0 one
    assert (await http.get(f"/a2a/{uuid.uuid4()}/.well-known/agent-card.json")).status_code == 404
    counter = (await http.get("/a2a/counter")).json()
    assert counter["defaultInputModes"] == ["application/json"]  # no messages input: data parts only
    assert (await http.get("/info")).json()["flags"]["a2a"] is True


# --- JSON-RPC errors: always a JSON-RPC error body, never a 500 ---------------------------------------------------

@pytest.mark.parametrize(("body", "code"), [
    (b"{", -32700),
    (b"[1, 2]", -32600),
    (b'"text"', -32600),
    (b'{"jsonrpc": "1.0", "id": 1, "method": "message/send", "params": {}}', -32600),
    (b'{"id": 1, "method": "message/send", "params": {}}', -32600),
    (b'{"jsonrpc": "2.0", "id": 1, "params": {}}', -32600),
    (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "message/send"}', -32600),
    (b'{"jsonrpc": "2.0", "method": "message/send", "params": {}}', -32600),  # a notification
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/frobnicate", "params": {}}', -32601),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": []}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"role": "ROLE_USER"}}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"role": "ROLE_USER", '
     b'"messageId": "m", "parts": [{"bogus": 1}]}}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {"role": "user", '
     b'"messageId": "m", "contextId": "not-a-uuid", "parts": [{"kind": "text", "text": "x"}]}}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {"role": "user", '
     b'"messageId": "m", "parts": [{"kind": "text", "text": "x"}]}, "configuration": {"historyLength": -1}}}',
     -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "nope"}}', -32001),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "00000000-0000-0000-0000-000000000000:'
     b'00000000-0000-0000-0000-000000000001"}}', -32001),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/cancel", "params": {"id": "x:y"}}', -32001),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": 500}}', -32602),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/pushNotificationConfig/set", "params": {}}', -32003),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "GetExtendedAgentCard", "params": {}}', -32007),
])
async def test_bad_jsonrpc(http: httpx.AsyncClient, body: bytes, code: int) -> None:
    r = await http.post(f"/a2a/{ECHO}", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 200
    answer = r.json()
    assert answer["jsonrpc"] == "2.0" and answer["error"]["code"] == code, answer
    assert "result" not in answer


async def test_unknown_assistant_and_task_of_another_assistant(http: httpx.AsyncClient) -> None:
    r = await rpc(http, "message/send", {"message": text_message("hi")}, assistant=str(uuid.uuid4()))
    assert r.json()["error"]["code"] == -32602
    task = (await rpc(http, "message/send", {"message": text_message("hi")})).json()["result"]
    r = await rpc(http, "tasks/get", {"id": task["id"]}, assistant=APPROVAL)
    assert r.json()["error"]["code"] == -32001


async def test_accept_header_and_errors_in_streams(http: httpx.AsyncClient) -> None:
    r = await rpc(http, "message/send", {"message": text_message("hi")}, accept="text/html")
    assert r.status_code == 400  # as LangGraph: the one check answered with an HTTP status
    r = await rpc(http, "message/stream", {"message": text_message("hi")}, accept="application/json")
    assert r.status_code == 400
    # An error found before the stream starts is a plain JSON-RPC error (what the a2a-sdk client reads).
    r = await rpc(http, "message/stream", {"message": {}}, accept="text/event-stream")
    assert r.status_code == 200 and r.json()["error"]["code"] == -32602
    finished = (await rpc(http, "message/send", {"message": text_message("hi")})).json()["result"]
    r = await rpc(http, "tasks/resubscribe", {"id": finished["id"]}, accept="text/event-stream")
    assert r.json()["error"]["code"] == -32004  # only a running task can be subscribed to
