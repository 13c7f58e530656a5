"""What a process has queued for a shared broker (Redis, PostgreSQL) and not sent yet, bounded by bytes.

A run's executor posts its events as they come, without waiting for each to be stored: they queue here, and
one sender task sends what is queued, in order, a batch at a time (what is queued while a batch is in flight
goes in the next). When the broker is slower than the runs (a slow link, a busy server), the queue would grow
without bound; instead, once the events queued and in flight weigh `max_bytes` (as `event_bytes` counts
them, the measure of the buffers' byte budgets), an event's post waits until a batch is sent: back-pressure
on the executors that produce faster than the broker takes. Ends and signals are never held back (they
weigh next to nothing, and a run's end must follow its events). What a batch that failed held is released
all the same: every waiter of the batch gets the failure, the broker's outage record (`broker/outage.py`)
counts what was not sent, and the runs go on. A stream end lost so is queued again once the outage is over
(`resend_lost_ends`, the outage's `on_end`): a client resuming the stream on a broker that kept the run's
events then sees it end, instead of waiting for an end that never comes.

With a `coalesce` window (the app's `stream_coalesce_ms`), events posted within that time of the last batch's
start wait for the window to end and go in the next batch together: a long reply's tokens, each posted in
a loop tick of its own, took a round trip each (most of the broker's cost per token). The first event after
a quiet spell goes at once, and so does a batch with anything a caller waits on or that must not wait (a
stream's end, a signal, a wake-up, an event whose id `publish` waits for): a short run is not delayed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from threadline.broker.base import event_bytes
from threadline.broker.outage import Outage
from threadline.errors import BrokerUnavailable, Unavailable

#: ("event", run_id, (event, data, future or None)), ("end", run_id, future), ("signal", channel, payload),
#: ("token", key, ""): a wake-up token (Redis).
Item = tuple[str, str, Any]


def waiters(batch: list[Item]) -> list[asyncio.Future[Any]]:
    """The futures that `publish` and `end_stream` wait on, of a batch: every one of them gets the batch's
    error when it fails (getting a connection can fail before any item is sent)."""
    found = [value for kind, _, value in batch if kind == "end"]
    return found + [value[2] for kind, _, value in batch if kind == "event" and value[2] is not None]


def _waits(item: Item) -> bool:
    """Whether an item may wait for the coalescing window: an event posted without a waiter. An end, a signal,
    a wake-up, an event whose id `publish` waits for go at once, and take what is queued with them."""
    kind, _, value = item
    return kind == "event" and value[2] is None


class Outbox:
    """The queue of one broker: `post`/`put` queue items, one task hands them to `send` in batches, in order."""

    def __init__(self, send: Callable[[list[Item]], Awaitable[None]], *, name: str, max_bytes: int,
                 outage: Outage, batch_items: int = 0, coalesce: float = 0.0) -> None:
        self._send, self._name, self.outage = send, name, outage
        self.max_bytes = max_bytes
        self.batch_items = batch_items  # most items in one batch; 0: everything queued
        self.coalesce = coalesce  # seconds posted events wait after a batch's start to share the next one
        self._started = -coalesce  # the loop's time when the last batch began to be sent
        self._urgent = asyncio.Event()  # something queued must not wait for the window (`_waits`)
        self._items: deque[Item] = deque()
        self._sizes: deque[int] = deque()  # the bytes each queued item counts for, in the same order
        self._sending: asyncio.Task[None] | None = None
        self._room = asyncio.Event()
        self._room.set()
        #: Bytes of the events queued or in flight (the batch being sent).
        self.held = 0
        #: Runs whose stream end was not sent during an outage (see `resend_lost_ends`).
        self.lost_ends: set[str] = set()

    def __len__(self) -> int:
        return len(self._items)

    async def post(self, item: Item) -> None:
        """Queue an event, once the outbox holds less than `max_bytes` (waiting for the sender until then)."""
        while self.held >= self.max_bytes:
            self._urgent.set()  # full: what is queued goes without waiting for the window
            self._start()  # (a sender that stopped on an error would leave this wait unanswered)
            self._room.clear()
            await self._room.wait()
        self._queue(item, event_bytes(item[2][0], item[2][1]))

    def put(self, item: Item) -> None:
        """Queue an end or a signal at once (never held back: it weighs nothing in the byte bound)."""
        self._queue(item, 0)

    def _queue(self, item: Item, size: int) -> None:
        self._items.append(item)
        self._sizes.append(size)
        self.held += size
        if not _waits(item):
            self._urgent.set()
        self._start()

    def _start(self) -> None:
        if self._items and (self._sending is None or self._sending.done()):
            self._sending = asyncio.create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._items:
            wait = self._started + self.coalesce - loop.time()
            if wait > 0 and not self._urgent.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), wait)
            self._started = loop.time()
            n = len(self._items) if not self.batch_items else min(len(self._items), self.batch_items)
            if n < len(self._items):  # a backlog: what this batch leaves behind goes next, without a wait
                self._urgent.set()
            else:
                self._urgent.clear()
            batch = [self._items.popleft() for _ in range(n)]
            size = sum(self._sizes.popleft() for _ in range(n))
            try:
                await self._send_or_fail(batch)
            finally:  # sent or failed, the batch no longer holds memory here
                self.held -= size
                if self.held < self.max_bytes:
                    self._room.set()

    async def _send_or_fail(self, batch: list[Item]) -> None:
        """Send a batch; when that fails, every waiter of the batch gets the error (not only those queued
        before the failure: getting a connection can fail before any item is sent). A broker outage is
        counted in its record (the runs go on); anything else is a bug, raised."""
        try:
            await self._send(batch)
        except BaseException as exc:
            failure = exc if isinstance(exc, Exception) else BrokerUnavailable(f"The {self.outage.service} "
                                                                               "broker stopped.")
            for waiter in waiters(batch):
                if not waiter.done():
                    waiter.set_exception(failure)
            if not isinstance(exc, Unavailable):
                raise
            # Idle workers poll and waiters re-check storage; the outage's lines count what was lost.
            self.outage.unsent(len(batch))
            self.lost_ends.update(name for kind, name, _ in batch if kind == "end")

    def resend_lost_ends(self) -> None:
        """Queue again the stream ends an outage lost (ending twice only renews the retention); nobody waits
        for them, so a second failure only puts them back in `lost_ends`."""
        lost, self.lost_ends = self.lost_ends, set()
        for run_id in lost:
            resent = asyncio.get_running_loop().create_future()
            resent.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no "never retrieved"
            self.put(("end", run_id, resent))

    async def drain(self) -> None:
        """Return once everything queued was sent (or failed): what `close` waits for."""
        while self._sending is not None and not self._sending.done():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._sending
