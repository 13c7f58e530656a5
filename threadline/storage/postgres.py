"""Scale-out storage: PostgreSQL through a psycopg pool, LangGraph's Postgres saver and store.

Any number of processes share one database. The runs table is the queue: a claim takes the oldest
available run with `FOR UPDATE SKIP LOCKED`, and a unique index makes "one running run per thread" a
fact the database enforces, whatever two claims race with. Time comes from the database clock, so the
leases of workers on different machines are compared on one clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import select
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime, timezone
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from threadline.errors import ConfigError, Conflict, NotFound, StorageUnavailable
from threadline.settings import redact_url
from threadline.storage.base import THREAD_EVENTS_KEPT, NewThreadEvent, Row, SortOrder, Storage
from threadline.storage.crons import Dialect, cron_row
from threadline.storage.sql import (
    JSON_COLUMNS, MIGRATIONS_TABLE, event_bounds, filter_terms, now_iso, pending_migrations, thread_event_bounds_select,
    thread_events_select, thread_ttl_columns, worker_lost,
)

log = logging.getLogger("threadline.storage")

_ASSISTANT_SORT = {"assistant_id", "graph_id", "name", "created_at", "updated_at"}
_THREAD_SORT = {"thread_id", "status", "created_at", "updated_at", "state_updated_at"}
_VERSION_COLS = ("assistant_id", "version", "graph_id", "name", "description", "config", "context", "metadata")
_MIGRATION_LOCK = 7_345_112_907  # pg_advisory_lock key: one process migrates at a time
_ACTIVE = "status IN ('pending', 'running')"


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """The backend's edge: a connection lost (the server restarted, an administrator terminated it, the
    network dropped), none to be had in time, or a transient refusal (a deadlock, a serialization failure, a
    statement timeout: psycopg's `OperationalError` family) becomes `StorageUnavailable`, whose message names
    no driver. Anything else (a constraint the code expects, a bug) passes through as it is."""
    try:
        yield
    except psycopg.OperationalError as exc:
        log.warning("database unavailable: %s: %s", type(exc).__name__, str(exc).strip())
        raise StorageUnavailable(f"The database is unavailable ({_reason(exc)}). Retry shortly.") from exc


def _reason(exc: psycopg.OperationalError) -> str:
    if isinstance(exc, PoolTimeout):
        return "no connection free in time"
    if isinstance(exc, (psycopg.errors.AdminShutdown, psycopg.errors.CannotConnectNow)) or exc.sqlstate is None:
        return "connection lost"  # no SQLSTATE: the client side found the connection gone
    return "transient failure"


def _readable(conn: psycopg.AsyncConnection) -> bool:
    """Whether the server wrote to (or closed) an idle connection: it does so when it terminates it."""
    try:
        return bool(select.select([conn.pgconn.socket], [], [], 0)[0])
    except (OSError, ValueError, psycopg.OperationalError):
        return True


async def _check(conn: psycopg.AsyncConnection) -> None:
    """The pool's check at checkout. An idle connection has nothing to read; one the server terminated has
    its goodbye (or EOF) waiting: only then a round trip confirms it, and the pool discards it and hands out
    another (a check per checkout with a round trip each costs a trip on every statement)."""
    if conn.broken or _readable(conn):
        await AsyncConnectionPool.check_connection(conn)


class _Pool(AsyncConnectionPool):
    """The psycopg pool, whose connections translate driver errors at the edge (see `_translated`). LangGraph's
    saver and store take their connections from it too, so the checkpoints of a run are translated as well."""

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[psycopg.AsyncConnection]:
        with _translated():
            async with super().connection(timeout) as conn:
                yield conn


class PostgresStorage(Storage):
    """Storage in one PostgreSQL database, shared by every API and worker process."""

    #: Longest a request waits for a pooled connection (all busy, or the database down) before its 503.
    checkout_seconds = 10.0

    def __init__(self, url: str, pool: AsyncConnectionPool, checkpointer: Any, store: Any,
                 vector_index: str | None) -> None:
        self.url = url
        self._pool = pool
        self.checkpointer = checkpointer
        self.store = store
        # vector_search: semantic search works once store.index is set (pgvector, or else an exact scan);
        # vector_index: how the configured store.index searches, "pgvector" or "exact_scan" (None: no index).
        self.capabilities = {"vector_search": True, "vector_index": vector_index, "ttl": True,
                             "multi_process": True}

    @classmethod
    async def open(cls, url: str, *, store_index: dict | None = None, store_ttl: dict | None = None,
                   pool_size: int = 10) -> PostgresStorage:
        from threadline.storage.postgres_saver import InlinePostgresSaver
        from threadline.storage.vectors import postgres_store

        pool = _Pool(
            url, min_size=1, max_size=pool_size, open=False, check=_check, timeout=cls.checkout_seconds,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        try:
            await pool.open(wait=True, timeout=15)
        except Exception as exc:
            await pool.close()
            raise ConfigError(f"cannot connect to PostgreSQL at {redact_url(url)}: {exc}") from exc
        try:
            vector = await _has_pgvector(pool)
            saver = InlinePostgresSaver(pool)  # type: ignore[arg-type]
            store, vector_index = postgres_store(pool, index=store_index, ttl=store_ttl, pgvector=vector)
            self = cls(url, pool, saver, store, vector_index)
            self.applied_migrations = await self.migrate()
            if store_ttl and store_ttl.get("sweep_interval_minutes"):
                await store.start_ttl_sweeper()
        except BaseException:
            await pool.close()
            raise
        return self

    async def migrate(self) -> list[str]:
        """Our numbered migrations, then LangGraph's saver and store setup, one process at a time."""
        async with self._pool.connection() as conn:
            # Try, don't wait, for the lock: a session blocked in pg_advisory_lock() is an open
            # transaction, and the CREATE INDEX CONCURRENTLY in LangGraph's setup waits for every open
            # transaction, so the holder and the waiter would wait for each other.
            while not (await (await conn.execute("SELECT pg_try_advisory_lock(%s) AS ok",
                                                 (_MIGRATION_LOCK,))).fetchone())["ok"]:
                await asyncio.sleep(0.1)
            try:
                applied = await _apply_migrations(conn)
                await self.checkpointer.setup()
                await self.store.setup()
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
        return applied

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.store.stop_ttl_sweeper(timeout=1)
        await self._pool.close()

    async def ping(self) -> None:
        await self._fetchone("SELECT 1 AS ok")  # StorageUnavailable when it cannot answer

    # --- helpers -------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _tx(self) -> AsyncIterator[psycopg.AsyncConnection]:
        async with self._pool.connection() as conn, conn.transaction():
            yield conn

    @contextlib.asynccontextmanager
    async def _pipelined_tx(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """A transaction in psycopg's pipeline mode: a statement is sent at once, and its result waited for
        only when it is fetched (which sends everything queued before it too)."""
        async with self._pool.connection() as conn, conn.pipeline(), conn.transaction():
            yield conn

    async def _fetchall(self, sql: str, params: tuple | list = ()) -> list[Row]:
        """A read; one whose connection was lost under it is read again, once, on a fresh connection (the
        pool replaces a broken one), so a database restart costs a read its retry, not the client a 503."""
        for last in (False, True):
            try:
                async with self._pool.connection() as conn:
                    cur = await conn.execute(sql, params)
                    return [_row(r) for r in await cur.fetchall()]
            except StorageUnavailable as exc:
                if last or isinstance(exc.__cause__, PoolTimeout):
                    raise
        raise AssertionError("unreachable")

    async def _fetchone(self, sql: str, params: tuple | list = ()) -> Row | None:
        rows = await self._fetchall(sql, params)
        return rows[0] if rows else None

    # --- assistants ----------------------------------------------------------
    async def create_assistant(self, row: Row, *, if_exists: Literal["raise", "do_nothing"]) -> Row:
        async with self._tx() as db:
            cur = await _insert(db, "assistants", row, on_conflict="(assistant_id) DO NOTHING")
            if cur.rowcount:
                await _insert(db, "assistant_versions", {k: row[k] for k in (*_VERSION_COLS, "created_at")})
            elif if_exists == "raise":
                raise Conflict(f"Assistant {row['assistant_id']} already exists")
        found = await self.get_assistant(row["assistant_id"])
        assert found is not None
        return found

    async def get_assistant(self, assistant_id: str) -> Row | None:
        return await self._fetchone("SELECT * FROM assistants WHERE assistant_id = %s", (assistant_id,))

    def _assistant_filter(self, graph_id: str | None, name: str | None, metadata: dict | None) -> tuple[str, list]:
        clauses: list[tuple[str, list]] = []
        if graph_id is not None:
            clauses.append(("graph_id = %s", [graph_id]))
        if name is not None:
            clauses.append(("name ILIKE %s", [f"%{_like(name)}%"]))
        return _where(clauses, metadata=metadata)

    async def search_assistants(self, *, graph_id, name, metadata, limit, offset, sort_by, sort_order) -> list[Row]:
        cond, params = self._assistant_filter(graph_id, name, metadata)
        order = _order(sort_by, sort_order, _ASSISTANT_SORT, "created_at", "assistant_id")
        return await self._fetchall(
            f"SELECT * FROM assistants {cond} ORDER BY {order} LIMIT %s OFFSET %s", [*params, limit, offset])

    async def count_assistants(self, *, graph_id, name, metadata) -> int:
        cond, params = self._assistant_filter(graph_id, name, metadata)
        row = await self._fetchone(f"SELECT COUNT(*) AS n FROM assistants {cond}", params)
        return int(row["n"]) if row else 0

    async def update_assistant(self, assistant_id: str, changes: Row) -> Row:
        async with self._tx() as db:
            current = await _one(db, "SELECT * FROM assistants WHERE assistant_id = %s FOR UPDATE", (assistant_id,))
            if current is None:
                raise NotFound(f"Assistant {assistant_id} not found")
            top = await _one(db, "SELECT MAX(version) AS v FROM assistant_versions WHERE assistant_id = %s",
                             (assistant_id,))
            new = {**current, **changes, "version": ((top or {}).get("v") or 0) + 1, "updated_at": now_iso()}
            await _insert(db, "assistant_versions",
                          {**{k: new[k] for k in _VERSION_COLS}, "created_at": new["updated_at"]})
            cols = [k for k in new if k != "assistant_id"]
            await db.execute(f"UPDATE assistants SET {', '.join(f'{_q(k)} = %s' for k in cols)} "
                             "WHERE assistant_id = %s", [_param(k, new[k]) for k in cols] + [assistant_id])
        found = await self.get_assistant(assistant_id)
        assert found is not None
        return found

    async def delete_assistant(self, assistant_id: str) -> bool:
        async with self._tx() as db:
            cur = await db.execute("DELETE FROM assistants WHERE assistant_id = %s", (assistant_id,))
            return cur.rowcount > 0

    async def list_assistant_versions(self, assistant_id, *, metadata, limit, offset) -> list[Row]:
        cond, params = _where([("assistant_id = %s", [assistant_id])], metadata=metadata)
        return await self._fetchall(
            f"SELECT * FROM assistant_versions {cond} ORDER BY version DESC LIMIT %s OFFSET %s",
            [*params, limit, offset])

    async def set_assistant_version(self, assistant_id: str, version: int) -> Row | None:
        async with self._tx() as db:
            v = await _one(db, "SELECT * FROM assistant_versions WHERE assistant_id = %s AND version = %s",
                           (assistant_id, version))
            if v is None:
                return None
            await db.execute(
                "UPDATE assistants SET graph_id = %s, name = %s, description = %s, config = %s, context = %s, "
                "metadata = %s, version = %s, updated_at = %s WHERE assistant_id = %s",
                (v["graph_id"], v["name"], v["description"], Jsonb(v["config"]), Jsonb(v["context"]),
                 Jsonb(v["metadata"]), version, now_iso(), assistant_id))
        return await self.get_assistant(assistant_id)

    # --- threads -------------------------------------------------------------
    async def create_thread(self, row: Row, *, if_exists: Literal["raise", "do_nothing"]) -> Row:
        async with self._tx() as db:
            cur = await _insert(db, "threads", row, on_conflict="(thread_id) DO NOTHING")
            if not cur.rowcount and if_exists == "raise":
                raise Conflict(f"Thread with ID {row['thread_id']} already exists")
        found = await self.get_thread(row["thread_id"])
        assert found is not None
        return found

    async def get_thread(self, thread_id: str, *, filters: dict | None = None) -> Row | None:
        cond, params = _where([("thread_id = %s", [thread_id])], filters=filters)
        return await self._fetchone(f"SELECT * FROM threads {cond}", params)

    async def update_thread(self, thread_id: str, changes: Row, *, merge_metadata: dict | None = None) -> Row | None:
        changes = {**changes, "updated_at": now_iso()}
        sets = [f"{_q(k)} = %s" for k in changes]
        params = [_param(k, v) for k, v in changes.items()]
        if merge_metadata:
            sets.append("metadata = metadata || %s")
            params.append(Jsonb(merge_metadata))
        async with self._tx() as db:
            cur = await db.execute(f"UPDATE threads SET {', '.join(sets)} WHERE thread_id = %s RETURNING *",
                                   [*params, thread_id])
            found = await cur.fetchone()
        return _row(found) if found else None

    async def delete_thread(self, thread_id: str) -> bool:
        async with self._tx() as db:
            deleted = await _delete_threads(db, [thread_id], keep_runs=False) > 0
        await self.checkpointer.adelete_thread(thread_id)
        return deleted

    async def delete_expired_threads(self, *, limit: int, now: str | None = None) -> list[str]:
        # The row locks order the sweep against enqueue_run, which locks the thread row before adding a
        # run: a thread an enqueue holds is skipped (it is about to be busy), and an enqueue waiting on a
        # thread being swept finds it gone. SKIP LOCKED lets concurrent sweepers take disjoint threads.
        async with self._tx() as db:
            cur = await db.execute(
                "SELECT thread_id FROM threads t WHERE expires_at <= COALESCE(%s::timestamptz, now()) "
                f"AND status <> 'busy' AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.thread_id "
                f"AND r.{_ACTIVE}) ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED", (now, limit))
            expired = [r["thread_id"] for r in await cur.fetchall()]
            await _delete_threads(db, expired, keep_runs=False)
        for thread_id in expired:
            await self.checkpointer.adelete_thread(thread_id)
        return expired

    def _thread_filter(self, ids, metadata, values, status, filters=None) -> tuple[str, list]:
        clauses: list[tuple[str, list]] = []
        if ids:
            clauses.append(("thread_id = ANY(%s)", [list(ids)]))
        if status is not None:
            clauses.append(("status = %s", [status]))
        return _where(clauses, metadata=metadata, values=values, filters=filters)

    async def search_threads(self, *, ids, metadata, values, status, limit, offset, sort_by, sort_order,
                             filters=None) -> list[Row]:
        cond, params = self._thread_filter(ids, metadata, values, status, filters)
        order = _order(sort_by, sort_order, _THREAD_SORT, "created_at", "thread_id")
        return await self._fetchall(
            f"SELECT * FROM threads {cond} ORDER BY {order} LIMIT %s OFFSET %s", [*params, limit, offset])

    async def count_threads(self, *, metadata, values, status, filters=None) -> int:
        cond, params = self._thread_filter(None, metadata, values, status, filters)
        row = await self._fetchone(f"SELECT COUNT(*) AS n FROM threads {cond}", params)
        return int(row["n"]) if row else 0

    # --- runs and the queue ----------------------------------------------------
    async def enqueue_run(self, run: Row, *, thread_metadata: dict[str, Any], create_thread: bool,
                          reject_if_active: bool, thread_ttl_minutes: float | None = None,
                          new_thread_metadata: dict[str, Any] | None = None,
                          claim_for: tuple[str, float] | None = None,
                          run_metadata: Callable[[dict[str, Any] | None], dict[str, Any]] | None = None) -> Row:
        now, thread_id = run["created_at"], run["thread_id"]
        # Pipelined (psycopg's pipeline mode): the statements whose results decide nothing are sent with the
        # next ones, so the enqueue takes three round trips (the thread and its active run, then the writes,
        # then COMMIT), not one per statement.
        async with self._pipelined_tx() as db:
            inserted = None
            if create_thread:
                inserted = await _insert(db, "threads", {
                    "thread_id": thread_id, "status": "busy", "metadata": new_thread_metadata or {}, "config": {},
                    "interrupts": {},
                    "created_at": now, "updated_at": now, **thread_ttl_columns(thread_ttl_minutes)},
                    on_conflict="(thread_id) DO NOTHING", returning=True)
            # The thread row lock orders concurrent enqueues on one thread (reject sees the other's run).
            locked = await db.execute("SELECT metadata FROM threads WHERE thread_id = %s FOR UPDATE", (thread_id,))
            active_cur = await db.execute(f"SELECT 1 FROM runs WHERE thread_id = %s AND {_ACTIVE} LIMIT 1",
                                          (thread_id,)) if reject_if_active or claim_for is not None else None
            created_thread = inserted is not None and await inserted.fetchone() is not None
            thread = await locked.fetchone()
            if thread is None:
                raise NotFound(f"Thread with ID {thread_id} not found")
            active = active_cur is not None and await active_cur.fetchone() is not None
            if reject_if_active and active:
                raise Conflict("Thread is already running a task. Wait for it to finish or choose a "
                               "different multitask strategy.")
            if run_metadata is not None:
                run = {**run, "metadata": run_metadata(None if created_thread else thread["metadata"])}
            await db.execute("UPDATE threads SET status = 'busy', metadata = metadata || %s, updated_at = %s "
                             "WHERE thread_id = %s", (Jsonb(thread_metadata), now, thread_id))
            lease: tuple[str, float] | None = None
            if claim_for is not None and not active and run["available_at"] <= now:
                # Claimed as `claim_run` claims, the lease on the database's clock; the thread's row lock
                # keeps any other run of this thread from being enqueued or claimed meanwhile.
                run = {**run, "status": "running", "worker_id": claim_for[0], "attempt": 1}
                lease = ("lease_expires_at", claim_for[1])
            cur = await _insert(db, "runs", run, returning=True, lease=lease)
            created = await cur.fetchone()
        assert created is not None
        return _row(created)

    async def claim_run(self, worker_id: str, lease_seconds: float) -> Row | None:
        sql = (
            "UPDATE runs SET status = 'running', worker_id = %s, attempt = attempt + 1, "
            "lease_expires_at = now() + make_interval(secs => %s), updated_at = now() "
            "WHERE run_id = (SELECT run_id FROM runs r WHERE status = 'pending' AND available_at <= now() "
            "  AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.thread_id = r.thread_id AND o.status = 'running') "
            "  AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = r.thread_id AND e.status = 'pending' "
            "                  AND e.seq < r.seq) "
            "  ORDER BY seq LIMIT 1 FOR UPDATE SKIP LOCKED) "
            "AND status = 'pending' RETURNING *"
        )
        try:
            # One statement is its own transaction: no BEGIN/COMMIT round trips on the hottest path.
            async with self._pool.connection() as db:
                cur = await db.execute(sql, (worker_id, lease_seconds))
                found = await cur.fetchone()
        except psycopg.errors.UniqueViolation:
            return None  # another worker just started a run of that thread; the next claim moves on
        return _row(found) if found else None

    async def heartbeat_runs(self, worker_id: str, held: dict[str, int], lease_seconds: float) -> set[str]:
        if not held:
            return set()
        async with self._tx() as db:
            cur = await db.execute(
                "UPDATE runs SET lease_expires_at = now() + make_interval(secs => %s) "
                "FROM unnest(%s::text[], %s::int[]) AS h(run_id, attempt) "
                "WHERE runs.run_id = h.run_id AND runs.attempt = h.attempt AND runs.worker_id = %s "
                "AND runs.status = 'running' RETURNING runs.run_id",
                (lease_seconds, list(held), list(held.values()), worker_id))
            return {r["run_id"] for r in await cur.fetchall()}

    async def release_runs(self, worker_id: str, held: dict[str, int]) -> list[str]:
        if not held:
            return []
        async with self._tx() as db:
            cur = await db.execute(
                "UPDATE runs SET status = 'pending', worker_id = NULL, lease_expires_at = NULL, "
                "attempt = runs.attempt - 1, updated_at = now() "
                "FROM unnest(%s::text[], %s::int[]) AS h(run_id, attempt) "
                "WHERE runs.run_id = h.run_id AND runs.attempt = h.attempt AND runs.worker_id = %s "
                "AND runs.status = 'running' RETURNING runs.run_id",
                (list(held), list(held.values()), worker_id))
            return [r["run_id"] for r in await cur.fetchall()]

    async def finish_run(self, run_id, status, *, error=None, output=None, thread_changes=None,
                         worker_id=None, attempt=None, delete_thread=False) -> Row | None:
        guard, params = "", [status, _json(error), _json(output), run_id]
        if worker_id is not None:
            guard = " AND worker_id = %s AND attempt = %s AND status = 'running'"
            params += [worker_id, attempt]
        finished: Row | None = None
        # Pipelined: the run's update and its thread's reconciliation go in one round trip, then COMMIT; when
        # the run was not ours to end, the transaction is rolled back instead.
        async with self._pipelined_tx() as db:
            cur = await db.execute(
                "UPDATE runs SET status = %s, error = %s, output = %s, lease_expires_at = NULL, "
                f"updated_at = now() WHERE run_id = %s{guard} RETURNING *", params)
            if not delete_thread:
                await _reconcile_thread(db, thread_changes or {}, run_id=run_id)
            found = await cur.fetchone()
            if found is None:
                raise psycopg.Rollback()
            finished = _row(found)
            if delete_thread:
                await _delete_threads(db, [finished["thread_id"]], keep_runs=True)
        if finished is not None and delete_thread:
            await self.checkpointer.adelete_thread(finished["thread_id"])
        return finished

    async def cancel_pending_runs(self, run_ids: list[str], status: str) -> list[str]:
        if not run_ids:
            return []
        async with self._tx() as db:
            cur = await db.execute(
                "UPDATE runs SET status = %s, updated_at = now() WHERE status = 'pending' AND run_id = ANY(%s) "
                "RETURNING run_id, thread_id", (status, list(run_ids)))
            rows = await cur.fetchall()
            for thread_id in sorted({r["thread_id"] for r in rows}):
                await _reconcile_thread(db, {}, thread_id=thread_id)
        return [r["run_id"] for r in rows]

    async def get_run(self, run_id: str) -> Row | None:
        return await self._fetchone("SELECT * FROM runs WHERE run_id = %s", (run_id,))

    async def search_runs(self, *, thread_id, assistant_id, status, metadata, limit, offset) -> list[Row]:
        clauses = [(f"{col} = %s", [val]) for col, val in
                   (("thread_id", thread_id), ("assistant_id", assistant_id), ("status", status)) if val is not None]
        cond, params = _where(clauses, metadata=metadata)
        return await self._fetchall(
            f"SELECT * FROM runs {cond} ORDER BY seq DESC LIMIT %s OFFSET %s", [*params, limit, offset])

    async def delete_run(self, run_id: str) -> bool:
        async with self._tx() as db:
            cur = await db.execute("DELETE FROM runs WHERE run_id = %s RETURNING thread_id", (run_id,))
            found = await cur.fetchone()
            if found is None:
                return False
            await _reconcile_thread(db, {}, thread_id=found["thread_id"], only_if_busy=True)
        return True

    async def active_runs(self, thread_id: str) -> list[Row]:
        return await self._fetchall(f"SELECT * FROM runs WHERE thread_id = %s AND {_ACTIVE} ORDER BY seq",
                                    (thread_id,))

    async def next_run(self, thread_id: str, after_seq: int) -> Row | None:
        return await self._fetchone("SELECT * FROM runs WHERE thread_id = %s AND seq > %s ORDER BY seq LIMIT 1",
                                    (thread_id, after_seq))

    async def last_run_seq(self, thread_id: str) -> int:
        row = await self._fetchone("SELECT MAX(seq) AS seq FROM runs WHERE thread_id = %s", (thread_id,))
        return int(row["seq"] or 0) if row else 0

    async def recover_runs(self, max_attempts: int, *, expired_only: bool) -> tuple[list[Row], list[Row]]:
        lapsed = " AND lease_expires_at < now()" if expired_only else ""
        requeued, failed = [], []
        async with self._tx() as db:
            cur = await db.execute(f"SELECT * FROM runs WHERE status = 'running'{lapsed} FOR UPDATE SKIP LOCKED")
            for r in [_row(x) for x in await cur.fetchall()]:
                if r["attempt"] <= max_attempts:
                    await db.execute("UPDATE runs SET status = 'pending', worker_id = NULL, lease_expires_at = NULL, "
                                     "updated_at = now() WHERE run_id = %s", (r["run_id"],))
                    requeued.append(r)
                else:
                    err = worker_lost(r["attempt"])
                    await db.execute("UPDATE runs SET status = 'error', error = %s, worker_id = NULL, "
                                     "lease_expires_at = NULL, updated_at = now() WHERE run_id = %s",
                                     (Jsonb(err), r["run_id"]))
                    failed.append({**r, "status": "error", "error": err})
                    await _reconcile_thread(db, {"status": "error", "error": err}, thread_id=r["thread_id"])
            if not expired_only:
                await db.execute(
                    "UPDATE threads SET status = 'idle', updated_at = now() WHERE status = 'busy' AND NOT EXISTS "
                    f"(SELECT 1 FROM runs WHERE runs.thread_id = threads.thread_id AND runs.{_ACTIVE})")
        return requeued, failed

    async def queue_stats(self) -> Row:
        row = await self._fetchone(
            "SELECT COUNT(*) FILTER (WHERE status = 'pending') AS pending, "
            "COUNT(*) FILTER (WHERE status = 'running') AS running, "
            "MIN(available_at) FILTER (WHERE status = 'pending') AS oldest FROM runs WHERE " + _ACTIVE)
        row = row or {}
        return {"pending": int(row.get("pending") or 0), "running": int(row.get("running") or 0),
                "oldest_pending_at": row.get("oldest")}

    # --- checkpoint helpers ----------------------------------------------------
    async def delete_checkpoints_for_run(self, thread_id: str, run_id: str) -> None:
        async with self._tx() as db:
            await db.execute(
                "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_id IN (SELECT checkpoint_id "
                "FROM checkpoints WHERE thread_id = %s AND metadata->>'run_id' = %s)", (thread_id, thread_id, run_id))
            await db.execute("DELETE FROM checkpoints WHERE thread_id = %s AND metadata->>'run_id' = %s",
                             (thread_id, run_id))

    async def copy_checkpoints(self, source_thread_id: str, target_thread_id: str) -> None:
        async with self._tx() as db:
            # The copies' metadata names the copy (`checkpoint_metadata`), as LangGraph's server's copies do.
            await db.execute(
                "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
                "checkpoint, metadata) SELECT %s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
                "checkpoint, metadata || jsonb_build_object('thread_id', %s::text) FROM checkpoints "
                "WHERE thread_id = %s ON CONFLICT DO NOTHING", (target_thread_id, target_thread_id, source_thread_id))
            for table, cols in (
                ("checkpoint_blobs", "checkpoint_ns, channel, version, type, blob"),
                ("checkpoint_writes", "checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob"),
            ):
                await db.execute(f"INSERT INTO {table} (thread_id, {cols}) SELECT %s, {cols} FROM {table} "
                                 "WHERE thread_id = %s ON CONFLICT DO NOTHING", (target_thread_id, source_thread_id))

    async def prune_checkpoints(self, thread_id: str, strategy: Literal["delete", "keep_latest"]) -> None:
        await self.checkpointer.aprune([thread_id], strategy=strategy)

    # --- protocol events ---------------------------------------------------------
    async def append_thread_events(self, thread_id: str, run_id: str | None,
                                   events: list[NewThreadEvent]) -> list[int]:
        if not events:
            return []
        async with self._tx() as db:
            # The upsert locks the thread's counter row until commit: a concurrent appender on the same
            # thread waits here, then takes the numbers after ours, so seqs also commit in order.
            cur = await db.execute(
                "INSERT INTO thread_event_counters AS c (thread_id, last_seq) VALUES (%s, %s) "
                "ON CONFLICT (thread_id) DO UPDATE SET last_seq = c.last_seq + EXCLUDED.last_seq "
                "RETURNING last_seq", (thread_id, len(events)))
            last = int((await cur.fetchone())["last_seq"])
            first = last - len(events) + 1
            async with db.cursor() as many:
                await many.executemany(
                    "INSERT INTO thread_events (thread_id, seq, run_id, method, channel, namespace, params) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    [(thread_id, first + i, run_id, e.method, e.channel, e.namespace, e.params)
                     for i, e in enumerate(events)])
            if last > THREAD_EVENTS_KEPT:
                await db.execute("DELETE FROM thread_events WHERE thread_id = %s AND seq <= %s",
                                 (thread_id, last - THREAD_EVENTS_KEPT))
        return list(range(first, last + 1))

    async def read_thread_events(self, thread_id: str, *, after: int = 0, limit: int = 500,
                                 run_id: str | None = None, method: str | None = None) -> list[Row]:
        return await self._fetchall(*thread_events_select("%s", thread_id, after, limit, run_id, method))

    async def thread_event_bounds(self, thread_id: str) -> tuple[int, int]:
        return event_bounds(await self._fetchone(thread_event_bounds_select("%s"), (thread_id,)))

    # --- crons (statements: storage/crons.py) ---------------------------------------
    async def create_cron(self, row: Row) -> Row:
        try:
            async with self._tx() as db:
                if row.get("thread_id") is not None and await _one(
                        db, _CRONS.sql("thread_exists"), (row["thread_id"],)) is None:
                    raise NotFound(f"Thread with ID {row['thread_id']} not found")
                created = await _one(db, _CRONS.sql("insert"), _CRONS.params(row))
        except psycopg.errors.ForeignKeyViolation as exc:  # its assistant or thread was deleted meanwhile
            raise NotFound(f"The cron's assistant {row['assistant_id']} or thread {row['thread_id']} is gone") \
                from exc
        assert created is not None
        return cron_row(created)

    async def get_cron(self, cron_id: str) -> Row | None:
        found = await self._fetchone(_CRONS.sql("get"), (cron_id,))
        return cron_row(found) if found else None

    async def update_cron(self, cron_id: str, change: Callable[[Row], Row]) -> Row | None:
        async with self._tx() as db:
            current = await _one(db, _CRONS.sql("get_for_update"), (cron_id,))
            if current is None:
                return None
            columns = change(cron_row(current))
            if not columns:
                return cron_row(current)
            updated = await _one(db, _CRONS.update(list(columns)),
                                 [*(_CRONS.value(c, v) for c, v in columns.items()), cron_id])
        return cron_row(updated) if updated is not None else None

    async def delete_cron(self, cron_id: str) -> bool:
        return await self._cron_write(_CRONS.sql("delete"), (cron_id,))

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
        return await self._cron_write(_CRONS.sql("claim"), (until, cron_id, tick, now))

    async def advance_cron(self, cron_id: str, tick: str, next_run_date: str | None) -> bool:
        return await self._cron_write(_CRONS.sql("advance"), (next_run_date, cron_id, tick))

    async def release_cron_tick(self, cron_id: str, tick: str) -> None:
        await self._cron_write(_CRONS.sql("release"), (cron_id, tick))

    async def _cron_write(self, sql: str, params: tuple) -> bool:
        """One statement, its own transaction: whether it changed a row."""
        async with self._pool.connection() as db:
            return (await db.execute(sql, params)).rowcount > 0


async def _apply_migrations(conn: psycopg.AsyncConnection) -> list[str]:
    await conn.execute(MIGRATIONS_TABLE)
    cur = await conn.execute("SELECT name FROM threadline_migrations")
    applied = []
    for name, script in pending_migrations("postgres", {r["name"] for r in await cur.fetchall()}):
        async with conn.transaction():  # the migration and its record commit together, or not at all
            await conn.execute(script, prepare=False)  # type: ignore[arg-type]
            await conn.execute("INSERT INTO threadline_migrations (name, applied_at) VALUES (%s, %s)",
                               (name, now_iso()))
        applied.append(name)
    return applied


async def _delete_threads(db: psycopg.AsyncConnection, thread_ids: list[str], *, keep_runs: bool) -> int:
    """Delete the threads' rows (not their checkpoints) inside the caller's transaction; return how many."""
    if not thread_ids:
        return 0
    tables = ("thread_events", "thread_event_counters") if keep_runs else ("runs", "thread_events",
                                                                          "thread_event_counters")
    for table in tables:
        await db.execute(f"DELETE FROM {table} WHERE thread_id = ANY(%s)", (thread_ids,))
    cur = await db.execute("DELETE FROM threads WHERE thread_id = ANY(%s)", (thread_ids,))
    return cur.rowcount


async def _has_pgvector(pool: AsyncConnectionPool) -> bool:
    """pgvector is installed, or available and this role may install it (LangGraph's store setup will).

    "Available" alone is not enough: on managed databases a role often may not CREATE EXTENSION, and then
    the exact scan is the way, not a failed start.
    """
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT (SELECT 1 FROM pg_extension WHERE extname = 'vector') AS installed, "
                                 "(SELECT 1 FROM pg_available_extensions WHERE name = 'vector') AS available")
        found = await cur.fetchone()
        if found["installed"]:
            return True
        if not found["available"]:
            return False
        try:
            async with conn.transaction():
                await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.Error as exc:
            log.warning("pgvector is available but cannot be installed by this role (%s): semantic search "
                        "uses an exact scan", exc)
            return False
        return True


