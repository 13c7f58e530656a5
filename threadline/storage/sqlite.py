"""The embedded default: one SQLite file (WAL), one writer, LangGraph's SQLite saver and store."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, Literal

import aiosqlite
import orjson
from langgraph.store.base import Op, Result, SearchOp
from langgraph.store.sqlite.aio import AsyncSqliteStore

from threadline.errors import ConfigError, Conflict, NotFound, StorageUnavailable
from threadline.storage.base import THREAD_EVENTS_KEPT, NewThreadEvent, Row, SortOrder, Storage
from threadline.storage.crons import Dialect, cron_row
from threadline.storage.sqlite_saver import WriterSqliteSaver, delete_thread_checkpoints
from threadline.storage.sqlite_writer import Writer, in_transaction, translated
from threadline.storage.sql import (
    JSON_COLUMNS, apply_migrations, dumps, event_bounds, iso_after, now_iso, thread_event_bounds_select,
    thread_events_select, thread_ttl_columns, where, worker_lost,
)

log = logging.getLogger("threadline.storage")

_ASSISTANT_SORT = {"assistant_id", "graph_id", "name", "created_at", "updated_at"}
_THREAD_SORT = {"thread_id", "status", "created_at", "updated_at", "state_updated_at"}


class SQLiteStorage(Storage):
    """Storage in one SQLite file. Our writes are serialized through one connection and a lock."""

    capabilities = {"vector_search": True, "ttl": True, "multi_process": False}

    def __init__(self, url: str, conn: aiosqlite.Connection, read_conn: aiosqlite.Connection,
                 store_conn: aiosqlite.Connection, wal_conn: aiosqlite.Connection, store: AsyncSqliteStore,
                 file_lock: IO[bytes]) -> None:
        self.url = url
        self._conn = conn
        # Reads use their own connection: on the writer's connection they would see another task's
        # transaction half done (a run already `success` while its thread is not yet updated).
        self._read = read_conn
        self._file_lock = file_lock
        self._store_conn = store_conn
        self.store = store
        self._wal_conn = wal_conn
        # Every writer of this process (our tables, LangGraph's checkpointer) uses one connection, mostly
        # from the event loop (sqlite_writer.py says why); the store keeps its own.
        self.writer = Writer(conn, wal_conn)
        self.checkpointer = WriterSqliteSaver(self.writer)
        # One read at a time on the read connection: overlapping statements there would share one
        # snapshot, and a read could miss a write committed just before it.
        self._read_lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str, *, store_index: dict | None = None, store_ttl: dict | None = None) -> SQLiteStorage:
        path = url.removeprefix("sqlite:").removeprefix("///")
        if not path or ":memory:" in path:
            # Several connections (writer, reads, the store, WAL checkpoints) must share one file.
            raise ConfigError(f"{url}: the SQLite backend needs a file path (sqlite:///path/to/file.db)")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        lock = _lock_exclusively(Path(path))
        conns: list[aiosqlite.Connection] = []
        try:
            for _ in range(4):
                # Used from the loop as well as from aiosqlite's thread (one at a time, under a lock).
                conn = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
                conns.append(conn)
                await conn.execute("PRAGMA journal_mode=WAL")
                await conn.execute("PRAGMA busy_timeout=30000")
                await conn.execute("PRAGMA synchronous=NORMAL")
            conn, read_conn, store_conn, wal_conn = conns
            conn.row_factory = read_conn.row_factory = aiosqlite.Row
            store = _SqliteStore(store_conn, index=store_index, ttl=store_ttl)  # type: ignore[arg-type]
            try:
                await store.setup()  # first: our migrations add triggers to its tables (0007)
            except AttributeError as exc:  # sqlite3 built without enable_load_extension: no sqlite-vec
                raise ConfigError(
                    "store.index needs SQLite extension loading (for sqlite-vec), which this Python's sqlite3 "
                    f"lacks ({exc}); use a Python built with loadable extensions, or remove store.index"
                ) from exc
            applied = await apply_migrations(conn, "sqlite")
            self = cls(url, conn, read_conn, store_conn, wal_conn, store, lock)
            self.applied_migrations = applied
            self.capabilities = {**cls.capabilities, "vector_index": "sqlite-vec" if store_index else None}
            await self.checkpointer.setup()
            await self.writer.prepare()
            if store_ttl and store_ttl.get("sweep_interval_minutes"):
                await store.start_ttl_sweeper()
        except BaseException:
            for c in conns:
                with contextlib.suppress(Exception):
                    await c.close()
            lock.close()
            raise
        return self

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.store.stop_ttl_sweeper(timeout=1)
        await self.writer.close()
        for conn in (self._conn, self._read, self._store_conn, self._wal_conn):
            with contextlib.suppress(Exception):
                await conn.close()
        self._file_lock.close()  # releases the lock

    async def ping(self) -> None:
        try:
            await self._fetchone("SELECT 1 AS ok")
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a closed connection
            raise StorageUnavailable("The database is unavailable. Retry shortly.") from exc

    # --- helpers -------------------------------------------------------------
    async def _write(self, fn: Any, *args: Any, inline: bool = True) -> Any:
        """Run `fn(sqlite3_connection, *args)` as one transaction, on the event loop unless `inline` is false
        (work that may touch many rows) or the database is locked (see sqlite_writer.py)."""
        return await self.writer.run(in_transaction, fn, *args, inline=inline)

    async def _fetchall(self, sql: str, params: tuple | list = ()) -> list[Row]:
        async with self._read_lock:
            with translated():
                rows = await self._read.execute_fetchall(sql, params)  # one trip to the connection's thread
        return [_row(r) for r in rows]

    async def _fetchone(self, sql: str, params: tuple | list = ()) -> Row | None:
        rows = await self._fetchall(sql, params)
        return rows[0] if rows else None

    async def _point(self, sql: str, params: tuple | list = ()) -> Row | None:
        """One row by key, read on the event loop: microseconds, where a trip to the thread costs hundreds
        (a WAL reader never waits for a writer)."""
        async with self._read_lock:
            with translated():
                rows = self._read._conn.execute(sql, params).fetchall()
        return _row(rows[0]) if rows else None

    # --- assistants ----------------------------------------------------------
    async def create_assistant(self, row: Row, *, if_exists: Literal["raise", "do_nothing"]) -> Row:
        await self._write(_create_assistant, row, if_exists, inline=False)
        found = await self.get_assistant(row["assistant_id"])
        assert found is not None
        return found

    async def get_assistant(self, assistant_id: str) -> Row | None:
        return await self._point("SELECT * FROM assistants WHERE assistant_id = ?", (assistant_id,))

    def _assistant_filter(self, graph_id: str | None, name: str | None, metadata: dict | None) -> tuple[str, list]:
        clauses: list[tuple[str, list]] = []
        if graph_id is not None:
            clauses.append(("graph_id = ?", [graph_id]))
        if name is not None:
            clauses.append(("name LIKE ? ESCAPE '\\'", [f"%{_like(name)}%"]))
        return where(clauses, metadata=metadata)

    async def search_assistants(self, *, graph_id, name, metadata, limit, offset, sort_by, sort_order) -> list[Row]:
        cond, params = self._assistant_filter(graph_id, name, metadata)
        order = _order(sort_by, sort_order, _ASSISTANT_SORT, "created_at")
        return await self._fetchall(
            f"SELECT * FROM assistants {cond} ORDER BY {order} LIMIT ? OFFSET ?", [*params, limit, offset]
        )

    async def count_assistants(self, *, graph_id, name, metadata) -> int:
        cond, params = self._assistant_filter(graph_id, name, metadata)
        row = await self._fetchone(f"SELECT COUNT(*) AS n FROM assistants {cond}", params)
        return int(row["n"]) if row else 0

    async def update_assistant(self, assistant_id: str, changes: Row) -> Row:
        await self._write(_update_assistant, assistant_id, changes, inline=False)
        found = await self.get_assistant(assistant_id)
        assert found is not None
        return found

    async def delete_assistant(self, assistant_id: str) -> bool:
        return await self._write(_delete_assistant, assistant_id, inline=False)

    async def list_assistant_versions(self, assistant_id, *, metadata, limit, offset) -> list[Row]:
        cond, params = where([("assistant_id = ?", [assistant_id])], metadata=metadata)
        return await self._fetchall(
            f"SELECT * FROM assistant_versions {cond} ORDER BY version DESC LIMIT ? OFFSET ?",
            [*params, limit, offset],
        )

    async def set_assistant_version(self, assistant_id: str, version: int) -> Row | None:
        if not await self._write(_set_assistant_version, assistant_id, version, inline=False):
            return None
        return await self.get_assistant(assistant_id)

    # --- threads -------------------------------------------------------------
    async def create_thread(self, row: Row, *, if_exists: Literal["raise", "do_nothing"]) -> Row:
        return await self._write(_create_thread, row, if_exists)

    async def get_thread(self, thread_id: str, *, filters: dict | None = None) -> Row | None:
        if filters:
            cond, params = where([("thread_id = ?", [thread_id])], filters=filters)
            return await self._point(f"SELECT * FROM threads {cond}", tuple(params))
        return await self._point("SELECT * FROM threads WHERE thread_id = ?", (thread_id,))

    async def update_thread(self, thread_id: str, changes: Row, *, merge_metadata: dict | None = None) -> Row | None:
        return await self._write(_update_thread, thread_id, changes, merge_metadata)

    async def delete_thread(self, thread_id: str) -> bool:
        # With its checkpoints, in one transaction. A thread can hold many rows: on the connection's thread.
        return await self._write(_delete_thread_and_checkpoints, thread_id, False, inline=False)

    async def delete_expired_threads(self, *, limit: int, now: str | None = None) -> list[str]:
        # One transaction on the writer: no run can be enqueued between finding a thread idle and deleting it,
        # and a thread goes with its checkpoints. Many rows: on the connection's thread.
        return await self._write(_delete_expired_threads, now or now_iso(), limit, inline=False)

    def _thread_filter(self, ids, metadata, values, status, filters=None) -> tuple[str, list]:
        clauses: list[tuple[str, list]] = []
        if ids:
            clauses.append((f"thread_id IN ({', '.join('?' for _ in ids)})", list(ids)))
        if status is not None:
            clauses.append(("status = ?", [status]))
        return where(clauses, metadata=metadata, values=values, filters=filters)

    async def search_threads(self, *, ids, metadata, values, status, limit, offset, sort_by, sort_order,
                             filters=None) -> list[Row]:
        cond, params = self._thread_filter(ids, metadata, values, status, filters)
        order = _order(sort_by, sort_order, _THREAD_SORT, "created_at")
        return await self._fetchall(
            f"SELECT * FROM threads {cond} ORDER BY {order} LIMIT ? OFFSET ?", [*params, limit, offset]
        )

    async def count_threads(self, *, metadata, values, status, filters=None) -> int:
        cond, params = self._thread_filter(None, metadata, values, status, filters)
        row = await self._fetchone(f"SELECT COUNT(*) AS n FROM threads {cond}", params)
        return int(row["n"]) if row else 0

    # --- runs and the queue ----------------------------------------------------
    def run_checkpointer(self, durability: str) -> Any:
        # `sync` commits each write before the next step; `async` and `exit` allow the group commit.
        return self.checkpointer if durability == "sync" else self.checkpointer.grouped()

    async def enqueue_run(self, run: Row, *, thread_metadata: dict[str, Any], create_thread: bool,
                          reject_if_active: bool, thread_ttl_minutes: float | None = None,
                          new_thread_metadata: dict[str, Any] | None = None,
                          claim_for: tuple[str, float] | None = None,
                          run_metadata: Callable[[dict[str, Any] | None], dict[str, Any]] | None = None) -> Row:
        return await self._write(_enqueue, run, thread_metadata, create_thread, reject_if_active,
                                 thread_ttl_columns(thread_ttl_minutes), new_thread_metadata or {}, claim_for,
                                 run_metadata)

    async def claim_run(self, worker_id: str, lease_seconds: float) -> Row | None:
        return await self.writer.run(_claim, worker_id, lease_seconds)

    async def heartbeat_runs(self, worker_id: str, held: dict[str, int], lease_seconds: float) -> set[str]:
        if not held:
            return set()
        return await self._write(_heartbeat, worker_id, held, lease_seconds)

    async def release_runs(self, worker_id: str, held: dict[str, int]) -> list[str]:
        return await self._write(_release, worker_id, held, inline=False)

    async def finish_run(self, run_id, status, *, error=None, output=None, thread_changes=None,
                         worker_id=None, attempt=None, delete_thread=False) -> Row | None:
        return await self._write(_finish, run_id, status, error, output, thread_changes or {}, worker_id, attempt,
                                 delete_thread)

    async def cancel_pending_runs(self, run_ids: list[str], status: str) -> list[str]:
        if not run_ids:
            return []
        return await self._write(_cancel_pending, run_ids, status, inline=False)

    async def get_run(self, run_id: str) -> Row | None:
        return await self._point("SELECT * FROM runs WHERE run_id = ?", (run_id,))

    async def search_runs(self, *, thread_id, assistant_id, status, metadata, limit, offset) -> list[Row]:
        clauses: list[tuple[str, list]] = []
        for col, val in (("thread_id", thread_id), ("assistant_id", assistant_id), ("status", status)):
            if val is not None:
                clauses.append((f"{col} = ?", [val]))
        cond, params = where(clauses, metadata=metadata)
        return await self._fetchall(
            f"SELECT * FROM runs {cond} ORDER BY seq DESC LIMIT ? OFFSET ?", [*params, limit, offset]
        )

    async def delete_run(self, run_id: str) -> bool:
        return await self._write(_delete_run, run_id, inline=False)

    async def active_runs(self, thread_id: str) -> list[Row]:
        return await self._fetchall(
            "SELECT * FROM runs WHERE thread_id = ? AND status IN ('pending', 'running') ORDER BY seq", (thread_id,)
        )

    async def next_run(self, thread_id: str, after_seq: int) -> Row | None:
        return await self._fetchone("SELECT * FROM runs WHERE thread_id = ? AND seq > ? ORDER BY seq LIMIT 1",
                                    (thread_id, after_seq))

    async def last_run_seq(self, thread_id: str) -> int:
        row = await self._fetchone("SELECT MAX(seq) AS seq FROM runs WHERE thread_id = ?", (thread_id,))
        return int(row["seq"] or 0) if row else 0

    async def recover_runs(self, max_attempts: int, *, expired_only: bool) -> tuple[list[Row], list[Row]]:
        return await self._write(_recover, max_attempts, expired_only, inline=False)

    async def queue_stats(self) -> Row:
        row = await self._fetchone(
            "SELECT SUM(status = 'pending') AS pending, SUM(status = 'running') AS running, "
            "MIN(CASE WHEN status = 'pending' THEN available_at END) AS oldest FROM runs"
        )
        return {"pending": int(row["pending"] or 0), "running": int(row["running"] or 0),
                "oldest_pending_at": row["oldest"]} if row else {"pending": 0, "running": 0, "oldest_pending_at": None}

    # --- checkpoint helpers ----------------------------------------------------
    async def delete_checkpoints_for_run(self, thread_id: str, run_id: str) -> None:
        # Finds the run's checkpoints by scanning the thread's metadata: on the connection's thread.
        await self._write(_delete_run_checkpoints, thread_id, run_id, inline=False)

    async def copy_checkpoints(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._write(_copy_checkpoints, source_thread_id, target_thread_id, inline=False)

    async def prune_checkpoints(self, thread_id: str, strategy: Literal["delete", "keep_latest"]) -> None:
        if strategy == "delete":
            await self.checkpointer.adelete_thread(thread_id)
        else:
            await self._write(_keep_latest_checkpoints, thread_id, inline=False)

    # --- protocol events ---------------------------------------------------------
    async def append_thread_events(self, thread_id: str, run_id: str | None,
                                   events: list[NewThreadEvent]) -> list[int]:
        if not events:
            return []
        return await self._write(_append_events, thread_id, run_id, events)

    async def read_thread_events(self, thread_id: str, *, after: int = 0, limit: int = 500,
                                 run_id: str | None = None, method: str | None = None) -> list[Row]:
        return await self._fetchall(*thread_events_select("?", thread_id, after, limit, run_id, method))

    async def thread_event_bounds(self, thread_id: str) -> tuple[int, int]:
        return event_bounds(await self._fetchone(thread_event_bounds_select("?"), (thread_id,)))

    # --- crons (statements: storage/crons.py) ---------------------------------------
    async def create_cron(self, row: Row) -> Row:
        return await self._write(_create_cron, row)

    async def get_cron(self, cron_id: str) -> Row | None:
        found = await self._point(_CRONS.sql("get"), (cron_id,))
        return cron_row(found) if found else None

    async def update_cron(self, cron_id: str, change: Callable[[Row], Row]) -> Row | None:
        return await self._write(_update_cron, cron_id, change)

    async def delete_cron(self, cron_id: str) -> bool:
        return await self._write(_cron_write, _CRONS.sql("delete"), (cron_id,))

    async def search_crons(self, *, assistant_id, thread_id, enabled, metadata, limit, offset, sort_by,
                           sort_order) -> list[Row]:
        where, params = _CRONS.filters(assistant_id=assistant_id, thread_id=thread_id, enabled=enabled,
                                       metadata=metadata)
        rows = await self._fetchall(_CRONS.search(where, sort_by, sort_order), [*params, limit, offset])
        return [cron_row(r) for r in rows]

    async def count_crons(self, *, assistant_id, thread_id, enabled, metadata) -> int:
        where, params = _CRONS.filters(assistant_id=assistant_id, thread_id=thread_id, enabled=enabled,
                                       metadata=metadata)
        row = await self._fetchone(_CRONS.count(where), params)
        return int(row["n"]) if row else 0

    async def due_crons(self, now: str, limit: int) -> list[Row]:
        return [cron_row(r) for r in await self._fetchall(_CRONS.sql("due"), (now, now, limit))]

    async def claim_cron_tick(self, cron_id: str, tick: str, *, now: str, until: str) -> bool:
        return await self._write(_cron_write, _CRONS.sql("claim"), (until, cron_id, tick, now))

    async def advance_cron(self, cron_id: str, tick: str, next_run_date: str | None) -> bool:
        return await self._write(_cron_write, _CRONS.sql("advance"), (next_run_date, cron_id, tick))

    async def release_cron_tick(self, cron_id: str, tick: str) -> None:
        await self._write(_cron_write, _CRONS.sql("release"), (cron_id, tick))


class _SqliteStore(AsyncSqliteStore):
    """LangGraph's SQLite store with semantic-search paging made consistent: its vector query takes the best
    `2 × limit` vectors *before* applying `offset`, so `limit=1, offset=2` came back empty while the third
    item exists. A semantic search with an offset asks for `limit + offset` from the top and is sliced here.
    """

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        pages: dict[int, tuple[int, int]] = {}
        for i, op in enumerate(ops):
            if isinstance(op, SearchOp) and op.query and op.offset:
                pages[i] = (op.offset, op.limit)
                ops[i] = op._replace(limit=op.limit + op.offset, offset=0)
        results = await super().abatch(ops)
        for i, (offset, limit) in pages.items():
            results[i] = results[i][offset:offset + limit]  # type: ignore[index]
        return results


def _delete_run_checkpoints(db: sqlite3.Connection, thread_id: str, run_id: str) -> None:
    written_by_run = ("SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? "
                      "AND json_extract(CAST(metadata AS TEXT), '$.run_id') = ?")
    db.execute(f"DELETE FROM writes WHERE thread_id = ? AND checkpoint_id IN ({written_by_run})",
               (thread_id, thread_id, run_id))
    db.execute("DELETE FROM checkpoints WHERE thread_id = ? AND json_extract(CAST(metadata AS TEXT), '$.run_id') = ?",
               (thread_id, run_id))


def _copy_checkpoints(db: sqlite3.Connection, source_thread_id: str, target_thread_id: str) -> None:
    # The copies' metadata names the copy (`checkpoint_metadata`), as LangGraph's server's copies do.
    db.execute("INSERT OR REPLACE INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, "
               "type, checkpoint, metadata) SELECT ?, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
               "checkpoint, CAST(json_set(CAST(metadata AS TEXT), '$.thread_id', ?) AS BLOB) "
               "FROM checkpoints WHERE thread_id = ?", (target_thread_id, target_thread_id, source_thread_id))
    db.execute("INSERT OR REPLACE INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, "
               "channel, type, value) SELECT ?, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, "
               "type, value FROM writes WHERE thread_id = ?", (target_thread_id, source_thread_id))


def _keep_latest_checkpoints(db: sqlite3.Connection, thread_id: str) -> None:
    keep = "SELECT checkpoint_ns, MAX(checkpoint_id) FROM checkpoints WHERE thread_id = ? GROUP BY checkpoint_ns"
    for table in ("writes", "checkpoints"):
        db.execute(f"DELETE FROM {table} WHERE thread_id = ? AND (checkpoint_ns, checkpoint_id) NOT IN ({keep})",
                   (thread_id, thread_id))


def _lock_exclusively(db: Path) -> IO[bytes]:
    """Hold `<db>.lock` for the life of this process's storage.

    The embedded backend is one process: at start it requeues every run left `running`, which would steal
    the runs of a second live process on the same file. A second process is refused instead.
    """
    handle = open(db.with_name(db.name + ".lock"), "wb")  # noqa: SIM115 - held until close()
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ConfigError(
            f"another Threadline process is using {db}: the embedded SQLite backend serves from one process "
            "(give this one its own --database-url, or use PostgreSQL to run several)"
        ) from None
    return handle


def _create_thread(db: sqlite3.Connection, row: Row, if_exists: str) -> Row:
    found = _one_now(db, "SELECT * FROM threads WHERE thread_id = ?", (row["thread_id"],))
    if found is not None:
        if if_exists == "raise":
            raise Conflict(f"Thread with ID {row['thread_id']} already exists")
        return found
    _insert_now(db, "threads", row)
    return _thread_now(db, row["thread_id"])


def _thread_now(db: sqlite3.Connection, thread_id: str) -> Row:
    """The thread as stored, read after the write: triggers keep `expires_at`, and RETURNING would show the
    row from before they ran."""
    found = _one_now(db, "SELECT * FROM threads WHERE thread_id = ?", (thread_id,))
    assert found is not None
    return found


def _update_thread(db: sqlite3.Connection, thread_id: str, changes: Row, merge_metadata: dict | None) -> Row | None:
    current = _one_now(db, "SELECT metadata FROM threads WHERE thread_id = ?", (thread_id,))
    if current is None:
        return None
    changes = {**changes, "updated_at": now_iso()}
    if merge_metadata:
        changes["metadata"] = {**current["metadata"], **merge_metadata}
    sets = ", ".join(f"{_q(k)} = ?" for k in changes)
    db.execute(f"UPDATE threads SET {sets} WHERE thread_id = ?", [_param(k, v) for k, v in changes.items()] + [thread_id])
    return _thread_now(db, thread_id)


def _enqueue(db: sqlite3.Connection, run: Row, thread_metadata: dict[str, Any], create_thread: bool,
             reject_if_active: bool, ttl_columns: Row, new_thread_metadata: dict[str, Any],
             claim_for: tuple[str, float] | None, run_metadata: Callable[[Row | None], Row] | None) -> Row:
    now, thread_id = run["created_at"], run["thread_id"]
    thread = _one_now(db, "SELECT metadata FROM threads WHERE thread_id = ?", (thread_id,))
    if thread is None and not create_thread:
        raise NotFound(f"Thread with ID {thread_id} not found")
    if run_metadata is not None:
        run = {**run, "metadata": run_metadata(thread["metadata"] if thread is not None else None)}
    active = False
    if thread is None:
        _insert_now(db, "threads", {
            "thread_id": thread_id, "status": "busy", "config": {}, "interrupts": {},
            "metadata": {**new_thread_metadata, **thread_metadata}, "created_at": now, "updated_at": now,
            **ttl_columns})
    else:
        if reject_if_active or claim_for is not None:
            active = _one_now(db, "SELECT 1 FROM runs WHERE thread_id = ? AND status IN ('pending', 'running') "
                                  "LIMIT 1", (thread_id,)) is not None
        if reject_if_active and active:
            raise Conflict("Thread is already running a task. Wait for it to finish or choose a "
                           "different multitask strategy.")
        db.execute("UPDATE threads SET status = 'busy', metadata = ?, updated_at = ? WHERE thread_id = ?",
                   (dumps({**thread["metadata"], **thread_metadata}), now, thread_id))
    if claim_for is not None and not active and run["available_at"] <= now:
        worker_id, lease_seconds = claim_for
        run = {**run, "status": "running", "worker_id": worker_id, "attempt": 1,
               "lease_expires_at": iso_after(lease_seconds)}
    created = _insert_now(db, "runs", run, returning=True)
    assert created is not None
    return created


_CLAIMABLE = (
    "SELECT run_id FROM runs r WHERE status = 'pending' AND available_at <= ? "
    "AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.thread_id = r.thread_id AND o.status = 'running') "
    "AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = r.thread_id "
    "               AND e.status = 'pending' AND e.seq < r.seq) "
    "ORDER BY seq LIMIT 1"
)


def _claim(db: sqlite3.Connection, worker_id: str, lease_seconds: float) -> Row | None:
    """The oldest claimable run, claimed. The search is a plain read: an idle slot's claim usually finds nothing,
    and then takes no write lock. Every writer of `runs` uses this connection under the writer's lock, so what
    it found is still claimable when the transaction begins (the UPDATE checks it is still pending anyway)."""
    now = now_iso()
    found = _one_now(db, _CLAIMABLE, (now,))
    if found is None:
        return None
    return in_transaction(db, _one_now, "UPDATE runs SET status = 'running', worker_id = ?, attempt = attempt + 1, "
                                        "lease_expires_at = ?, updated_at = ? WHERE run_id = ? AND status = 'pending' "
                                        "RETURNING *", (worker_id, iso_after(lease_seconds), now, found["run_id"]))


def _finish(db: sqlite3.Connection, run_id: str, status: str, error: Any, output: Any, thread_changes: Row,
            worker_id: str | None, attempt: int | None, delete_thread: bool) -> Row | None:
    now = now_iso()
    output_json = dumps(output) if output is not None else None
    guard, params = "", [status, dumps(error) if error is not None else None, output_json, now, run_id]
    if worker_id is not None:
        guard = " AND worker_id = ? AND attempt = ? AND status = 'running'"
        params += [worker_id, attempt]
    # The output, often the thread's whole state, is neither read back nor encoded twice.
    finished = _one_now(db, "UPDATE runs SET status = ?, error = ?, output = ?, lease_expires_at = NULL, "
                            f"updated_at = ? WHERE run_id = ?{guard} RETURNING *", params, as_given={"output": output})
    if finished is None:
        return None
    if delete_thread:
        _delete_thread_and_checkpoints(db, finished["thread_id"], True)
        return finished
    if output_json is not None and thread_changes.get("values") is output:
        thread_changes = {**thread_changes, "values": Encoded(output_json)}
    _reconcile_now(db, finished["thread_id"], thread_changes, now)
    return finished


def _append_events(db: sqlite3.Connection, thread_id: str, run_id: str | None,
                   events: list[NewThreadEvent]) -> list[int]:
    """Number the events on from the thread's counter and store them, keeping the newest; one transaction
    (BEGIN IMMEDIATE: reading the counter and bumping it cannot interleave), one trip per batch."""
    now = now_iso()
    last = db.execute("INSERT INTO thread_event_counters (thread_id, last_seq) VALUES (?, ?) ON CONFLICT (thread_id) "
                      "DO UPDATE SET last_seq = last_seq + excluded.last_seq RETURNING last_seq",
                      (thread_id, len(events))).fetchone()["last_seq"]
    first = last - len(events) + 1
    db.executemany(
        "INSERT INTO thread_events (thread_id, seq, run_id, method, channel, namespace, params, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [(thread_id, first + i, run_id, e.method, e.channel, e.namespace, e.params, now) for i, e in enumerate(events)])
    if last > THREAD_EVENTS_KEPT:
        db.execute("DELETE FROM thread_events WHERE thread_id = ? AND seq <= ?", (thread_id, last - THREAD_EVENTS_KEPT))
    return list(range(first, last + 1))


def _heartbeat(db: sqlite3.Connection, worker_id: str, held: dict[str, int], lease_seconds: float) -> set[str]:
    """One statement for every held run (a run deleted or taken meanwhile is not returned)."""
    marks = ", ".join("?" for _ in held)
    rows = db.execute(f"UPDATE runs SET lease_expires_at = ? WHERE worker_id = ? AND status = 'running' "
                      f"AND run_id IN ({marks}) RETURNING run_id, attempt",
                      [iso_after(lease_seconds), worker_id, *held]).fetchall()
    return {r["run_id"] for r in rows if held.get(r["run_id"]) == r["attempt"]}


def _reconcile_now(db: sqlite3.Connection, thread_id: str, changes: Row, now: str,
                   only_if_busy: bool = False) -> None:
    """A thread is busy while it has an active run; otherwise it takes the status the finisher computed."""
    active = _one_now(
        db, "SELECT 1 FROM runs WHERE thread_id = ? AND status IN ('pending', 'running') LIMIT 1", (thread_id,)
    ) is not None
    changes = dict(changes)
    if active:
        changes["status"] = "busy"
    elif "status" not in changes:
        if only_if_busy:
            db.execute("UPDATE threads SET status = 'idle', updated_at = ? WHERE thread_id = ? AND status = 'busy'",
                       (now, thread_id))
            return
        changes["status"] = "idle"
    changes["updated_at"] = now
    sets = ", ".join(f"{_q(k)} = ?" for k in changes)
    db.execute(f"UPDATE threads SET {sets} WHERE thread_id = ?",
               [_param(k, v) for k, v in changes.items()] + [thread_id])


def _create_assistant(db: sqlite3.Connection, row: Row, if_exists: str) -> None:
    if _one_now(db, "SELECT 1 FROM assistants WHERE assistant_id = ?", (row["assistant_id"],)) is not None:
        if if_exists == "raise":
            raise Conflict(f"Assistant {row['assistant_id']} already exists")
        return
    _insert_now(db, "assistants", row)
    _insert_now(db, "assistant_versions", {k: row[k] for k in (
        "assistant_id", "version", "graph_id", "name", "description", "config", "context", "metadata", "created_at")})


def _update_assistant(db: sqlite3.Connection, assistant_id: str, changes: Row) -> None:
    current = _one_now(db, "SELECT * FROM assistants WHERE assistant_id = ?", (assistant_id,))
    if current is None:
        raise NotFound(f"Assistant {assistant_id} not found")
    top = _one_now(db, "SELECT MAX(version) AS v FROM assistant_versions WHERE assistant_id = ?", (assistant_id,))
    new = {**current, **changes, "version": ((top or {}).get("v") or 0) + 1, "updated_at": now_iso()}
    version = {k: new[k] for k in ("assistant_id", "version", "graph_id", "name", "description",
                                   "config", "context", "metadata")}
    _insert_now(db, "assistant_versions", {**version, "created_at": new["updated_at"]})
    sets = ", ".join(f"{_q(k)} = ?" for k in new if k != "assistant_id")
    db.execute(f"UPDATE assistants SET {sets} WHERE assistant_id = ?",
               [_param(k, new[k]) for k in new if k != "assistant_id"] + [assistant_id])


def _delete_assistant(db: sqlite3.Connection, assistant_id: str) -> bool:
    db.execute("DELETE FROM assistant_versions WHERE assistant_id = ?", (assistant_id,))
    return db.execute("DELETE FROM assistants WHERE assistant_id = ?", (assistant_id,)).rowcount > 0


def _set_assistant_version(db: sqlite3.Connection, assistant_id: str, version: int) -> bool:
    v = _one_now(db, "SELECT * FROM assistant_versions WHERE assistant_id = ? AND version = ?",
                 (assistant_id, version))
    if v is None:
        return False
    db.execute("UPDATE assistants SET graph_id = ?, name = ?, description = ?, config = ?, context = ?, "
               "metadata = ?, version = ?, updated_at = ? WHERE assistant_id = ?",
               (v["graph_id"], v["name"], v["description"], dumps(v["config"]), dumps(v["context"]),
                dumps(v["metadata"]), version, now_iso(), assistant_id))
    return True


def _release(db: sqlite3.Connection, worker_id: str, held: dict[str, int]) -> list[str]:
    """Runs back in the queue without spending an attempt, if `worker_id` still holds that attempt."""
    now = now_iso()
    return [run_id for run_id, attempt in held.items() if db.execute(
        "UPDATE runs SET status = 'pending', worker_id = NULL, lease_expires_at = NULL, attempt = attempt - 1, "
        "updated_at = ? WHERE run_id = ? AND worker_id = ? AND attempt = ? AND status = 'running'",
        (now, run_id, worker_id, attempt)).rowcount]


def _cancel_pending(db: sqlite3.Connection, run_ids: list[str], status: str) -> list[str]:
    now = now_iso()
    marks = ", ".join("?" for _ in run_ids)
    rows = db.execute(f"SELECT run_id, thread_id FROM runs WHERE status = 'pending' AND run_id IN ({marks})",
                      run_ids).fetchall()
    for r in rows:
        db.execute("UPDATE runs SET status = ?, updated_at = ? WHERE run_id = ?", (status, now, r["run_id"]))
    for thread_id in {r["thread_id"] for r in rows}:
        _reconcile_now(db, thread_id, {}, now)
    return [r["run_id"] for r in rows]


def _delete_run(db: sqlite3.Connection, run_id: str) -> bool:
    found = _one_now(db, "SELECT thread_id FROM runs WHERE run_id = ?", (run_id,))
    if found is None:
        return False
    db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
    _reconcile_now(db, found["thread_id"], {}, now_iso(), only_if_busy=True)
    return True


def _recover(db: sqlite3.Connection, max_attempts: int, expired_only: bool) -> tuple[list[Row], list[Row]]:
    now = now_iso()
    lapsed = " AND lease_expires_at < ?" if expired_only else ""
    rows = [_row(r) for r in db.execute(f"SELECT * FROM runs WHERE status = 'running'{lapsed}",
                                        (now,) if expired_only else ()).fetchall()]
    requeued, failed = [], []
    for r in rows:
        if r["attempt"] <= max_attempts:
            db.execute("UPDATE runs SET status = 'pending', worker_id = NULL, lease_expires_at = NULL, "
                       "updated_at = ? WHERE run_id = ?", (now, r["run_id"]))
            requeued.append(r)
        else:
            err = worker_lost(r["attempt"])
            db.execute("UPDATE runs SET status = 'error', error = ?, worker_id = NULL, lease_expires_at = NULL, "
                       "updated_at = ? WHERE run_id = ?", (dumps(err), now, r["run_id"]))
            failed.append({**r, "status": "error", "error": err})
            _reconcile_now(db, r["thread_id"], {"status": "error", "error": err}, now)
    # A thread marked busy with no active run (e.g. a crash between writes) is reconciled too.
    db.execute("UPDATE threads SET status = 'idle', updated_at = ? WHERE status = 'busy' AND NOT EXISTS "
               "(SELECT 1 FROM runs WHERE runs.thread_id = threads.thread_id AND runs.status IN "
               "('pending', 'running'))", (now,))
    return requeued, failed


def _one_now(db: sqlite3.Connection, sql: str, params: tuple | list = (), *, as_given: Row | None = None) -> Row | None:
    """The statement's one row. `as_given`: columns the caller has just written, taken as they are instead
    of decoded from the row."""
    cur = db.execute(sql, params)
    found = cur.fetchone()
    cur.close()  # an UPDATE … RETURNING is only complete once its statement is done
    return _row(found, as_given) if found is not None else None


def _insert_now(db: sqlite3.Connection, table: str, row: Row, *, returning: bool = False) -> Row | None:
    cols = list(row)
    cur = db.execute(f"INSERT INTO {table} ({', '.join(_q(c) for c in cols)}) VALUES ({', '.join('?' for _ in cols)})"
                     + (" RETURNING *" if returning else ""), [_param(c, row[c]) for c in cols])
    if not returning:
        return None
    inserted = cur.fetchone()
    cur.close()
    return _row(inserted)


def _delete_expired_threads(db: sqlite3.Connection, now: str, limit: int) -> list[str]:
    expired = [r["thread_id"] for r in db.execute(
        "SELECT thread_id FROM threads t WHERE expires_at IS NOT NULL AND expires_at <= ? "
        "AND status != 'busy' AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.thread_id "
        "AND r.status IN ('pending', 'running')) ORDER BY expires_at LIMIT ?", (now, limit)).fetchall()]
    _delete_threads(db, expired, False)
    for thread_id in expired:
        delete_thread_checkpoints(db, thread_id)
    return expired


def _delete_thread_and_checkpoints(db: sqlite3.Connection, thread_id: str, keep_runs: bool) -> bool:
    deleted = _delete_threads(db, [thread_id], keep_runs) > 0
    delete_thread_checkpoints(db, thread_id)
    return deleted


def _delete_threads(db: sqlite3.Connection, thread_ids: list[str], keep_runs: bool) -> int:
    """Delete the threads' rows (not their checkpoints) inside the caller's transaction; return how many."""
    if not thread_ids:
        return 0
    ids = f"({', '.join('?' for _ in thread_ids)})"
    tables = ("thread_events", "thread_event_counters") if keep_runs else ("runs", "thread_events",
                                                                          "thread_event_counters")
    for table in tables:
        db.execute(f"DELETE FROM {table} WHERE thread_id IN {ids}", thread_ids)
    cur = db.execute(f"DELETE FROM threads WHERE thread_id IN {ids}", thread_ids)
    return cur.rowcount


def _q(col: str) -> str:
    return f'"{col}"'


class Encoded(str):
    """A JSON column's value already encoded."""


