"""Thread TTLs: langgraph.json `checkpointer.ttl` and `ttl` on thread create and update.

An expired thread is deleted with its checkpoints and runs by the sweeper. Sweeps are triggered by
calling the runtime's `threads.sweep_expired(now=…)` with a `now` past the expiry, so no test waits
for a clock; one test checks the background sweeper itself by waiting on its effect.

The tests of the ttl project share one app per backend (`server`, started once): a sweep there deletes what
every test left expired, so each test looks only at its own threads among what a sweep deleted
(`Server.sweep(ids, ...)`). A test of another project starts its own app on `own_backend`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from asgi_lifespan import LifespanManager
from langgraph_sdk.client import LangGraphClient

from tests.services import Backend
from tests.waits import until
from threadline.api.app import create_app
from threadline.config import CheckpointerTTL, load_config
from threadline.core.runtime import Runtime
from threadline.errors import ConfigError
from threadline.settings import Settings

TTL_PROJECT = Path(__file__).parent / "project" / "ttl" / "langgraph.json"  # default_ttl: 60 minutes
FAST_SWEEP_PROJECT = TTL_PROJECT.with_name("fast_sweep.json")  # sweeps every 0.12 s, no default
PLAIN_PROJECT = Path(__file__).parent / "project" / "langgraph.json"  # no checkpointer.ttl


class Server:
    """One app in-process: its langgraph-sdk client, raw HTTP client and runtime."""

    def __init__(self, sdk: LangGraphClient, http: httpx.AsyncClient, runtime: Runtime) -> None:
        self.sdk, self.http, self.runtime = sdk, http, runtime

    async def sweep(self, ids: Collection[str] | None = None, **later: float) -> list[str]:
        """Sweep as if the clock read now + `later` (timedelta keywords): the threads deleted, or those of
        them among `ids` (on an app shared with other tests)."""
        now = datetime.now(UTC) + timedelta(**later)
        swept = await self.runtime.threads.sweep_expired(now=now.isoformat())
        return swept if ids is None else [tid for tid in swept if tid in set(ids)]

    async def exists(self, thread_id: str) -> bool:
        resp = await self.http.get(f"/threads/{thread_id}")
        assert resp.status_code in (200, 404), resp.text
        return resp.status_code == 200

    async def has_checkpoints(self, thread_id: str) -> bool:
        config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        return await self.runtime.storage.checkpointer.aget_tuple(config) is not None


@contextlib.asynccontextmanager
async def serve(config: Path, backend: Backend) -> AsyncIterator[Server]:
    """The app over `config` on the test's backend, with no workers: a run stays pending, its thread busy."""
    application = create_app(Settings(config=str(config), workers=0, **backend.settings()))
    async with LifespanManager(application, startup_timeout=30, shutdown_timeout=30) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://threadline", timeout=30) as client:
            yield Server(LangGraphClient(client), client, application.state.runtime)


pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # the mark above reaches the module's plain functions too, which run as such
              pytest.mark.filterwarnings("ignore:.*is marked with '@pytest.mark.asyncio' but it is not an async")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(module_backend: Backend) -> AsyncIterator[Server]:
    """The ttl project (default_ttl 60 minutes), shared by the module's tests on each backend."""
    async with serve(TTL_PROJECT, module_backend) as s:
        yield s


