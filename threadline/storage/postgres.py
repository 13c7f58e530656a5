"""Scale-out storage: PostgreSQL through a psycopg pool, LangGraph's Postgres saver and store.

Any number of processes share one database. The runs table is the queue: a claim takes the oldest
available run with `FOR UPDATE SKIP LOCKED`, and a unique index makes "one running run per thread" a
fact the database enforces, whatever two claims race with. Time comes from the database clock, so the
leases of workers on different machines are compared on one clock.

Only the connections live here: the pool (errors translated at its edge, connections checked at checkout) and
the pipelined transaction that awaits each script (`scripts.py`). The statements are `statements.py`'s, the
rules `rules.py`'s, the methods `sqlstorage.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, cast

import psycopg
import psycopg.types.json
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from threadline.errors import ConfigError, StorageUnavailable
from threadline.pgcompression import compress_with_lz4
from threadline.pgpool import check_at_checkout
from threadline.settings import redact_url
from threadline.storage.base import Row
from threadline.storage.records import RunRecord
from threadline.storage.scripts import Final, Q, QuotaRefused, RunRefused, Script, T, ThreadRefused, Undo
from threadline.storage.sql import MIGRATIONS_TABLE, loads, now_iso, pending_migrations
from threadline.storage.sqlstorage import SQLStorage
from threadline.storage.statements import POSTGRES

if TYPE_CHECKING:
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from langgraph.store.postgres import AsyncPostgresStore

    from threadline.storage.postgres_saver import InlinePostgresSaver

log = logging.getLogger("threadline.storage")
_Conn = psycopg.AsyncConnection[DictRow]

_MIGRATION_LOCK = 7_345_112_907  # pg_advisory_lock key: one process migrates at a time
#: An `options` string that already sets the idle-in-transaction timeout (`-c name=…`, `--name=…`, `-` for `_`).
_SETS_IDLE_TIMEOUT = re.compile(r"idle[-_]in[-_]transaction[-_]session[-_]timeout\s*=", re.IGNORECASE)


def application_name(url: str) -> dict[str, str]:
    """The name our sessions show in `pg_stat_activity` ("threadline"), unless the URL names them: the lease
    sweeper finds this deployment's stalled sessions by it (`Storage.end_stalled_sessions`)."""
    return {} if conninfo_to_dict(url).get("application_name") else {"application_name": "threadline"}


def session_options(url: str, idle_in_transaction_ms: int) -> str:
    """The `options` our pooled connections start with: the operator's own (the URL's `options`, else
    `PGOPTIONS`, which an `options` keyword would otherwise replace), plus our idle-in-transaction timeout
    unless theirs already sets one: the operator's value wins."""
    try:
        given = conninfo_to_dict(url).get("options")
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"database_url is not a PostgreSQL connection string: {exc}") from None
    given = str(given if given is not None else os.environ.get("PGOPTIONS", "")).strip()
    if _SETS_IDLE_TIMEOUT.search(given):
        return given
    return f"{given} -c idle_in_transaction_session_timeout={idle_in_transaction_ms}".strip()


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """The backend's edge: a connection lost (the server restarted, an administrator terminated it, the
    network dropped), none to be had in time, or a transient refusal (a deadlock, a serialization failure, a
    statement timeout: psycopg's `OperationalError` family) becomes `StorageUnavailable`, whose message names
    no driver. Anything else (a constraint the code expects, a bug) passes through as it is."""
    try:
        yield
    # The server ending a session left idle in a transaction (see `idle_in_transaction_ms`) is psycopg's
    # InternalError by its SQLSTATE class, but to us it is a connection lost like any other.
    except (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout) as exc:
        log.warning("database unavailable: %s: %s", type(exc).__name__, str(exc).strip())
        raise StorageUnavailable(f"The database is unavailable ({_reason(exc)}). Retry shortly.") from exc


