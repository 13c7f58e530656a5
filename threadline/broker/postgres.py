"""The PostgreSQL broker: the semantics of `RedisBroker`, for deployments whose only service is PostgreSQL.

Each run's events are rows of an UNLOGGED table, numbered per run (`<ms>-<seq>`, the time never going
back within a run, so ids order as Redis Stream ids do), bounded by count and by the publishing process's
byte budgets (`threadline.broker.budget`), and forgotten `retain_seconds` after the run's end (`live_seconds`
after the last event of a run that never ends) by a sweep each process runs now and then.

Signals ride one NOTIFY channel, with small payloads (kind, sender, run id, a cancel's action; one
"stream changed" per batch sent names every run it appended to): each
process LISTENs on one dedicated connection and hands them to local waiters (`LocalSignals`), and a
subscriber waits for a "stream changed" notification, then reads the rows. NOTIFY only wakes: a
subscriber also looks again every `block_seconds`, idle workers poll storage, waiters re-check storage, a
cancel is also stored for its run, and after the listening connection dropped each process re-checks
everything it waits for. Names and SQL are in `threadline.broker.pgsql`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any

import psycopg
from limits.aio.storage import Storage
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from threadline.broker.base import Broker, StreamEvent, event_bytes
from threadline.broker.budget import ByteBudget
from threadline.broker.local import LocalSignals
from threadline.broker.outage import Outage, exchange
from threadline.broker.outbox import Item, Outbox
from threadline.broker.pgsql import PgNames
from threadline.broker.windows import PostgresWindows
from threadline.errors import Unavailable
from threadline.pgcompression import compress_with_lz4
from threadline.pgpool import check_at_checkout

log = logging.getLogger("threadline.broker")

_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, OSError)  # OSError: TimeoutError
#: Serializes the broker's CREATE TABLE IF NOT EXISTS across processes (two at once can collide).
_DDL_LOCK = 0x74686C62  # "thlb"
#: The class of the advisory locks that serialize the takes of one lease scope ("thll").
_LEASE_LOCK = 0x74686C6C

Cursor = tuple[int, int]  # (ms, seq) of an event id


_POOL_NAME = "threadline-broker"


class _PoolReconnects(logging.Filter):
    """psycopg_pool warns once per failed attempt of the broker's pool to reconnect (several a second while the
    database is away); the broker's outage record says it instead, once (broker/outage.py)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno < logging.ERROR and f"in '{_POOL_NAME}'" in record.getMessage())


def _quiet_pool_reconnects() -> None:
    pool_log = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, _PoolReconnects) for f in pool_log.filters):
        pool_log.addFilter(_PoolReconnects())


def _cursor(event_id: str) -> Cursor:
    """`event_id` as a cursor when it is one of ours (`<ms>-<seq>`), else (0, 0): replay everything kept."""
    ms, dash, seq = event_id.partition("-")
    if dash and all(p.isascii() and p.isdigit() and int(p) < 2**63 for p in (ms, seq)):
        return int(ms), int(seq)
    return 0, 0