async def seeded_thread(sdk: LangGraphClient, **kwargs: Any) -> str:
    """A thread of the counter graph with two checkpoints of state."""
    thread = await sdk.threads.create(graph_id="counter", supersteps=[
        {"updates": [{"values": {"count": 1}, "as_node": "count"}]},
        {"updates": [{"values": {"count": 2}, "as_node": "count"}]},
    ], **kwargs)
    return str(thread["thread_id"])


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_expired_thread_is_deleted_with_its_checkpoints(server: Server) -> None:
    short = await seeded_thread(server.sdk, ttl=1)  # the sdk sends {"ttl": 1, "strategy": "delete"}
    default = await seeded_thread(server.sdk)  # default_ttl: 60 minutes
    assert await server.has_checkpoints(short) and await server.has_checkpoints(default)
    mine = (short, default)
    assert await server.sweep(mine, seconds=30) == []  # nothing has expired yet
    assert await server.sweep(mine, minutes=2) == [short]
    assert not await server.exists(short) and await server.exists(default)
    assert not await server.has_checkpoints(short) and await server.has_checkpoints(default)
    assert (await server.http.get(f"/threads/{short}/history")).status_code == 404
    assert (await server.http.post(f"/threads/{short}/history", json={})).status_code == 404
    # default_ttl applies to a thread created without one.
    assert await server.sweep(mine, minutes=61) == [default]
    assert not await server.has_checkpoints(default)


async def test_busy_thread_is_not_swept(server: Server) -> None:
    tid = await seeded_thread(server.sdk, ttl=1)
    run = await server.sdk.runs.create(tid, "counter", input={})  # no workers: stays pending
    assert (await server.sdk.threads.get(tid))["status"] == "busy"
    assert await server.sweep([tid], days=1) == []
    assert await server.exists(tid) and await server.has_checkpoints(tid)
    await server.sdk.runs.cancel(tid, run["run_id"])
    assert await server.sweep([tid], days=1) == [tid]  # idle again: swept, with its runs
    assert (await server.http.get(f"/runs/{run['run_id']}")).status_code == 404


async def test_thread_created_by_a_run_gets_the_default_ttl(server: Server) -> None:
    tid = str(uuid.uuid4())
    run = await server.sdk.runs.create(tid, "counter", input={}, if_not_exists="create")
    await server.sdk.runs.cancel(tid, run["run_id"])
    got = (await server.http.get(f"/threads/{tid}", params={"include": "ttl"})).json()
    assert got["ttl"]["ttl_minutes"] == 60 and got["ttl"]["strategy"] == "delete"
    assert await server.sweep([tid], minutes=59) == []
    assert await server.sweep([tid], minutes=61) == [tid]


async def test_ttl_counts_from_the_last_update(server: Server) -> None:
    tid = await seeded_thread(server.sdk, ttl={"strategy": "delete", "ttl": 10})
    updated = await server.sdk.threads.update(tid, metadata={"touched": True}, ttl=5)
    got = (await server.http.get(f"/threads/{tid}", params={"include": "ttl"})).json()
    assert got["ttl"]["ttl_minutes"] == 5
    lifespan = ts(got["ttl"]["expires_at"]) - ts(str(updated["updated_at"]))
    assert abs(lifespan - timedelta(minutes=5)) <= timedelta(milliseconds=1)  # SQLite keeps milliseconds
    assert "ttl" not in await server.sdk.threads.get(tid)  # only with include=ttl
    # Every write extends it: a state update moves updated_at, and expires_at with it.
    await server.sdk.threads.update_state(tid, {"count": 3}, as_node="count")
    later = (await server.http.get(f"/threads/{tid}", params={"include": "ttl"})).json()
    lifespan = ts(later["ttl"]["expires_at"]) - ts(later["updated_at"])
    assert abs(lifespan - timedelta(minutes=5)) <= timedelta(milliseconds=1)
    assert ts(later["ttl"]["expires_at"]) > ts(got["ttl"]["expires_at"])
    assert await server.sweep([tid], minutes=4) == []
    assert await server.sweep([tid], minutes=6) == [tid]


async def test_concurrent_sweeps_delete_each_thread_once(server: Server) -> None:
    ids = {await seeded_thread(server.sdk, ttl=1) for _ in range(6)}
    results = await asyncio.gather(*(server.sweep(ids, minutes=2) for _ in range(3)))
    swept = [tid for result in results for tid in result]
    assert sorted(swept) == sorted(ids)  # all of them, none twice
    assert await server.sweep(ids, minutes=2) == []


