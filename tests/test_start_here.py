"""A run its request waits for starts at once on a free local slot, claimed in the transaction that creates it
(`Runs.create(start_here=True)`, `WorkerPool.reserve`/`adopt`); every other run goes through the queue."""

from __future__ import annotations

import asyncio
import gc
import uuid
import warnings
from typing import Any

import httpx
import pytest

from tests.conftest import PROJECT
from threadline.core.runtime import Runtime
from threadline.core.worker import WorkerPool
from threadline.settings import Settings
from threadline.tracing import REQUEST_ID


@pytest.fixture
def settings(backend: Any) -> Settings:
    """One slot, so that a test can fill it."""
    return Settings(config=str(PROJECT), workers=1, heartbeat_seconds=5.0, **backend.settings())


async def idle(pool: WorkerPool | None) -> None:
    """Until the pool's slot is free and its loop is asleep: a slot claims once at start and once after each
    run, and while that claim is in flight the slot is reserved for it."""
    assert pool is not None
    for _ in range(300):
        await asyncio.sleep(0.02)
        if pool.free == pool.size:
            return
    raise AssertionError("the pool never became idle")


def record_claims(runtime: Runtime) -> list[str]:
    """The ids of the runs the worker's claimer claimed from the queue."""
    claimed: list[str] = []
    claim = runtime.storage.claim_runs

    async def recording(*args: Any, **kwargs: Any) -> Any:
        runs = await claim(*args, **kwargs)
        claimed.extend(run["run_id"] for run in runs)
        return runs

    runtime.storage.claim_runs = recording  # type: ignore[method-assign]
    return claimed


async def test_a_waited_run_starts_without_a_claim_and_a_background_run_is_queued(
        http: httpx.AsyncClient, runtime: Runtime) -> None:
    claimed = record_claims(runtime)
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    await idle(runtime.workers)
    r = await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "counter", "input": {"increment": 3}})
    assert r.status_code == 200 and r.json()["count"] == 3, r.text
    (waited,) = (await http.get(f"/threads/{tid}/runs")).json()
    assert waited["status"] == "success"
    assert waited["run_id"] not in claimed

    r = await http.post(f"/threads/{tid}/runs", json={"assistant_id": "counter", "input": {"increment": 1}})
    background = r.json()
    assert background["status"] == "pending"  # as the reference shows a created run
    assert (await http.get(f"/threads/{tid}/runs/{background['run_id']}/join")).json()["count"] == 4
    assert background["run_id"] in claimed

    await idle(runtime.workers)  # the join returns as the run ends; its slot frees and claims again just after
    async with http.stream("POST", "/runs/stream", json={"assistant_id": "counter", "input": {"increment": 2}}) as s:
        body = (await s.aread()).decode()
    assert '"count":2' in body.replace(" ", "")
    streamed = body.split('"run_id":"', 1)[1].split('"', 1)[0]
    assert streamed not in claimed
    assert (await http.get(f"/runs/{streamed}")).json()["status"] == "success"


async def test_a_full_pool_and_a_busy_thread_send_a_waited_run_through_the_queue(
        http: httpx.AsyncClient, runtime: Runtime) -> None:
    claimed = record_claims(runtime)
    assert runtime.workers is not None and runtime.workers.size == 1
    first = (await http.post("/threads", json={})).json()["thread_id"]
    other = (await http.post("/threads", json={})).json()["thread_id"]
    busy = await http.post(f"/threads/{first}/runs", json={"assistant_id": "slow",
                                                             "input": {"tag": "a", "steps": 8, "delay": 0.05}})
    busy_id = busy.json()["run_id"]
    for _ in range(200):
        if (await http.get(f"/threads/{first}/runs/{busy_id}")).json()["status"] == "running":
            break
        await asyncio.sleep(0.01)

    # The one slot is taken: a waited run on another thread waits in the queue, it does not start beside it.
    waiting = asyncio.create_task(http.post(f"/threads/{other}/runs/wait", json={
        "assistant_id": "slow", "input": {"tag": "b", "steps": 1, "delay": 0.01}}))
    for _ in range(200):
        runs = (await http.get(f"/threads/{other}/runs")).json()
        if runs:
            break
        await asyncio.sleep(0.01)
    assert runs[0]["status"] == "pending"
    assert runtime.workers.busy == 1
    r = await waiting
    assert r.status_code == 200 and r.json()["done"] == ["b"]
    assert runs[0]["run_id"] in claimed

    # Its own thread busy: a waited run queues behind the thread's run even with the slot free.
    queued = await http.post(f"/threads/{first}/runs", json={"assistant_id": "slow",
                                                               "input": {"tag": "c", "steps": 4, "delay": 0.05}})
    r = await http.post(f"/threads/{first}/runs/wait", json={"assistant_id": "slow",
                                                               "input": {"tag": "d", "steps": 1, "delay": 0.01}})
    assert r.status_code == 200 and r.json()["done"] == ["a", "c", "d"]
    ids = {run["run_id"] for run in (await http.get(f"/threads/{first}/runs")).json()}
    assert ids - {busy_id, queued.json()["run_id"]} <= set(claimed)


