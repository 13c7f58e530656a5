"""The broker contract, run against every broker: per-run streams with ids, replay from a cursor, a bounded
buffer, the end of a stream, wake-ups, run-done and cancel signals, between the processes of a deployment.

Redis tests use their own key prefix (deleted afterwards). Without a Redis server they skip, except under
CI (`CI=true`), where they fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import psycopg
import pytest
import redis.asyncio as aioredis
from limits import parse
from limits.aio.strategies import SlidingWindowCounterRateLimiter

from tests.services import KEY_PREFIX, PG_ADMIN_URL, REDIS_URL, owned_name, unavailable
from tests.ticks import Ticks
from tests.waits import until
from threadline.broker.base import Broker, StreamEvent, event_bytes
from threadline.broker.budget import ByteBudget
from threadline.broker.keys import Keys
from threadline.broker.leases import Leases
from threadline.broker.memory import PACK_EVENTS, MemoryBroker
from threadline.broker.pgsql import PgNames
from threadline.broker.postgres import PostgresBroker
from threadline.broker.redis import RedisBroker
from threadline.errors import Unavailable

BROKERS = ["memory", "redis", "postgres"]


class Deployment:
    """The brokers of one test, all of one backend: with Redis or PostgreSQL, each is a process of one
    deployment (on PostgreSQL, its tables and channel are named by the test's own prefix, dropped afterwards)."""

    #: Small, so that a subscriber that does not give its connection back soon exhausts the pool.
    max_subscribers = 8

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.keys = Keys(owned_name(KEY_PREFIX))
        self.opened: list[Broker] = []
        self.reached = False

    async def open(self, buffer_events: int = 10_000, **budgets: int) -> Broker:
        """A broker; `budgets`: `buffer_bytes` and `total_bytes` (and `outbox_bytes`, shared brokers only)."""
        broker: Broker
        if self.kind == "memory":
            broker = MemoryBroker(buffer_events=buffer_events, **budgets)
        elif self.kind == "postgres":
            broker = PostgresBroker(PG_ADMIN_URL, buffer_events=buffer_events, key_prefix=self.keys.prefix,
                                    **budgets)
        else:
            broker = RedisBroker(REDIS_URL, buffer_events=buffer_events, key_prefix=self.keys.prefix,
                                 max_subscribers=self.max_subscribers, **budgets)
        self.opened.append(broker)
        try:
            await broker.start()
        except Unavailable as exc:
            unavailable(f"{self.kind} unreachable: {exc}")
        self.reached = self.kind != "memory"
        return broker

    async def expire_leases(self, scope: str) -> None:
        """Make every lease of `scope` expired, as if its life had passed on the broker's clock (which the test
        cannot move): a lease that is not renewed after this is gone."""
        if self.kind == "memory":
            for broker in self.opened:
                held = broker._leases.get(scope, {})  # type: ignore[attr-defined]
                held.update(dict.fromkeys(held, float("-inf")))
        elif self.kind == "postgres":
            async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as conn:
                await conn.execute(f"UPDATE {PgNames(self.keys.prefix).leases} "
                                   "SET expires_at = now() - interval '1 second' WHERE scope = %s", (scope,))
        else:
            client = aioredis.Redis.from_url(REDIS_URL)
            try:
                leases = cast(list[bytes], await client.zrange(self.keys.leases(scope), 0, -1))
                if leases:
                    await client.zadd(self.keys.leases(scope), dict.fromkeys(leases, 0), xx=True)  # scores: ms
            finally:
                await client.aclose()

    async def another_process(self, broker: Broker) -> Broker:
        """A broker of another process of `broker`'s deployment (in-process, the deployment is `broker`)."""
        return broker if self.kind == "memory" else await self.open()

    async def close(self) -> None:
        for broker in self.opened:
            await broker.close()
        if self.reached and self.kind == "postgres":
            names = PgNames(self.keys.prefix)
            async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as conn:
                await conn.execute(f"DROP TABLE IF EXISTS {names.streams}, {names.events}, {names.cancels}, "
                                   f"{names.leases}, {names.windows}")
        elif self.reached:
            client = aioredis.Redis.from_url(REDIS_URL)
            keys = [key async for key in client.scan_iter(match=self.keys.everything, count=1000)]
            if keys:
                await client.delete(*keys)
            await client.aclose()


@pytest.fixture(params=BROKERS)
async def deployment(request: pytest.FixtureRequest) -> AsyncIterator[Deployment]:
    deployment = Deployment(request.param)
    yield deployment
    await deployment.close()


@pytest.fixture
async def redis_deployment() -> AsyncIterator[Deployment]:
    deployment = Deployment("redis")
    yield deployment
    await deployment.close()


@pytest.fixture
async def broker(deployment: Deployment) -> Broker:
    return await deployment.open()


@pytest.fixture
async def peer(deployment: Deployment, broker: Broker) -> Broker:
    """Another process of `broker`'s deployment."""
    return await deployment.another_process(broker)


async def _collect(broker: Broker, run_id: str, **kwargs: object) -> list[bytes]:
    return [ev.data async for ev in broker.subscribe(run_id, **kwargs)]  # type: ignore[arg-type]


async def _collect_events(broker: Broker, run_id: str, **kwargs: object) -> list[StreamEvent]:
    return [ev async for ev in broker.subscribe(run_id, **kwargs)]  # type: ignore[arg-type]


def _numbers(*values: int) -> list[bytes]:
    return [str(i).encode() for i in values]


# Streams.


async def test_replay_after_cursor_and_from_start(broker: Broker) -> None:
    ids = [await broker.publish("r", "values", str(i).encode()) for i in range(50)]
    await broker.end_stream("r")
    assert await _collect(broker, "r", after=ids[19]) == _numbers(*range(20, 50))
    assert len(await _collect(broker, "r", replay=True)) == 50
    assert await _collect(broker, "r") == []  # a join after the end sees nothing new


async def test_a_long_finished_run_reads_back_as_it_streamed(deployment: Deployment) -> None:
    """More events than a finished run is packed from (the in-process broker holds them in one buffer then:
    `_Packed`): replayed whole, from a cursor, with context, and dropped by the process budget, each event comes
    back with its id, name and bytes (partial markers and non-ASCII included)."""
    n = 3 * PACK_EVENTS
    events = [("messages|sub:1" if i % 3 else "values", b"\x00[1,2]\n\xc3\xa9%05d" % i if i % 2 else b"%05d" % i)
              for i in range(n)]
    small = event_bytes("values", b"%05d" % 0)
    broker = await deployment.open(total_bytes=sum(event_bytes(*ev) for ev in events) + 5 * small)
    live = broker.subscribe("r", replay=True)
    sent = [StreamEvent(await broker.publish("r", name, data), name, data) for name, data in events]
    await broker.end_stream("r")
    assert [ev async for ev in live] == sent
    assert await _collect_events(broker, "r", replay=True) == sent
    assert await _collect_events(broker, "r", after=sent[n // 2].id) == sent[n // 2 + 1:]
    with_context = await _collect_events(broker, "r", after=sent[9].id, context=True)
    assert [ev._replace(context=False) for ev in with_context] == sent and \
        [ev.context for ev in with_context] == [True] * 10 + [False] * (n - 10)
    assert await _collect(broker, "r") == []
    for i in range(12):  # a running run past the process budget: the finished one goes first, whole
        await broker.publish("s", "values", b"%05d" % i)
    assert await _collect(broker, "r", replay=True) == []
    assert await broker.resume_gap("r", "-1")
    await broker.end_stream("s")
    assert await _collect(broker, "s", replay=True) == [b"%05d" % i for i in range(12)]


async def test_an_event_after_a_long_run_ended_reads_back_after_it(broker: Broker) -> None:
    """An event posted after a long run's end (the in-process broker held its events packed then, and holds
    them as a live buffer again): every event, the late ones last, by replay, from a cursor and as context."""
    n = PACK_EVENTS + 10
    sent = [StreamEvent(await broker.publish("r", "values", b"%05d" % i), "values", b"%05d" % i) for i in range(n)]
    await broker.end_stream("r")
    await broker.post("r", "error", b'{"late": 1}')
    late = await broker.publish("r", "values", b'{"late": 2}')
    replayed = await _collect_events(broker, "r", replay=True)
    assert replayed[:n] == sent
    assert [(ev.event, ev.data) for ev in replayed[n:]] == [("error", b'{"late": 1}'), ("values", b'{"late": 2}')]
    assert replayed[-1].id == late and len({ev.id for ev in replayed}) == n + 2
    assert await _collect(broker, "r", after=sent[-1].id) == [b'{"late": 1}', b'{"late": 2}']
    assert await _collect_events(broker, "r", after=sent[n - 3].id) == replayed[n - 2:]
    with_context = await _collect_events(broker, "r", after=sent[4].id, context=True)
    assert [ev._replace(context=False) for ev in with_context] == replayed
    assert [ev.context for ev in with_context] == [True] * 5 + [False] * (n - 3)
    assert await _collect(broker, "r", after=late) == []


async def test_a_slow_reader_while_a_long_run_ends_gets_each_event_once(broker: Broker, peer: Broker) -> None:
    """A reader subscribed from the start that is part way through a long run's events when the run ends (the
    in-process broker packs them then, under the reader's cursor) and one that has read everything and waits:
    each gets every event exactly once, in order, and then the end."""
    n = 3 * PACK_EVENTS
    # Events of 2 kB: a broker hands a reader about 256 kB at a time, so the first reader is between two
    # batches of its broker's when the run ends, as well as inside one.
    data = [b"%05d" % i + b"x" * 2_000 for i in range(n)]
    slow, waiting = peer.subscribe("r", replay=True), peer.subscribe("r", replay=True)
    ids = [await broker.publish("r", "values", data[0])]
    assert (await anext(slow)).data == data[0] and (await anext(waiting)).data == data[0]
    ids += [await broker.publish("r", "values", d) for d in data[1:]]
    waited = [ev async for ev in _take(waiting, n - 1)]
    read = [await anext(slow) for _ in range(n // 2)]  # half way, then the run ends under it
    pending = asyncio.ensure_future(anext(waiting))  # waiting for more when the run ends
    await asyncio.sleep(0.05)
    assert not pending.done()
    await broker.end_stream("r")
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 10)
    read += [ev async for ev in slow]
    assert [ev.data for ev in read] == data[1:] and [ev.id for ev in read] == ids[1:]
    assert [ev.data for ev in waited] == data[1:] and [ev.id for ev in waited] == ids[1:]


async def _take(subscription: AsyncIterator[StreamEvent], n: int) -> AsyncIterator[StreamEvent]:
    for _ in range(n):
        yield await anext(subscription)


async def test_bounded_buffer_keeps_the_latest(deployment: Deployment) -> None:
    broker = await deployment.open(buffer_events=10)
    ids = [await broker.publish("r", "values", str(i).encode()) for i in range(50)]
    await broker.end_stream("r")
    await broker.end_stream("r")  # ending twice is harmless: it takes nothing from the buffer
    assert await _collect(broker, "r", after=ids[4]) == _numbers(*range(40, 50))
    assert await _collect(broker, "r", replay=True) == _numbers(*range(40, 50))


async def test_buffer_is_bounded_by_bytes_and_a_resume_past_it_is_a_gap(deployment: Deployment) -> None:
    broker = await deployment.open(buffer_bytes=20_000)
    ids = [await broker.publish("r", "values", b"%04d" % i + b"x" * 996) for i in range(100)]  # 116 KB
    await broker.end_stream("r")
    kept = await _collect(broker, "r", replay=True)
    assert 0 < await broker.buffered_bytes("r") <= 20_000
    assert [int(data[:4]) for data in kept] == list(range(100 - len(kept), 100))  # the newest, in order
    assert await broker.resume_gap("r", ids[10])  # those after it were dropped
    assert await _collect(broker, "r", after=ids[10]) == kept  # it gets what is kept
    assert not await broker.resume_gap("r", ids[-2])
    assert await _collect(broker, "r", after=ids[-2]) == kept[-1:]


async def test_an_event_larger_than_the_budget_is_still_delivered(deployment: Deployment) -> None:
    broker = await deployment.open(buffer_bytes=1_000)
    live = asyncio.create_task(_collect(broker, "r", replay=True))
    await broker.publish("r", "values", b"a" * 5_000)
    await broker.publish("r", "values", b"b" * 5_000)
    await broker.end_stream("r")
    assert (await _collect(broker, "r", replay=True)) == [b"b" * 5_000]  # the newest is always kept
    assert (await live)[-1] == b"b" * 5_000


async def test_process_budget_drops_finished_runs_first_oldest_first(deployment: Deployment) -> None:
    event = b"x" * 1_000
    size = event_bytes("values", event)
    broker = await deployment.open(total_bytes=10 * size)
    for run_id in ("a", "b"):
        for _ in range(4):
            await broker.publish(run_id, "values", event)
        await broker.end_stream(run_id)
    first = await broker.publish("c", "values", event)
    for _ in range(3):  # 12 events: over the budget by 2, so the first finished run goes, whole
        await broker.publish("c", "values", event)
    assert await _collect(broker, "a", replay=True) == []
    assert await broker.resume_gap("a", "-1")
    assert await _collect(broker, "b", replay=True) == [event] * 4
    assert not await broker.resume_gap("c", first)  # the running run lost nothing
    for _ in range(8):  # then the running run's own oldest events: nothing finished is left but "b"
        await broker.publish("c", "values", event)
    assert await _collect(broker, "b", replay=True) == []
    await broker.end_stream("c")
    assert 0 < await broker.buffered_bytes("c") <= 10 * size
    assert await broker.resume_gap("c", first)


async def test_finished_runs_keep_at_most_their_own_budget_the_first_ended_going_first() -> None:
    """In process, the finished runs' buffers are bounded apart (`finished_bytes`, well under the process budget):
    a burst of runs on a large state, each posting its whole state, kept hundreds of MB for ten minutes."""
    event = b"x" * 1_000
    size = event_bytes("values", event)
    broker = MemoryBroker(total_bytes=100 * size, finished_bytes=10 * size)
    running = [await broker.publish("live", "values", event) for _ in range(8)]
    for run_id in ("a", "b", "c"):
        for _ in range(4):
            await broker.publish(run_id, "values", event)
        await broker.end_stream(run_id)
    # 12 events' worth finished, over the 10 allowed: "a", which ended first, goes whole.
    assert await _collect(broker, "a", replay=True) == []
    assert await broker.resume_gap("a", "-1")
    assert await _collect(broker, "b", replay=True) == [event] * 4
    assert await _collect(broker, "c", replay=True) == [event] * 4
    assert broker.finished_bytes == 8 * size and broker.held_bytes == 16 * size
    assert not await broker.resume_gap("live", running[0])  # a running run's buffer is not the finished ones'
    await broker.end_stream("live")  # 16 events' worth finished now: the older runs go, the newest stays
    assert broker.finished_bytes == broker.held_bytes == 8 * size
    assert len(await _collect(broker, "live", replay=True)) == 8
    assert await _collect(broker, "c", replay=True) == []


async def test_a_finished_run_being_read_is_kept_and_bounded_once_its_reader_is_done() -> None:
    event = b"x" * 1_000
    size = event_bytes("values", event)
    broker = MemoryBroker(finished_bytes=5 * size)
    broker.batch_bytes = size  # one event a batch: the reader is in the middle of the run's stream
    for _ in range(4):
        await broker.publish("a", "values", event)
    await broker.end_stream("a")
    reader = broker.subscribe_batches("a", replay=True)
    assert len(await anext(reader)) == 1
    for _ in range(4):
        await broker.publish("b", "values", event)
    await broker.end_stream("b")  # over the budget, but "a" is being read: kept, and "b" after it
    assert broker.finished_bytes == 8 * size
    assert [len(batch) async for batch in reader] == [1, 1, 1]  # the rest of "a", none lost
    # Its reader done, "a" goes; "b", newer, stays.
    assert broker.finished_bytes == 4 * size
    assert await _collect(broker, "a", replay=True) == []
    assert await _collect(broker, "b", replay=True) == [event] * 4


async def test_a_slow_reader_does_not_grow_what_is_held(deployment: Deployment) -> None:
    broker = await deployment.open(buffer_bytes=20_000)
    reader = broker.subscribe("r", replay=True)
    await broker.publish("r", "values", b"%04d" % 0)
    assert int((await anext(reader)).data) == 0
    for i in range(1, 200):  # while the reader reads nothing: 10 times the budget
        await broker.publish("r", "values", b"%04d" % i + b"x" * 996)
        assert await broker.buffered_bytes("r") <= 20_000
    await broker.end_stream("r")
    rest = [int(ev.data[:4]) async for ev in reader]
    # It goes on from what is still kept (the events dropped meanwhile are a gap), in order, to the end.
    assert rest == sorted(set(rest)) and rest[-1] == 199 and len(rest) < 199


async def test_context_comes_before_the_cursor(broker: Broker) -> None:
    ids = [await broker.publish("r", "values", str(i).encode()) for i in range(10)]
    got = [(ev.context, ev.data) async for ev in _until_end(broker, "r", after=ids[3], context=True)]
    assert got == [(True, b"%d" % i) for i in range(4)] + [(False, b"%d" % i) for i in range(4, 12)]
    # A join from now: everything kept so far is context.
    joined = broker.subscribe("r", context=True)
    seen = [await anext(joined) for _ in range(12)]
    assert [ev.context for ev in seen] == [True] * 12
    assert [ev.data for ev in seen][-2:] == [b"10", b"11"]
    await joined.aclose()  # type: ignore[attr-defined]  # each broker's `subscribe` is an async generator


async def _until_end(broker: Broker, run_id: str, **kwargs: object) -> AsyncIterator[StreamEvent]:
    """Subscribe, publish two more events and end the stream."""
    subscription = broker.subscribe(run_id, **kwargs)  # type: ignore[arg-type]
    first = await anext(subscription)
    for i in (10, 11):
        await broker.publish(run_id, "values", b"%d" % i)
    await broker.end_stream(run_id)
    yield first
    async for ev in subscription:
        yield ev


async def test_live_subscriber_gets_events_in_order(broker: Broker) -> None:
    got = asyncio.create_task(_collect(broker, "r", replay=True))
    for i in range(5):
        await broker.publish("r", "custom", str(i).encode())
        await asyncio.sleep(0)
    await broker.end_stream("r")
    assert await got == _numbers(*range(5))


async def test_concurrent_publishes_reach_a_live_subscriber_each_once(broker: Broker) -> None:
    """Publishes of one run from several tasks while a subscriber is waking: every event arrives once, with an
    id of its own. (The memory broker numbered an event before taking its lock and stored it with the number
    current after, so two publishes that waited for the lock stored one number twice and a subscriber whose
    cursor had passed it lost the second event: a join missed a run's last `custom` event under load.)"""
    got = asyncio.create_task(_collect_events(broker, "r", replay=True))
    for round_ in range(20):
        await asyncio.gather(*(broker.publish("r", "custom", f"{round_}-{i}".encode()) for i in range(5)))
        await asyncio.sleep(0)
    await broker.end_stream("r")
    events = await got
    assert sorted(e.data for e in events) == sorted(f"{r}-{i}".encode() for r in range(20) for i in range(5))
    assert len({e.id for e in events}) == len(events)


async def test_publishes_to_several_runs_at_once_get_their_own_runs_ids(broker: Broker) -> None:
    """Events of several runs published together (one batch, one statement on PostgreSQL): each publish gets
    the id its event has in its own run, and each run replays only its own events."""
    runs = ["a", "b", "c"]
    sent: dict[str, list[tuple[str, bytes]]] = {run_id: [] for run_id in runs}

    async def publish(run_id: str, data: bytes) -> None:
        sent[run_id].append((await broker.publish(run_id, "custom", data), data))

    for round_ in range(5):
        await asyncio.gather(*(publish(run_id, f"{run_id}{round_}-{i}".encode())
                               for i in range(3) for run_id in runs[: round_ % 3 + 1]))
    for run_id in runs:
        await broker.end_stream(run_id)
        got = await _collect_events(broker, run_id, replay=True)
        assert {data: event_id for event_id, data in sent[run_id]} == {ev.data: ev.id for ev in got}
        assert len(got) == len(sent[run_id]) == 3 * len([r for r in range(5) if runs.index(run_id) <= r % 3])


async def test_event_names_data_and_ids_round_trip(broker: Broker) -> None:
    sent = [await broker.publish("r", "messages/partial", b'{"a": [1, "\xc3\xa9"]}'),
            await broker.publish("r", "updates|sub:1", b"{}")]
    await broker.end_stream("r")
    got = [ev async for ev in broker.subscribe("r", replay=True)]
    assert [(ev.id, ev.event, ev.data) for ev in got] == [
        (sent[0], "messages/partial", b'{"a": [1, "\xc3\xa9"]}'), (sent[1], "updates|sub:1", b"{}")]
    assert sent[0] != sent[1]


async def test_last_event_id_that_is_not_an_id_replays_everything(broker: Broker) -> None:
    for i in range(3):
        await broker.publish("r", "values", str(i).encode())
    await broker.end_stream("r")
    assert await _collect(broker, "r", after="not-an-id") == _numbers(0, 1, 2)


async def test_last_event_id_from_before_a_restart_replays_everything(broker: Broker) -> None:
    """A client that resumes after the server restarted sends an id the new process did not make: every
    event buffered now came after it (the run went back to the queue and started again)."""
    earlier = f"{int(time.time() * 1000) - 60_000}-7"  # a higher sequence number than any event below
    for i in range(3):
        await broker.publish("r", "values", str(i).encode())
    await broker.end_stream("r")
    assert await _collect(broker, "r", after=earlier) == _numbers(0, 1, 2)


async def test_stream_started_once_something_is_published(broker: Broker, peer: Broker) -> None:
    assert not await peer.stream_started("r")
    await broker.publish("r", "metadata", b"{}")
    assert await peer.stream_started("r")


async def test_the_end_is_final(broker: Broker, peer: Broker) -> None:
    """Events published after the end do not reopen the stream: they are buffered, and a subscriber drains
    the buffer and stops, never waiting for more."""
    for i in range(3):
        await broker.publish("r", "values", str(i).encode())
    await broker.end_stream("r")
    late = await broker.publish("r", "values", b"3")
    assert await _collect(peer, "r", replay=True) == _numbers(0, 1, 2, 3)
    assert await _collect(peer, "r", after=late) == []
    assert await _collect(peer, "r") == []


async def test_events_cross_processes(broker: Broker, peer: Broker) -> None:
    live = asyncio.create_task(_collect(peer, "r", replay=True))
    ids = [await broker.publish("r", "values", str(i).encode()) for i in range(10)]
    await broker.end_stream("r")
    assert await _collect(peer, "r", after=ids[6]) == _numbers(7, 8, 9)
    assert await _collect(peer, "r", replay=True) == _numbers(*range(10))
    assert await asyncio.wait_for(live, 10) == _numbers(*range(10))


async def test_cancelled_subscriber_releases_its_connection(broker: Broker, peer: Broker) -> None:
    async def consume(got: asyncio.Event) -> None:
        async for _ in peer.subscribe("r", replay=True):
            got.set()

    await broker.publish("r", "values", b"0")
    # More subscribers than a Redis test broker has connections for them: a leak would refuse the later ones.
    for _ in range(3 * Deployment.max_subscribers):
        got = asyncio.Event()
        task = asyncio.create_task(consume(got))
        waiting = asyncio.create_task(got.wait())
        await asyncio.wait([task, waiting], timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # the subscriber failed: show why
        assert got.is_set()
        task.cancel()  # the client left while the subscriber waits for more
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()
    await broker.publish("r", "values", b"1")
    await broker.end_stream("r")
    assert await _collect(peer, "r", replay=True) == _numbers(0, 1)


async def test_posts_are_stored_in_order_and_before_the_end(broker: Broker, peer: Broker) -> None:
    """A run's executor posts its events without waiting for each: they still reach every process in order,
    all of them before the end, which comes last."""
    live = asyncio.create_task(_collect(peer, "r", replay=True))
    other = asyncio.create_task(_collect(peer, "r2", replay=True))
    for i in range(100):
        await broker.post("r", "values", str(i).encode())
        await broker.post("r2", "values", str(-i).encode())
    await broker.end_stream("r")
    assert await _collect(peer, "r", replay=True) == _numbers(*range(100))
    assert await asyncio.wait_for(live, 10) == _numbers(*range(100))
    await broker.end_stream("r2")
    assert await asyncio.wait_for(other, 10) == _numbers(*(-i for i in range(100)))


async def test_posts_and_publishes_keep_their_order(broker: Broker, peer: Broker) -> None:
    """A publish waits for its event to be stored and returns its id; posted before it, events come before."""
    for i in range(30):
        await broker.post("r", "values", str(i).encode())
    last = await broker.publish("r", "values", b"30")
    await broker.end_stream("r")
    got = [ev async for ev in peer.subscribe("r", replay=True)]
    assert [ev.data for ev in got] == _numbers(*range(31))
    assert got[-1].id == last


async def test_a_posted_stream_expires_after_its_end(redis_deployment: Deployment) -> None:
    """Posted events keep the stream alive for `live_seconds`; its end shortens that to `retain_seconds`."""
    broker = await redis_deployment.open()
    assert isinstance(broker, RedisBroker)
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await broker.post("r", "values", b"0")
        await broker.end_stream("r2")  # another run's end: sent after r's post, so r's post is stored
        assert broker.retain_seconds < await client.ttl(redis_deployment.keys.events("r")) <= broker.live_seconds
        await broker.post("r", "values", b"1")
        await broker.end_stream("r")
        for key in (redis_deployment.keys.events("r"), redis_deployment.keys.end("r")):
            assert 0 < await client.ttl(key) <= broker.retain_seconds
    finally:
        await client.aclose()


# Wake-ups.


async def test_one_wake_up_wakes_one_waiter(broker: Broker) -> None:
    woke: list[int] = []

    async def waiter(i: int) -> None:
        await broker.wait_for_work(3600)
        woke.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    for _ in range(5):
        await asyncio.sleep(0)
    await broker.wake_workers()
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(woke) == 1
    await broker.wake_workers()
    await broker.wake_workers()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)  # a lost wake-up would hang here
    assert sorted(woke) == [0, 1, 2]


async def test_wake_up_before_wait_is_not_lost(broker: Broker) -> None:
    await broker.wake_workers()
    await asyncio.wait_for(broker.wait_for_work(3600), 10)  # a lost wake-up would hang here


async def test_wake_up_crosses_processes(broker: Broker, peer: Broker) -> None:
    waiter = asyncio.create_task(peer.wait_for_work(3600))
    await broker.wake_workers()
    await asyncio.wait_for(waiter, 10)  # a lost wake-up would hang here


async def _blocked_takers(deployment: Deployment) -> int:
    """How many connections wait in a BLPOP on the deployment's wake-up tokens."""
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        return sum(1 for c in await client.client_list() if c.get("cmd") == "blpop")
    finally:
        await client.aclose()


async def test_redis_wake_up_wakes_one_process_of_many(redis_deployment: Deployment) -> None:
    """On Redis a wake-up is a token one waiting process takes, not a message every process claims for (all but
    one of them finding nothing)."""
    api = await redis_deployment.open()  # a process without a claimer, as an API process
    peers = [await redis_deployment.open() for _ in range(3)]
    waiters = [asyncio.create_task(peer.wait_for_work(3600)) for peer in peers]
    await until(lambda: _blocked_takers(redis_deployment), what="the peers waiting for a token")
    await api.wake_workers()
    await until(lambda: any(w.done() for w in waiters), what="one peer woken")
    await asyncio.sleep(0.3)  # time for a second one to wake, were the wake-up sent to every process
    assert sum(w.done() for w in waiters) == 1
    for _ in range(2):
        await api.wake_workers()
    await asyncio.wait_for(asyncio.gather(*waiters), 10)  # each wake-up woke another: none was lost


async def test_redis_token_taken_by_a_process_no_longer_waiting_goes_to_another(
        redis_deployment: Deployment) -> None:
    api = await redis_deployment.open()
    first, second = await redis_deployment.open(), await redis_deployment.open()
    waiting = asyncio.create_task(first.wait_for_work(3600))
    await until(lambda: _blocked_takers(redis_deployment), what="the first process waiting for a token")
    await first.wake_here()  # woken by its own run's end: it waits no more, its BLPOP is still out
    await asyncio.wait_for(waiting, 10)
    await api.wake_workers()  # taken by the first process's BLPOP, with no claimer to hand it to
    await asyncio.wait_for(second.wait_for_work(3600), 10)  # a lost token would hang here


@pytest.mark.parametrize("cancels", [2, 3])
async def test_idle_slots_cancelled_in_quick_succession_end_and_wake_ups_still_work(broker: Broker,
                                                                                     cancels: int) -> None:
    """A shutdown cancels every idle slot, and a second signal (or asyncio's own teardown) cancels them again
    before they have finished: each must end, and the broker must still hand out wake-ups. On Python 3.11 a
    condition wait under `asyncio.wait_for` left its lock held here, and every later wake-up hung on it."""
    waiters = [asyncio.create_task(broker.wait_for_work(3600)) for _ in range(4)]
    for _ in range(3):
        await asyncio.sleep(0)
    for _ in range(cancels):
        for waiter in waiters:
            waiter.cancel()
        await asyncio.sleep(0)
    async with asyncio.timeout(5):
        ended = await asyncio.gather(*waiters, return_exceptions=True)
    assert all(isinstance(e, asyncio.CancelledError) for e in ended)
    async with asyncio.timeout(5):
        await broker.wake_workers()
        await broker.wait_for_work(3600)  # the wake-up was not lost to the cancelled slots


async def test_a_slot_cancelled_as_it_is_woken_passes_the_wake_up_on(broker: Broker) -> None:
    first = asyncio.create_task(broker.wait_for_work(3600))
    for _ in range(3):
        await asyncio.sleep(0)
    await broker.wake_workers()
    first.cancel()  # before it has run: it was handed the wake-up, and cannot take it
    with contextlib.suppress(asyncio.CancelledError):
        await first
    async with asyncio.timeout(5):
        await broker.wait_for_work(3600)


# Run done.


async def test_run_done_crosses_processes(broker: Broker, peer: Broker) -> None:
    done = peer.listen_run_done("r")
    other = peer.listen_run_done("r2")
    await broker.notify_run_done("r")
    assert await done(10)
    assert not await other(0.05)  # only the run that is done


# Cancel.


async def test_cancel_sent_before_registration_is_applied(broker: Broker) -> None:
    await broker.send_cancel("r", "rollback")
    seen: list[str] = []
    unregister = await broker.on_cancel("r", seen.append)
    assert seen == ["rollback"]
    unregister()


async def test_cancel_before_registration_in_another_process_is_applied_once(broker: Broker, peer: Broker) -> None:
    await broker.send_cancel("r", "rollback")
    seen: list[str] = []
    unregister = await peer.on_cancel("r", seen.append)
    assert seen == ["rollback"]
    unregister()
    again: list[str] = []
    (await peer.on_cancel("r", again.append))()
    assert again == []


async def test_cancel_after_registration_reaches_another_process(broker: Broker, peer: Broker) -> None:
    seen: list[str] = []
    got = asyncio.Event()

    def callback(action: str) -> None:
        seen.append(action)
        got.set()

    unregister = await peer.on_cancel("r", callback)
    await broker.send_cancel("r", "interrupt")
    await asyncio.wait_for(got.wait(), 10)
    assert seen == ["interrupt"]
    unregister()
    # Delivered, so nothing is left over for a later registration; a new cancel is kept for one.
    again: list[str] = []
    (await peer.on_cancel("r", again.append))()
    assert again == []
    await broker.send_cancel("r", "rollback")
    (await peer.on_cancel("r", again.append))()
    assert again == ["rollback"]


# Redis only: a cancel that crosses its worker's registration in the same process.


async def test_redis_cancel_stored_after_its_worker_looked_is_still_applied(
        redis_deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker registers after the sender found no callback, and looks for a stored cancel before the sender
    has stored it (its pipeline is held back here until the registration is done). The listener skips the
    process's own messages, so the sender must apply it: before, the cancel was lost and the run went on to
    `success` (test_cancel_and_stream_join saw it under load)."""
    broker = await redis_deployment.open()
    held = asyncio.Event()
    pipeline = broker._redis.pipeline  # type: ignore[attr-defined]

    def held_pipeline(*args: object, **kwargs: object) -> object:
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute

        async def execute_when_released() -> object:
            await held.wait()
            return await execute()

        pipe.execute = execute_when_released
        return pipe

    monkeypatch.setattr(broker._redis, "pipeline", held_pipeline)  # type: ignore[attr-defined]
    sending = asyncio.create_task(broker.send_cancel("r", "interrupt"))
    await asyncio.sleep(0.05)  # the sender found no callback and waits to store the cancel
    seen: list[str] = []
    monkeypatch.setattr(broker._redis, "pipeline", pipeline)  # type: ignore[attr-defined]
    unregister = await broker.on_cancel("r", seen.append)  # looks before the cancel is stored
    assert seen == []
    held.set()
    await sending
    await asyncio.sleep(0.2)  # a second application (the listener's) would come by now
    assert seen == ["interrupt"]
    unregister()


# Redis only: what a process sees when its connection to Redis drops.


async def test_redis_listener_recovers_from_a_dropped_connection(
        redis_deployment: Deployment, caplog: pytest.LogCaptureFixture) -> None:
    broker = await redis_deployment.open()
    peer = await redis_deployment.another_process(broker)
    got = asyncio.Event()
    unregister = await peer.on_cancel("r", lambda action: got.set())
    done = peer.listen_run_done("r")
    client = aioredis.Redis.from_url(REDIS_URL)
    listeners = [c["id"] for c in await client.client_list(_type="pubsub")
                 if c.get("name") == redis_deployment.keys.listener_name]
    assert len(listeners) == 2
    with caplog.at_level(logging.WARNING, logger="threadline.broker"):
        for client_id in listeners:
            await client.client_kill_filter(_id=client_id)
        # Sent while the listeners may be gone: each is recovered when they resubscribe.
        await broker.send_cancel("r", "interrupt")
        await broker.notify_run_done("r")
        await asyncio.wait_for(got.wait(), 30)
        assert await done(30)
        waiter = asyncio.create_task(peer.wait_for_work(3600))
        await broker.wake_workers()
        await asyncio.wait_for(waiter, 30)
    await client.aclose()
    unregister()
    # One line per process when its listener lost Redis, one when it is back; no line per retry.
    assert caplog.text.count("Redis unavailable") == 2 and caplog.text.count("Redis is back") == 2, caplog.text


async def test_redis_unreachable_is_unavailable() -> None:
    broker = RedisBroker("redis://127.0.0.1:1/0", key_prefix=owned_name(KEY_PREFIX))
    with pytest.raises(Unavailable):
        await broker.start()
    with pytest.raises(Unavailable):
        await broker.ping()
    await broker.close()


async def test_posts_redis_cannot_store_are_logged_and_the_end_fails(
        redis_deployment: Deployment, caplog: pytest.LogCaptureFixture) -> None:
    """A run does not wait for its posts, so Redis failing under them does not fail the run: the lost
    events are logged, and only the end of the stream, which the run does wait for, reports the failure."""
    broker = await redis_deployment.open()
    assert isinstance(broker, RedisBroker)
    await broker.post("r", "values", b"0")
    await broker.end_stream("r0")  # goes after r's post: once it returns, the post is stored
    healthy = broker._redis
    broker._redis = aioredis.Redis.from_url("redis://127.0.0.1:1/0")  # Redis is gone
    try:
        with caplog.at_level(logging.WARNING, logger="threadline.broker"):
            await broker.post("r", "values", b"1")  # returns at once, as when Redis is up
            with pytest.raises(Unavailable):
                await broker.end_stream("r")
        assert caplog.text.count("Redis unavailable") == 1  # the outage's first line: not one per item
    finally:
        await broker._redis.aclose()
        broker._redis = healthy
    with caplog.at_level(logging.WARNING, logger="threadline.broker"):
        await broker.post("r", "values", b"2")  # Redis is back: posting goes on
        await broker.end_stream("r")
    # The outage's last line counts what was lost (the post and the end, in one batch or two).
    assert re.search(r"Redis is back after [\d.]+ s: \d+ exchanges failed and 2 stream events, ends and signals "
                     r"were not sent", caplog.text), caplog.text
    assert await _collect(broker, "r", replay=True) == _numbers(0, 2)


async def test_redis_posts_survive_a_dropped_connection_and_a_missing_script(
        redis_deployment: Deployment, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch goes out as one script call on the outbox's own connection (`broker/redis_posts.py`). When Redis
    closed that connection while it was idle (a restart, an idle timeout), the next batch is sent on a fresh
    one and nothing is lost; when Redis does not know the script (a restart, `SCRIPT FLUSH`: here, a digest it
    never saw), the script is sent whole."""
    broker = await redis_deployment.open()
    assert isinstance(broker, RedisBroker)
    await broker.post("r", "values", b"0")
    await broker.publish("r", "values", b"1")  # the outbox's connection is open now
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        poster = broker._poster[1]
        await poster.send_command("CLIENT", "ID")
        await client.client_kill_filter(_id=await poster.read_response())
        await broker.post("r", "values", b"2")
        event_id = await broker.publish("r", "values", b"3")
        monkeypatch.setattr("threadline.broker.redis_posts.POST_SHA", "0" * 40)
        await broker.post("r", "values", b"4")
        await broker.end_stream("r")
    finally:
        await client.aclose()
    events = await _collect_events(broker, "r", replay=True)
    assert [ev.data for ev in events] == _numbers(0, 1, 2, 3, 4) and events[3].id == event_id


async def test_a_stream_end_lost_in_an_outage_is_sent_once_redis_is_back(redis_deployment: Deployment) -> None:
    """A run that ends while Redis is away: its end is not sent, and Redis (not restarted: a partition) still
    holds its events. Once Redis answers again the end is sent by itself, so a client resuming the stream gets
    what was kept and the stream ends, instead of waiting for an end that never comes."""
    broker = await redis_deployment.open()
    assert isinstance(broker, RedisBroker)
    await broker.post("r", "values", b"0")
    await broker.end_stream("r0")  # once it returns, r's post is stored
    healthy = broker._redis
    broker._redis = aioredis.Redis.from_url("redis://127.0.0.1:1/0")  # Redis is gone
    try:
        with pytest.raises(Unavailable):
            await broker.end_stream("r")
    finally:
        await broker._redis.aclose()
        broker._redis = healthy
    assert not await broker._redis.exists(redis_deployment.keys.end("r"))
    await broker.ping()  # the first exchange that succeeds ends the outage
    assert await asyncio.wait_for(_collect(broker, "r", after="0-0"), 30) == _numbers(0)


async def _stream_reads(deployment: Deployment) -> list[dict[str, Any]]:
    """The deployment's stream-reading connections (`broker/redis_reads.py`), as Redis lists them."""
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        return [c for c in await client.client_list() if c.get("name") == deployment.keys.reads_name]
    finally:
        await client.aclose()


async def _one_blocked_read(deployment: Deployment) -> bool:
    reads = await _stream_reads(deployment)
    return len(reads) == 1 and reads[0].get("cmd") == "xread" and "b" in reads[0].get("flags", "")


async def test_redis_subscribers_of_many_runs_share_one_read_and_each_gets_its_events_once(
        redis_deployment: Deployment) -> None:
    """An API process reads the streams of all its subscribers with one `XREAD` on one connection: while
    subscribers of six runs (two of them on one run, from different cursors) wait, one read is blocked for them
    all; then each gets its own run's events, every one exactly once and in order, and its end."""
    api, worker = await redis_deployment.open(), await redis_deployment.open()
    runs = [f"r{i}" for i in range(6)]
    first = {run: await worker.publish(run, "values", b"0") for run in runs}
    live = {run: asyncio.create_task(_collect_events(api, run, after=first[run])) for run in runs}
    replaying = asyncio.create_task(_collect_events(api, "r0", replay=True))
    await until(lambda: _one_blocked_read(redis_deployment), what="one blocked XREAD for every subscriber")
    n = 300
    for i in range(1, n + 1):  # interleaved, so that most reads carry several runs' events
        for run in runs:
            await worker.post(run, "values", b"%d" % i)
    for run in runs:
        await worker.end_stream(run)
    for run, task in live.items():
        got = await asyncio.wait_for(task, 30)
        assert [ev.data for ev in got] == _numbers(*range(1, n + 1)), run
        assert [_stream_id(ev.id) for ev in got] == sorted({_stream_id(ev.id) for ev in got}), run
    assert [ev.data for ev in await asyncio.wait_for(replaying, 30)] == _numbers(*range(n + 1))
    assert len(await _stream_reads(redis_deployment)) == 1  # still the one connection


def _stream_id(event_id: str) -> tuple[int, int]:
    ms, _, n = event_id.partition("-")
    return int(ms), int(n)


async def test_redis_a_subscriber_that_stops_reading_stalls_no_one_and_holds_no_more(
        redis_deployment: Deployment) -> None:
    """A subscriber that took a batch and stopped (its client reads slowly) is left out of the shared read: the
    process holds nothing more for it while the subscribers of other runs get all their events and their ends;
    once it reads again it gets the rest of its run, exactly once and in order."""
    api, worker = await redis_deployment.open(), await redis_deployment.open()
    assert isinstance(api, RedisBroker)
    data = [b"%04d" % i + b"x" * 2_000 for i in range(700)]  # the first read takes 500: the rest is ~400 kB
    for d in data:
        await worker.post("slow", "values", d)
    await worker.end_stream("r")  # once it returns, the posts are stored
    stopped = api.subscribe_batches("slow", replay=True)
    got = list(await anext(stopped))
    assert 0 < len(got) < len(data)
    others = {run: asyncio.create_task(_collect(api, run, replay=True)) for run in ("a", "b")}
    for i in range(100):
        for run in others:
            await worker.post(run, "values", b"%d" % i)
    for run in others:
        await worker.end_stream(run)
    for task in others.values():
        assert await asyncio.wait_for(task, 30) == _numbers(*range(100))
    held = [follower.ready for follower in api._reads._followers]
    assert len(held) == 1 and not isinstance(held[0], BaseException)
    assert sum(len(fields[3]) for _, fields in held[0] or []) <= api.batch_bytes + 2_100
    await worker.end_stream("slow")
    got += [ev async for batch in stopped for ev in batch]
    assert [ev.data for ev in got] == data


async def _join_is_read(api: Broker, worker: Broker, waiting: asyncio.Task[Any]) -> None:
    """Run "b" joins the read that run "a"'s subscriber (`waiting`) is blocked in: it gets its event and its end,
    and so does "a" once ended."""
    joined = asyncio.create_task(_collect(api, "b", replay=True))
    await worker.post("b", "values", b"0")
    await worker.end_stream("b")
    assert await asyncio.wait_for(joined, 30) == _numbers(0)
    await worker.end_stream("a")
    assert await asyncio.wait_for(waiting, 30) == []


async def test_redis_a_subscriber_joining_a_long_blocked_read_is_read_without_waiting_for_it(
        redis_deployment: Deployment) -> None:
    """A read blocked for every subscriber of a process (here for an hour) is unblocked when another subscriber
    joins, which gets its events and its end without waiting for the read to time out."""
    api, worker = await redis_deployment.open(), await redis_deployment.open()
    assert isinstance(api, RedisBroker)
    api._reads.block_seconds = 3600.0
    waiting = asyncio.create_task(_collect(api, "a", replay=True))
    await until(lambda: _one_blocked_read(redis_deployment), what="the read blocked for the first subscriber")
    await _join_is_read(api, worker, waiting)


async def test_redis_where_an_acl_refuses_client_unblock_a_join_is_still_read(
        redis_deployment: Deployment, caplog: pytest.LogCaptureFixture) -> None:
    """A Redis user without `CLIENT UNBLOCK` (an admin command an ACL may refuse): the process learns it on its
    reading connection, says so once, and its read blocks briefly instead, so a subscriber that joins a read
    (whose timeout is an hour here) still gets its events and its end."""
    user = redis_deployment.keys.prefix.replace(" ", "_") + "-no-unblock"
    admin = aioredis.Redis.from_url(REDIS_URL)
    await admin.execute_command("ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-client|unblock")
    try:
        scheme, _, rest = REDIS_URL.partition("://")
        api = RedisBroker(f"{scheme}://{user}:pw@{rest}", key_prefix=redis_deployment.keys.prefix)
        redis_deployment.opened.append(api)
        await api.start()
        worker = await redis_deployment.open()
        api._reads.block_seconds = 3600.0
        waiting = asyncio.create_task(_collect(api, "a", replay=True))
        await until(lambda: not api._reads.unblock, what="the refusal seen")
        assert "CLIENT UNBLOCK is refused" in caplog.text
        await _join_is_read(api, worker, waiting)
    finally:
        await admin.execute_command("ACL", "DELUSER", user)
        await admin.aclose()


async def test_redis_a_read_that_fails_unexpectedly_fails_its_subscribers_and_the_reader_goes_on(
        redis_deployment: Deployment, caplog: pytest.LogCaptureFixture) -> None:
    """An error the shared read did not expect (a bug in handing out a reply, not an outage) fails the subscribers
    that were in that read, as an outage would (`Unavailable`, a 503 or an `error` event to their clients), is
    logged, and leaves the reader serving: it waits for the next subscriber instead of reading again at once."""
    api, worker = await redis_deployment.open(), await redis_deployment.open()
    assert isinstance(api, RedisBroker)
    reads = api._reads
    real = reads._deliver
    broken = True

    def deliver(*args: Any) -> None:
        if broken:
            raise RuntimeError("a bug")
        real(*args)

    reads._deliver = deliver  # type: ignore[method-assign,assignment]  # the fault, on this one reader
    failing = asyncio.create_task(_collect(api, "a", replay=True))
    await until(lambda: reads.reads >= 1, what="the first read")
    await worker.post("a", "values", b"0")
    with pytest.raises(Unavailable):
        await asyncio.wait_for(failing, 30)
    assert "the stream read failed" in caplog.text
    sent = reads.reads
    await asyncio.sleep(0.3)
    assert reads.reads == sent  # nobody wants a batch: no read (no loop on the failure)
    broken = False
    await worker.post("b", "values", b"1")
    await worker.end_stream("b")
    assert await asyncio.wait_for(_collect(api, "b", replay=True), 30) == _numbers(1)


# Leases (the stream cap shared by every API process).


async def test_leases_are_counted_across_processes_up_to_the_limit(broker: Broker, peer: Broker) -> None:
    """A scope holds at most `limit` live leases, whichever process takes them; a dropped one makes room,
    and scopes are counted apart."""
    first = await broker.take_lease("streams:a", 2, 60)
    second = await peer.take_lease("streams:a", 2, 60)
    assert first and second and first != second
    assert await broker.take_lease("streams:a", 2, 60) is None
    assert await peer.take_lease("streams:a", 2, 60) is None
    assert await peer.take_lease("streams:b", 2, 60)  # another identity's
    await peer.drop_lease("streams:a", first)  # any process may give it back
    await peer.drop_lease("streams:a", first)  # twice is no error
    assert await broker.take_lease("streams:a", 2, 60)
    assert await peer.take_lease("streams:a", 2, 60) is None


async def test_concurrent_takes_never_pass_the_limit(broker: Broker, peer: Broker) -> None:
    taken = await asyncio.gather(*(b.take_lease("streams:a", 3, 60) for b in [broker, peer] * 10))
    assert sum(1 for lease in taken if lease) == 3


# Rate limits: `Broker.rate_counters`, the `limits` storage of the deployment's budgets (api/ratelimit.py).

DAILY = parse("4/day")


async def test_a_rate_budget_is_spent_across_processes(broker: Broker, peer: Broker) -> None:
    """Every process of a deployment counts into one budget (in process, the process is the deployment)."""
    here, there = (SlidingWindowCounterRateLimiter(b.rate_counters) for b in (broker, peer))
    taken = [await limiter.hit(DAILY, "runs", "ip:a") for limiter in (here, there) * 3]
    assert taken == [True, True, True, True, False, False]
    assert await here.hit(DAILY, "runs", "ip:b")  # another identity's budget
    stats = await there.get_window_stats(DAILY, "runs", "ip:a")
    assert stats.remaining == 0 and time.time() < stats.reset_time <= time.time() + 2 * 86400 + 1
    assert not await there.test(DAILY, "runs", "ip:a")
    await here.clear(DAILY, "runs", "ip:a")
    assert await there.hit(DAILY, "runs", "ip:a")


async def test_concurrent_hits_never_pass_the_rate_budget(broker: Broker, peer: Broker) -> None:
    limiters = [SlidingWindowCounterRateLimiter(b.rate_counters) for b in (broker, peer)]
    taken = await asyncio.gather(*(limiter.hit(DAILY, "runs", "ip:a") for limiter in limiters * 10))
    assert sum(taken) == 4


async def test_postgres_rate_windows_slide_on_the_databases_clock(pg_deployment: Deployment) -> None:
    """The previous window's hits count while it overlaps the last `expiry` seconds; older ones not at all;
    idle keys are swept."""
    broker = await pg_deployment.open()
    assert isinstance(broker, PostgresBroker)
    limiter = SlidingWindowCounterRateLimiter(broker.rate_counters)
    assert [await limiter.hit(DAILY, "runs", "ip:a") for _ in range(5)] == [True] * 4 + [False]
    names = PgNames(pg_deployment.keys.prefix)
    async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as conn:
        await conn.execute(f"UPDATE {names.windows} SET win = win - 1")  # the hits are the previous window's now
        previous, weight, current, _ = await broker.rate_counters.get_sliding_window(  # type: ignore[attr-defined]
            DAILY.key_for("runs", "ip:a"), DAILY.get_expiry())
        assert (previous, current) == (4, 0) and 0 < weight <= 86400
        await conn.execute(f"UPDATE {names.windows} SET win = win - 1")  # two windows back: forgotten
        assert [await limiter.hit(DAILY, "runs", "ip:a") for _ in range(5)] == [True] * 4 + [False]
        await conn.execute(f"UPDATE {names.windows} SET expires_at = now() - interval '1 second'")
        broker._swept_at = -broker.sweep_seconds  # due now
        await broker._housekeeping()
        assert not await (await conn.execute(f"SELECT 1 FROM {names.windows}")).fetchall()


async def test_a_lease_not_renewed_expires_and_a_renewed_one_does_not(deployment: Deployment, broker: Broker,
                                                                     peer: Broker) -> None:
    """A process that dies cannot drop its leases: they expire `seconds` after they were taken or last renewed;
    one renewed after it expired is held again."""
    kept = await broker.take_lease("streams:a", 2, 1.0)
    lost = await broker.take_lease("streams:a", 2, 1.0)
    assert kept and lost
    assert await peer.take_lease("streams:a", 2, 60) is None
    started = time.monotonic()

    async def renewed_and_retaken() -> str | None:
        await broker.renew_leases({"streams:a": [kept]}, 1.0)
        return await peer.take_lease("streams:a", 2, 60)

    retaken = await until(renewed_and_retaken, timeout=15, interval=0.2, what="the unrenewed lease to expire")
    assert time.monotonic() - started >= 0.9  # not before its time
    await deployment.expire_leases("streams:a")  # both held leases' lives past, on the broker's clock
    await broker.renew_leases({"streams:a": [kept]}, 60)
    await peer.renew_leases({"streams:a": [retaken]}, 60)
    assert await peer.take_lease("streams:a", 2, 60) is None  # both held again: the scope is full


async def test_the_process_keeper_renews_what_it_holds_and_releases_once(deployment: Deployment, broker: Broker,
                                                                         peer: Broker) -> None:
    ticks = Ticks()
    leases = Leases(broker, 60, sleep=ticks.sleep)
    try:
        release = await leases.take("streams:a", 1)
        assert release is not None
        assert await leases.take("streams:a", 1) is None
        await deployment.expire_leases("streams:a")  # past the lease's life: only its renewals keep it
        await ticks.tick()  # the keeper's next round
        assert await peer.take_lease("streams:a", 1, 60) is None
        await release()
        await release()
        other = await peer.take_lease("streams:a", 1, 60)
        assert other is not None
        assert await leases.take("streams:a", 1) is None  # the second release dropped nobody else's
        assert leases.held == {}
    finally:
        await leases.close()


def test_byte_budget_says_how_many_newest_events_to_keep() -> None:
    """The Redis broker's account (pure): per run by bytes and count, then the process's total, finished
    runs first and whole, then the largest running run; finished runs are forgotten once expired."""
    now = [0.0]
    budget = ByteBudget(buffer_events=5, buffer_bytes=2_000, total_bytes=2_500, retain_seconds=600,
                        clock=lambda: now[0])
    for _ in range(4):
        budget.added("a", 600)
    assert budget.trims() == {"a": 3}  # 2,400 bytes: the oldest goes
    for _ in range(6):
        budget.added("b", 100)
    assert budget.trims() == {"b": 5}  # six events: one over the count
    budget.ended("a")
    budget.added("c", 900)  # 1,800 + 500 + 900 > 2,500: "a" (finished) goes whole
    assert budget.trims() == {"a": 0} and budget.held == 1_400
    budget.added("c", 900)
    budget.added("c", 900)  # "c" over its own 2,000
    assert budget.trims() == {"c": 2} and budget.held == 2_300
    budget.added("b", 300)
    budget.added("b", 200)  # over the total with nothing finished: the largest running run's oldest
    assert budget.trims() == {"b": 5, "c": 1} and budget.held == 1_700
    budget.ended("b")
    now[0] = 601.0
    budget.ended("c")  # "b" expired in Redis by now: no longer counted
    assert budget.held == 900 and budget.trims() == {}


# PostgreSQL only: the listening connection dropping, an unreachable server, retention.


@pytest.fixture
async def pg_deployment() -> AsyncIterator[Deployment]:
    deployment = Deployment("postgres")
    yield deployment
    await deployment.close()


async def test_postgres_listener_recovers_from_a_dropped_connection(
        pg_deployment: Deployment, caplog: pytest.LogCaptureFixture) -> None:
    broker = await pg_deployment.open()
    peer = await pg_deployment.another_process(broker)
    got = asyncio.Event()
    unregister = await peer.on_cancel("r", lambda action: got.set())
    done = peer.listen_run_done("r")
    live = asyncio.create_task(_collect(peer, "r", replay=True))
    names = PgNames(pg_deployment.keys.prefix)
    async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as admin:
        with caplog.at_level(logging.INFO, logger="threadline.broker"):
            killed = await (await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
                (names.listener_name,))).fetchall()
            assert len(killed) == 2
            # Sent while the listeners may be gone: each is recovered when they listen again.
            await broker.publish("r", "values", b"0")
            await broker.send_cancel("r", "interrupt")
            await broker.notify_run_done("r")
            await broker.end_stream("r")
            await asyncio.wait_for(got.wait(), 30)
            assert await done(30)
            assert await asyncio.wait_for(live, 30) == [b"0"]
            waiter = asyncio.create_task(peer.wait_for_work(3600))
            await broker.wake_workers()
            await asyncio.wait_for(waiter, 30)
    unregister()
    assert "listening again" in caplog.text


async def test_postgres_broker_replaces_a_pooled_connection_the_server_closed(pg_deployment: Deployment) -> None:
    """The pool checks a connection at checkout without a round trip (one per statement doubled them): a
    connection the server terminated while it was idle is still found out and replaced, not handed to a publish."""
    broker = await pg_deployment.open()
    assert isinstance(broker, PostgresBroker)
    await broker.publish("r", "values", b"0")
    async with broker._pool.connection() as conn:  # the pool holds one connection while idle (min_size)
        pid = conn.info.backend_pid
    async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as admin:
        assert await (await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))).fetchone() == (True,)
        await until(lambda: _gone(admin, pid), what="the backend is gone")
    await broker.publish("r", "values", b"1")
    await broker.end_stream("r")
    assert [ev.data async for ev in broker.subscribe("r", replay=True)] == [b"0", b"1"]


async def _gone(admin: psycopg.AsyncConnection[Any], pid: int) -> bool:
    return not await (await admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))).fetchall()