@pytest.mark.parametrize("body", [
    {"ttl": {"ttl": 0}}, {"ttl": -5}, {"ttl": "soon"}, {"ttl": {"strategy": "delete"}},
    {"ttl": {"strategy": "keep_latest", "ttl": 5}},
])
async def test_bad_ttl_is_refused(server: Server, body: dict[str, Any]) -> None:
    r = await server.http.post("/threads", json=body)
    assert r.status_code == 422 and "ttl" in r.json()["detail"], r.text
    tid = (await server.sdk.threads.create())["thread_id"]
    r = await server.http.patch(f"/threads/{tid}", json={"metadata": {}, **body})
    assert r.status_code == 422 and "ttl" in r.json()["detail"], r.text


async def test_a_ttl_with_a_field_nobody_defines_is_kept(server: Server) -> None:
    """As LangGraph's server: the unknown field is ignored, the TTL honoured."""
    r = await server.http.post("/threads", json={"ttl": {"ttl": 5, "unknown": 1}})
    assert r.status_code == 200, r.text
    assert await server.sweep([r.json()["thread_id"]], minutes=6) == [r.json()["thread_id"]]


async def test_without_config_only_threads_given_a_ttl_expire(own_backend: Backend) -> None:
    async with serve(PLAIN_PROJECT, own_backend) as plain:
        kept = (await plain.sdk.threads.create())["thread_id"]
        expiring = (await plain.sdk.threads.create(ttl=1))["thread_id"]
        assert (await plain.http.get("/info")).json()["storage"]["thread_ttl"] is None
        assert await plain.sweep(days=365) == [expiring]
        assert await plain.exists(kept)


async def test_default_ttl_applies_only_to_threads_created_under_it(own_backend: Backend) -> None:
    async with serve(PLAIN_PROJECT, own_backend) as before:
        old = (await before.sdk.threads.create())["thread_id"]
    async with serve(TTL_PROJECT, own_backend) as after:
        new = (await after.sdk.threads.create())["thread_id"]
        assert (await after.http.get("/info")).json()["storage"]["thread_ttl"] == {
            "strategy": "delete", "sweep_interval_minutes": 60, "default_ttl": 60, "sweep_limit": 1000}
        assert await after.sweep(days=365) == [new]
        assert await after.exists(old)


async def test_background_sweeper_deletes_expired_threads(own_backend: Backend) -> None:
    async with serve(FAST_SWEEP_PROJECT, own_backend) as s:
        tid = await seeded_thread(s.sdk, ttl=0.001)  # 60 ms
        kept = await seeded_thread(s.sdk)  # no default_ttl in this project
        async def swept() -> bool:
            return not await s.exists(tid)

        await until(swept, timeout=10, what="the sweeper (every 0.12 s) to delete the thread")
        assert not await s.exists(tid) and not await s.has_checkpoints(tid)
        assert await s.exists(kept)


def test_checkpointer_ttl_config(tmp_path: Path) -> None:
    path = tmp_path / "langgraph.json"

    def load(ttl: Any) -> Any:
        path.write_text(json.dumps({"graphs": {"a": "./a.py:g"}, "checkpointer": {"ttl": ttl}}))
        return load_config(path)

    assert load({}).checkpointer_ttl == CheckpointerTTL(
        strategy="delete", sweep_interval_minutes=5.0, default_ttl=None, sweep_limit=1000)
    cfg = load({"strategy": "delete", "sweep_interval_minutes": 60, "default_ttl": 43200, "sweep_limit": 50})
    assert cfg.checkpointer_ttl == CheckpointerTTL(
        strategy="delete", sweep_interval_minutes=60.0, default_ttl=43200.0, sweep_limit=50)
    assert load({"default_ttl": 1, "later": True}).unsupported == ["checkpointer.ttl.later"]
    for bad in ({"strategy": "keep_latest"}, {"default_ttl": 0}, {"sweep_interval_minutes": "hourly"},
                {"sweep_limit": 2.5}, "43200"):
        with pytest.raises(ConfigError, match="checkpointer.ttl"):
            load(bad)
