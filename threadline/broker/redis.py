"""The Redis broker: the semantics of `MemoryBroker`, shared by every process of a deployment.

Redis holds each run's events (a Redis Stream trimmed to exactly `buffer_events`, and by the publishing
process to its byte budgets, `threadline.broker.budget`), a flag once the stream has ended, and a cancel sent
before the worker registered. They expire: `retain_seconds` after the run's
end, `live_seconds` after the last event of a run that never ends (its process died).

Run-done and cancel signals are pub/sub messages: each process listens with one connection and hands them
to local waiters. A wake-up (a run was enqueued) is a token pushed on a list, which one waiting claimer of
one process takes (BLPOP, on a connection of its own): one claim answers each enqueued run, where a message
to every process made each of them claim, and all but one found nothing. A lost token, or a message, costs
latency, never a stuck run: idle workers poll storage,
waiters re-check storage, a cancel is also stored for its run, and after a dropped subscription each
process re-checks everything it waits for. Names of keys and channels are in `threadline.broker.keys`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any

from limits.aio.storage import RedisStorage, Storage
from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from threadline.broker.base import Broker, StreamEvent, event_bytes
from threadline.broker.budget import ByteBudget
from threadline.broker.keys import Keys
from threadline.broker.local import LocalSignals
from threadline.broker.outage import Outage, exchange
from threadline.broker.outbox import Item, Outbox
from threadline.broker.redis_posts import POST_SCRIPT, pack_batch
from threadline.broker.redis_reads import SharedReads, id_key, stream_events
from threadline.errors import Unavailable

log = logging.getLogger("threadline.broker")

_ERRORS = (RedisError, OSError)  # OSError includes TimeoutError


#: KEYS: the scope's set; ARGV: limit, lease, ms to live. Expired leases go first; the clock is Redis's, one for
#: every process. 1 when taken, 0 when `limit` live leases are held.
_TAKE_LEASE = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""
#: KEYS: the scope's set; ARGV: ms to live, then the leases to renew (held again if they had expired).
_RENEW_LEASES = """
local t = redis.call('TIME')
local expires = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], expires, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return 0
"""


def _after_id(event_id: str) -> str:
    """The stream id to read after: `event_id` when it is one (`<ms>-<n>`), else "0-0", replaying everything
    buffered (as `MemoryBroker` does with an id that is not one of its own)."""
    ms, dash, n = event_id.partition("-")
    if dash and all(part.isascii() and part.isdigit() and int(part) < 2**64 for part in (ms, n)):
        return f"{int(ms)}-{int(n)}"
    return "0-0"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisBroker(Broker):
    """Per-run Redis Streams for events; pub/sub for wake-ups, run-done and cancel signals."""

    #: How long a finished run's events stay available for late joins and resumption (as MemoryBroker).
    retain_seconds = 600
    #: How long a run that never ends keeps its events after the last one.
    live_seconds = 24 * 3600
    #: Longest a blocking read waits before looking again, so connections turn over.
    block_seconds = 5.0
    #: Longest any other exchange with Redis may take.
    command_seconds = 5.0
    #: Most events read from Redis at once.
    batch_events = 500
    #: Most items (events, ends, signals) sent in one script call: Redis runs a script alone, so a batch that
    #: piled up while Redis was slow is cut into calls of this many.
    batch_items = 1000
    #: About the most bytes of events a subscriber reads from Redis at once (fewer events when they are large).
    batch_bytes = 256 * 1024
    #: How long the process's shared stream read blocks while a subscriber holds a batch (it joins the next read
    #: when it wants more); see `threadline.broker.redis_reads`.
    short_block_ms = 2
    #: During an outage, at most one log line (a count of what failed) per this many seconds.
    outage_report_seconds = 30.0
    #: Most wake-up tokens kept (more are dropped: runs claimed by a slot that frees, or by a poll, need none),
    #: and how long the list lives after its last push (nobody took them: the claimers poll anyway).
    wake_tokens_max = 1000
    wake_tokens_seconds = 60

    def __init__(self, url: str, *, buffer_events: int = 10_000, buffer_bytes: int = 8 << 20,
                 total_bytes: int = 256 << 20, key_prefix: str = "threadline", max_connections: int = 64,
                 max_subscribers: int = 1000, outbox_bytes: int = 16 << 20, coalesce_seconds: float = 0.0) -> None:
        self._budget = ByteBudget(buffer_events, buffer_bytes, total_bytes, self.retain_seconds)
        self._keys = Keys(key_prefix)
        self._url = url
        # Signals carry the sender's id: the sender applies its own at once, its listener skips them.
        self._id = uuid.uuid4().hex
        # Timeouts are ours (asyncio.timeout): redis-py's socket_timeout sends through asyncio.wait_for,
        # which on Python 3.11 can swallow a cancellation and leave a cancelled subscriber (or run) running.
        options: dict[str, Any] = {"socket_timeout": None, "socket_connect_timeout": 5, "socket_keepalive": True}
        # Commands wait for a free connection. Subscribers' other reads (context, `buffered_bytes`) take a
        # connection of their own pool, so many stream clients cannot starve the workers that publish.
        self._redis = Redis.from_pool(BlockingConnectionPool.from_url(
            url, max_connections=max_connections, timeout=None, **options))
        self._reader = Redis.from_pool(ConnectionPool.from_url(url, max_connections=max_subscribers, **options))
        # Every subscriber's next batch comes from one `XREAD` of the process, on a connection of its own
        # (`threadline.broker.redis_reads`).
        self._reads = SharedReads(Redis.from_url(url, client_name=self._keys.reads_name, **options), self._redis,
                                  self._exchange, block_seconds=self.block_seconds, short_block_ms=self.short_block_ms,
                                  batch_events=self.batch_events, batch_bytes=self.batch_bytes)
        # No silent reconnect on the listener: resubscribing is ours, so we re-check what we may have missed.
        self._listener = Redis.from_url(url, retry=Retry(NoBackoff(), 0), client_name=self._keys.listener_name,
                                        **options)
        self._pubsub: PubSub | None = None
        self._listening: asyncio.Task[None] | None = None
        # Wake-up tokens are taken on a connection of their own (a BLPOP blocks it), only while a claimer of
        # this process waits for work (`_want`); an API-only process never opens it.
        self._taker = Redis.from_url(url, **options)
        self._taking: asyncio.Task[None] | None = None
        self._waiting = 0
        self._want = asyncio.Event()
        # What this process does with a signal, wherever it came from (shared with MemoryBroker).
        self._signals = LocalSignals()
        # Runs whose stored early cancel still has to be read (Redis failed at registration, or resubscribed).
        self._unchecked: set[str] = set()
        # One warning when Redis goes away, a count while it stays away, one when it is back (broker/outage.py);
        # once it is back, the stream ends it lost are sent again.
        self.outage = Outage("Redis", log, report_seconds=self.outage_report_seconds,
                             on_end=lambda: self._outbox.resend_lost_ends())
        # What is waiting to be sent, in order, bounded by bytes (`threadline.broker.outbox`; see `_send_batch`).
        self._outbox = Outbox(self._send_batch, name="threadline-redis-posts", max_bytes=outbox_bytes,
                              outage=self.outage, batch_items=self.batch_items, coalesce=coalesce_seconds)
        self._poster: tuple[Any, Any] | None = None  # (pool, the connection the outbox sends on)
        self._take_lease = self._redis.register_script(_TAKE_LEASE)
        self._renew_leases = self._redis.register_script(_RENEW_LEASES)

    # Lifecycle.

    async def start(self) -> None:
        await self.ping()
        async with self._exchange(self.command_seconds):
            self._pubsub = await self._subscribe()
        self._listening = asyncio.create_task(self._listen(), name="threadline-redis-broker")

    async def ping(self) -> None:
        async with self._exchange():
            await self._redis.ping()

    async def close(self) -> None:
        await self._outbox.drain()  # what was queued is sent first
        await self._drop_poster()
        if self._taking is not None:
            self._taking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._taking
            self._taking = None
        if self._listening is not None:
            self._listening.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listening
            self._listening = None
        await self._drop_subscription()
        await self._reads.close()
        for client in (self._redis, self._reader, self._reads.client, self._listener, self._taker):
            with contextlib.suppress(*_ERRORS):
                await client.aclose()

    # Streams.

    async def publish(self, run_id: str, event: str, data: bytes) -> str:
        # Through the same queue as posts, so the two keep their order; this one waits to be stored.
        stored = asyncio.get_running_loop().create_future()
        await self._outbox.post(("event", run_id, (event, data, stored)))
        return await asyncio.shield(stored)

    async def post(self, run_id: str, event: str, data: bytes) -> None:
        await self._outbox.post(("event", run_id, (event, data, None)))

    async def end_stream(self, run_id: str) -> None:
        # After the run's posts, in the queue's order; often in the same round trip as its last events.
        ended = asyncio.get_running_loop().create_future()
        self._outbox.put(("end", run_id, ended))
        await asyncio.shield(ended)

    async def _send_batch(self, batch: list[Item]) -> None:
        """Send a batch of the outbox as one script call (`broker/redis_posts.py`). A run's stream expires
        `live_seconds` after its last event, `retain_seconds` after its end; the end flag is a stream of its
        own (a blocking read of the events wakes on it too, and it takes no place in the events' buffer);
        ending twice only renews the retention. Whoever waits for an item (`publish`, `end_stream`) gets the
        event's id (a failure is the outbox's to hand out)."""
        packed = pack_batch(batch, self._keys, self._budget, self._id, live_seconds=self.live_seconds,
                            retain_seconds=self.retain_seconds, wake_tokens_max=self.wake_tokens_max,
                            wake_tokens_seconds=self.wake_tokens_seconds)
        async with self._exchange():
            ids = await self._post(packed.args)
        for index, waiter in packed.waiters:
            if not waiter.done():
                waiter.set_result(str(ids[index], "ascii"))

    async def _post(self, args: list[Any]) -> Any:
        """`EVALSHA` on the outbox's own connection (one sender at a time: the outbox's), taken from the
        client's pool once instead of per batch; the script is sent whole when Redis does not have it (a
        restart, `SCRIPT FLUSH`). A connection that fails is closed by redis-py and opened again by the next
        call; a batch that failed to reach Redis is sent once more on a fresh one (as redis-py's retry did the
        pipeline)."""
        for attempt in (1, 2):
            pool = self._redis.connection_pool
            if self._poster is None or self._poster[0] is not pool:
                await self._drop_poster()
                self._poster = (pool, await pool.get_connection())  # type: ignore[no-untyped-call]
            connection = self._poster[1]
            try:
                await connection.send_packed_command(connection.pack_command("EVALSHA", *args), check_health=False)
                try:
                    return await connection.read_response()
                except NoScriptError:
                    await connection.send_packed_command(connection.pack_command("EVAL", POST_SCRIPT, *args[1:]),
                                                         check_health=False)
                    return await connection.read_response()
            except (RedisConnectionError, RedisTimeoutError):
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _drop_poster(self) -> None:
        poster, self._poster = self._poster, None
        if poster is not None:
            with contextlib.suppress(*_ERRORS):
                await poster[0].release(poster[1])

    def queued_bytes(self) -> int:
        return self._outbox.held

    async def resume_gap(self, run_id: str, after: str) -> bool:
        """Approximate: events were trimmed and the oldest kept one is after `after` (a client that had read
        exactly the newest trimmed event is counted too: Redis does not say which ids MAXLEN dropped)."""
        async with self._exchange():
            try:
                info: Any = await self._redis.xinfo_stream(self._keys.events(run_id))
            except RedisError:  # no such stream
                return False
        if int(info.get("entries-added") or 0) <= int(info.get("length") or 0):
            return False
        first = info.get("first-entry")
        if not first:  # every event was trimmed: a gap for a client that had not read the newest
            newest = info.get("last-generated-id") or b"0-0"
            newest = newest.decode() if isinstance(newest, bytes) else str(newest)
            return id_key(newest) > id_key(_after_id(after))
        kept = first[0].decode() if isinstance(first[0], bytes) else str(first[0])
        return id_key(kept) > id_key(_after_id(after))

    async def buffered_bytes(self, run_id: str) -> int:
        total, start, events = 0, "-", self._keys.events(run_id)
        while True:
            async with self._exchange():
                entries: Any = await self._reader.xrange(events, min=start, count=self.batch_events)
            total += sum(event_bytes(fields[b"e"].decode(), fields[b"d"]) for _, fields in entries)
            if len(entries) < self.batch_events:
                return total
            start = "(" + entries[-1][0].decode()

    async def stream_started(self, run_id: str) -> bool:
        async with self._exchange():
            return bool(await self._redis.exists(self._keys.events(run_id), self._keys.end(run_id)))

    async def subscribe_batches(self, run_id: str, *, after: str | None = None, replay: bool = False,
                                context: bool = False) -> AsyncIterator[list[StreamEvent]]:
        events, end = self._keys.events(run_id), self._keys.end(run_id)
        if after is not None:
            cursor = _after_id(after)
        elif replay:
            cursor = "0-0"
        else:  # from now on: after the newest event at this moment ("$" would race the first read)
            async with self._exchange():
                newest: Any = await self._redis.xrevrange(events, count=1)
            cursor = newest[0][0].decode() if newest else "0-0"
        if context and cursor != "0-0":
            async for before in self._context(events, cursor):
                yield before
        follower = self._reads.follow(events, end, cursor)
        try:
            while (entries := await follower.take()) is not None:
                yield stream_events(entries)
                self._reads.want(follower)
        finally:
            self._reads.unfollow(follower)

    async def _context(self, events: str, cursor: str) -> AsyncIterator[list[StreamEvent]]:
        """The events still kept up to `cursor` (included), marked as context, in batches."""
        start = "-"
        while True:
            async with self._exchange():
                entries: Any = await self._reader.xrange(events, min=start, max=cursor, count=self.batch_events)
            if entries:
                yield [StreamEvent(entry_id.decode(), fields[b"e"].decode(), fields[b"d"], context=True)
                       for entry_id, fields in entries]
            if len(entries) < self.batch_events:
                return
            start = "(" + entries[-1][0].decode()

    # Rate limits.

    @functools.cached_property
    def rate_counters(self) -> Storage:
        """`limits`' own Redis storage (its scripts, on Redis's clock), under this deployment's prefix."""
        uri = self._url if self._url.startswith("async+") else "async+" + self._url
        return RedisStorage(uri, implementation="redispy", key_prefix=self._keys.rate_limits)

    # Leases.

    async def take_lease(self, scope: str, limit: int, seconds: float) -> str | None:
        lease = uuid.uuid4().hex
        async with self._exchange():
            taken = await self._take_lease(keys=[self._keys.leases(scope)], args=[limit, lease, _ms(seconds)])
        return lease if taken else None

    async def renew_leases(self, leases: Mapping[str, Collection[str]], seconds: float) -> None:
        async with self._exchange(), self._redis.pipeline(transaction=False) as pipe:
            for scope, ids in leases.items():
                if ids:
                    await self._renew_leases(keys=[self._keys.leases(scope)], args=[_ms(seconds), *ids], client=pipe)
            await pipe.execute()

    async def drop_lease(self, scope: str, lease: str) -> None:
        async with self._exchange():
            await self._redis.zrem(self._keys.leases(scope), lease)

    # Wake-ups.

    async def wake_workers(self) -> None:
        """This process's claimer at once, without a round trip, when it waits; else a token for one claimer
        of any process (counted here too: a claimer in the middle of a claim looks again after it)."""
        if not self._signals.wake_waiting():
            await self._signals.wake()
            self._outbox.put(("token", self._keys.wake_tokens, ""))

    async def wake_here(self) -> None:
        await self._signals.wake()

    async def wait_for_work(self, timeout: float) -> None:
        self._waiting += 1
        self._want.set()
        if self._taking is None:
            self._taking = asyncio.create_task(self._take_tokens(), name="threadline-redis-wake-tokens")
        try:
            await self._signals.wait_for_work(timeout)
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._want.clear()

    async def _take_tokens(self) -> None:
        """While a claimer of this process waits for work, take one wake-up token at a time and hand it to
        the claimer. A token taken once no claimer waits any more (its slots filled meanwhile) goes back on
        the list for another process. Redis away: the claimers' poll finds the runs, and this tries again."""
        backoff = 0.1
        while True:
            await self._want.wait()
            try:
                async with self._exchange(self.block_seconds):
                    taken = await self._taker.blpop([self._keys.wake_tokens], timeout=self.block_seconds)
            except (*_ERRORS, Unavailable) as exc:
                if not isinstance(exc, Unavailable):  # an Unavailable was counted by its exchange
                    self.outage.failed(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = 0.1
            if taken is not None and not self._signals.wake_waiting():
                self._outbox.put(("token", self._keys.wake_tokens, ""))

    # Run done.

    async def notify_run_done(self, run_id: str) -> None:
        self._signals.done(run_id)
        self._signal(self._keys.done_channel(run_id))

    def listen_run_done(self, run_id: str) -> Any:
        return self._signals.listen_done(run_id)

    # Cancel.

    async def send_cancel(self, run_id: str, action: str) -> None:
        applied = self._signals.cancel(run_id, action)
        try:
            async with self._exchange(), self._redis.pipeline(transaction=False) as pipe:
                if not applied:  # kept for a worker between its claim and its registration
                    pipe.set(self._keys.early_cancel(run_id), action, ex=self.retain_seconds)
                pipe.publish(self._keys.cancel_channel(run_id), f"{self._id} {action}")
                await pipe.execute()
        except Unavailable:
            if not applied:
                raise
            return  # cancelled here; the outage is logged and counted by `_exchange`
        if not applied and self._signals.has_cancel(run_id):
            # A worker of this process registered meanwhile, and may have looked for the stored cancel before it
            # was stored; the listener skips this process's own messages. Whoever takes the stored cancel
            # applies it: that registration, or here.
            async with self._exchange():
                taken = await self._redis.getdel(self._keys.early_cancel(run_id))
            if taken is not None:
                self._signals.cancel(run_id, action)

    async def on_cancel(self, run_id: str, callback: Any) -> Any:
        unregister = self._signals.register_cancel(run_id, callback)
        try:
            async with self._exchange():
                early: Any = await self._redis.getdel(self._keys.early_cancel(run_id))
        except Unavailable:  # counted by the outage; the listener retries once it has resubscribed
            self._unchecked.add(run_id)
        else:
            if early is not None:
                callback(early.decode())
        return unregister

    # The listener.

    def _exchange(self, extra_seconds: float = 0.0) -> contextlib.AbstractAsyncContextManager[None]:
        return exchange(self.outage, self.command_seconds + extra_seconds, _ERRORS, unavailable="Redis is unavailable")

    def _signal(self, channel: str, payload: str = "") -> None:
        """Queued with the posts, not waited for: a lost signal costs latency, never a stuck run."""
        self._outbox.put(("signal", channel, payload))

    async def _subscribe(self) -> PubSub:
        """Subscribe to our channels; return once Redis confirmed, so no signal sent afterwards is missed."""
        pubsub = self._listener.pubsub()
        try:
            await pubsub.subscribe(self._keys.wake_channel)
            await pubsub.psubscribe(self._keys.done_pattern, self._keys.cancel_pattern)
            confirmed = 0
            while confirmed < 3:
                message = await pubsub.get_message(timeout=self.command_seconds)
                if message is None:
                    raise TimeoutError("Redis did not confirm the subscriptions")
                if message["type"] in ("subscribe", "psubscribe"):
                    confirmed += 1
                else:
                    await self._dispatch(message)
        except BaseException:
            with contextlib.suppress(*_ERRORS):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated before redis-py 8.2
            raise
        return pubsub

    async def _drop_subscription(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(*_ERRORS):
                await pubsub.aclose()  # type: ignore[no-untyped-call, unused-ignore]  # unannotated before redis-py 8.2

    async def _listen(self) -> None:
        backoff = 0.1
        while True:
            try:
                if self._pubsub is None:
                    self._pubsub = await self._subscribe()
                    self.outage.recovered()
                    log.info("Redis broker: subscribed again; re-checking what may have been missed")
                    # Each of these is safe to repeat: a worker slot claims nothing, a waiter re-checks
                    # storage, a cancel applied twice is one cancel.
                    await self._signals.wake()
                    self._signals.done_all()
                    self._unchecked.update(self._signals.cancel_ids())
                    backoff = 0.1
                for run_id in list(self._unchecked):
                    early: Any = None
                    if self._signals.has_cancel(run_id):  # else it stays stored for the run's registration
                        async with self._exchange():
                            early = await self._redis.getdel(self._keys.early_cancel(run_id))
                    self._unchecked.discard(run_id)
                    if early is not None:
                        self._signals.cancel(run_id, early.decode())
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=self.block_seconds)
                if message is not None:
                    await self._dispatch(message)
            except (*_ERRORS, Unavailable) as exc:
                if not isinstance(exc, Unavailable):  # an Unavailable was counted by its exchange
                    self.outage.failed(exc)
                log.debug("Redis broker: listening failed (%s); subscribing again in %.1f s", exc, backoff)
                await self._drop_subscription()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception:  # a cancel callback failed: the listener carries on
                log.exception("Redis broker: a signal could not be handled")

    async def _dispatch(self, message: dict[str, Any]) -> None:
        sender, _, payload = message["data"].decode(errors="replace").partition(" ")
        if sender == self._id:
            return  # applied here when it was sent
        kind, run_id = self._keys.parse_channel(message["channel"].decode(errors="replace"))
        if kind == "wake":
            await self._signals.wake()
        elif kind == "done":
            self._signals.done(run_id)
        elif kind == "cancel" and self._signals.has_cancel(run_id):
            # Delivered: nothing is left for a later registration (deleted before the callbacks run).
            async with self._exchange():
                await self._redis.delete(self._keys.early_cancel(run_id))
            self._signals.cancel(run_id, payload)
