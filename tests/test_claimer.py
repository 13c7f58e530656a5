"""One claimer per worker process (`WorkerPool._claimer`): it claims for all its free slots in one statement,
so an idle process costs the database one claim a poll whatever its slots."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import PROJECT
from tests.test_storage import enqueue
from tests.waits import until
from threadline.core.runtime import Runtime
from threadline.core.worker import WorkerPool
from threadline.settings import Settings

SLOTS = 8


@pytest.fixture
def poll_seconds() -> float:
    """The claimer's poll: a test sets another with `@pytest.mark.parametrize("poll_seconds", [...])`."""
    return WorkerPool.poll_seconds


@pytest.fixture
def settings(backend: Any, poll_seconds: float, monkeypatch: pytest.MonkeyPatch) -> Settings:
    # Set before the app starts, so the claimer's first wait already has it (set on the started pool, the
    # test slept out the wait begun with the default poll).
    monkeypatch.setattr(WorkerPool, "poll_seconds", poll_seconds)
    return Settings(config=str(PROJECT), workers=SLOTS, heartbeat_seconds=5.0, **backend.settings())


def count_claims(runtime: Runtime) -> list[int]:
    """Claim statements sent from now on (one claim for one slot or for many counts one), and the runs they took."""
    storage = runtime.storage
    counted = [0, 0]
    claim_runs, claim_run = getattr(storage, "claim_runs", None), storage.claim_run

    async def many(*args: Any, **kwargs: Any) -> Any:
        assert claim_runs is not None
        runs = await claim_runs(*args, **kwargs)
        counted[0] += 1
        counted[1] += len(runs)
        return runs

    async def one(*args: Any, **kwargs: Any) -> Any:  # a claim for one slot, as each slot's loop made before
        run = await claim_run(*args, **kwargs)
        counted[0] += 1
        counted[1] += run is not None
        return run

    storage.claim_runs = many  # type: ignore[method-assign]
    storage.claim_run = one  # type: ignore[method-assign]  # the pool claims through `claim_runs`: unused
    return counted


@pytest.mark.parametrize("poll_seconds", [0.1])
async def test_an_idle_pool_claims_once_a_poll_not_once_per_slot(runtime: Runtime) -> None:
    pool = runtime.workers
    assert pool is not None
    await until(lambda: pool.free == SLOTS, timeout=30, what="the pool idle")
    counted = count_claims(runtime)
    await asyncio.sleep(1.0)
    # One claimer: about 10 polls in the second (fewer on a loaded machine, never more). One loop per slot
    # made about SLOTS times as many.
    assert 1 <= counted[0] <= 13, counted


@pytest.mark.parametrize("poll_seconds", [60.0])  # no poll during the test: only the wake-up below claims
async def test_one_wake_up_fills_every_free_slot_in_one_claim(runtime: Runtime) -> None:
    pool = runtime.workers
    assert pool is not None
    # Its start's claim done (every slot free again), the claimer waits: 60 s, or a wake-up.
    await until(lambda: pool.free == SLOTS, timeout=30, what="the pool idle")
    counted = count_claims(runtime)
    for _ in range(SLOTS):  # queued without a wake-up each, as runs released or recovered in bulk could be
        await enqueue(runtime.storage)
    await runtime.broker.wake_workers()
    # Per-slot loops took one run per wake-up and left the rest to the poll, 60 s away.
    await until(lambda: counted[1] == SLOTS, timeout=10, what=f"all {SLOTS} runs claimed after one wake-up")
    assert counted[0] <= 2, counted


@pytest.mark.parametrize("poll_seconds", [60.0])  # no poll: only a wake-up or a run's end makes a claim
async def test_a_runs_end_claims_only_when_its_thread_has_a_next_run(runtime: Runtime) -> None:
    """A slot freed by a run's end claims at once for the run's thread's next run (which waited for it); a run
    whose thread has none claims nothing (a claim for nothing per run, before)."""
    pool = runtime.workers
    assert pool is not None
    await until(lambda: pool.free == SLOTS, timeout=30, what="the pool idle")  # and the claimer waits
    counted = count_claims(runtime)
    alone = await enqueue(runtime.storage)
    await runtime.broker.wake_workers()

    async def ended(run_id: str) -> bool:
        run = await runtime.storage.get_run(run_id)
        return run is not None and run["status"] not in ("pending", "running")

    await until(lambda: ended(alone["run_id"]), timeout=30, what="the run ended")
    await until(lambda: pool.free == SLOTS, timeout=10, what="its slot free")
    await asyncio.sleep(0.3)  # time for a claim, were the run's end to make one
    assert counted[0] == 1, counted

    first = await enqueue(runtime.storage)
    second = await enqueue(runtime.storage, first["thread_id"], create=False)  # waits for the first to end
    await runtime.broker.wake_workers()
    # With no claim at the first run's end, the second would wait for the poll, 60 s away.
    await until(lambda: ended(second["run_id"]), timeout=30, what="the thread's next run claimed at its end")
