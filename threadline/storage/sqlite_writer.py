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

**Group commit.** A run whose `durability` is LangGraph's `async` or `exit` writes its checkpoints with
`group=True`: they join one open transaction instead of committing each (seven commits for a two-step
run). The group is committed by the next user of the lock that is not itself a grouped write (the lock
commits it on acquire: our own transactions, LangGraph's saver methods, the WAL checkpoint, the run's final
state read when it comes from storage, and its finish), and at the latest `GROUP_SECONDS` after its first
write. So every write of our tables still commits before it returns, a run is never recorded as finished
before its checkpoints are durable, and a crash loses at most the last `GROUP_SECONDS` of an unfinished
run's checkpoints, which LangGraph's `async` durability allows (the run itself is retried or failed at
restart). `sync` runs commit each write, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import aiosqlite

from threadline.errors import StorageUnavailable

log = logging.getLogger("threadline.storage")

CHECKPOINT_EVERY = 500  # commits between WAL checkpoints
BUSY_RETRY_SECONDS = 30.0  # how long the connection's thread waits for SQLite's write lock
GROUP_SECONDS = 0.01  # the longest a group of checkpoint writes stays uncommitted
# The writer's page cache, at most (SQLite's default is 2 MB). This connection also reads the checkpoints,
# and no other connection of the process writes the tables it reads, so its cache stays valid from one
# transaction to the next (a read connection's is emptied whenever another commits). With 2 MB, a thread of
# 1 MB of values evicted its own pages at every write: each read of its stored values and each rewrite of its
# row went to the file page by page (a state update on the 1 MB thread of `bench/workloads.py`: about 1.5 ms
# of CPU more). Pages are allocated as they are used, so a small database never takes it all; 8 MB holds
# what a turn on such a thread writes and reads again, and 32 MB only added to the process's memory (a 1 MB
# thread's turns: RSS peak 190 against 215 MB, CPU alike; bench/README.md, "Large state on SQLite").
CACHE_KIB = 8 * 1024


class _CommittingLock(asyncio.Lock):
    """The writer's lock: whoever takes it finds no group open (it commits the group first), except a
    grouped write, which takes it with `asyncio.Lock.acquire`."""

    def __init__(self, writer: Writer) -> None:
        super().__init__()
        self._writer = writer

    async def acquire(self) -> Literal[True]:
        await super().acquire()
        try:
            self._writer._commit_group()
        except BaseException:
            self.release()
            raise
        return True


class Writer:
    """`conn` is used inline on the loop and, when the database is locked, on its own thread; `lock` makes
    those uses one at a time. `wal_conn` is a connection used only to checkpoint the WAL."""

    def __init__(self, conn: aiosqlite.Connection, wal_conn: aiosqlite.Connection) -> None:
        self.conn = conn
        self.lock = _CommittingLock(self)
        self._wal_conn = wal_conn
        self._commits = 0
        self._checkpointing: asyncio.Task[Any] | None = None
        self._group_open = False
        self._group_timer: asyncio.TimerHandle | None = None
        self._group_flush: asyncio.Task[None] | None = None

    async def prepare(self) -> None:
        """Set the connection up for use from the loop (after migrations and setup, which may wait for locks)."""
        await self.conn.execute("PRAGMA busy_timeout=0")
        await self.conn.execute("PRAGMA wal_autocheckpoint=0")
        await self.conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")

    async def run(self, fn: Callable[..., Any], *args: Any, inline: bool = True, group: bool = False) -> Any:
        """`fn(sqlite3_connection, *args)` under the lock: on the loop when `inline` and the database is not
        locked, else on the connection's thread. `fn` must be safe to run again after it raised `locked`
        (one transaction, or one statement). With `group`, `fn` joins the open group of writes (see the
        module docstring) instead of committing on its own."""
        with translated():
            return await self._run(fn, *args, inline=inline, group=group)

    async def _run(self, fn: Callable[..., Any], *args: Any, inline: bool, group: bool) -> Any:
        if group:
            await asyncio.Lock.acquire(self.lock)  # joins the group rather than committing it
        else:
            await self.lock.acquire()
        release = True
        try:
            db = self.conn._conn
            changes = db.total_changes
            if inline:
                try:
                    if group and not self._group_open:
                        db.execute("BEGIN IMMEDIATE")
                        self._open_group()
                    result = fn(db, *args)
                except sqlite3.OperationalError as exc:
                    if not is_busy(exc):
                        raise
                else:
                    if not group:
                        self._wrote(db.total_changes != changes)
                    return result
            work = asyncio.ensure_future(self.conn._execute(retrying, fn, db, *args))  # type: ignore[no-untyped-call]
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

    def _open_group(self) -> None:
        self._group_open = True
        self._group_timer = asyncio.get_running_loop().call_later(GROUP_SECONDS, self._flush_group)

    def _flush_group(self) -> None:
        self._group_timer = None
        if self._group_open and (self._group_flush is None or self._group_flush.done()):
            self._group_flush = asyncio.create_task(self._take_lock(), name="threadline-group-commit")

    async def _take_lock(self) -> None:
        try:
            async with self.lock:  # taking it commits the group
                pass
        except Exception:
            log.exception("committing a group of checkpoint writes failed")

    def _commit_group(self) -> None:
        """Under the lock: commit the open group, if any (on failure it is rolled back, and the error raised)."""
        if not self._group_open:
            return
        self._group_open = False
        if self._group_timer is not None:
            self._group_timer.cancel()
            self._group_timer = None
        db = self.conn._conn
        try:
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        self._wrote(True)

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
        await self._take_lock()  # commits an open group
        if self._checkpointing is not None:
            await asyncio.gather(self._checkpointing, return_exceptions=True)


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """The backend's edge: SQLite still locked past its budget (another program holds the write lock), or a
    file the database cannot use (disk full, read-only, I/O error), becomes `StorageUnavailable`; core never
    sees `sqlite3`'s exceptions. Any other error (a constraint, a bug) passes through as it is."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        if is_busy(exc) or _unusable(exc):
            raise StorageUnavailable(f"The database is unavailable ({_reason(exc)}). Retry shortly.") from exc
        raise


def _unusable(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY,
                                                sqlite3.SQLITE_CANTOPEN)


def _reason(exc: sqlite3.Error) -> str:
    return "locked by another writer" if is_busy(exc) else "the database file cannot be written"


def is_busy(exc: sqlite3.Error) -> bool:
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


def in_transaction(db: sqlite3.Connection, fn: Callable[..., Any], *args: Any) -> Any:
    """BEGIN IMMEDIATE, `fn(db, *args)`, then COMMIT (or ROLLBACK if it raised). Inside an open group of
    writes: a savepoint, so a failure undoes `fn`'s writes only."""
    if db.in_transaction:
        db.execute("SAVEPOINT grouped")
        try:
            result = fn(db, *args)
        except BaseException:
            db.execute("ROLLBACK TO grouped")
            db.execute("RELEASE grouped")
            raise
        db.execute("RELEASE grouped")
        return result
    db.execute("BEGIN IMMEDIATE")
    try:
        result = fn(db, *args)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return result
