"""The embedded default: one SQLite file (WAL), one writer, LangGraph's SQLite saver and store.

Only the connections live here: the writer (`sqlite_writer.py`: one connection, mostly used from the event loop,
group commit) steps each transaction's script (`scripts.py`) synchronously on its connection; reads use a
connection of their own. The statements are `statements.py`'s, the rules `rules.py`'s, the methods
`sqlstorage.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO, Any, Literal, cast

import aiosqlite
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.store.base import Op, Result, SearchOp
from langgraph.store.sqlite.aio import AsyncSqliteStore

from threadline.errors import ConfigError, StorageUnavailable
from threadline.storage.base import Row
from threadline.storage.records import RunRecord
from threadline.storage.scripts import Final, Q, Script, T, Undo
from threadline.storage.sql import JSON_COLUMNS, apply_migrations, dumps, iso_after, loads, now_iso
from threadline.storage.sqlite_saver import WriterSqliteSaver, delete_run_checkpoints, keep_latest_checkpoints
from threadline.storage.sqlite_writer import Writer, in_transaction, translated
from threadline.storage.sqlstorage import SQLStorage
from threadline.storage.statements import SQLITE, Encoded

log = logging.getLogger("threadline.storage")


class SQLiteStorage(SQLStorage):
    """Storage in one SQLite file. Our writes are serialized through one connection and a lock."""

    capabilities = {"vector_search": True, "ttl": True, "multi_process": False}
    dialect = SQLITE

    def __init__(self, url: str, conn: aiosqlite.Connection, read_conn: aiosqlite.Connection,
                 store_conn: aiosqlite.Connection, wal_conn: aiosqlite.Connection, store: AsyncSqliteStore,
                 file_lock: IO[bytes], serde: SerializerProtocol | None = None) -> None:
        self.url = url
        self._conn = conn
        # Reads use their own connection: on the writer's connection they would see another task's
        # transaction half done (a run already `success` while its thread is not yet updated).
        self._reader = read_conn
        self._file_lock = file_lock
        self._store_conn = store_conn
        self.store: AsyncSqliteStore = store
        self._wal_conn = wal_conn
        # Every writer of this process (our tables, LangGraph's checkpointer) uses one connection, mostly
        # from the event loop (sqlite_writer.py says why); the store keeps its own.
        self.writer = Writer(conn, wal_conn)
        self.checkpointer: WriterSqliteSaver = WriterSqliteSaver(self.writer, serde=serde)
        # One read at a time on the read connection: overlapping statements there would share one
        # snapshot, and a read could miss a write committed just before it.
        self._read_lock = asyncio.Lock()

    @classmethod
    async def open(cls, url: str, *, store_index: dict[str, Any] | None = None,
                   store_ttl: dict[str, Any] | None = None, serde: SerializerProtocol | None = None) -> SQLiteStorage:
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
                # The schema's ON DELETE CASCADE does the deletes it names (off by default in SQLite).
                await conn.execute("PRAGMA foreign_keys=ON")
                # Case folding beyond ASCII, as PostgreSQL's ILIKE folds (SQLite's own lower() is ASCII only).
                await conn.create_function("lower", 1, _lower, deterministic=True)
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
            self = cls(url, conn, read_conn, store_conn, wal_conn, store, lock, serde)
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
        for conn in (self._conn, self._reader, self._store_conn, self._wal_conn):
            with contextlib.suppress(Exception):
                await conn.close()
        self._file_lock.close()  # releases the lock

    async def ping(self) -> None:
        try:
            await self._read("SELECT 1 AS ok", {})
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a closed connection
            raise StorageUnavailable("The database is unavailable. Retry shortly.") from exc

    # --- the driver ----------------------------------------------------------
    async def _transact(self, script: Callable[..., Script[T]], *args: Any, heavy: bool = False,
                        idempotent: bool = False) -> T:
        """One transaction on the writer, on the event loop unless `heavy` (or the database is locked: see
        sqlite_writer.py), where the script is stepped again from its start. `idempotent` changes nothing
        here: the writer's connection is a file's, never lost under a script, and a locked database is
        already waited for."""
        try:
            result: T = await self.writer.run(in_transaction, _stepped, script, args, inline=not heavy)
        except Undo as undo:
            return cast(T, undo.value)
        return result

    async def _read(self, sql: str, params: dict[str, Any], *, point: bool = False) -> list[Row]:
        """A read; `point` (one row by key) on the event loop: microseconds, where a trip to the connection's
        thread costs hundreds (a WAL reader never waits for a writer)."""
        bound = _bind(params, now_iso())
        async with self._read_lock:
            with translated():
                if point:
                    rows = self._reader._conn.execute(sql, bound).fetchall()
                else:
                    rows = list(await self._reader.execute_fetchall(sql, bound))
        return [_row(r) for r in rows]

    # --- what only this backend does ---------------------------------------------
    def run_checkpointer(self, durability: str) -> Any:
        # `sync` commits each write before the next step; `async` and `exit` allow the group commit.
        return self.checkpointer if durability == "sync" else self.checkpointer.grouped()

    async def claim_runs(self, worker_id: str, lease_seconds: float, deadline_seconds: float = 0.0, *,
                         limit: int = 1) -> list[RunRecord]:
        since = time.monotonic()
        claimed: list[RunRecord] = await self.writer.run(_claim, worker_id, lease_seconds, deadline_seconds, limit)
        for run in claimed:
            self._remember_deadline(run, deadline_seconds, since)
        return claimed

    async def delete_checkpoints_for_run(self, thread_id: str, run_id: str) -> None:
        # Finds the run's checkpoints by their metadata (many rows), and walks the thread's others for the values
        # they still name: on the connection's thread.
        await self.writer.run(in_transaction, delete_run_checkpoints, self.checkpointer.serde, thread_id, run_id,
                              inline=False)

    async def prune_checkpoints(self, thread_id: str, strategy: Literal["delete", "keep_latest"]) -> None:
        if strategy == "delete":
            await self.checkpointer.adelete_thread(thread_id)
        else:
            await self.writer.run(in_transaction, keep_latest_checkpoints, self.checkpointer.serde, thread_id,
                                  inline=False)


def _stepped(db: sqlite3.Connection, script: Callable[..., Script[T]], args: tuple[Any, ...]) -> T:
    """Step `script` to its end on `db`, each statement at once; one timestamp for the whole transaction."""
    steps = script(SQLITE, *args)
    now = now_iso()
    try:
        step = next(steps)
        while True:
            # A final step is as any other: the writer commits after the script.
            qs = step.step if isinstance(step, Final) else step
            result = _execute(db, qs, now) if isinstance(qs, Q) else [_execute(db, s, now) for s in qs]
            step = steps.send(result)
    except StopIteration as stop:
        return cast(T, stop.value)


def _execute(db: sqlite3.Connection, q: Q, now: str) -> list[Row] | None:
    if q.many:
        db.executemany(q.sql, [_bind(p, now) for p in q.params])
        return None
    cur = db.execute(q.sql, _bind(q.params, now))
    rows = cur.fetchall() if cur.description else []
    cur.close()  # an UPDATE … RETURNING is only complete once its statement is done
    return [_row(r) for r in rows] if q.wait else None


def _bind(params: dict[str, Any], now: str) -> dict[str, Any]:
    """The dialect's parameters, with the transaction's `now` and a lease's or a deadline's end on the app clock."""
    bound: dict[str, Any] = {}
    for key, value in params.items():  # `SQLITE.params`, then text as plain `str`, in one pass (2-3 a statement)
        if key in JSON_COLUMNS or isinstance(value, dict):
            if value is not None and not isinstance(value, Encoded):
                value = dumps(value)
        elif isinstance(value, (list, tuple)):
            value = dumps(list(value))
        if isinstance(value, str) and type(value) is not str:
            value = str(value)
        bound[key] = value
    bound.setdefault("now", now)
    if bound.get("lease_seconds") is not None:
        bound["lease_at"] = iso_after(float(bound["lease_seconds"]))
    if bound.get("deadline_seconds") is not None:  # from the transaction's `now`, which it is measured against
        bound["deadline_at"] = (datetime.fromisoformat(now) + timedelta(seconds=float(bound["deadline_seconds"]))
                                ).isoformat(timespec="microseconds")
    return bound


def _claim(db: sqlite3.Connection, worker_id: str, lease_seconds: float, deadline_seconds: float,
           limit: int) -> list[RunRecord]:
    """Up to `limit` of the oldest claimable runs, claimed. The search is a plain read: an idle worker's claim
    usually finds nothing, and then takes no write lock. Every writer of `runs` uses this connection under the
    writer's lock, so what it found is still claimable when the transaction begins (the UPDATE checks it is
    still pending anyway)."""
    now = now_iso()
    params = {"worker_id": worker_id, "lease_seconds": lease_seconds, "deadline_seconds": deadline_seconds,
              "limit": limit}
    cur = db.execute(SQLITE.statement("next_claimable_run"), {"now": now})
    found = cur.fetchone()
    cur.close()
    if found is None:
        return []
    claimed = in_transaction(db, _execute, Q(SQLITE.statement("claim_runs"), params), now) or []
    return sorted(claimed, key=lambda r: r["seq"])


def _lower(text: Any) -> Any:
    return text.lower() if isinstance(text, str) else text


def _row(r: Any) -> Row:
    out = dict(r)
    for col in JSON_COLUMNS:
        if col in out and isinstance(out[col], str):
            out[col] = loads(out[col])
    return out


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