def _param(col: str, value: Any) -> Any:
    if isinstance(value, Encoded):
        return str(value)
    return dumps(value) if col in JSON_COLUMNS and value is not None else value


def _row(r: Any, as_given: Row | None = None) -> Row:
    out = dict(r)
    for col in JSON_COLUMNS:
        if as_given and col in as_given:
            out[col] = as_given[col]
        elif col in out and isinstance(out[col], str):
            out[col] = _json(out[col])
    return out


def _json(text: str) -> Any:
    """orjson (a few times faster), else the standard parser: `dumps` lets NaN and Infinity through,
    which orjson refuses."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def _order(sort_by: str, sort_order: SortOrder, allowed: set[str], default: str) -> str:
    col = sort_by if sort_by in allowed else default
    direction = "ASC" if sort_order == "asc" else "DESC"
    return f"{_q(col)} {direction}, rowid {direction}"


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# --- crons ---------------------------------------------------------------------------------------
_CRONS = Dialect(mark="?", true="1", for_update="", encode_json=dumps, metadata_key=lambda key: f'$."{key}"',
                 metadata_match="(metadata -> {p}) = json({p})")


def _create_cron(db: sqlite3.Connection, row: Row) -> Row:
    if row.get("thread_id") is not None and _one_now(db, _CRONS.sql("thread_exists"), (row["thread_id"],)) is None:
        raise NotFound(f"Thread with ID {row['thread_id']} not found")
    created = _one_now(db, _CRONS.sql("insert"), _CRONS.params(row))
    assert created is not None
    return cron_row(created)


def _update_cron(db: sqlite3.Connection, cron_id: str, change: Callable[[Row], Row]) -> Row | None:
    """Read, change and write in the writer's one transaction: no other write comes between."""
    current = _one_now(db, _CRONS.sql("get_for_update"), (cron_id,))
    if current is None:
        return None
    columns = change(cron_row(current))
    if not columns:
        return cron_row(current)
    updated = _one_now(db, _CRONS.update(list(columns)),
                       [*(_CRONS.value(c, v) for c, v in columns.items()), cron_id])
    return cron_row(updated) if updated is not None else None


def _cron_write(db: sqlite3.Connection, sql: str, params: tuple) -> bool:
    return db.execute(sql, params).rowcount > 0
