"""The in-process broker of the embedded default."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from threadline.broker.base import Broker, StreamEvent


def event_seq(event_id: str) -> int:
    """The per-run sequence number inside an event id `<ms>-<seq>` (-1 when it is not one of ours)."""
    try:
        return int(event_id.rsplit("-", 1)[-1])
    except ValueError:
        return -1


class _RunStream:
    def __init__(self, maxlen: int) -> None:
        self.events: deque[tuple[int, StreamEvent]] = deque(maxlen=maxlen)
        self.seq = 0
        self.ended = False
        self.changed = asyncio.Condition()
        self.ended_at: float | None = None


class MemoryBroker(Broker):
    """Everything in this process: a bounded buffer per run, asyncio events for signals."""

    #: How long a finished run's buffer stays available for late joins and resumption.
    retain_seconds = 600.0

    def __init__(self, buffer_events: int = 10_000) -> None:
        self._buffer = buffer_events
        self._streams: dict[str, _RunStream] = {}
        # Wake-ups are counted, so one enqueued run wakes one idle worker slot, not all of them (each
        # woken slot opens a write transaction to claim). Capped: extra wake-ups only cost an empty claim.
        self._wakeups = 0
        self._work = asyncio.Condition()
        # Finished streams by end time, oldest first, for eviction without scanning every stream.
        self._ended: deque[tuple[float, str]] = deque()
        self._done: dict[str, asyncio.Event] = {}
        self._cancel: dict[str, list[Any]] = {}
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

    async def stream_started(self, run_id: str) -> bool:
        return run_id in self._streams

    async def subscribe(self, run_id: str, *, after: str | None = None, replay: bool = False) -> AsyncIterator[StreamEvent]:
        stream = self._stream(run_id)
        if after is not None:
            cursor = event_seq(after)
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
        async with self._work:
            self._wakeups = min(self._wakeups + 1, 1024)
            self._work.notify(1)

    async def wait_for_work(self, timeout: float) -> None:
        async with self._work:
            if self._wakeups == 0:
                try:
                    await asyncio.wait_for(self._work.wait_for(lambda: self._wakeups > 0), timeout)
                except asyncio.TimeoutError:
                    return
            self._wakeups -= 1

    async def notify_run_done(self, run_id: str) -> None:
        event = self._done.pop(run_id, None)
        if event is not None:
            event.set()

    def listen_run_done(self, run_id: str) -> Any:
        event = self._done.setdefault(run_id, asyncio.Event())

        async def wait(timeout: float | None) -> bool:
            try:
                await asyncio.wait_for(event.wait(), timeout)
                return True
            except asyncio.TimeoutError:
                return False

        return wait

    async def send_cancel(self, run_id: str, action: str) -> None:
        callbacks = list(self._cancel.get(run_id, []))
        if not callbacks:
            self._early_cancel[run_id] = action
            if len(self._early_cancel) > 10_000:
                self._early_cancel.pop(next(iter(self._early_cancel)))
        for callback in callbacks:
            callback(action)

    async def on_cancel(self, run_id: str, callback: Any) -> Any:
        self._cancel.setdefault(run_id, []).append(callback)
        early = self._early_cancel.pop(run_id, None)
        if early is not None:
            callback(early)

        def unregister() -> None:
            callbacks = self._cancel.get(run_id, [])
            if callback in callbacks:
                callbacks.remove(callback)
            if not callbacks:
                self._cancel.pop(run_id, None)

        return unregister