def _reason(exc: psycopg.Error) -> str:
    if isinstance(exc, PoolTimeout):
        return "no connection free in time"
    if isinstance(exc, (psycopg.errors.AdminShutdown, psycopg.errors.CannotConnectNow,
                        psycopg.errors.IdleInTransactionSessionTimeout)) or exc.sqlstate is None:
        return "connection lost"  # no SQLSTATE: the client side found the connection gone
    return "transient failure"


#: What `threadline_check_quota` (migration 0009) raises when a run would pass a cap on active runs.
QUOTA_SQLSTATE = "TL429"
#: What `threadline_enqueue_run` (migration 0012) raises: no such thread; `reject` and an active run.
NO_THREAD_SQLSTATE, THREAD_BUSY_SQLSTATE = "TL404", "TL409"
#: What `threadline_finish_run` (migration 0015) raises: the run was not the caller's to end.
RUN_REFUSED_SQLSTATE = "TL410"


class _Pool(AsyncConnectionPool[_Conn]):
    """The psycopg pool, whose connections translate driver errors at the edge (see `_translated`). LangGraph's
    saver and store take their connections from it too, so the checkpoints of a run are translated as well."""

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[_Conn]:
        with _translated():
            async with super().connection(timeout) as conn:
                yield conn


class PostgresStorage(SQLStorage):
    """Storage in one PostgreSQL database, shared by every API and worker process."""

    #: Longest a request waits for a pooled connection (all busy, or the database down) before its 503.
    checkout_seconds = 10.0
    dialect = POSTGRES
    #: `threadline_enqueue_run` (migration 0012): an enqueue is one statement and one round trip.
    enqueues_at_once = True

    def __init__(self, url: str, pool: _Pool, checkpointer: InlinePostgresSaver, store: AsyncPostgresStore,
                 vector_index: str | None, reads: _Pool | None = None) -> None:
        self.url = url
        self._pool = pool
        self._reads = reads or pool
        # Reads take a turn before a connection, so that at most as many as the read pool holds ever ask it: a
        # pool with many callers waiting hands each returned connection over through its lock, behind them,
        # and a connection PostgreSQL is done with stays checked out meanwhile (see `_read_turn`).
        self._read_turns = asyncio.Semaphore(self._reads.max_size)
        self.checkpointer: InlinePostgresSaver = checkpointer
        self.store: AsyncPostgresStore = store
        # vector_search: semantic search works once store.index is set (pgvector, or else an exact scan);
        # vector_index: how the configured store.index searches, "pgvector" or "exact_scan" (None: no index).
        self.capabilities = {"vector_search": True, "vector_index": vector_index, "ttl": True,
                             "multi_process": True}

    # A process that stops inside a transaction (SIGSTOP, a VM frozen, a GC pause) keeps its row locks while
    # its connection lives: the sweeper's `FOR UPDATE SKIP LOCKED` would then skip its run for ever, and
    # the run would stay `running` after its lease lapsed. The server ends such a session after this long
    # idle inside a transaction (ours last milliseconds), and the stalled process finds its connection gone.
    idle_in_transaction_ms = 10_000
    #: Connections kept for reads (`_read`: thread, run, assistant reads and searches, `/ok?check_db`). Writes
    #: may all wait at once (a burst of run enqueues, each waiting on its thread's row lock or the database)
    #: holding every connection of the main pool; a read must not wait behind them for a connection.
    read_pool_size = 4

    @classmethod
    async def open(cls, url: str, *, store_index: dict[str, Any] | None = None, store_ttl: dict[str, Any] | None = None,
                   pool_size: int = 10, serde: SerializerProtocol | None = None,
                   caps_active_runs: bool = False, checkpoint_cache_bytes: int = 0) -> PostgresStorage:
        from threadline.storage.blob_cache import BlobCache
        from threadline.storage.postgres_saver import InlinePostgresSaver
        from threadline.storage.vectors import postgres_store

        def new_pool(size: int) -> _Pool:
            return _Pool(url, min_size=1, max_size=size, open=False, check=check_at_checkout,
                         timeout=cls.checkout_seconds, configure=_configure,
                         kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row,
                                 "options": session_options(url, cls.idle_in_transaction_ms),
                                 **application_name(url)})

        pool, reads = new_pool(pool_size), new_pool(min(cls.read_pool_size, pool_size))
        try:
            await pool.open(wait=True, timeout=15)
            await reads.open(wait=True, timeout=15)
        except Exception as exc:
            await pool.close()
            await reads.close()
            raise ConfigError(f"cannot connect to PostgreSQL at {redact_url(url)}: {exc}") from exc
        try:
            vector = await _has_pgvector(pool)
            saver = InlinePostgresSaver(pool, serde=serde)
            if checkpoint_cache_bytes > 0:
                saver.blob_cache = BlobCache(checkpoint_cache_bytes)
            store, vector_index = postgres_store(pool, index=store_index, ttl=store_ttl, pgvector=vector)
            self = cls(url, pool, saver, store, vector_index, reads)
            self.applied_migrations = await self.migrate(adopt_quota_runs=caps_active_runs)
            if store_ttl and store_ttl.get("sweep_interval_minutes"):
                await store.start_ttl_sweeper()
        except BaseException:
            await pool.close()
            await reads.close()
            raise
        return self

    async def migrate(self, *, adopt_quota_runs: bool = False) -> list[str]:
        """Our numbered migrations, then LangGraph's saver and store setup, one process at a time.
        `adopt_quota_runs` (a process that enqueues under a cap): the active runs that hold no quota slots
        (enqueued with no cap) take theirs, so the cap counts them. Without a cap nothing reads the slots, and a
        start skips the walk over every active run."""
        async with self._pool.connection() as conn:
            # Try, don't wait, for the lock: a session blocked in pg_advisory_lock() is an open
            # transaction, and the CREATE INDEX CONCURRENTLY in LangGraph's setup waits for every open
            # transaction, so the holder and the waiter would wait for each other.
            # ASYNC110 does not apply: another process holds the lock, so there is no event here to wait on.
            while not await _fetch_ok(conn, "SELECT pg_try_advisory_lock(%s) AS ok", _MIGRATION_LOCK):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            try:
                applied = await _apply_migrations(conn)
                if adopt_quota_runs:
                    await conn.execute("SELECT threadline_adopt_quota_runs()")
                await self.checkpointer.setup()
                await self.store.setup()
                await compress_with_lz4(conn, _LZ4_COLUMNS, log)
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
        return applied

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.store.stop_ttl_sweeper(timeout=1)
        await self._pool.close()
        await self._reads.close()

    async def ping(self) -> None:
        await self._read("SELECT 1 AS ok", {})  # StorageUnavailable when it cannot answer

    # --- the driver ----------------------------------------------------------
    async def _transact(self, script: Callable[..., Script[T]], *args: Any, heavy: bool = False,
                        idempotent: bool = False) -> T:
        """One transaction in psycopg's pipeline mode: the statements of a step are sent together and their
        results waited for only where the script reads them, so a step costs one round trip (and statements
        whose results decide nothing ride along with the next). An `idempotent` script whose connection was
        lost under it runs again, once, on a fresh connection, as a read does (`_read`)."""
        for last in (not idempotent, True):
            try:
                return await self._transact_once(script, *args)
            except StorageUnavailable as exc:
                if last or isinstance(exc.__cause__, PoolTimeout):
                    raise
        raise AssertionError("unreachable")

    async def _transact_once(self, script: Callable[..., Script[T]], *args: Any) -> T:
        steps = script(POSTGRES, *args)
        try:
            step = next(steps)
        except StopIteration as stop:
            return cast(T, stop.value)
        except Undo as undo:
            return cast(T, undo.value)
        if isinstance(step, Final):
            if isinstance(step.step, Q):
                return await self._one_statement(steps, step.step)
            return await self._one_flush(steps, step.step)
        try:
            async with self._pool.connection() as conn, conn.pipeline():
                final: Final | None = None
                try:
                    async with conn.transaction():
                        try:
                            while not isinstance(step, Final):
                                if isinstance(step, Q):
                                    step = steps.send((await _execute(conn, [step]))[0])
                                else:
                                    step = steps.send(await _execute(conn, step))
                        except StopIteration as stop:
                            return cast(T, stop.value)
                        # The last statements go with the COMMIT, which the block's end sends: one round trip.
                        final = step
                        qs = [final.step] if isinstance(final.step, Q) else list(final.step)
                        sent = await _send(conn, qs)
                except psycopg.Error as exc:
                    if final is None:
                        raise
                    steps.throw(_refused(exc))  # the script words a refusal, or lets the error through
                    raise
                rows = await _fetch(qs, sent)
                try:
                    steps.send(rows[0] if isinstance(final.step, Q) else rows)
                except StopIteration as stop:
                    return cast(T, stop.value)
                raise AssertionError(f"{script.__name__}: a script returns after its final step")
        except Undo as undo:
            return cast(T, undo.value)

    async def _one_statement(self, steps: Script[T], q: Q) -> T:
        """A script that is one statement (its first step a `Final` of one `Q`: the enqueue,
        `threadline_enqueue_run`): the statement is its own transaction, sent alone in autocommit, so it costs
        one round trip and no BEGIN, COMMIT or pipeline of its own."""
        try:
            async with self._pool.connection() as conn:
                try:
                    cur = await conn.execute(q.sql, POSTGRES.params(q.params))
                    rows = [_row(r) for r in await cur.fetchall()] if q.wait else None
                except psycopg.Error as exc:
                    steps.throw(_refused(exc))  # the script words a refusal, or lets the error through
                    raise
            return _last_step(steps, rows)
        except Undo as undo:
            return cast(T, undo.value)

    async def _one_flush(self, steps: Script[T], qs: tuple[Q, ...]) -> T:
        """A script that is one step of several statements (`finish_run`): sent in a pipeline with no BEGIN,
        they are one implicit transaction, which the pipeline's one Sync (at its end) commits, or rolls back
        whole on an error: one round trip, where `conn.transaction()` costs three (its BEGIN, and the COMMIT
        and the pipeline's end are each synced)."""
        try:
            async with self._pool.connection() as conn:
                try:
                    async with conn.pipeline():
                        sent = await _send(conn, qs)
                except psycopg.Error as exc:
                    steps.throw(_refused(exc))  # the script words a refusal, or lets the error through
                    raise
                rows = await _fetch(qs, sent)  # the results arrived with the Sync
            return _last_step(steps, rows)
        except Undo as undo:
            return cast(T, undo.value)

    async def _read(self, sql: str, params: dict[str, Any], *, point: bool = False) -> list[Row]:
        """A read; one whose connection was lost under it is read again, once, on a fresh connection (the
        pool replaces a broken one), so a database restart costs a read its retry, not the client a 503."""
        bound = POSTGRES.params(params)
        async with self._read_turn():
            for last in (False, True):
                try:
                    async with self._reads.connection() as conn:
                        cur = await conn.execute(sql, bound)
                        return [_row(r) for r in await cur.fetchall()]
                except StorageUnavailable as exc:
                    if last or isinstance(exc.__cause__, PoolTimeout):
                        raise
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def _read_turn(self) -> AsyncIterator[None]:
        """A turn to read, waited for at most `checkout_seconds` (then 503, as a pool's checkout). Under a burst
        of reads (bench/load.py: 100 clients per API process), psycopg_pool queued every caller on its lock and
        each returned connection waited there behind the callers before it went back to the pool: reads held
        their connections 150 ms on average for sub-millisecond lookups, while PostgreSQL sat idle. Waiting
        here instead, a connection goes back as soon as its read is done."""
        try:
            async with asyncio.timeout(self.checkout_seconds):
                await self._read_turns.acquire()
        except TimeoutError:
            raise StorageUnavailable("The database is unavailable (no connection free in time). Retry shortly."
                                     ) from None
        try:
            yield
        finally:
            self._read_turns.release()

    # --- what only this backend does ---------------------------------------------
    async def claim_runs(self, worker_id: str, lease_seconds: float, deadline_seconds: float = 0.0, *,
                         limit: int = 1) -> list[RunRecord]:
        since = time.monotonic()
        try:
            # One statement is its own transaction: no BEGIN/COMMIT round trips on the hottest path.
            async with self._pool.connection() as db:
                cur = await db.execute(POSTGRES.statement("claim_runs"), {
                    "worker_id": worker_id, "lease_seconds": lease_seconds, "deadline_seconds": deadline_seconds,
                    "limit": limit})
                found = await cur.fetchall()
        except psycopg.errors.UniqueViolation:
            return []  # another worker just started a run of one of those threads; the next claim moves on
        claimed = sorted((cast("RunRecord", _row(r)) for r in found), key=lambda r: r["seq"])
        for run in claimed:
            self._remember_deadline(run, deadline_seconds, since)
        return claimed

    async def prune_checkpoints(self, thread_id: str, strategy: Literal["delete", "keep_latest"]) -> None:
        await self.checkpointer.aprune([thread_id], strategy=strategy)

    async def delete_thread(self, thread_id: str) -> bool:
        deleted = await super().delete_thread(thread_id)
        if self.checkpointer.blob_cache is not None:  # its blobs are gone: the memory is better spent on others
            self.checkpointer.blob_cache.forget_thread(thread_id)
        return deleted