@pytest.mark.parametrize("started", [True, False], ids=["running", "task-not-started"])
async def test_a_started_run_goes_back_to_the_queue_at_shutdown(settings: Settings, started: bool) -> None:
    """Whether its task is running or (stopped at once) has not run a step yet: the run was claimed at its
    creation, so shutdown releases it (else it would wait for its lease to lapse, or for the next start)."""
    runtime = await Runtime.open(settings)
    try:
        await runtime.start()
        assert runtime.workers is not None
        await idle(runtime.workers)
        run = await runtime.runs.create(str(uuid.uuid4()), {
            "assistant_id": "slow", "if_not_exists": "create", "input": {"tag": "s", "steps": 50, "delay": 0.05}},
            start_here=True)
        assert run["status"] == "running" and run["attempt"] == 1
        assert runtime.workers.started_here(run["run_id"]) is not None
        if started:
            await asyncio.sleep(0.1)
        await runtime.workers.stop()  # without the sleep, no await in between: the task has not run a step
        released = await runtime.storage.get_run(run["run_id"])
        assert released is not None and released["status"] == "pending"
        assert runtime.workers.started_here(run["run_id"]) is None
    finally:
        await runtime.close()


async def test_a_run_stopped_before_its_execution_starts_leaves_no_coroutine_unawaited(settings: Settings) -> None:
    """Shutdown can cancel a run's execution task after its slot made it and before it ran a step (the
    window seen as `coroutine 'Executor.execute' was never awaited` in the rate-limit tests): the run goes
    back to the queue, and no execution was made that nobody runs. The run carries its request's id, as a
    run created over HTTP does, so its execution is wrapped to continue that request (`traced_run`)."""
    runtime = await Runtime.open(settings)
    try:
        await runtime.start()
        pool = runtime.workers
        assert pool is not None
        await idle(pool)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            token = REQUEST_ID.set("a-request-id")
            try:
                run = await runtime.runs.create(str(uuid.uuid4()), {
                    "assistant_id": "slow", "if_not_exists": "create",
                    "input": {"tag": "s", "steps": 50, "delay": 0.05}}, start_here=True)
            finally:
                REQUEST_ID.reset(token)
            # One step at a time (this task is always queued, so no other task runs two steps in between):
            # the slot has made its execution task when it counts as busy, and that task has not run yet.
            for _ in range(10_000):
                if pool.busy:
                    break
                await asyncio.sleep(0)
            assert pool.busy == 1
            await pool.stop()
            gc.collect()
        released = await runtime.storage.get_run(run["run_id"])
        assert released is not None and released["status"] == "pending"
        unawaited = [str(w.message) for w in caught if "never awaited" in str(w.message)]
        assert unawaited == []
    finally:
        await runtime.close()


