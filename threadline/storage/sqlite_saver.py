"""LangGraph's SQLite checkpointer on the embedded backend's writer connection, its writes committed in groups.

A run writes a checkpoint and each task's writes at every step. Done as LangGraph's `AsyncSqliteSaver` does
it, each is its own transaction and its own trip to a connection thread, on a second connection whose write
lock the queue's connection then waits for. Here:

- the saver shares the storage's writer connection and its lock, so no two connections of ours contend
  for SQLite's write lock, and every trip to that connection's thread runs in the order it was asked for;
- a write is serialized on the caller's task (a value that cannot be serialized fails its own run, never a
  group), then buffered; whatever trip to the writer's thread comes next commits the buffer first, in one
  transaction: a flush scheduled at once, a checkpoint read, or a queue write such as the run's finish;
- durability is LangGraph's own: with `durability="async"` (its default) a write returns once buffered and
  is committed in the background while the next step runs, as LangGraph's async mode promises; with
  "sync", "exit", or outside a run (`update_state`) it returns once committed.

The rows and tables are LangGraph's `SqliteSaver`'s, and reads use its own code.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import aiosqlite
from langgraph.checkpoint.base import WRITES_IDX_MAP, CheckpointTuple, get_checkpoint_metadata
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

log = logging.getLogger("threadline.storage")

# Where LangGraph's loop puts a run's durability mode in the config it hands the checkpointer.
_DURABILITY = "__pregel_durability"

_PUT_CHECKPOINT = (
    "INSERT OR REPLACE INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
    "checkpoint, metadata) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_PUT_WRITES = ("INSERT OR {} INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, "
               "channel, type, value) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")

# One buffered write: (sql, rows for executemany). Every one is idempotent (INSERT OR REPLACE / IGNORE of
# the same key and value), so a group whose commit failed is simply committed again by the next trip.
Buffered = tuple[str, list[tuple[Any, ...]]]


class GroupedSqliteSaver(AsyncSqliteSaver):
    """See the module docstring. `lock` is the storage's writer lock; `trip` must be called holding it."""

    def __init__(self, conn: aiosqlite.Connection, lock: asyncio.Lock) -> None:
        super().__init__(conn)
        self.lock = lock  # type: ignore[assignment]  # LangGraph's own methods take it around their statements
        # LangGraph's sync saver on the same sqlite3 connection, only ever called on the connection's thread.
        self._reader = SqliteSaver(conn._conn, serde=self.serde)
        self._reader.is_setup = True  # setup() creates the tables
        self._pending: list[Buffered] = []
        self._committed: asyncio.Future[None] | None = None  # resolves when `_pending` is committed
        self._flusher: asyncio.Task[None] | None = None

    # --- trips to the writer's thread ------------------------------------------------------------------
    async def trip(self, fn: Callable[..., Any] | None, *args: Any) -> Any:
        """With the writer lock held: commit what is buffered, then `fn(sqlite3_connection, *args)`, in one
        trip. The trip is shielded: a caller cancelled meanwhile does not stop the buffered writes."""
        items, committed = self._pending, self._committed
        self._pending, self._committed = [], None
        inner = asyncio.ensure_future(self.conn._execute(_commit_then, self.conn._conn, items, fn, args))
        if items or committed is not None:
            inner.add_done_callback(partial(self._settle, items, committed))
        failed, result = await asyncio.shield(inner)
        if failed is not None:
            raise failed
        return result

    def _settle(self, items: list[Buffered], committed: asyncio.Future[None] | None,
                trip: asyncio.Future[Any]) -> None:
        error = asyncio.CancelledError() if trip.cancelled() else trip.exception()
        if error is not None:  # not committed: back to the front of the buffer, for the next trip
            self._pending[:0] = items
            log.warning("checkpoint writes could not be committed (%s); the next write retries them", error)
        if committed is not None and not committed.done():
            if error is None:
                committed.set_result(None)
            else:
                committed.set_exception(error)

    async def flush(self) -> None:
        """Commit every buffered write now."""
        async with self.lock:
            await self.trip(None)

    def _buffer(self, item: Buffered) -> asyncio.Future[None]:
        self._pending.append(item)
        if self._committed is None:
            self._committed = asyncio.get_running_loop().create_future()
            self._committed.add_done_callback(_consume_error)  # a background write's failure is logged
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_soon(), name="threadline-checkpoint-flush")
        return self._committed

    async def _flush_soon(self) -> None:
        # Until the buffer is empty: what was buffered during a trip has no other flush coming. A failed
        # trip (logged by _settle) leaves its writes buffered for the next write or read to retry.
        async with self.lock:
            while self._pending:
                try:
                    await self.trip(None)
                except Exception:
                    return

    async def _written(self, config: Any, item: Buffered) -> None:
        committed = self._buffer(item)
        if (config.get("configurable") or {}).get(_DURABILITY) != "async":
            await asyncio.shield(committed)

    # --- LangGraph's checkpointer API ------------------------------------------------------------------
    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        configurable = config["configurable"]
        thread_id, checkpoint_ns = str(configurable["thread_id"]), configurable["checkpoint_ns"]
        type_, blob = self.serde.dumps_typed(checkpoint)
        meta = json.dumps(get_checkpoint_metadata(config, metadata), ensure_ascii=False).encode("utf-8", "ignore")
        row = (thread_id, checkpoint_ns, checkpoint["id"], configurable.get("checkpoint_id"), type_, blob, meta)
        await self._written(config, (_PUT_CHECKPOINT, [row]))
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": checkpoint_ns,
                                 "checkpoint_id": checkpoint["id"]}}

    async def aput_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        configurable = config["configurable"]
        key = (str(configurable["thread_id"]), str(configurable["checkpoint_ns"]), str(configurable["checkpoint_id"]))
        rows = [(*key, task_id, task_path, WRITES_IDX_MAP.get(channel, idx), channel, *self.serde.dumps_typed(value))
                for idx, (channel, value) in enumerate(writes)]
        special = all(w[0] in WRITES_IDX_MAP for w in writes)  # as LangGraph: these replace, others are kept
        await self._written(config, (_PUT_WRITES.format("REPLACE" if special else "IGNORE"), rows))

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        async with self.lock:
            return await self.trip(_call, self._reader.get_tuple, config)

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[CheckpointTuple]:
        await self.flush()
        async for item in super().alist(config, **kwargs):
            yield item

    async def aget_delta_channel_history(self, **kwargs: Any) -> Any:
        await self.flush()
        return await super().aget_delta_channel_history(**kwargs)

    async def adelete_thread(self, thread_id: str) -> None:
        async with self.lock:
            await self.trip(in_transaction, delete_thread_checkpoints, str(thread_id))