def _refused(exc: psycopg.Error) -> BaseException:
    """`check_quota`'s refusal (SQLSTATE TL429, the counts in its detail) as `QuotaRefused`, `enqueue_run`'s as
    `ThreadRefused`, `finish_run`'s as `RunRefused`; else `exc`."""
    if exc.sqlstate == RUN_REFUSED_SQLSTATE:
        return RunRefused()
    if exc.sqlstate in (NO_THREAD_SQLSTATE, THREAD_BUSY_SQLSTATE):
        return ThreadRefused(busy=exc.sqlstate == THREAD_BUSY_SQLSTATE)
    if exc.sqlstate != QUOTA_SQLSTATE:
        return exc
    mine, total = (int(n) for n in (exc.diag.message_detail or "0 0").split())
    return QuotaRefused(mine, total)


async def _execute(conn: _Conn, qs: Sequence[Q]) -> list[list[Row] | None]:
    """Send the statements, then fetch the rows of those waited for."""
    return await _fetch(qs, await _send(conn, qs))


async def _send(conn: _Conn, qs: Sequence[Q]) -> list[psycopg.AsyncCursor[DictRow] | None]:
    sent: list[psycopg.AsyncCursor[DictRow] | None] = []
    for q in qs:
        if q.many:
            async with conn.cursor() as many:
                await many.executemany(q.sql, [POSTGRES.params(p) for p in q.params])
            sent.append(None)
        else:
            sent.append(await conn.execute(q.sql, POSTGRES.params(q.params)))
    return sent