async def _reconcile_thread(db: psycopg.AsyncConnection, changes: Row, *, thread_id: str | None = None,
                            run_id: str | None = None, only_if_busy: bool = False) -> None:
    """A thread is busy while it has an active run; otherwise it takes the status the finisher computed
    (`changes["status"]`, else idle; with `only_if_busy` and no status given, only a busy thread changes).

    The thread is named by its id, or by one of its runs (`run_id`). The status is decided in SQL, so no
    result is waited for here: a finish pipelines these statements behind its run's own update. The thread
    row is locked first, as `enqueue_run` locks it: a run enqueued concurrently is then either seen by the
    UPDATE, a statement of its own that starts after the lock is held (the thread stays busy), or enqueued
    after us (and marks the thread busy itself).
    """
    target, key = ("%s", thread_id) if run_id is None else ("(SELECT thread_id FROM runs WHERE run_id = %s)", run_id)
    await db.execute(f"SELECT 1 FROM threads WHERE thread_id = {target} FOR UPDATE", (key,))
    active = f"EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = threads.thread_id AND r.{_ACTIVE})"
    status = changes.get("status")
    changes = {k: v for k, v in changes.items() if k != "status"} | {"updated_at": now_iso()}
    only_busy = f" AND (status = 'busy' OR {active})" if only_if_busy and status is None else ""
    await db.execute(
        f"UPDATE threads SET {''.join(f'{_q(k)} = %s, ' for k in changes)}"
        f"status = CASE WHEN {active} THEN 'busy' ELSE %s END WHERE thread_id = {target}{only_busy}",
        [*(_param(k, v) for k, v in changes.items()), status or "idle", key])