async def test_postgres_one_notification_wakes_every_run_of_a_batch(pg_deployment: Deployment) -> None:
    """A batch's runs share its "stream changed" notifications (as many as their ids need: a payload stays
    under NOTIFY's limit); here the peer only looks again when notified, and every run's subscriber is woken."""
    broker = await pg_deployment.open()
    peer = await pg_deployment.another_process(broker)
    assert isinstance(peer, PostgresBroker)
    peer.block_seconds = 3600.0
    runs = [f"{i:03d}-" + "r" * 120 for i in range(100)]  # 12 kB of ids: more than one payload
    await asyncio.gather(*(broker.publish(run_id, "values", b"0") for run_id in runs))
    subscriptions = [peer.subscribe(run_id, replay=True) for run_id in runs]
    assert [(await anext(sub)).data for sub in subscriptions] == [b"0"] * len(runs)
    nexts = [asyncio.ensure_future(anext(sub)) for sub in subscriptions]
    await asyncio.sleep(0.2)  # the subscribers read, found nothing, and wait for a notification
    await asyncio.gather(*(broker.publish(run_id, "values", b"1") for run_id in runs))
    done = await asyncio.wait_for(asyncio.gather(*nexts), 30)
    assert [ev.data for ev in done] == [b"1"] * len(runs)
    await asyncio.gather(*(broker.end_stream(run_id) for run_id in runs))  # ends are notified alike
    ends = await asyncio.wait_for(asyncio.gather(*(anext(sub, None) for sub in subscriptions)), 30)
    assert ends == [None] * len(runs)


