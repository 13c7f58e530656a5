"""The embedded backend's one write connection, used from the event loop.

An SQLite statement on a local file takes microseconds; handing it to a connection thread (as aiosqlite
does) and waiting for the answer took 400-500 µs per trip on our 2-core machines, and a run made a dozen
such trips. So the hot writes and point reads run *on the event loop*, as short transactions, under one
asyncio lock that every writer of this process takes (our tables and LangGraph's checkpointer share this
connection: no two connections of ours contend for SQLite's write lock).

The loop never waits on SQLite's lock: the connection's `busy_timeout` is 0, and work that finds the
database locked (the store's connection, or another program, is writing) is handed to the connection's
thread, which retries until the lock is free. WAL checkpoints (the fsync) are taken off the loop too: the
connection does not checkpoint on commit, and every `CHECKPOINT_EVERY` writing transactions a checkpoint runs
on a connection of its own, on its thread, while writers wait for the lock.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import aiosqlite

log = logging.getLogger("threadline.storage")

CHECKPOINT_EVERY = 500  # commits between WAL checkpoints
BUSY_RETRY_SECONDS = 30.0  # how long the connection's thread waits for SQLite's write lock


class Writer:
    """`conn` is used inline on the loop and, when the database is locked, on its own thread; `lock` makes
    those uses one at a time. `wal_conn` is a connection used only to checkpoint the WAL."""

    def __init__(self, conn: aiosqlite.Connection, wal_conn: aiosqlite.Connection) -> None:
        self.conn = conn
        self.lock = asyncio.Lock()
        self._wal_conn = wal_conn
        self._commits = 0
        self._checkpointing: asyncio.Task[Any] | None = None

    async def prepare(self) -> None:
        """Set the connection up for use from the loop (after migrations and setup, which may wait for locks)."""
        await self.conn.execute("PRAGMA busy_timeout=0")
        await self.conn.execute("PRAGMA wal_autocheckpoint=0")

    async def run(self, fn: Callable[..., Any], *args: Any, inline: bool = True) -> Any:
        """`fn(sqlite3_connection, *args)` under the lock: on the loop when `inline` and the database is not
        locked, else on the connection's thread. `fn` must be safe to run again after it raised `locked`
        (one transaction, or one statement)."""
        await self.lock.acquire()
        release = True
        try:
            db = self.conn._conn
            changes = db.total_changes
            if inline:
                try:
                    result = fn(db, *args)
                except sqlite3.OperationalError as exc:
                    if not is_busy(exc):
                        raise
                else:
                    self._wrote(db.total_changes != changes)
                    return result
            work = asyncio.ensure_future(self.conn._execute(retrying, fn, db, *args))
            try:
                result = await asyncio.shield(work)
            except asyncio.CancelledError:
                if not work.done():  # the thread still uses the connection: keep the lock until it is done
                    release = False
                    work.add_done_callback(self._release_after)
                raise
            self._wrote(db.total_changes != changes)
            return result
        finally:
            if release:
                self.lock.release()

    def _release_after(self, work: asyncio.Future[Any]) -> None:
        self.lock.release()
        if not work.cancelled() and work.exception() is not None:
            log.warning("a write whose caller left failed: %s", work.exception())

    def _wrote(self, changed: bool) -> None:
        if not changed:
            return
        self._commits += 1
        if self._commits % CHECKPOINT_EVERY == 0 and (self._checkpointing is None or self._checkpointing.done()):
            self._checkpointing = asyncio.create_task(self._checkpoint_wal(), name="threadline-wal-checkpoint")

    async def _checkpoint_wal(self) -> None:
        # Under the lock: no write lands while it runs, so it completes, and the next write starts the WAL
        # over from its beginning (a checkpoint racing a stream of writes never completes, and the WAL grows).
        # Writers wait their turn meanwhile; the loop does not.
        try:
            async with self.lock:
                await self._wal_conn.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)")
        except Exception:  # the next one tries again; the WAL only grows meanwhile
            log.exception("WAL checkpoint failed")

    async def close(self) -> None:
        if self._checkpointing is not None:
            await asyncio.gather(self._checkpointing, return_exceptions=True)


def is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def retrying(fn: Callable[..., Any], db: sqlite3.Connection, *args: Any) -> Any:
    """On the connection's thread: `fn`, again while the database is locked, for up to BUSY_RETRY_SECONDS."""
    deadline = time.monotonic() + BUSY_RETRY_SECONDS
    delay = 0.002
    while True:
        try:
            return fn(db, *args)
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def begin_now(db: sqlite3.Connection) -> None:
    db.execute("BEGIN IMMEDIATE")


def in_transaction(db: sqlite3.Connection, fn: Callable[..., Any], *args: Any) -> Any:
    """BEGIN IMMEDIATE, `fn(db, *args)`, then COMMIT (or ROLLBACK if it raised)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        result = fn(db, *args)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return result
