"""Races between processes on a shared database, forced deterministically with a second connection."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timezone

import psycopg
import pytest

from threadline.storage import open_storage


async def test_a_finish_does_not_mark_idle_a_thread_that_just_got_a_run(database_url: str) -> None:
    """A run enqueued (by another process) while a run of the same thread finishes keeps the thread busy."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer: an enqueue and a finish cannot interleave")
    storage = await open_storage(database_url)
    try:
        tid, now = str(uuid.uuid4()), datetime.now(timezone.utc).isoformat()
        await storage.enqueue_run(
            {"run_id": str(uuid.uuid4()), "thread_id": tid, "assistant_id": "a", "status": "pending",
             "metadata": {}, "kwargs": {}, "available_at": now, "created_at": now, "updated_at": now},
            thread_metadata={}, create_thread=True, reject_if_active=False)
        first = await storage.claim_run("w1", 30)
        assert first is not None and first["thread_id"] == tid
        # Another process is enqueueing a second run on the thread: it holds the thread row, not yet committed.
        async with await psycopg.AsyncConnection.connect(database_url) as other:
            await other.execute("SELECT 1 FROM threads WHERE thread_id = %s FOR UPDATE", (tid,))
            await other.execute(
                "INSERT INTO runs (run_id, thread_id, assistant_id, status, available_at, created_at, updated_at) "
                "VALUES (%s, %s, 'a', 'pending', now(), now(), now())", (str(uuid.uuid4()), tid))
            await other.execute("UPDATE threads SET status = 'busy' WHERE thread_id = %s", (tid,))
            finishing = asyncio.create_task(storage.finish_run(first["run_id"], "success", worker_id="w1",
                                                               attempt=first["attempt"]))
            async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as watch:
                for _ in range(500):  # until the finish waits on the thread row's lock
                    cur = await watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                              "AND datname = current_database()")
                    if (await cur.fetchone())[0]:
                        break
                    await asyncio.sleep(0.01)
            await other.commit()
        assert (await finishing)["status"] == "success"
        assert (await storage.get_thread(tid))["status"] == "busy"
    finally:
        await storage.close()


async def test_a_released_run_has_spent_no_attempt_and_a_stale_holder_cannot_release_it(database_url: str) -> None:
    """SIGTERM hands runs back with release_runs: the next claim is the same attempt, and a release (or a
    finish) by a worker that no longer holds that attempt changes nothing."""
    storage = await open_storage(database_url)
    try:
        now = datetime.now(timezone.utc).isoformat()
        run_id, thread_id = str(uuid.uuid4()), str(uuid.uuid4())
        await storage.enqueue_run(
            {"run_id": run_id, "thread_id": thread_id, "assistant_id": "a", "status": "pending",
             "metadata": {}, "kwargs": {}, "available_at": now, "created_at": now, "updated_at": now},
            thread_metadata={}, create_thread=True, reject_if_active=False)
        first = await storage.claim_run("w1", 30)
        assert first is not None and first["run_id"] == run_id and first["attempt"] == 1
        assert await storage.release_runs("w1", {run_id: 1}) == [run_id]
        released = await storage.get_run(run_id)
        assert released["status"] == "pending" and released["attempt"] == 0 and released["worker_id"] is None
        second = await storage.claim_run("w2", 30)
        assert second is not None and second["run_id"] == run_id and second["attempt"] == 1
        assert await storage.release_runs("w1", {run_id: 1}) == []  # w1 no longer holds it
        assert await storage.finish_run(run_id, "success", worker_id="w1", attempt=1,
                                        thread_changes={"values": {"stale": True}}) is None
        assert (await storage.get_run(run_id))["status"] == "running"
        thread = await storage.get_thread(thread_id)  # nor did the stale finish touch the thread
        assert thread["status"] == "busy" and thread["values"] != {"stale": True}
        assert (await storage.finish_run(run_id, "success", worker_id="w2", attempt=1))["status"] == "success"
    finally:
        await storage.close()