async def _fetch(qs: Sequence[Q], sent: Sequence[psycopg.AsyncCursor[DictRow] | None]) -> list[list[Row] | None]:
    return [[_row(r) for r in await cur.fetchall()] if q.wait and cur is not None else None
            for q, cur in zip(qs, sent, strict=True)]


def _last_step(steps: Script[T], rows: Any) -> T:
    """Send a script the rows of its final step; what it returns (an `Undo` it raises goes to the caller)."""
    try:
        steps.send(rows)
    except StopIteration as stop:
        return cast(T, stop.value)
    raise AssertionError("a script returns after its final step")


async def _fetch_ok(conn: _Conn, sql: str, *params: Any) -> bool:
    found = await (await conn.execute(sql, params)).fetchone()
    return bool(found and found["ok"])


#: The large columns compressed with lz4 (`threadline.pgcompression`), after every migration and LangGraph's
#: setup: a thread's values and a run's output (migrations 0014 and 0016 set them; 0019 changed their type,
#: which drops the setting) and LangGraph's columns that hold a checkpoint's channel values and a task's
#: writes (msgpack in bytea; a long conversation's messages: 1 MB, written again by every step that adds one),
#: whose tables its setup makes after our migrations.
_LZ4_COLUMNS = (("threads", "values"), ("runs", "output"), ("checkpoint_blobs", "blob"),
                ("checkpoint_writes", "blob"))


