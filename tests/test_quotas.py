"""Quotas: caps on active (pending + running) runs per identity and on the whole queue, checked inside the
enqueue transaction; a refused run is a 429 with a clear message, and the runs already queued are intact."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from asgi_lifespan import LifespanManager

from tests.conftest import PROJECT
from tests.services import Backend
from tests.test_crons import Clock
from threadline.api.app import create_app
from threadline.core.runtime import Runtime
from threadline.settings import Settings


async def _served(backend: Backend, **limits: Any) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    # No workers: runs stay pending, so the caps are reached and stay reached.
    app = create_app(Settings(config=str(PROJECT), workers=0, **backend.settings(), **limits))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://t",
                                     timeout=30) as http:
            yield app.state.runtime, http


async def _client(backend: Backend, **limits: Any) -> AsyncIterator[httpx.AsyncClient]:
    async for _, http in _served(backend, **limits):
        yield http


BODY = {"assistant_id": "echo", "input": {"messages": []}}


async def test_the_queue_cap_refuses_new_runs_and_keeps_the_queued_ones(backend: Backend) -> None:
    async for http in _client(backend, max_active_runs=3):
        tids = [(await http.post("/threads", json={})).json()["thread_id"] for _ in range(5)]
        # Concurrent creations race for the last places: exactly three win.
        answers = await asyncio.gather(*(http.post(f"/threads/{tid}/runs", json=BODY) for tid in tids))
        codes = sorted(a.status_code for a in answers)
        assert codes == [200, 200, 200, 429, 429]
        refused = next(a for a in answers if a.status_code == 429)
        assert "queue is full" in refused.json()["detail"] and refused.headers["retry-after"]
        created = [a.json()["run_id"] for a in answers if a.status_code == 200]
        pending = (await http.post("/runs/search", json={"limit": 10})).json()
        assert sorted(r["run_id"] for r in pending) == sorted(created)
        assert {r["status"] for r in pending} == {"pending"}
        metrics = (await http.get("/metrics")).text
        assert "lg_api_queue_cap 3.0" in metrics and "lg_api_num_pending_runs 3.0" in metrics
        # A stateless run counts against the same cap; cancelling one frees a place.
        assert (await http.post("/runs", json=BODY)).status_code == 429
        await http.post(f"/runs/{created[0]}/cancel")
        assert (await http.post("/runs", json=BODY)).status_code == 200


async def test_the_per_identity_cap_leaves_other_clients_alone(backend: Backend) -> None:
    async for http in _client(backend, max_active_runs_per_identity=2, trusted_proxies="127.0.0.1"):
        tid = (await http.post("/threads", json={})).json()["thread_id"]

        async def create(client: str) -> httpx.Response:
            # B023: called only inside this iteration (the loop runs once, with the one client)
            return await http.post(f"/threads/{tid}/runs", json=BODY, headers={"X-Forwarded-For": client})  # noqa: B023

        assert [(await create("10.0.0.1")).status_code for _ in range(3)] == [200, 200, 429]
        refused = await create("10.0.0.1")
        assert refused.status_code == 429 and "Too many active runs" in refused.json()["detail"]
        assert [(await create("10.0.0.2")).status_code for _ in range(2)] == [200, 200]
        assert len((await http.get(f"/threads/{tid}/runs")).json()) == 4


def _a2a_message(text: str) -> dict[str, Any]:
    return {"message": {"kind": "message", "role": "user", "messageId": str(uuid.uuid4()),
                        "parts": [{"kind": "text", "text": text}]}, "configuration": {"blocking": False}}


def _rpc(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


async def test_the_per_identity_cap_counts_runs_of_every_surface(backend: Backend) -> None:
    """Runs created over A2A, MCP and Protocol v2 commands count against their caller's cap, and one past it is
    refused in each surface's own error shape; other callers are left alone."""
    async for http in _client(backend, max_active_runs_per_identity=2, trusted_proxies="127.0.0.1"):
        def who(client: str) -> dict[str, str]:
            return {"X-Forwarded-For": client, "Accept": "application/json, text/event-stream"}

        tid = (await http.post("/threads", json={})).json()["thread_id"]
        # Two runs over A2A and Protocol v2 fill one client's cap: a REST run is one too many.
        sent = (await http.post("/a2a/echo", json=_rpc("message/send", _a2a_message("hi")),
                                headers=who("10.0.0.1"))).json()
        assert sent["result"]["status"]["state"] == "submitted"
        started = (await http.post(f"/threads/{tid}/commands", headers=who("10.0.0.1"), json={
            "id": 1, "method": "run.start", "params": {"assistant_id": "echo", "input": {"messages": []}}})).json()
        assert started["type"] == "success"
        assert (await http.post(f"/threads/{tid}/runs", json=BODY, headers=who("10.0.0.1"))).status_code == 429

        # One more over each surface: refused, in its own shape.
        a2a = (await http.post("/a2a/echo", json=_rpc("message/send", _a2a_message("again")),
                               headers=who("10.0.0.1"))).json()
        assert a2a["error"]["code"] == -32000 and "Too many active runs" in a2a["error"]["message"]
        assert a2a["error"]["data"] == {"code": "quota_exceeded", "retry_after": 5}
        mcp = (await http.post("/mcp", json=_rpc("tools/call", {"name": "echo", "arguments": {"messages": []}}),
                               headers=who("10.0.0.1"))).json()
        assert mcp["error"]["code"] == -32000 and "Too many active runs" in mcp["error"]["message"]
        command = (await http.post(f"/threads/{tid}/commands", headers=who("10.0.0.1"), json={
            "id": 2, "method": "run.start", "params": {"assistant_id": "echo", "input": {"messages": []}}})).json()
        assert command["type"] == "error" and command["error"] == "quota_exceeded" and command["retry_after"] == 5
        assert "Too many active runs" in command["message"]

        # Another client is not held by the first one's runs.
        other = (await http.post("/a2a/echo", json=_rpc("message/send", _a2a_message("hi")),
                                 headers=who("10.0.0.2"))).json()
        assert other["result"]["status"]["state"] == "submitted"
        assert len((await http.post("/runs/search", json={"limit": 10})).json()) == 3


async def test_a_crons_runs_count_against_its_creator(backend: Backend) -> None:
    async for rt, http in _served(backend, max_active_runs_per_identity=1, trusted_proxies="127.0.0.1"):
        crons = rt.crons
        assert crons is not None
        clock = Clock(datetime.now(UTC) + timedelta(days=365))
        crons.clock = clock
        busy, idle = {"X-Forwarded-For": "10.0.0.1"}, {"X-Forwarded-For": "10.0.0.2"}
        made = {}
        for name, headers in (("busy", busy), ("idle", idle)):
            made[name] = (await http.post("/runs/crons", headers=headers, json={
                "assistant_id": "echo", "schedule": "* * * * *", "input": {"messages": []}})).json()["cron_id"]
        # The busy client already has its one active run.
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        assert (await http.post(f"/threads/{tid}/runs", json=BODY, headers=busy)).status_code == 200
        clock.advance(minutes=1)
        await crons.run_due()
        runs = (await http.post("/runs/search", json={"limit": 10})).json()
        from_crons = {r["metadata"].get("cron_id") for r in runs} - {None}
        assert from_crons == {made["idle"]}  # the busy creator's tick was refused by its cap
