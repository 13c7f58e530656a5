"""Following a thread (`GET /threads/{id}/stream`, langgraph-sdk `threads.join_stream`) across its runs.

The module's tests share one started app per backend (tests/shared_app.py), each following a thread of its own."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from langgraph_sdk.client import LangGraphClient
from langgraph_sdk.schema import StreamPart

from tests.shared_app import shared_app
from tests.test_streams import live  # noqa: F401  (the live-server fixture)
from tests.waits import until
from threadline.core.runtime import Runtime
from threadline.core.thread_stream import follow_thread

pytestmark = pytest.mark.asyncio(loop_scope="module")

backend, served, http, live_url = shared_app(live_url=True)


async def _follow(client: LangGraphClient, tid: str, runs_to_finish: int, **kwargs: Any) -> list[StreamPart]:
    """Parts of the thread's stream until `runs_to_finish` run_done markers have gone by."""
    parts: list[StreamPart] = []
    async for part in await client.threads.join_stream(tid, **kwargs):
        parts.append(part)
        if sum(p.event == "metadata" and p.data.get("status") == "run_done" for p in parts) == runs_to_finish:
            break
    return parts


async def _following(client: LangGraphClient, tid: str, runs_to_finish: int,
                     **kwargs: Any) -> asyncio.Task[list[StreamPart]]:
    """`_follow` in a task, once its response has begun: from then on, the follower gets every run created
    (`follow_thread` fixes "now" before the response's headers), so a test creates its runs after this."""
    begun = asyncio.Event()

    async def seen(response: httpx.Response) -> None:
        if response.url.path == f"/threads/{tid}/stream":
            begun.set()

    client.http.client.event_hooks["response"].append(seen)
    try:
        following = asyncio.create_task(_follow(client, tid, runs_to_finish, **kwargs))
        await asyncio.wait_for(begun.wait(), 30)
    finally:
        client.http.client.event_hooks["response"].remove(seen)
    return following


async def test_follows_every_run_of_the_thread_in_turn(live: LangGraphClient) -> None:  # noqa: F811
    tid = (await live.threads.create())["thread_id"]
    following = await _following(live, tid, 2)  # listening before any run exists
    first = await live.runs.create(tid, "slow", input={"tag": "a", "steps": 3, "delay": 0.02},
                                   stream_mode=["custom"])
    second = await live.runs.create(tid, "slow", input={"tag": "b", "steps": 2, "delay": 0.02},
                                    stream_mode=["custom"])
    parts = await asyncio.wait_for(following, 30)
    summary = [(p.event, p.data.get("run_id") or p.data.get("tag"), p.data.get("status") or p.data.get("step"))
               for p in parts]
    assert summary == [
        ("metadata", first["run_id"], None), ("custom", "a", 0), ("custom", "a", 1), ("custom", "a", 2),
        ("metadata", first["run_id"], "run_done"),
        ("metadata", second["run_id"], None), ("custom", "b", 0), ("custom", "b", 1),
        ("metadata", second["run_id"], "run_done"),
    ]
    assert all(p.id for p in parts)


async def test_last_event_id_resumes_inside_a_run_and_goes_on_to_later_runs(live: LangGraphClient) -> None:  # noqa: F811
    tid = (await live.threads.create())["thread_id"]
    following = await _following(live, tid, 2)
    await live.runs.create(tid, "slow", input={"tag": "a", "steps": 4, "delay": 0.01}, stream_mode=["custom"])
    await live.runs.create(tid, "slow", input={"tag": "b", "steps": 2, "delay": 0.01}, stream_mode=["custom"])
    everything = await asyncio.wait_for(following, 30)
    # A client that saw up to the second custom event of the first run comes back after both ended.
    cut = [i for i, p in enumerate(everything) if p.event == "custom"][1]
    resumed = await asyncio.wait_for(
        _follow(live, tid, 2, last_event_id=everything[cut].id), 30)
    assert [(p.event, p.data, p.id) for p in resumed] == [(p.event, p.data, p.id) for p in everything[cut + 1:]]


async def test_lifecycle_mode_has_only_run_start_and_end(live: LangGraphClient) -> None:  # noqa: F811
    tid = (await live.threads.create())["thread_id"]
    following = await _following(live, tid, 1, stream_mode="lifecycle")
    run = await live.runs.create(tid, "slow", input={"tag": "l", "steps": 2, "delay": 0.01},
                                 stream_mode=["custom", "values"])
    parts = await asyncio.wait_for(following, 30)
    assert [(p.event, p.data.get("status")) for p in parts] == [("metadata", None), ("metadata", "run_done")]
    assert parts[0].data["run_id"] == run["run_id"]


async def test_joining_while_a_run_is_running_follows_it_then_the_next(live: LangGraphClient) -> None:  # noqa: F811
    tid = (await live.threads.create())["thread_id"]
    first = await live.runs.create(tid, "slow", input={"tag": "a", "steps": 30, "delay": 0.02},
                                   stream_mode=["custom"])
    await until(lambda: _status_is(live, tid, first["run_id"], "running"), what="the first run to be running")
    following = await _following(live, tid, 2)
    second = await live.runs.create(tid, "slow", input={"tag": "b", "steps": 1, "delay": 0}, stream_mode=["custom"])
    parts = await asyncio.wait_for(following, 30)
    done = [p.data["run_id"] for p in parts if p.data.get("status") == "run_done"]
    assert done == [first["run_id"], second["run_id"]]
    steps_a = [p.data["step"] for p in parts if p.event == "custom" and p.data["tag"] == "a"]
    assert steps_a and steps_a == list(range(steps_a[0], 30))  # from when it joined, contiguous


async def test_unknown_thread_is_404(http: httpx.AsyncClient) -> None:
    r = await http.get("/threads/00000000-0000-0000-0000-000000000000/stream")
    assert r.status_code == 404 and "detail" in r.json()
    bad = await http.get("/threads/00000000-0000-0000-0000-000000000000/stream", params={"stream_mode": "nope"})
    assert bad.status_code == 422


async def test_a_run_created_once_the_stream_is_opened_is_followed_whole(runtime: Runtime) -> None:
    """The stream's starting point is fixed before its response begins: a client that has the response's headers
    and then creates a run gets all of that run, however late the server starts sending. (Fixed at the first
    event, a quick run created in between counted as past: the differential suite's thread stream came back
    empty in 1 of 20 rounds beside a CPU hog.)"""
    tid = (await runtime.threads.create())["thread_id"]
    events = await follow_thread(runtime.runs, tid)  # what the route does before its response begins
    run = await runtime.runs.create(tid, {"assistant_id": "slow", "input": {"tag": "q", "steps": 2, "delay": 0},
                                          "stream_mode": ["custom"]})
    await runtime.runs.wait(run["run_id"], tid)  # over before the stream sends anything
    got: list[tuple[str, Any]] = []
    async with asyncio.timeout(30):
        async for ev in events:
            got.append((ev.event, json.loads(ev.data)))
            if ev.event == "metadata" and got[-1][1].get("status") == "run_done":
                break
    assert [(e, d.get("step", d.get("status"))) for e, d in got] == [
        ("metadata", None), ("custom", 0), ("custom", 1), ("metadata", "run_done")]
    await events.aclose()  # type: ignore[attr-defined]


async def _status_is(client: LangGraphClient, tid: str, run_id: str, status: str) -> bool:
    return bool((await client.runs.get(tid, run_id))["status"] == status)
