"""One reader of Redis Streams for every subscriber of a process (`RedisBroker.subscribe_batches`).

Each subscriber (`Follower`) has a cursor in its run's event stream. One task of the process, on one connection
of its own, reads with one `XREAD` the streams of every subscriber that wants its next batch (one cursor per
stream; its end flag too while it has not ended), and hands each subscriber its entries. A subscriber whose
batch has not been taken yet is left out of the read: it holds at most one batch (about `batch_bytes`), as a
subscriber reading for itself did, and a reader that stops reading stalls no one else.

A subscriber that wants more while the read is blocked joins the next one: a read blocks `short_block_ms` while
any subscriber holds a batch (it will want more soon), twice as long after each read that found nothing and
saw no one join (up to `block_seconds`), and `block_seconds` while every subscriber is in it; a subscriber that
joins a read blocked longer than `short_block_ms` unblocks it (`CLIENT UNBLOCK` from the broker's command
connection), so it never waits for more than about `short_block_ms` plus a round trip. Where Redis refuses
`CLIENT UNBLOCK` (an ACL without admin commands; asked once per connection), reads block at most
`fallback_block_ms` (32 ms) instead: a join waits at most that, and idle subscribers cost a read that often.

A read that fails (Redis away) fails the subscribers that were in it, each with the broker's `Unavailable`, as
each one's own read did; the connection is opened again by the next read.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from threadline.broker.base import StreamEvent
from threadline.errors import BrokerUnavailable

log = logging.getLogger("threadline.broker")

#: What a follower is handed when its stream has ended and it has read everything.
_END: list[Any] = []


def id_key(stream_id: str) -> tuple[int, int]:
    ms, _, n = stream_id.partition("-")
    return int(ms or 0), int(n or 0)


def stream_events(entries: list[Any]) -> list[StreamEvent]:
    """Entries of a raw `XREAD` reply (fields `e`, event, `d`, data, as `broker/redis_posts.py` writes them)."""
    return [StreamEvent(entry_id.decode(), fields[1].decode(), fields[3]) for entry_id, fields in entries]


class Follower:
    """One subscriber of the shared reader: its run's stream keys, its cursor, and what it was handed."""

    __slots__ = ("events", "end", "cursor", "count", "ended", "wanting", "closed", "ready", "woken")

    def __init__(self, events: str, end: str, cursor: str, count: int) -> None:
        self.events, self.end, self.cursor, self.count = events, end, cursor, count
        self.ended = False  # its end flag was seen: it drains without blocking, then ends
        self.wanting = True  # in the next read (not holding a batch)
        self.closed = False
        self.ready: list[Any] | BaseException | None = None
        self.woken = asyncio.Event()

    def hand(self, ready: list[Any] | BaseException) -> None:
        self.ready, self.wanting = ready, False
        self.woken.set()

    async def take(self) -> list[Any] | None:
        """The next entries (never empty), or None at the end; raises what failed the read."""
        await self.woken.wait()
        self.woken.clear()
        ready, self.ready = self.ready, None
        if isinstance(ready, BaseException):
            raise ready
        assert ready is not None
        return ready if ready is not _END else None