async def _one(db: psycopg.AsyncConnection, sql: str, params: tuple | list = ()) -> Row | None:
    cur = await db.execute(sql, params)
    found = await cur.fetchone()
    return _row(found) if found is not None else None


async def _insert(db: psycopg.AsyncConnection, table: str, row: Row, *, on_conflict: str | None = None,
                  returning: bool = False, lease: tuple[str, float] | None = None) -> psycopg.AsyncCursor:
    """`lease=(column, seconds)`: that column is set to the database's `now()` plus `seconds`."""
    cols = [c for c in row if lease is None or c != lease[0]]
    marks = ["%s" for _ in cols]
    params = [_param(c, row[c]) for c in cols]
    if lease is not None:
        cols.append(lease[0])
        marks.append("now() + make_interval(secs => %s)")
        params.append(lease[1])
    sql = (f"INSERT INTO {table} ({', '.join(_q(c) for c in cols)}) VALUES ({', '.join(marks)})"
           + (f" ON CONFLICT {on_conflict}" if on_conflict else "") + (" RETURNING *" if returning else ""))
    return await db.execute(sql, params)


def _where(clauses: list[tuple[str, list]], *, metadata: dict | None = None,
           values: dict | None = None, filters: dict | None = None) -> tuple[str, list]:
    """AND together clauses, plus top-level key equality on the JSON columns `metadata` and `values`, plus an
    authorization filter on `metadata` (`sql.filter_terms`)."""
    parts = [c for c, _ in clauses]
    params = [p for _, ps in clauses for p in ps]
    for column, wanted in (("metadata", metadata), ("values", values)):
        for key, value in (wanted or {}).items():
            parts.append(f'("{column}" -> %s) = %s')
            params += [key, Jsonb(value)]
    for key, op, value in filter_terms(filters):
        if op == "$eq":
            parts.append('("metadata" -> %s) = %s')
            params += [key, Jsonb(value)]
        else:  # $contains: the key's list holds each value
            parts.append("""(jsonb_typeof("metadata" -> %s) = 'array' AND ("metadata" -> %s) @> %s)""")
            params += [key, key, Jsonb(value)]
    return ("WHERE " + " AND ".join(parts) if parts else ""), params


def _q(col: str) -> str:
    return f'"{col}"'


def _json(value: Any) -> Any:
    return Jsonb(value) if value is not None else None


def _param(col: str, value: Any) -> Any:
    return Jsonb(value) if col in JSON_COLUMNS and value is not None else value


def _row(r: Any) -> Row:
    out = dict(r)
    for key, value in out.items():
        if isinstance(value, datetime):
            out[key] = value.astimezone(timezone.utc).isoformat(timespec="microseconds")
    return out


def _order(sort_by: str, sort_order: SortOrder, allowed: set[str], default: str, key: str) -> str:
    col = sort_by if sort_by in allowed else default
    direction = "ASC" if sort_order == "asc" else "DESC"
    return f"{_q(col)} {direction}, {_q(key)} {direction}"


def _like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")



# --- crons ---------------------------------------------------------------------------------------
_CRONS = Dialect(mark="%s", true="TRUE", for_update=" FOR UPDATE", encode_json=Jsonb, metadata_key=str,
                 metadata_match="(metadata -> {p}) = {p}")