async def test_postgres_unreachable_is_unavailable() -> None:
    broker = PostgresBroker("postgresql://postgres@127.0.0.1:1/test", key_prefix=owned_name(KEY_PREFIX))
    broker.command_seconds = 0.5  # refused at once, but the pool retries until its bound (5 s by default)
    with pytest.raises(Unavailable):
        await broker.start()
    with pytest.raises(Unavailable):
        await broker.ping()
    await broker.close()


async def test_postgres_streams_are_forgotten_after_their_retention(pg_deployment: Deployment) -> None:
    """A finished stream is kept `retain_seconds` after its end, a running one `live_seconds` after its last
    event; the periodic sweep forgets them (here made older by moving their times back)."""
    broker = await pg_deployment.open()
    assert isinstance(broker, PostgresBroker)
    for run_id in ("ended", "running", "fresh"):
        await broker.publish(run_id, "values", b"0")
    await broker.end_stream("ended")
    await broker.end_stream("fresh")
    names = PgNames(pg_deployment.keys.prefix)
    async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as admin:
        await admin.execute(f"UPDATE {names.streams} SET ended_at = ended_at - interval '601 seconds' "
                            "WHERE run_id = 'ended'")
        await admin.execute(f"UPDATE {names.streams} SET touched_at = touched_at - interval '86401 seconds' "
                            "WHERE run_id = 'running'")
        broker._swept_at = -broker.sweep_seconds  # due now
        await broker._housekeeping()
        left = await (await admin.execute(f"SELECT DISTINCT run_id FROM {names.events}")).fetchall()
    assert left == [("fresh",)]
    assert not await broker.stream_started("ended") and not await broker.stream_started("running")
    assert await _collect(broker, "fresh", replay=True) == [b"0"]