class SharedReads:
    """The process's one stream reader (see the module docstring)."""

    def __init__(self, reads: Redis, commands: Redis, exchange: Callable[[float], Any], *, block_seconds: float,
                 short_block_ms: int, batch_events: int, batch_bytes: int, unblock: bool = True) -> None:
        self._reads = reads  # whose pool gives the reader its connection
        self._commands = commands  # where `CLIENT UNBLOCK` is sent
        self._exchange = exchange
        self.block_seconds = block_seconds
        self.short_block_ms = short_block_ms
        self.batch_events, self.batch_bytes = batch_events, batch_bytes
        self.unblock = unblock  # False once Redis refused CLIENT UNBLOCK (an ACL): reads block briefly instead
        self.fallback_block_ms = 32
        self._followers: set[Follower] = set()
        self._changed = asyncio.Event()  # a follower joined or wants more
        self._task: asyncio.Task[None] | None = None
        self._connection: Any = None
        self._client_id: int | None = None
        self._generation = 0  # reads sent so far
        self._unblockable = False  # the read in flight blocks long: a join unblocks it
        self._unblocking: asyncio.Task[None] | None = None
        self._block_ms = short_block_ms
        self.reads = 0  # XREADs sent (for tests and benches)

    @property
    def client(self) -> Redis:
        return self._reads

    def follow(self, events: str, end: str, cursor: str) -> Follower:
        follower = Follower(events, end, cursor, self.batch_events)
        self._followers.add(follower)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="threadline-redis-stream-reads")
        self._joined()
        return follower

    def want(self, follower: Follower) -> None:
        """`follower` took its batch and wants the next."""
        follower.wanting = True
        self._joined()

    def unfollow(self, follower: Follower) -> None:
        follower.closed = True
        self._followers.discard(follower)

    async def close(self) -> None:
        for task in (self._unblocking, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._unblocking = None
        await self._drop_connection()
        for follower in self._followers:  # a subscriber still waiting fails as on a read that failed
            follower.hand(BrokerUnavailable("Redis is unavailable (the broker closed). Retry shortly."))

    def _joined(self) -> None:
        self._changed.set()
        self._block_ms = self.short_block_ms
        if self._unblockable and self.unblock and self._unblocking is None:
            self._unblocking = asyncio.create_task(self._unblock(self._generation),
                                                   name="threadline-redis-stream-unblock")

    async def _unblock(self, generation: int) -> None:
        """Unblock read `generation`. `CLIENT UNBLOCK` goes on another connection, so it may reach Redis before
        the read does (it then unblocks nothing): sent again until the read has returned."""
        try:
            while self._unblockable and self._generation == generation:
                if self._client_id is not None:
                    async with self._exchange(0.0):
                        if await self._commands.client_unblock(self._client_id):
                            return
                await asyncio.sleep(0.001)
        except Exception as exc:  # noqa: BLE001 - the read ends by itself within block_seconds
            log.debug("Redis broker: could not unblock the stream read (%s)", exc)
        finally:
            self._unblocking = None

    async def _run(self) -> None:
        while True:
            try:
                await self._round()
            except Exception:  # a bug: the subscribers waiting fail, the reader goes on
                log.exception("Redis broker: the stream read failed")
                await self._drop_connection()
                for follower in list(self._followers):
                    if follower.wanting:
                        follower.hand(BrokerUnavailable("Redis is unavailable (the read failed). Retry shortly."))

    async def _round(self) -> None:
        """One read for every subscriber that wants its next batch (or a wait for one to)."""
        wanting = [follower for follower in self._followers if follower.wanting]
        if not wanting:
            self._changed.clear()
            await self._changed.wait()
            return
        streams: dict[str, str] = {}
        for follower in wanting:
            cursor = streams.get(follower.events)
            if cursor is None or id_key(follower.cursor) < id_key(cursor):
                streams[follower.events] = follower.cursor
        draining = False
        for follower in wanting:
            if follower.ended:
                draining = True
            else:
                streams[follower.end] = "0-0"
        count = min(follower.count for follower in wanting)
        if draining:
            block: int | None = None
        elif len(wanting) < len(self._followers):  # someone holds a batch: it will want more soon
            block = min(self._block_ms, int(self.block_seconds * 1000))
        else:
            block = int(self.block_seconds * 1000)
        self._changed.clear()
        self._generation += 1
        self._unblockable = self.unblock and block is not None and block > self.short_block_ms
        try:
            reply = await self._read(streams, count, block)
        except asyncio.CancelledError:
            await self._drop_connection()
            raise
        except Exception as exc:  # noqa: BLE001 - Unavailable (counted by its exchange), or a bug: each reader raises it
            await self._drop_connection()
            for follower in wanting:
                if not follower.closed:
                    follower.hand(copy.copy(exc))  # each raises its own
            return
        finally:
            self._unblockable = False
        got: dict[bytes, list[Any]] = dict(reply) if reply else {}
        if not got and block is not None and not self._changed.is_set():
            self._block_ms = min(2 * self._block_ms, int(self.block_seconds * 1000))
        self._deliver(wanting, streams, got, count)

    def _deliver(self, wanting: list[Follower], streams: dict[str, str], got: dict[bytes, list[Any]],
                 count: int) -> None:
        for follower in wanting:
            if follower.closed:
                continue
            if follower.end.encode() in got:
                follower.ended = True
            read = got.get(follower.events.encode()) or []
            entries = read
            if read and follower.cursor != streams[follower.events]:  # another follower's cursor was earlier
                after = id_key(follower.cursor)
                entries = [entry for entry in read if id_key(entry[0].decode()) > after]
            if entries:
                follower.cursor = entries[-1][0].decode()
                follower.count = self._next_count(entries)
                follower.hand(entries)
            elif follower.ended and len(read) < count:  # everything after its cursor was read: the end
                follower.hand(_END)

    def _next_count(self, entries: list[Any]) -> int:
        """How many events to read next: about `batch_bytes` of events the size of the last batch's."""
        size = sum(len(fields[3]) for _, fields in entries) // len(entries) + 1
        return max(1, min(self.batch_events, self.batch_bytes // size))

    async def _read(self, streams: dict[str, str], count: int, block: int | None) -> Any:
        """One `XREAD` on the reader's own connection (opened, and its client id asked, when there is none)."""
        args: list[Any] = ["XREAD", "COUNT", count]
        if block is not None:
            args += ["BLOCK", block]
        args += ["STREAMS", *streams.keys(), *streams.values()]
        async with self._exchange(self.block_seconds):
            for attempt in (1, 2):  # a connection that dropped while idle (Redis restarted): once more, afresh
                try:
                    if self._connection is None:
                        pool = self._reads.connection_pool
                        self._connection = await pool.get_connection()  # type: ignore[no-untyped-call]
                        self._client_id = None
                    connection = self._connection
                    if self._client_id is None:
                        await connection.send_command("CLIENT", "ID", check_health=False)
                        self._client_id = int(await connection.read_response())
                        if self.unblock:
                            await self._check_unblock(connection)
                    if not self.unblock and block is not None:
                        args[args.index("BLOCK") + 1] = block = min(block, self.fallback_block_ms)
                    self.reads += 1
                    await connection.send_packed_command(connection.pack_command(*args), check_health=False)
                    return await connection.read_response()
                except RedisConnectionError:
                    await self._drop_connection()
                    if attempt == 2:
                        raise
        raise AssertionError("unreachable")

    async def _check_unblock(self, connection: Any) -> None:
        """Whether this Redis user may send `CLIENT UNBLOCK` (an ACL can refuse it: it is an admin command),
        asked once per connection with the reader's own id (not blocked: it unblocks nothing). Refused, the
        read blocks at most `fallback_block_ms`, so a join waits at most that instead of a round trip."""
        await connection.send_command("CLIENT", "UNBLOCK", self._client_id, check_health=False)
        try:
            await connection.read_response()
        except ResponseError as exc:
            self.unblock = False
            self._unblockable = False
            log.warning("Redis broker: CLIENT UNBLOCK is refused (%s): the shared stream read blocks at most %d ms "
                        "at a time instead", exc, self.fallback_block_ms)

    async def _drop_connection(self) -> None:
        connection, self._connection, self._client_id = self._connection, None, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.disconnect()
            with contextlib.suppress(Exception):
                await self._reads.connection_pool.release(connection)