def delete_thread_checkpoints(db: sqlite3.Connection, thread_id: str) -> None:
    db.execute("DELETE FROM checkpoints WHERE thread_id = ?", (thread_id,))
    db.execute("DELETE FROM writes WHERE thread_id = ?", (thread_id,))


def begin_now(db: sqlite3.Connection) -> None:
    """BEGIN IMMEDIATE, retried: SQLite can refuse at once (not after busy_timeout) while another connection
    (the store's) holds the write lock in some WAL states. Runs on the writer's thread."""
    for attempt in range(50):
        try:
            db.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == 49:
                raise
            time.sleep(min(0.005 * (attempt + 1), 0.1))


def in_transaction(db: sqlite3.Connection, fn: Any, *args: Any) -> Any:
    """On the writer's thread: begin, `fn`, then COMMIT (or ROLLBACK if it raised)."""
    begin_now(db)
    try:
        result = fn(db, *args)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return result


def _commit_then(db: sqlite3.Connection, items: list[Buffered], fn: Callable[..., Any] | None,
                 args: tuple[Any, ...]) -> tuple[Exception | None, Any]:
    """On the writer's thread: the buffered writes in one transaction (raising if that fails), then `fn`,
    whose own failure is returned rather than raised: the buffered writes were committed regardless."""
    if items:
        in_transaction(db, _insert_all, items)
    if fn is None:
        return None, None
    try:
        return None, fn(db, *args)
    except Exception as exc:
        return exc, None


def _insert_all(db: sqlite3.Connection, items: list[Buffered]) -> None:
    for sql, rows in items:
        db.executemany(sql, rows)


def _call(db: sqlite3.Connection, fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _consume_error(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