async def test_posts_postgres_cannot_store_are_logged_and_the_end_fails(
        pg_deployment: Deployment, caplog: pytest.LogCaptureFixture) -> None:
    """As on Redis: a run does not wait for its posts; only the end of its stream reports the failure, even
    when no connection could be had at all."""
    from psycopg_pool import AsyncConnectionPool

    broker = await pg_deployment.open()
    assert isinstance(broker, PostgresBroker)
    await broker.post("r", "values", b"0")
    await broker.end_stream("r0")  # goes after r's post: once it returns, the post is stored
    healthy, broker._pool = broker._pool, AsyncConnectionPool("postgresql://postgres@127.0.0.1:1/test", open=False)
    broker.command_seconds = 1.0
    try:
        await broker._pool.open(wait=False)
        with caplog.at_level(logging.WARNING, logger="threadline.broker"):
            await broker.post("r", "values", b"1")  # returns at once, as when the database is up
            with pytest.raises(Unavailable):
                await broker.end_stream("r")
        assert caplog.text.count("PostgreSQL unavailable") == 1  # the outage's first line: not one per item
    finally:
        await broker._pool.close()
        broker._pool = healthy
    with caplog.at_level(logging.WARNING, logger="threadline.broker"):
        await broker.post("r", "values", b"2")  # the database is back: posting goes on
        await broker.end_stream("r")
    # The outage's last line counts what was lost (the post and the end, in one batch or two).
    assert re.search(r"PostgreSQL is back after [\d.]+ s: \d+ exchanges failed and 2 stream events, ends and "
                     r"signals were not sent", caplog.text), caplog.text
    assert await _collect(broker, "r", replay=True) == _numbers(0, 2)


