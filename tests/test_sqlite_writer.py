"""The embedded backend's write connection runs on the event loop: it must never block the loop on SQLite's
lock, must still finish work that found the database locked, and must keep the WAL from growing."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from threadline.storage import open_storage, sqlite_writer
from threadline.storage.records import NewRun


def _run_row(thread_id: str) -> NewRun:
    now = datetime.now(UTC).isoformat()
    return {"run_id": str(uuid.uuid4()), "thread_id": thread_id, "assistant_id": "a", "status": "pending",
            "metadata": {}, "kwargs": {}, "multitask_strategy": "reject", "available_at": now, "created_at": now,
            "updated_at": now}


async def test_a_write_that_finds_the_database_locked_waits_off_the_loop(tmp_path: Path) -> None:
    storage = await open_storage(f"sqlite:///{tmp_path / 'tl.db'}")
    try:
        other = sqlite3.connect(tmp_path / "tl.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another connection holds SQLite's write lock
        tid = str(uuid.uuid4())
        enqueue = asyncio.create_task(storage.enqueue_run(_run_row(tid), thread_metadata={}, create_thread=True,
                                                          reject_if_active=False))
        # The loop keeps turning while the enqueue waits for the lock.
        ticks, started = 0, time.monotonic()
        while time.monotonic() - started < 0.3:
            await asyncio.sleep(0.01)
            ticks += 1
        assert not enqueue.done()
        assert ticks >= 15, f"the event loop was blocked: {ticks} ticks in 0.3 s"
        other.execute("COMMIT")
        other.close()
        run = await asyncio.wait_for(enqueue, 10)
        assert (await storage.get_run(run["run_id"]))["status"] == "pending"
        assert (await storage.get_thread(tid))["status"] == "busy"
    finally:
        await storage.close()


async def test_a_write_cancelled_while_waiting_for_the_lock_keeps_the_connection_until_it_ends(
        tmp_path: Path) -> None:
    storage = await open_storage(f"sqlite:///{tmp_path / 'tl.db'}")
    try:
        other = sqlite3.connect(tmp_path / "tl.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        tid = str(uuid.uuid4())
        waiting = asyncio.create_task(storage.enqueue_run(_run_row(tid), thread_metadata={}, create_thread=True,
                                                          reject_if_active=False))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        # The thread still holds the connection: the next write waits its turn instead of running beside it.
        second = asyncio.create_task(storage.enqueue_run(_run_row(str(uuid.uuid4())), thread_metadata={},
                                                         create_thread=True, reject_if_active=False))
        await asyncio.sleep(0.1)
        assert not second.done()
        other.execute("COMMIT")
        other.close()
        await asyncio.wait_for(second, 10)
        # The cancelled caller's enqueue still happened once, whole: its thread is there and busy.
        assert (await storage.get_thread(tid))["status"] == "busy"
    finally:
        await storage.close()


async def test_the_wal_is_checkpointed_off_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def wal_size_after(writes: int, every: int) -> int:
        monkeypatch.setattr(sqlite_writer, "CHECKPOINT_EVERY", every)
        db = tmp_path / f"wal-{every}.db"
        storage = await open_storage(f"sqlite:///{db}")
        try:
            for _ in range(writes):
                await storage.enqueue_run(_run_row(str(uuid.uuid4())), thread_metadata={}, create_thread=True,
                                          reject_if_active=False)
                await asyncio.sleep(0)  # lets a scheduled checkpoint run
            await storage.writer.close()  # type: ignore[attr-defined]  # SQLite's: waits for a checkpoint in flight
            return (db.parent / (db.name + "-wal")).stat().st_size
        finally:
            await storage.close()

    never = await wal_size_after(600, every=10**9)
    often = await wal_size_after(600, every=20)
    # Without checkpoints the WAL holds every page written; with them, writers start over at its beginning.
    assert often * 3 < never, (often, never)


def _committed(db_path: Path, thread_id: str, table: str = "checkpoints") -> int:
    """The thread's rows in `table` that another connection sees: only committed ones."""
    other = sqlite3.connect(db_path)
    try:
        return other.execute(f"SELECT count(*) FROM {table} WHERE thread_id = ?", (thread_id,)).fetchone()[0]
    finally:
        other.close()


async def _put(saver: object, thread_id: str, step: int) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    checkpoint = empty_checkpoint()
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    saved = await saver.aput(config, checkpoint, {"source": "loop", "step": step}, {})  # type: ignore[attr-defined]
    # A task's writes, several rows: one savepoint inside the group.
    await saver.aput_writes(saved, [("a", 1), ("b", 2)], task_id=str(uuid.uuid4()))  # type: ignore[attr-defined]