async def test_creates_that_fail_give_their_reserved_slot_back(http: httpx.AsyncClient, runtime: Runtime) -> None:
    """A waited run's slot is reserved before its enqueue: an enqueue that fails (a missing thread, a
    rejected strategy) must not keep it, or the one slot would be gone for good."""
    claimed = record_claims(runtime)
    await idle(runtime.workers)
    for _ in range(3):
        r = await http.post(f"/threads/{uuid.uuid4()}/runs/wait", json={"assistant_id": "counter", "input": {}})
        assert r.status_code == 404
    assert runtime.workers is not None and runtime.workers.free == 1
    tid = (await http.post("/threads", json={})).json()["thread_id"]
    await idle(runtime.workers)
    r = await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "counter", "input": {"increment": 1}})
    assert r.status_code == 200 and r.json()["count"] == 1
    (run,) = (await http.get(f"/threads/{tid}/runs")).json()
    assert run["run_id"] not in claimed  # started at once on the slot, not through the queue


@pytest.mark.slow  # two apps with workers of their own, seconds of waited runs
async def test_waits_on_one_thread_through_two_processes_run_one_at_a_time(backend: Any) -> None:
    """Two API processes with workers of their own, on one PostgreSQL and Redis: waited runs on one thread,
    sent to both at once, start at once where they can, and still run one at a time, in turn: each sees the
    state the one before it left (the counter adds up) and each is run once. Each round, one process's run
    is let in first, on an idle thread and an idle pool, so that it starts at once; the others follow it
    concurrently, from both processes."""
    if backend.kind != "postgres":
        pytest.skip("one process owns an SQLite file")
    from asgi_lifespan import LifespanManager

    from threadline.api.app import create_app

    settings = Settings(config=str(PROJECT), workers=2, heartbeat_seconds=5.0, **backend.settings())
    a_app, b_app = create_app(settings), create_app(settings)
    async with LifespanManager(a_app, startup_timeout=30) as a, LifespanManager(b_app, startup_timeout=30) as b:
        clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=m.app), base_url="http://threadline",
                                     timeout=60) for m in (a, b)]
        started_here: list[list[str]] = [[], []]
        for pool, started in zip((a_app.state.runtime.workers, b_app.state.runtime.workers), started_here, strict=True):
            def adopt(run: Any, *args: Any, _adopt: Any = pool.adopt, _started: list[str] = started,
                      **kwargs: Any) -> Any:
                _started.append(run["run_id"])
                return _adopt(run, *args, **kwargs)
            pool.adopt = adopt
        pools = (a_app.state.runtime.workers, b_app.state.runtime.workers)
        try:
            tid = (await clients[0].post("/threads", json={})).json()["thread_id"]
            rounds, per_round = 6, 6

            def wait(r: int, i: int) -> Any:
                return clients[(i + r) % 2].post(f"/threads/{tid}/runs/wait", json={
                    "assistant_id": "counter", "input": {"increment": 1, "tag": f"{r}-{i}"}})

            for r in range(rounds):
                leader = r % 2  # the processes take turns
                await idle(pools[leader])
                before = len(started_here[leader])
                first = asyncio.ensure_future(wait(r, 0))
                for _ in range(500):
                    if len(started_here[leader]) > before or first.done():
                        break
                    await asyncio.sleep(0.01)
                assert len(started_here[leader]) == before + 1, f"round {r}: the leader's run did not start at once"
                answers = [*await asyncio.gather(*(wait(r, i) for i in range(1, per_round))), await first]
                assert all(answer.status_code == 200 for answer in answers), [a.text for a in answers]
            runs = (await clients[1].get(f"/threads/{tid}/runs", params={"limit": 100})).json()
            assert len(runs) == rounds * per_round
            assert all(run["status"] == "success" for run in runs)
            state = (await clients[1].get(f"/threads/{tid}/state")).json()
            assert state["values"]["count"] == rounds * per_round  # no two runs read the same state
            assert sorted(state["values"]["log"]) == sorted(f"{r}-{i}" for r in range(rounds) for i in range(per_round))
            assert (await clients[0].get(f"/threads/{tid}")).json()["status"] == "idle"
            # Each process started its leaders' runs at once (others, at once or through the queue).
            assert all(len(started) >= rounds // 2 for started in started_here), started_here
            assert not set(started_here[0]) & set(started_here[1])
        finally:
            for client in clients:
                await client.aclose()
