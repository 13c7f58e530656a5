"""Joining live runs and resuming with Last-Event-ID, over a real HTTP server (in-process uvicorn).

The module's tests share one started app per backend (tests/shared_app.py), served over uvicorn as `live_url`:
each works on threads of its own, and a test that finds "the newest run" made it itself, after the others'
runs ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import Run
from sse_starlette import ServerSentEvent
from sse_starlette.event import ensure_bytes

from tests.conftest import serving_asgi
from tests.shared_app import shared_app
from tests.waits import agent_stopped, logged, until
from threadline.api.sse import frame
from threadline.broker.base import StreamEvent
from threadline.shapes import OnCompletion

pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http, live_url = shared_app(live_url=True)


@pytest_asyncio.fixture(loop_scope="module")
async def live(live_url: str) -> AsyncIterator[LangGraphClient]:
    async with httpx.AsyncClient(base_url=live_url, timeout=30) as client:
        yield LangGraphClient(client)


async def test_join_live_run_then_resume_with_last_event_id(live: LangGraphClient) -> None:
    tid = (await live.threads.create())["thread_id"]
    run = await live.runs.create(tid, "slow", input={"tag": "j", "steps": 10, "delay": 0.03},
                                 stream_mode=["custom", "values"], stream_resumable=True)
    first: list = []
    async for part in live.runs.join_stream(tid, run["run_id"]):
        first.append(part)
        if sum(p.event == "custom" for p in first) == 3:
            break
    assert first[0].event == "metadata" or first[0].event in ("custom", "values")
    last_id = first[-1].id
    assert last_id
    rest = [p async for p in live.runs.join_stream(tid, run["run_id"], last_event_id=last_id)]
    steps = [p.data["step"] for p in first + rest if p.event == "custom"]
    assert steps == list(range(10)), steps  # nothing missed, nothing twice
    # A join after the run ended, without Last-Event-ID, is an empty stream (as the reference).
    assert [p async for p in live.runs.join_stream(tid, run["run_id"])] == []


async def test_stream_disconnect_cancels_run_when_asked(live: LangGraphClient) -> None:
    tid = (await live.threads.create())["thread_id"]
    async for part in live.runs.stream(tid, "slow", input={"tag": "disc", "steps": 200, "delay": 0.02},
                                       stream_mode="custom", on_disconnect="cancel"):
        if part.event == "custom":
            break
    await _assert_cancelled_and_stopped(live, tid, "disc")


@pytest.mark.parametrize("stateless", [False, True])
async def test_stream_disconnect_continues_by_default(live: LangGraphClient, stateless: bool) -> None:
    """As LangGraph's server: a client that breaks out of a stream leaves the run going."""
    # Any: langgraph-sdk's overloads of `stream` take a thread id or None, not a value that may be either.
    tid: Any = None if stateless else (await live.threads.create())["thread_id"]
    keep: OnCompletion | None = "keep" if stateless else None
    given: dict[str, Any] = {"tag": "sgo", "steps": 10, "delay": 0.02}
    async for part in live.runs.stream(tid, "slow", input=given, stream_mode="custom", on_completion=keep):
        if part.event == "custom":
            break
    await _assert_finished(live, "sgo", 10)


async def test_wait_over_real_http(live: LangGraphClient) -> None:
    tid = (await live.threads.create())["thread_id"]
    out = await live.runs.wait(tid, "counter", input={"increment": 1})
    assert isinstance(out, dict) and out["count"] == 1


async def test_wait_disconnect_cancels_run(live: LangGraphClient) -> None:
    from tests.project.agents import WORK_LOG

    http = live.http.client
    tid = (await live.threads.create())["thread_id"]
    waiting = asyncio.create_task(http.post(f"/threads/{tid}/runs/wait", json={
        "assistant_id": "slow", "input": {"tag": "wdisc", "steps": 200, "delay": 0.02}, "on_disconnect": "cancel"}))
    await until(logged(WORK_LOG, "wdisc:"))
    waiting.cancel()  # the client goes away mid-wait
    await _assert_cancelled_and_stopped(live, tid, "wdisc")


@pytest.mark.parametrize("how", [{}, {"on_disconnect": "continue"}, {"stateless": True}])
async def test_wait_disconnect_keeps_running_by_default_and_with_continue(live: LangGraphClient,
                                                                          how: dict[str, Any]) -> None:
    from tests.project.agents import WORK_LOG

    http = live.http.client
    body = {"assistant_id": "slow", "input": {"tag": "wcont", "steps": 10, "delay": 0.02},
            **{k: v for k, v in how.items() if k != "stateless"}}
    if how.get("stateless"):
        path = "/runs/wait"
        body["on_completion"] = "keep"
    else:
        path = f"/threads/{(await live.threads.create())['thread_id']}/runs/wait"
    waiting = asyncio.create_task(http.post(path, json=body))
    await until(logged(WORK_LOG, "wcont:"))
    waiting.cancel()
    await _assert_finished(live, "wcont", 10)


