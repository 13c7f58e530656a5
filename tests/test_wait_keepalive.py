"""A wait for a run that lasts sends a newline every `heartbeat_seconds`, then the JSON (as LangGraph's server)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.client import LangGraphClient

from tests.conftest import PROJECT, serving
from tests.services import Backend
from threadline.settings import Settings

SLOW: dict[str, Any] = {"tag": "k", "steps": 4, "delay": 0.1}  # about 0.4 s: several heartbeats of 0.05 s


@pytest.fixture
def settings(backend: Backend, request: pytest.FixtureRequest) -> Settings:
    heartbeat = getattr(request, "param", 0.05)  # a test may ask for another interval (indirect parametrize)
    if heartbeat is None:  # the default
        return Settings(config=str(PROJECT), workers=4, **backend.settings())
    return Settings(config=str(PROJECT), workers=4, heartbeat_seconds=heartbeat, **backend.settings())


def _kept_alive(body: bytes) -> Any:
    """The JSON after the heartbeats; fails unless there was at least one."""
    assert body.startswith(b"\n"), body[:40]
    assert body.strip(b"\n")[:1] in (b"{", b"["), body[:40]
    return json.loads(body)


async def test_thread_wait_sends_newlines_then_the_output(http: httpx.AsyncClient) -> None:
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    r = await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "slow", "input": SLOW})
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert _kept_alive(r.content) == {**SLOW, "done": ["k"]}
    assert r.headers["location"].endswith("/join") and f"/threads/{tid}/runs/" in r.headers["location"]


async def test_stateless_wait_and_join_send_newlines(http: httpx.AsyncClient) -> None:
    r = await http.post("/runs/wait", json={"assistant_id": "slow", "input": SLOW})
    assert r.status_code == 200 and _kept_alive(r.content) == {**SLOW, "done": ["k"]}
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    run = (await http.post(f"/threads/{tid}/runs", json={"assistant_id": "slow", "input": SLOW})).json()
    r = await http.get(f"/threads/{tid}/runs/{run['run_id']}/join")
    assert r.status_code == 200 and _kept_alive(r.content) == {**SLOW, "done": ["k"]}


# A long interval, so "quick" does not depend on how busy the machine is (0.05 s failed under load).
@pytest.mark.parametrize("settings", [30.0], indirect=True, ids=["heartbeat-30s"])
async def test_a_quick_wait_is_plain_json(http: httpx.AsyncClient) -> None:
    r = await http.post("/runs/wait", json={"assistant_id": "failing", "input": {"reason": "no"}})
    assert r.status_code == 200 and r.headers["content-length"] == str(len(r.content))
    assert r.json() == {"__error__": {"error": "ValueError", "message": "no"}}


async def test_an_error_after_the_200_is_the_body(http: httpx.AsyncClient) -> None:
    """Once the 200 is sent, a failure of the wait (here: the run rolled back, so there is no run to answer
    with) is reported as a failed run's output is."""
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    waiting = asyncio.create_task(http.post(f"/threads/{tid}/runs/wait", json={
        "assistant_id": "slow", "input": {**SLOW, "steps": 20}}))
    for _ in range(200):
        runs = (await http.get(f"/threads/{tid}/runs")).json()
        if runs and runs[0]["status"] == "running":
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # a few heartbeats have gone out
    cancel = await http.post(f"/threads/{tid}/runs/{runs[0]['run_id']}/cancel", params={"action": "rollback"})
    assert cancel.status_code in (200, 202)
    r = await waiting
    assert r.status_code == 200
    out = _kept_alive(r.content)
    assert out["__error__"]["error"] == "NotFound", out


async def test_sdk_wait_and_join_over_a_real_socket(settings: Settings) -> None:
    """The status and headers come at once, newlines while the run goes on, and langgraph-sdk parses it."""
    async with serving(settings) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as raw:
            tid = (await raw.post("/threads", json={})).json()["thread_id"]
            started = time.monotonic()
            async with raw.stream("POST", f"/threads/{tid}/runs/wait",
                                  json={"assistant_id": "slow", "input": SLOW}) as r:
                headers_after = time.monotonic() - started
                chunks = [(time.monotonic() - started, c) async for c in r.aiter_raw()]
        body = b"".join(c for _, c in chunks)
        assert _kept_alive(body) == {**SLOW, "done": ["k"]}
        assert headers_after < chunks[-1][0] - 0.1  # the 200 came well before the answer
        assert chunks[0][1].startswith(b"\n")
        client: LangGraphClient = get_client(url=url)
        assert await client.runs.wait(tid, "slow", input=SLOW) == {**SLOW, "done": ["k", "k"]}
        run = await client.runs.create(tid, "slow", input=SLOW)
        assert await client.runs.join(tid, run["run_id"]) == {**SLOW, "done": ["k", "k", "k"]}
        assert await client.runs.wait(None, "slow", input=SLOW) == {**SLOW, "done": ["k"]}


@pytest.mark.slow  # six seconds of real time: the default cadence (5 s) cannot be shortened here
@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the cadence is the API's, not the backend's
@pytest.mark.parametrize("settings", [None], indirect=True, ids=["default-heartbeat"])
async def test_by_default_a_wait_of_six_seconds_is_kept_alive(http: httpx.AsyncClient) -> None:
    """As LangGraph's server, a newline every 5 s by default: a run of at least 6 s gets one (Aegra's e2e suite
    counts them on a 15 s wait). With a 15 s default, such a wait was a plain JSON answer."""
    body: dict[str, Any] = {"assistant_id": "slow", "input": {"tag": "d", "steps": 1, "delay": 6.0}}
    r = await http.post("/runs/wait", json=body)
    assert r.status_code == 200 and _kept_alive(r.content) == {**body["input"], "done": ["d"]}