async def test_a_stream_end_lost_in_a_database_outage_is_sent_once_it_is_back(pg_deployment: Deployment) -> None:
    """As on Redis: a run that ends while the database is away has its end sent again once it answers, so a
    client resuming the stream gets what was kept and the stream ends."""
    from psycopg_pool import AsyncConnectionPool

    broker = await pg_deployment.open()
    assert isinstance(broker, PostgresBroker)
    await broker.post("r", "values", b"0")
    await broker.end_stream("r0")  # once it returns, r's post is stored
    healthy, broker._pool = broker._pool, AsyncConnectionPool("postgresql://postgres@127.0.0.1:1/test", open=False)
    broker.command_seconds = 1.0
    try:
        await broker._pool.open(wait=False)
        with pytest.raises(Unavailable):
            await broker.end_stream("r")
    finally:
        await broker._pool.close()
        broker._pool = healthy
    await broker.ping()  # the first exchange that succeeds ends the outage
    assert await asyncio.wait_for(_collect(broker, "r", after="0-0"), 30) == _numbers(0)


# The outbox of the shared brokers.


@pytest.mark.parametrize("kind", ["redis", "postgres"])
async def test_posts_wait_once_the_outbox_holds_its_bytes(kind: str) -> None:
    """Posts do not wait for their events to be stored, but what is posted and not yet stored is bounded by
    bytes: past `outbox_bytes`, a post waits for the broker. Every event is still stored, in order."""
    deployment = Deployment(kind)
    try:
        bound, data = 20_000, b"x" * 1_000
        broker = await deployment.open(outbox_bytes=bound)
        peer = await deployment.open()
        live = asyncio.create_task(_collect(peer, "r", replay=True))
        queued = []
        for _ in range(200):  # 200 events of ~1 KB, ten times the bound, posted without a pause
            await broker.post("r", "values", data)
            queued.append(broker.queued_bytes())
        await broker.end_stream("r")
        assert max(queued) <= bound + event_bytes("values", data)  # never more than the bound and one event
        assert broker.queued_bytes() == 0
        assert await asyncio.wait_for(live, 10) == [data] * 200
    finally:
        await deployment.close()