async def _assert_finished(live: LangGraphClient, tag: str, steps: int) -> None:
    """The newest run did all its work and succeeded, though its client left."""
    from tests.project.agents import WORK_LOG

    async def newest_ended() -> dict[str, Any] | None:
        [run] = (await live.http.client.post("/runs/search", json={"limit": 1})).json()
        return run if run["status"] not in ("pending", "running") else None

    run = await until(newest_ended, what="the newest run to end")
    assert run["status"] == "success"
    assert sum(w.startswith(f"{tag}:") for w in WORK_LOG) == steps


async def test_webhook_receives_the_finished_run(sdk: LangGraphClient) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    received: list[dict] = []
    arrived = asyncio.Event()

    async def hook(request: Request) -> Response:
        received.append(await request.json())
        arrived.set()
        return Response(status_code=204)

    async with serving_asgi(Starlette(routes=[Route("/hook", hook, methods=["POST"])])) as receiver:
        tid = (await sdk.threads.create())["thread_id"]
        run = await sdk.runs.create(tid, "counter", input={"increment": 2}, webhook=f"{receiver}/hook")
        await asyncio.wait_for(arrived.wait(), 10)
    assert received[0]["run_id"] == run["run_id"] and received[0]["status"] == "success"
    assert received[0]["values"]["count"] == 2 and received[0]["error"] is None
    assert "worker_id" not in received[0]  # the public run, not the storage row


async def _assert_cancelled_and_stopped(live: LangGraphClient, tid: str, tag: str) -> None:
    """The thread's run ends `interrupted`, and the agent does no work after that (by WORK_LOG)."""
    from tests.project.agents import WORK_LOG

    async def interrupted() -> list[Run] | None:
        runs = await live.runs.list(tid)
        return runs if runs[0]["status"] == "interrupted" else None

    runs = await until(interrupted, what="the thread's run to end interrupted")
    assert runs[0]["status"] == "interrupted"
    done = len([w for w in WORK_LOG if w.startswith(f"{tag}:")])
    await agent_stopped(tag)
    assert len([w for w in WORK_LOG if w.startswith(f"{tag}:")]) == done < 200


async def test_a_broker_failure_mid_stream_is_reported_and_does_not_cancel_the_run(
        runtime: Any, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a client that leaves cancels a streamed run: our own failure (the broker) ends the stream with an
    `error` event and the run goes on."""
    from threadline.errors import Unavailable

    async def failing_subscribe(run_id: str, **_: Any) -> AsyncIterator[Any]:
        raise Unavailable("Redis is unavailable: connection reset")
        yield  # an async generator

    monkeypatch.setattr(runtime.broker, "subscribe_batches", failing_subscribe)  # undone for the next test
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    r = await http.post(f"/threads/{tid}/runs/stream", json={
        "assistant_id": "slow", "input": {"tag": "bf", "steps": 3, "delay": 0.01}, "stream_mode": "custom"})
    assert r.status_code == 200
    assert "event: error" in r.text and "Unavailable" in r.text
    run = (await http.get(f"/threads/{tid}/runs")).json()[0]
    joined = await http.get(f"/threads/{tid}/runs/{run['run_id']}/join")
    assert joined.status_code == 200 and joined.json()["done"] == ["bf"]
    assert (await http.get(f"/threads/{tid}/runs/{run['run_id']}")).json()["status"] == "success"


@pytest.mark.parametrize("event", [
    StreamEvent("1764500000000-1", "values", '{"messages":[{"content":"é"}]}'.encode()),
    StreamEvent("1764500000000-2", "messages|tools:1f1ecc", b"[]"),
    StreamEvent("1764500000000-3", "custom", b'"two\\nlines"'),  # an escaped newline: one line of JSON
    StreamEvent("1764500000000-4", "custom", b"two\nlines"),  # a raw one: two data lines
])
async def test_an_event_is_framed_as_sse_starlette_frames_it(event: StreamEvent) -> None:
    expected = ensure_bytes(ServerSentEvent(data=event.data.decode(), event=event.event, id=event.id), "\r\n")
    assert ensure_bytes(frame(event), "\r\n") == expected


async def test_the_send_override_still_replaces_sse_starlettes_method() -> None:
    """`CountedEventSource` skips sse-starlette's per-event cancel scope by overriding a method of its own: if
    sse-starlette renames it, the override is dead and this says so."""
    from sse_starlette import EventSourceResponse

    from threadline.api.sse import CountedEventSource

    assert callable(getattr(EventSourceResponse, "_send_with_timeout", None))
    assert CountedEventSource._send_with_timeout is not EventSourceResponse._send_with_timeout
