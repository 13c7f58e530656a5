"""Quotas: caps on active (pending + running) runs per identity and on the whole queue, checked inside the
enqueue transaction; a refused run is a 429 with a clear message, and the runs already queued are intact."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
from asgi_lifespan import LifespanManager

from tests.conftest import PROJECT
from tests.services import Backend
from threadline.api.app import create_app
from threadline.settings import Settings


async def _client(backend: Backend, **limits: Any) -> AsyncIterator[httpx.AsyncClient]:
    # No workers: runs stay pending, so the caps are reached and stay reached.
    app = create_app(Settings(config=str(PROJECT), workers=0, **backend.settings(), **limits))
    async with LifespanManager(app, startup_timeout=30, shutdown_timeout=30) as manager:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app), base_url="http://t",
                                     timeout=30) as http:
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
            return await http.post(f"/threads/{tid}/runs", json=BODY, headers={"X-Forwarded-For": client})

        assert [(await create("10.0.0.1")).status_code for _ in range(3)] == [200, 200, 429]
        refused = await create("10.0.0.1")
        assert refused.status_code == 429 and "Too many active runs" in refused.json()["detail"]
        assert [(await create("10.0.0.2")).status_code for _ in range(2)] == [200, 200]
        assert len((await http.get(f"/threads/{tid}/runs")).json()) == 4