async def _apply_migrations(conn: _Conn) -> list[str]:
    await conn.execute(MIGRATIONS_TABLE)
    cur = await conn.execute("SELECT name FROM threadline_migrations")
    applied = []
    for name, script in pending_migrations("postgres", {r["name"] for r in await cur.fetchall()}):
        async with conn.transaction():  # the migration and its record commit together, or not at all
            await conn.execute(script, prepare=False)
            await conn.execute("INSERT INTO threadline_migrations (name, applied_at) VALUES (%s, %s)",
                               (name, now_iso()))
        applied.append(name)
    return applied


async def _has_pgvector(pool: _Pool) -> bool:
    """pgvector is installed, or available and this role may install it (LangGraph's store setup will).

    "Available" alone is not enough: on managed databases a role often may not CREATE EXTENSION, and then
    the exact scan is the way, not a failed start.
    """
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT (SELECT 1 FROM pg_extension WHERE extname = 'vector') AS installed, "
                                 "(SELECT 1 FROM pg_available_extensions WHERE name = 'vector') AS available")
        found = await cur.fetchone() or {}
        if found.get("installed"):
            return True
        if not found.get("available"):
            return False
        try:
            async with conn.transaction():
                await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.Error as exc:
            log.warning("pgvector is available but cannot be installed by this role (%s): semantic search "
                        "uses an exact scan", exc)
            return False
        return True