async def test_grouped_checkpoint_writes_commit_on_the_next_lock_user_or_soon_after(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """`async`/`exit` runs' checkpoint writes join one transaction: the process reads them at once, other
    connections once the group commits, which the next non-grouped user of the lock does first."""
    db_path = tmp_path / "tl.db"
    storage = await open_storage(f"sqlite:///{db_path}")
    try:
        monkeypatch.setattr(sqlite_writer, "GROUP_SECONDS", 3600.0)  # only the next lock user commits
        grouped = storage.run_checkpointer("async")
        assert grouped is not storage.checkpointer and storage.run_checkpointer("exit") is grouped
        tid = str(uuid.uuid4())
        for step in range(3):
            await _put(grouped, tid, step)
        assert _committed(db_path, tid) == 0  # not committed yet
        found = await storage.checkpointer.aget_tuple({"configurable": {"thread_id": tid, "checkpoint_ns": ""}})
        assert found is not None and found.metadata["step"] == 2  # reads under the lock commit the group first
        assert _committed(db_path, tid) == 3
        # Our own tables' writes commit what was grouped before them, and themselves, before they return.
        tid2 = str(uuid.uuid4())
        await _put(grouped, tid2, 0)
        run = await storage.enqueue_run(_run_row(tid2), thread_metadata={}, create_thread=True, reject_if_active=False)
        assert _committed(db_path, tid2) == 1
        other = sqlite3.connect(db_path)
        assert other.execute("SELECT status FROM runs WHERE run_id = ?", (run["run_id"],)).fetchone() == ("pending",)
        other.close()

        monkeypatch.setattr(sqlite_writer, "GROUP_SECONDS", 0.01)  # and with nobody else writing: soon after
        tid3 = str(uuid.uuid4())
        await _put(grouped, tid3, 0)
        for _ in range(100):
            if _committed(db_path, tid3):
                break
            await asyncio.sleep(0.01)
        assert _committed(db_path, tid3) == 1

        # `sync` runs commit every write before it returns.
        tid4 = str(uuid.uuid4())
        await _put(storage.run_checkpointer("sync"), tid4, 0)
        assert _committed(db_path, tid4) == 1
    finally:
        await storage.close()


async def test_closing_commits_an_open_group(tmp_path: Path, monkeypatch) -> None:
    db_path = tmp_path / "tl.db"
    storage = await open_storage(f"sqlite:///{db_path}")
    monkeypatch.setattr(sqlite_writer, "GROUP_SECONDS", 3600.0)
    tid = str(uuid.uuid4())
    await _put(storage.run_checkpointer("async"), tid, 0)
    assert _committed(db_path, tid) == 0
    await storage.close()
    assert _committed(db_path, tid) == 1


async def test_a_grouped_write_that_finds_the_database_locked_waits_off_the_loop_and_commits(
        tmp_path: Path, monkeypatch) -> None:
    """A run's checkpoint write that cannot open a group (another connection holds SQLite's write lock, as the
    store's may) waits on the connection's thread, the loop still turning, and is committed on its own; the
    run's next writes group as usual."""
    db_path = tmp_path / "tl.db"
    storage = await open_storage(f"sqlite:///{db_path}")
    try:
        monkeypatch.setattr(sqlite_writer, "GROUP_SECONDS", 3600.0)  # a group would stay open: this must not
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        tid = str(uuid.uuid4())
        put = asyncio.create_task(_put(storage.run_checkpointer("async"), tid, 0))
        ticks, started = 0, time.monotonic()
        while time.monotonic() - started < 0.3:
            await asyncio.sleep(0.01)
            ticks += 1
        assert not put.done()
        assert ticks >= 15, f"the event loop was blocked: {ticks} ticks in 0.3 s"
        other.execute("COMMIT")
        other.close()
        await asyncio.wait_for(put, 10)
        assert _committed(db_path, tid) == 1  # the checkpoint, committed on its own
        assert _committed(db_path, tid, "writes") == 0  # its task's writes, put once the lock was free: grouped
        await storage.checkpointer.aget_tuple({"configurable": {"thread_id": tid, "checkpoint_ns": ""}})
        assert _committed(db_path, tid, "writes") == 2  # committed by the next user of the lock
    finally:
        await storage.close()