class PostgresBroker(Broker):
    """Per-run rows of an UNLOGGED table for events; LISTEN/NOTIFY for wake-ups, run-done and cancel signals."""

    retain_seconds = 600
    live_seconds = 24 * 3600
    #: Longest a subscriber or the listener waits for a notification before looking again.
    block_seconds = 5.0
    #: How long a notified subscriber waits before it reads: what the publishers commit meanwhile comes in the
    #: same read (a read per notification per subscriber is most of the broker's cost per event on a long
    #: stream; SSE responses write at most every `stream_coalesce_ms` anyway).
    read_delay_seconds = 0.005
    command_seconds = 5.0
    #: How often each process forgets expired streams and cancels.
    sweep_seconds = 60.0
    batch_events = 500
    batch_bytes = 256 * 1024
    #: Most queued items (events, ends, signals) sent in one transaction.
    batch_items = 2000
    #: During an outage, at most one log line (a count of what failed) per this many seconds.
    outage_report_seconds = 30.0

    def __init__(self, url: str, *, buffer_events: int = 10_000, buffer_bytes: int = 8 << 20,
                 total_bytes: int = 256 << 20, key_prefix: str = "threadline", max_connections: int = 16,
                 outbox_bytes: int = 16 << 20, coalesce_seconds: float = 0.0) -> None:
        self._url = url
        self._names = PgNames(key_prefix)
        self._budget = ByteBudget(buffer_events, buffer_bytes, total_bytes, self.retain_seconds)
        self._id = uuid.uuid4().hex
        self._pool = AsyncConnectionPool(url, min_size=1, max_size=max_connections, open=False, name=_POOL_NAME,
                                         kwargs={"autocommit": True, "application_name": "threadline:broker"},
                                         check=check_at_checkout)
        _quiet_pool_reconnects()
        self._listener: psycopg.AsyncConnection[Any] | None = None
        self._listening: asyncio.Task[None] | None = None
        self._signals = LocalSignals()
        self._unchecked: set[str] = set()  # runs whose stored early cancel still has to be read
        self._changed: dict[str, asyncio.Event] = {}  # run → set when its stream changes (then replaced)
        self._watching: dict[str, int] = {}  # run → how many subscribers of this process follow it
        # One warning when the database goes away, a count while it stays away, one when it is back
        # (broker/outage.py); once it is back, the stream ends it lost are sent again.
        self.outage = Outage("PostgreSQL", log, report_seconds=self.outage_report_seconds,
                             on_end=lambda: self._outbox.resend_lost_ends())
        # What is waiting to be sent, in order, bounded by bytes (`threadline.broker.outbox`; see `_send_batch`).
        self._outbox = Outbox(self._send_batch, name="threadline-pg-posts", max_bytes=outbox_bytes,
                              outage=self.outage, batch_items=self.batch_items, coalesce=coalesce_seconds)
        self._swept_at = 0.0

    # Lifecycle.

    async def start(self) -> None:
        async with self._exchange(2 * self.command_seconds):
            await self._pool.open(wait=True, timeout=self.command_seconds)
            async with self._pool.connection() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_DDL_LOCK,))
                await conn.execute(self._names.ddl())
            # An event's data in lz4 (a `values` event of a large state is the whole state: 5-6 ms of the
            # database's CPU to store 1 MB with pglz, about 1 with lz4), set once, outside the DDL's lock.
            async with self._pool.connection() as conn:
                await compress_with_lz4(conn, [(self._names.events, "data")], log)
            self._listener = await self._listen_connection()
        self._listening = asyncio.create_task(self._listen(), name="threadline-pg-broker")

    async def ping(self) -> None:
        async with self._exchange(), self._pool.connection() as conn:
            await conn.execute("SELECT 1")

    async def close(self) -> None:
        await self._outbox.drain()  # what was queued is sent first
        if self._listening is not None:
            self._listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listening
            self._listening = None
        await self._drop_listener()
        with contextlib.suppress(*_ERRORS):
            await self._pool.close()

    def _exchange(self, extra_seconds: float = 0.0) -> contextlib.AbstractAsyncContextManager[None]:
        return exchange(self.outage, self.command_seconds + extra_seconds, _ERRORS,
                        unavailable="The database broker is unavailable", timeouts=(TimeoutError, PoolTimeout))

    async def _fetch(self, sql: str, params: dict[str, Any], *, binary: bool = False) -> list[tuple[Any, ...]]:
        """The rows of a statement. `binary`: sent in PostgreSQL's binary format, which events' `data` is read
        in: as text, a bytea is written out in hex, twice its size (for a 1 MB event 5-6 ms of the server's CPU and
        5 ms of ours, against 1.2 and 0.7)."""
        async with self._exchange(), self._pool.connection() as conn:
            cur = await conn.execute(sql, params, binary=binary)
            return await cur.fetchall()

    # Streams.

    async def publish(self, run_id: str, event: str, data: bytes) -> str:
        stored = asyncio.get_running_loop().create_future()
        await self._outbox.post(("event", run_id, (event, data, stored)))
        return await asyncio.shield(stored)

    async def post(self, run_id: str, event: str, data: bytes) -> None:
        await self._outbox.post(("event", run_id, (event, data, None)))

    async def end_stream(self, run_id: str) -> None:
        ended = asyncio.get_running_loop().create_future()
        self._outbox.put(("end", run_id, ended))
        await asyncio.shield(ended)

    async def _send_batch(self, batch: list[Item]) -> None:
        """Send a batch of the outbox in one transaction (pipelined). Whoever waits for an item (`publish`,
        `end_stream`) gets its outcome (a failure is the outbox's to hand out)."""
        waiting: list[tuple[_Ids | asyncio.Future[Any], Any]] = []  # (waiter, cursor whose rows say its id, or None)
        touched: set[str] = set()
        async with self._exchange(), self._pool.connection() as conn, conn.transaction():
            async with conn.pipeline():
                await self._send(conn, batch, waiting, touched)
            results = [(w, await r.fetchall() if r is not None else None) for w, r in waiting]
        for done_waiter, rows in results:
            if not done_waiter.done():
                done_waiter.set_result(rows)
        for run_id in touched:
            self._wake_run(run_id)

    async def _send(self, conn: Any, batch: list[Item],
                    waiting: list[tuple[_Ids | asyncio.Future[Any], Any]], touched: set[str]) -> None:
        """One transaction: nothing of it is seen before its commit (rows and notifications alike), so only
        each run's own order matters. Every run's events go in one statement, whatever was posted between them."""
        names = self._names
        groups: dict[str, list[tuple[str, bytes, asyncio.Future[str] | None]]] = {}
        ends: list[tuple[str, asyncio.Future[Any]]] = []
        for kind, name, value in batch:
            if kind == "event":
                groups.setdefault(name, []).append(value)
            elif kind == "end":
                ends.append((name, value))
        if groups:
            waiting.append(await self._append(conn, groups))
            touched.update(groups)
        for run_id, ended in ends:
            self._budget.ended(run_id)
            await conn.execute(names.end, {"run": run_id})
            waiting.append((ended, None))
            touched.add(run_id)
        for run_id, keep in self._budget.trims().items():  # within the count and the byte budgets
            await conn.execute(names.trim, {"run": run_id, "keep": keep})
        for kind, name, _ in batch:  # wake-ups, run-done: in the order sent
            if kind == "signal":
                await conn.execute(names.notify, {"channel": names.channel, "payload": name})
        for payload in _changed_notes(self._id, touched):  # one per batch, not one per run
            await conn.execute(names.notify, {"channel": names.channel, "payload": payload})

    async def _append(self, conn: Any, groups: dict[str, list[tuple[str, bytes, asyncio.Future[str] | None]]]
                      ) -> tuple[_Ids, Any]:
        """Every run's events of a batch in one statement (a statement per run cost PostgreSQL as much again)."""
        runs, counts, event_runs, idx, events, data, sizes = [], [], [], [], [], [], []
        for run_id, group in groups.items():
            runs.append(run_id)
            counts.append(len(group))
            for i, (event, payload, _) in enumerate(group, 1):
                size = event_bytes(event, payload)
                self._budget.added(run_id, size)
                event_runs.append(run_id)
                idx.append(i)
                events.append(event)
                data.append(payload)
                sizes.append(size)
        cur = await conn.execute(self._names.append, {
            "runs": runs, "counts": counts, "ms": _now_ms(), "event_runs": event_runs, "idx": idx,
            "events": events, "data": data, "sizes": sizes})
        return _Ids({run_id: [stored for _, _, stored in group] for run_id, group in groups.items()}), cur

    def queued_bytes(self) -> int:
        return self._outbox.held

    async def resume_gap(self, run_id: str, after: str) -> bool:
        rows = await self._fetch(self._names.stream, {"run": run_id})
        return bool(rows) and rows[0][1] > 0 and (rows[0][0], rows[0][1]) > _cursor(after)

    async def buffered_bytes(self, run_id: str) -> int:
        return int((await self._fetch(self._names.buffered_bytes, {"run": run_id}))[0][0])

    async def stream_started(self, run_id: str) -> bool:
        return bool(await self._fetch(self._names.newest, {"run": run_id}))

    async def subscribe_batches(self, run_id: str, *, after: str | None = None, replay: bool = False,
                                context: bool = False) -> AsyncIterator[list[StreamEvent]]:
        known = after is None  # whether the cursor is an event's id (not a client's, which could be any)
        if after is not None:
            cursor = _cursor(after)
        elif replay:
            cursor = (0, 0)
        else:
            newest = await self._fetch(self._names.newest, {"run": run_id})
            cursor = (newest[0][0], newest[0][1]) if newest else (0, 0)
        self._watching[run_id] = self._watching.get(run_id, 0) + 1
        try:
            if context and cursor != (0, 0):
                async for before in self._context(run_id, cursor):
                    yield before
            limit = self.batch_events
            while True:
                changed = self._changed.setdefault(run_id, asyncio.Event())  # before reading: none is missed
                rows = await self._fetch(self._names.read, {"run": run_id, "ms": cursor[0], "seq": cursor[1],
                                                            "floor": cursor[1] if known else 0, "limit": limit},
                                         binary=True)
                ended = bool(rows[0][0])
                batch = [row for row in rows if row[2] is not None]
                if batch:
                    size = sum(len(row[4]) for row in batch) // len(batch) + 1
                    limit = max(1, min(self.batch_events, self.batch_bytes // size))
                if batch:
                    cursor, known = (batch[-1][1], batch[-1][2]), True
                    yield [StreamEvent(f"{ms}-{seq}", event, bytes(data)) for _, ms, seq, event, data in batch]
                    continue
                if ended:
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.block_seconds):
                        await changed.wait()
                    await asyncio.sleep(self.read_delay_seconds)
        finally:
            self._watching[run_id] -= 1
            if not self._watching[run_id]:
                del self._watching[run_id]
                self._changed.pop(run_id, None)

    async def _context(self, run_id: str, cursor: Cursor) -> AsyncIterator[list[StreamEvent]]:
        start = 0
        while True:
            rows = await self._fetch(self._names.context, {"run": run_id, "ms": cursor[0], "seq": cursor[1],
                                                           "from": start, "limit": self.batch_events}, binary=True)
            if rows:
                start = rows[-1][1]
                yield [StreamEvent(f"{ms}-{seq}", event, bytes(data), context=True) for ms, seq, event, data in rows]
            if len(rows) < self.batch_events:
                return

    def _wake_run(self, run_id: str) -> None:
        changed = self._changed.pop(run_id, None)
        if changed is not None:
            changed.set()

    # Leases.

    async def take_lease(self, scope: str, limit: int, seconds: float) -> str | None:
        lease = uuid.uuid4().hex
        params = {"class": _LEASE_LOCK, "scope": scope, "lease": lease, "secs": seconds, "limit": limit}
        async with self._exchange(), self._pool.connection() as conn, conn.pipeline():
            async with conn.transaction():  # one round trip: the lock, then the count and the insert
                await conn.execute(self._names.lock_scope, params)
                cur = await conn.execute(self._names.take_lease, params)
            return lease if await cur.fetchall() else None

    async def renew_leases(self, leases: Mapping[str, Collection[str]], seconds: float) -> None:
        pairs = [(scope, lease) for scope, ids in leases.items() for lease in ids]
        if pairs:
            async with self._exchange(), self._pool.connection() as conn:
                await conn.execute(self._names.renew_leases, {"secs": seconds, "scopes": [s for s, _ in pairs],
                                                              "leases": [lease for _, lease in pairs]})

    async def drop_lease(self, scope: str, lease: str) -> None:
        async with self._exchange(), self._pool.connection() as conn:
            await conn.execute(self._names.drop_lease, {"scope": scope, "lease": lease})

    # Rate limits.

    @functools.cached_property
    def rate_counters(self) -> Storage:
        return PostgresWindows(self._window_query, self._names, self.ping)

    async def _window_query(self, statement: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        async with self._exchange(), self._pool.connection() as conn:
            cur = await conn.execute(statement, params)
            return await cur.fetchall() if cur.description is not None else []

    # Signals.

    async def wake_workers(self) -> None:
        await self._signals.wake()  # this process's claimer at once, without a round trip
        self._signal("w", "")

    async def wake_here(self) -> None:
        await self._signals.wake()

    async def wait_for_work(self, timeout: float) -> None:
        await self._signals.wait_for_work(timeout)

    async def notify_run_done(self, run_id: str) -> None:
        self._signals.done(run_id)
        self._signal("d", run_id)

    def listen_run_done(self, run_id: str) -> Any:
        return self._signals.listen_done(run_id)

    async def send_cancel(self, run_id: str, action: str) -> None:
        applied = self._signals.cancel(run_id, action)
        try:
            async with self._exchange(), self._pool.connection() as conn, conn.transaction():
                if not applied:  # kept for a worker between its claim and its registration
                    await conn.execute(self._names.store_cancel, {"run": run_id, "action": action})
                # "c": stored, so whoever takes it from the table applies it (exactly once, whichever of the
                # listener and a registration comes first); "C": not stored, applied by whoever has callbacks.
                kind = "C" if applied else "c"
                await conn.execute(self._names.notify, {"channel": self._names.channel,
                                                        "payload": f"{kind} {self._id} {run_id} {action}"})
        except Unavailable:
            if not applied:
                raise
            # cancelled here; the outage is logged and counted by `_exchange`

    async def on_cancel(self, run_id: str, callback: Any) -> Any:
        unregister = self._signals.register_cancel(run_id, callback)
        try:
            rows = await self._fetch(self._names.take_cancel, {"run": run_id})
        except Unavailable:  # counted by the outage; the listener retries once it listens again
            self._unchecked.add(run_id)
        else:
            if rows:
                callback(rows[0][0])
        return unregister

    def _signal(self, kind: str, run_id: str) -> None:
        """Queued with the posts, not waited for: a lost signal costs latency, never a stuck run."""
        self._outbox.put(("signal", f"{kind} {self._id} {run_id}", None))

    # The listener.

    async def _listen_connection(self) -> psycopg.AsyncConnection[Any]:
        """A connection LISTENing on our channel: once this returns, no signal sent afterwards is missed."""
        conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True, connect_timeout=5,
                                                     application_name=self._names.listener_name)
        try:
            await conn.execute(f'LISTEN "{self._names.channel}"')
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _drop_listener(self) -> None:
        conn, self._listener = self._listener, None
        if conn is not None:
            with contextlib.suppress(*_ERRORS, psycopg.Error):
                await conn.close()

    async def _listen(self) -> None:
        backoff = 0.1
        while True:
            try:
                if self._listener is None:
                    async with self._exchange():
                        self._listener = await self._listen_connection()
                    log.info("PostgreSQL broker: listening again; re-checking what may have been missed")
                    # Each is safe to repeat: a slot claims nothing, a waiter or subscriber re-checks.
                    await self._signals.wake()
                    self._signals.done_all()
                    for run_id in list(self._changed):
                        self._wake_run(run_id)
                    self._unchecked.update(self._signals.cancel_ids())
                    backoff = 0.1
                await self._housekeeping()
                async for note in self._listener.notifies(timeout=self.block_seconds):
                    await self._dispatch(note.payload)
            except (*_ERRORS, Unavailable) as exc:
                if not isinstance(exc, Unavailable):  # an Unavailable was counted by its exchange
                    self.outage.failed(exc)
                log.debug("PostgreSQL broker: listening failed (%s); listening again in %.1f s", exc, backoff)
                await self._drop_listener()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception:  # a cancel callback failed: the listener carries on
                log.exception("PostgreSQL broker: a signal could not be handled")

    async def _housekeeping(self) -> None:
        for run_id in list(self._unchecked):
            rows = []
            if self._signals.has_cancel(run_id):  # else it stays stored for the run's registration
                rows = await self._fetch(self._names.take_cancel, {"run": run_id})
            self._unchecked.discard(run_id)
            if rows:
                self._signals.cancel(run_id, rows[0][0])
        now = asyncio.get_running_loop().time()
        if now - self._swept_at >= self.sweep_seconds:
            self._swept_at = now
            async with self._exchange(), self._pool.connection() as conn:
                await conn.execute(self._names.sweep, {"retain": self.retain_seconds, "live": self.live_seconds})

    async def _dispatch(self, payload: str) -> None:
        kind, sender, run_id, action = (payload.split(" ", 3) + ["", "", ""])[:4]
        if sender == self._id:
            return  # applied here when it was sent
        if kind == "e":  # "e <sender> <run> <run>…": these runs' streams changed
            for changed in payload.split(" ")[2:]:
                self._wake_run(changed)
        elif kind == "w":
            await self._signals.wake()
        elif kind == "d":
            self._signals.done(run_id)
        elif kind == "c" and self._signals.has_cancel(run_id):
            if await self._fetch(self._names.take_cancel, {"run": run_id}):
                self._signals.cancel(run_id, action)
        elif kind == "C":
            self._signals.cancel(run_id, action)


#: Most bytes of one "stream changed" payload (NOTIFY takes less than 8,000).
_NOTE_BYTES = 4000


def _changed_notes(sender: str, runs: Collection[str]) -> list[str]:
    """The payloads saying that `runs`' streams changed: as few as fit (`e <sender> <run> <run>…`)."""
    notes: list[list[str]] = []
    size = _NOTE_BYTES
    for run_id in runs:
        if size + 1 + len(run_id.encode()) > _NOTE_BYTES:
            notes.append(["e", sender])
            size = 2 + len(sender)
        notes[-1].append(run_id)
        size += 1 + len(run_id.encode())
    return [" ".join(note) for note in notes]


def _now_ms() -> int:
    return int(time.time() * 1000)


class _Ids:
    """The waiters of one append, by run: given its (run, ms, seq) rows, each publish gets its event's id."""

    def __init__(self, futures: dict[str, list[asyncio.Future[str] | None]]) -> None:
        self._futures = futures

    def done(self) -> bool:
        return all(f is None or f.done() for group in self._futures.values() for f in group)

    def set_exception(self, exc: BaseException) -> None:
        for group in self._futures.values():
            for f in group:
                if f is not None and not f.done():
                    f.set_exception(exc)

    def set_result(self, rows: Any) -> None:
        ids: dict[str, list[tuple[int, int]]] = {}
        for run_id, ms, seq in rows:
            ids.setdefault(run_id, []).append((seq, ms))
        for run_id, group in self._futures.items():
            for f, (seq, ms) in zip(group, sorted(ids.get(run_id, [])), strict=False):
                if f is not None and not f.done():
                    f.set_result(f"{ms}-{seq}")
