"""The in-process broker of the embedded default."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from threadline.broker.base import Broker, StreamEvent
from threadline.broker.local import LocalSignals


def event_seq(event_id: str) -> int:
    """The per-run sequence number inside an event id `<ms>-<seq>` (-1 when it is not one of ours, as `-1`,
    which clients send to replay everything: its `1` is no sequence number)."""
    ms, dash, seq = event_id.partition("-")
    if dash and ms.isascii() and ms.isdigit() and seq.isascii() and seq.isdigit():
        return int(seq)
    return -1


def event_ms(event_id: str) -> int:
    """When an event id `<ms>-<seq>` was made (-1 when it is not one of ours)."""
    try:
        return int(event_id.split("-", 1)[0])
    except ValueError:
        return -1


class _RunStream:
    def __init__(self, maxlen: int) -> None:
        self.events: deque[tuple[int, StreamEvent]] = deque(maxlen=maxlen)
        self.seq = 0
        self.ended = False
        self.changed = asyncio.Condition()
        self.ended_at: float | None = None
        self.dropped = 0  # seq of the newest event the bounded buffer dropped


class MemoryBroker(Broker):
    """Everything in this process: a bounded buffer per run, asyncio events for signals."""

    #: How long a finished run's buffer stays available for late joins and resumption.
    retain_seconds = 600.0

    def __init__(self, buffer_events: int = 10_000) -> None:
        self._buffer = buffer_events
        self._started_ms = int(time.time() * 1000)
        self._streams: dict[str, _RunStream] = {}
        self._signals = LocalSignals()
        # Finished streams by end time, oldest first, for eviction without scanning every stream.
        self._ended: deque[tuple[float, str]] = deque()
        # Cancels sent before the worker registered (between claim and start); honoured on registration.
        self._early_cancel: dict[str, str] = {}

    def _stream(self, run_id: str) -> _RunStream:
        stream = self._streams.get(run_id)
        if stream is None:
            stream = self._streams[run_id] = _RunStream(self._buffer)
            self._evict()
        return stream

    def _evict(self) -> None:
        cutoff = time.monotonic() - self.retain_seconds
        while self._ended and self._ended[0][0] < cutoff:
            self._streams.pop(self._ended.popleft()[1], None)

    async def publish(self, run_id: str, event: str, data: bytes) -> str:
        stream = self._stream(run_id)
        stream.seq += 1
        ev = StreamEvent(f"{int(time.time() * 1000)}-{stream.seq}", event, data)
        async with stream.changed:
            if len(stream.events) == stream.events.maxlen:
                stream.dropped = stream.events[0][0]
            stream.events.append((stream.seq, ev))
            stream.changed.notify_all()
        return ev.id

    async def end_stream(self, run_id: str) -> None:
        stream = self._stream(run_id)
        async with stream.changed:
            if stream.ended:
                return
            stream.ended = True
            stream.ended_at = time.monotonic()
            stream.changed.notify_all()
        self._ended.append((stream.ended_at, run_id))

    async def resume_gap(self, run_id: str, after: str) -> bool:
        stream = self._streams.get(run_id)
        if stream is None or not stream.dropped:
            return False
        seq = event_seq(after) if event_ms(after) >= self._started_ms else 0
        return stream.dropped > seq

    async def stream_started(self, run_id: str) -> bool:
        return run_id in self._streams

    async def subscribe(self, run_id: str, *, after: str | None = None, replay: bool = False) -> AsyncIterator[StreamEvent]:
        stream = self._stream(run_id)
        if after is not None:
            # An id from before this process started (a client resuming across a restart) numbers another
            # process's events: everything buffered here comes after it.
            cursor = event_seq(after) if event_ms(after) >= self._started_ms else 0
        elif replay:
            cursor = 0
        else:
            cursor = stream.seq
        while True:
            async with stream.changed:
                while not stream.ended and (not stream.events or stream.events[-1][0] <= cursor):
                    await stream.changed.wait()
                # Only the events after the cursor, from the end: O(new events), not O(buffer).
                fresh = min(max(stream.seq - cursor, 0), len(stream.events))
                batch = list(itertools.islice(reversed(stream.events), fresh))[::-1]
                ended = stream.ended
            for seq, ev in batch:
                cursor = seq
                yield ev
            if ended and not batch:
                return

    async def wake_workers(self) -> None:
        await self._signals.wake()

    async def wait_for_work(self, timeout: float) -> None:
        await self._signals.wait_for_work(timeout)

    async def notify_run_done(self, run_id: str) -> None:
        self._signals.done(run_id)

    def listen_run_done(self, run_id: str) -> Any:
        return self._signals.listen_done(run_id)

    async def send_cancel(self, run_id: str, action: str) -> None:
        if not self._signals.cancel(run_id, action):
            self._early_cancel[run_id] = action
            if len(self._early_cancel) > 10_000:
                self._early_cancel.pop(next(iter(self._early_cancel)))

    async def on_cancel(self, run_id: str, callback: Any) -> Any:
        unregister = self._signals.register_cancel(run_id, callback)
        early = self._early_cancel.pop(run_id, None)
        if early is not None:
            callback(early)
        return unregister