@pytest.mark.parametrize("kind", ["redis", "postgres"])
async def test_events_posted_within_the_window_share_a_batch_and_what_is_waited_on_goes_at_once(kind: str) -> None:
    """With a coalescing window (`stream_coalesce_ms`), the first event after a quiet spell is sent at once,
    and the events posted within the window after it wait to share the next batch (each token of a model that
    streams from a thread is posted in a loop tick of its own: without the window, a round trip each). What
    someone waits on (a stream's end, an event's id from `publish`) is sent at once, with what is queued. The
    window here is 30 s, so anything held by it would outlast the waits below."""
    deployment = Deployment(kind)
    live: asyncio.Task[list[bytes]] | None = None
    try:
        broker = await deployment.open()
        outbox = broker._outbox  # type: ignore[attr-defined]
        outbox.coalesce = 30.0
        batches: list[list[tuple[str, str]]] = []
        send, first_sent = outbox._send, asyncio.Event()

        async def counted(batch: list[Any]) -> None:
            batches.append([(item, run_id) for item, run_id, _ in batch])
            await send(batch)
            first_sent.set()

        outbox._send = counted
        peer = await deployment.open()
        live = asyncio.create_task(_collect(peer, "r", replay=True))
        await broker.post("r", "values", b"0")
        await asyncio.wait_for(first_sent.wait(), 10)  # the first event after a quiet spell: not held by the window
        assert batches == [[("event", "r")]]
        for i in range(1, 6):  # each in a tick of its own, all within the window
            await broker.post("r", "values", str(i).encode())
            await asyncio.sleep(0)
        assert len(batches) == 1
        assert await asyncio.wait_for(broker.publish("r2", "values", b"p"), 10)  # its id is waited for
        assert batches[1] == [("event", "r")] * 5 + [("event", "r2")]
        await broker.post("r", "values", b"6")
        await asyncio.wait_for(broker.end_stream("r"), 10)  # an end is waited for too
        assert batches[2] == [("event", "r"), ("end", "r")]
        assert await asyncio.wait_for(live, 10) == [str(i).encode() for i in range(7)]
    finally:
        if live is not None:
            live.cancel()
        for opened in deployment.opened:  # nothing left to wait 30 s for when the test failed
            opened._outbox.coalesce = 0.0  # type: ignore[attr-defined]
            opened._outbox._urgent.set()  # type: ignore[attr-defined]
        await deployment.close()