def _json_int(text: str) -> int | float:
    """A JSON integer as jsonb gives it back. jsonb keeps numbers as `numeric` and writes a large float in full
    (`1e30` comes back as `1000000000000000000000000000000`): past 64 bits that is the float it was, since
    nothing downstream (orjson, SQLite) holds a larger integer, and one row must not break every answer with it."""
    value = int(text)
    return value if -(2**63) <= value < 2**63 else float(text)


#: One decoder for every jsonb value: `json.loads(..., parse_int=...)` builds a new one at each call, which was
#: half of parsing a small document (a history of 200 checkpoints reads 400 of them: their checkpoint and
#: metadata). orjson is faster still but reads an integer from 2**63 to 2**64 - 1 as an int, where jsonb has
#: written a float of that size in full: it would come back another type than the SQLite backend gives.
_JSON_DECODER = json.JSONDecoder(parse_int=_json_int)


def _loads(data: str | bytes) -> Any:
    """A jsonb value (every JSON column, and LangGraph's checkpoints and their metadata): as `json.loads`
    with `parse_int=_json_int` reads it (psycopg gives UTF-8 bytes), with one decoder made once."""
    return _JSON_DECODER.decode(data if isinstance(data, str) else data.decode("utf-8", "surrogatepass"))


class _TextJsonLoader(psycopg.types.json.JsonLoader):
    """The `json` type, which only `TEXT_JSON_COLUMNS` have (a thread's values and a run's output, migration
    0019): the text `dumps` wrote, kept as it was, read as SQLite reads its JSON columns (`sql.loads`)."""

    _loads = staticmethod(loads)


class _TextJsonBinaryLoader(psycopg.types.json.JsonBinaryLoader):
    """As `_TextJsonLoader`, in the binary format (which for `json` is the same text)."""

    _loads = staticmethod(loads)


async def _configure(conn: Any) -> None:
    psycopg.types.json.set_json_loads(_loads, conn)
    conn.adapters.register_loader("json", _TextJsonLoader)
    conn.adapters.register_loader("json", _TextJsonBinaryLoader)


def _row(r: Any) -> Row:
    out = dict(r)
    for key, value in out.items():
        if isinstance(value, datetime):
            out[key] = value.astimezone(UTC).isoformat(timespec="microseconds")
    return out