async def test_postgres_event_data_is_compressed_with_lz4_and_read_whole() -> None:
    """The PostgreSQL broker's events are compressed with lz4 where the server has it (pglz took 5-6 ms of its
    CPU to store a 1 MB `values` event), also in a table made by an older version, and come back byte for
    byte (read in the binary format: as text a bytea is written out in hex)."""
    async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as conn:
        try:
            await conn.execute("CREATE TEMP TABLE lz4_probe (v bytea COMPRESSION lz4)")
        except psycopg.errors.FeatureNotSupported:
            pytest.skip("this PostgreSQL was built without lz4")
    deployment = Deployment("postgres")
    try:
        names = PgNames(deployment.keys.prefix)
        await deployment.open()
        async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as conn:
            await conn.execute(f"ALTER TABLE {names.events} ALTER COLUMN data SET COMPRESSION pglz")  # as before
        broker = await deployment.open()  # another process starts: the column is made lz4 again
        async with await psycopg.AsyncConnection.connect(PG_ADMIN_URL, autocommit=True) as conn:
            cur = await conn.execute("SELECT attcompression FROM pg_attribute WHERE attrelid = %s::regclass "
                                     "AND attname = 'data'", (names.events,))
            assert (await cur.fetchone()) == ("l",)
        data = bytes(range(256)) * 4096  # 1 MB, every byte value
        await broker.publish("r", "values", data)
        await broker.end_stream("r")
        assert await asyncio.wait_for(_collect(broker, "r", replay=True), 10) == [data]
    finally:
        await deployment.close()


def test_redis_replies_are_parsed_in_c() -> None:
    """redis-py parses replies and packs commands with hiredis when it is installed (a declared dependency):
    half the CPU of an event's trip through Redis (`bench/redis_path.py`). Fails if packaging drops it."""
    import redis.utils

    assert redis.utils.HIREDIS_AVAILABLE
