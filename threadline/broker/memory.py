"""The in-process broker of the embedded default."""

from __future__ import annotations

import asyncio
import time
import uuid
from array import array
from collections import deque
from collections.abc import AsyncIterator, Collection, Iterator, Mapping
from typing import Any

from threadline.broker.base import Broker, StreamEvent, event_bytes
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


class _Packed:
    """A finished run's held events in one buffer: their ids, names and data end to end in one `bytes`, and their
    sequence numbers, counted sizes and bounds in three arrays. Read as the live `deque` of `(seq, event, size)`
    it replaces (by index, from either end, oldest dropped first).

    Why: while a run streams, each held event is five or six small objects allocated between the far larger
    short-lived ones of the model's per-token work, and those few live objects keep most of Python's allocator
    arenas from being given back: about 30 MB of RSS stayed per finished 16,000-token run, for 2 MB of counted
    events, until its buffer was dropped (`bench/memory_after.py`, numbers in `bench/README.md`). Packed, the
    small objects go, and what is held is a few large blocks the allocator gives back whole."""

    __slots__ = ("_blob", "_bounds", "_seqs", "_sizes", "_start")

    def __init__(self, events: deque[tuple[int, StreamEvent, int]]) -> None:
        parts: list[bytes] = []
        bounds = array("Q", [0])  # per event: where its id, its name and its data end
        end = 0
        for _, ev, _ in events:
            for part in (ev.id.encode(), ev.event.encode(), ev.data):
                parts.append(part)
                end += len(part)
                bounds.append(end)
        self._blob = b"".join(parts)
        self._bounds = bounds
        self._seqs = array("q", (seq for seq, _, _ in events))
        self._sizes = array("q", (size for _, _, size in events))
        self._start = 0  # events before it were dropped

    def __len__(self) -> int:
        return len(self._seqs) - self._start

    def __getitem__(self, index: int) -> tuple[int, StreamEvent, int]:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        i = self._start + index
        b, blob = self._bounds, self._blob
        ev = StreamEvent(blob[b[3 * i]:b[3 * i + 1]].decode(), blob[b[3 * i + 1]:b[3 * i + 2]].decode(),
                         blob[b[3 * i + 2]:b[3 * i + 3]])
        return self._seqs[i], ev, self._sizes[i]

    def __iter__(self) -> Iterator[tuple[int, StreamEvent, int]]:
        return (self[index] for index in range(len(self)))

    def popleft(self) -> tuple[int, StreamEvent, int]:
        entry = self[0]
        self._start += 1
        if not len(self):  # all dropped: the buffer goes with the last one
            self._blob, self._bounds, self._seqs, self._sizes, self._start = b"", array("Q", [0]), array("q"), \
                array("q"), 0
        return entry


#: A finished run is packed when it holds at least this many events: a short run's few events are not worth it.
PACK_EVENTS = 256


class _RunStream:
    def __init__(self) -> None:
        # (seq, event, bytes it counts for); packed once the run has ended (`_Packed`)
        self.events: deque[tuple[int, StreamEvent, int]] | _Packed = deque()
        self.bytes = 0
        self.seq = 0
        self.ended = False
        self.waiters: list[asyncio.Future[None]] = []  # subscribers waiting for the next change
        self.ended_at: float | None = None
        self.dropped = 0  # seq of the newest event the bounded buffer dropped
        self.readers = 0  # subscribers of this process reading it now

    def changed(self) -> None:
        """Wake every subscriber waiting (one loop, no lock: nothing in between can interleave)."""
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def drop_oldest(self) -> int:
        """Drop the oldest buffered event; the bytes freed."""
        seq, _, size = self.events.popleft()
        self.dropped, self.bytes = seq, self.bytes - size
        return size

    def drop_all(self) -> int:
        """Drop every buffered event at once (a packed buffer is not rebuilt event by event); the bytes freed."""
        freed = self.bytes
        if self.events:
            self.dropped = self.events[-1][0]
        self.events, self.bytes = deque(), 0
        return freed


class MemoryBroker(Broker):
    """Everything in this process: a bounded buffer per run, asyncio events for signals."""

    #: How long a finished run's buffer stays available for late joins and resumption.
    retain_seconds = 600.0
    #: Most bytes of events a subscriber takes from the buffer at once.
    batch_bytes = 256 * 1024

    def __init__(self, buffer_events: int = 10_000, buffer_bytes: int = 8 << 20, total_bytes: int = 256 << 20,
                 finished_bytes: int = 64 << 20) -> None:
        self._buffer = buffer_events
        self._buffer_bytes = buffer_bytes
        self._total_bytes = total_bytes
        self._finished_bytes = finished_bytes
        self._held = 0  # bytes of every buffer together
        self._finished_held = 0  # ... of the finished runs' buffers
        self._started_ms = int(time.time() * 1000)
        self._streams: dict[str, _RunStream] = {}
        self._signals = LocalSignals()
        # Finished streams by end time, oldest first, for eviction without scanning every stream.
        self._ended: deque[tuple[float, str]] = deque()
        self._ended_holding: deque[str] = deque()  # finished runs whose buffers the process budget may drop
        # Cancels sent before the worker registered (between claim and start); honoured on registration.
        self._early_cancel: dict[str, str] = {}
        self._leases: dict[str, dict[str, float]] = {}  # scope → lease → when it expires (monotonic)

    @property
    def held_bytes(self) -> int:
        """Bytes the buffers of this process hold (as counted against `total_bytes`)."""
        return self._held

    @property
    def finished_bytes(self) -> int:
        """Bytes the buffers of finished runs hold (as counted against `finished_bytes`)."""
        return self._finished_held

    def _freed(self, stream: _RunStream, size: int) -> None:
        self._held -= size
        if stream.ended:
            self._finished_held -= size

    async def buffered_bytes(self, run_id: str) -> int:
        stream = self._streams.get(run_id)
        return 0 if stream is None else stream.bytes

    def _stream(self, run_id: str) -> _RunStream:
        stream = self._streams.get(run_id)
        if stream is None:
            stream = self._streams[run_id] = _RunStream()
            self._evict()
        return stream

    def _evict(self) -> None:
        cutoff = time.monotonic() - self.retain_seconds
        while self._ended and self._ended[0][0] < cutoff:
            stream = self._streams.pop(self._ended.popleft()[1], None)
            if stream is not None:
                self._freed(stream, stream.bytes)
        while self._ended_holding and self._ended_holding[0] not in self._streams:
            self._ended_holding.popleft()

    def _bound(self, stream: _RunStream) -> None:
        """Drop what is over the run's bounds, then over the process's (see `Broker`)."""
        while len(stream.events) > 1 and (len(stream.events) > self._buffer or stream.bytes > self._buffer_bytes):
            self._freed(stream, stream.drop_oldest())
        if self._held <= self._total_bytes:
            return
        while self._ended_holding and self._held > self._total_bytes:  # finished runs first, oldest first, whole
            ended = self._streams.get(self._ended_holding.popleft())
            if ended is not None:
                self._freed(ended, ended.drop_all())
        while self._held > self._total_bytes:  # then the oldest events of the largest running stream
            largest = max(self._streams.values(), key=lambda s: s.bytes if len(s.events) > 1 else 0)
            if len(largest.events) <= 1:
                return
            self._freed(largest, largest.drop_oldest())

    def _bound_finished(self) -> None:
        """Drop the finished runs' buffers past `finished_bytes`, whole, the runs that ended first first. One that a
        subscriber of this process still reads (a slow client at the end of a long reply) stops the dropping
        until that subscriber is done: a stream in progress is never cut, and a newer run never goes before an
        older one (the newest may be what a client that subscribes as its run ends is about to read)."""
        while self._ended_holding and self._finished_held > self._finished_bytes:
            ended = self._streams.get(self._ended_holding[0])
            if ended is not None and ended.readers:
                return
            self._ended_holding.popleft()
            if ended is not None:
                self._freed(ended, ended.drop_all())

    async def publish(self, run_id: str, event: str, data: bytes) -> str:
        return self._append(run_id, event, data)

    async def post(self, run_id: str, event: str, data: bytes) -> None:
        self._append(run_id, event, data)  # stored at once: no other coroutine in between, per token

    def _append(self, run_id: str, event: str, data: bytes) -> str:
        stream = self._stream(run_id)
        stream.seq += 1
        ev = StreamEvent(f"{int(time.time() * 1000)}-{stream.seq}", event, data)
        size = event_bytes(event, data)
        if isinstance(stream.events, _Packed):  # an event after the end (none is sent today): live again
            stream.events = deque(stream.events)
        stream.events.append((stream.seq, ev, size))
        stream.bytes += size
        self._held += size
        if stream.ended:
            self._finished_held += size
        self._bound(stream)
        stream.changed()
        return ev.id

    async def end_stream(self, run_id: str) -> None:
        stream = self._stream(run_id)
        if stream.ended:
            return
        stream.ended = True
        stream.ended_at = time.monotonic()
        self._finished_held += stream.bytes
        if isinstance(stream.events, deque) and len(stream.events) >= PACK_EVENTS:
            stream.events = _Packed(stream.events)
        stream.changed()
        self._ended.append((stream.ended_at, run_id))
        self._ended_holding.append(run_id)
        self._evict()
        self._bound_finished()

    async def resume_gap(self, run_id: str, after: str) -> bool:
        stream = self._streams.get(run_id)
        if stream is None or not stream.dropped:
            return False
        seq = event_seq(after) if event_ms(after) >= self._started_ms else 0
        return stream.dropped > seq

    async def stream_started(self, run_id: str) -> bool:
        return run_id in self._streams

    async def subscribe_batches(self, run_id: str, *, after: str | None = None, replay: bool = False,
                                context: bool = False) -> AsyncIterator[list[StreamEvent]]:
        stream = self._stream(run_id)
        if after is not None:
            # An id from before this process started (a client resuming across a restart) numbers another
            # process's events: everything buffered here comes after it.
            cursor = event_seq(after) if event_ms(after) >= self._started_ms else 0
        elif replay:
            cursor = 0
        else:
            cursor = stream.seq
        stream.readers += 1
        try:
            if context and cursor:
                before = [ev._replace(context=True) for seq, ev, _ in list(stream.events) if seq <= cursor]
                if before:
                    yield before
            while True:
                while not stream.ended and (not stream.events or stream.events[-1][0] <= cursor):
                    waiter = asyncio.get_running_loop().create_future()
                    stream.waiters.append(waiter)
                    await waiter
                # Only the events after the cursor: O(new events), not O(buffer); and a batch of at most
                # `batch_bytes`, so a slow reader keeps no more than that of what the buffer has dropped.
                fresh = min(max(stream.seq - cursor, 0), len(stream.events))
                batch, taken = [], 0
                for index in range(len(stream.events) - fresh, len(stream.events)):
                    seq, ev, size = stream.events[index]
                    batch.append(ev)
                    taken += size
                    if taken >= self.batch_bytes:
                        break
                ended = stream.ended
                if not batch:
                    if ended:
                        return
                    continue
                cursor = seq
                yield batch
        finally:
            stream.readers -= 1
            if stream.ended and not stream.readers:  # kept for it past `finished_bytes`: bound now
                self._bound_finished()

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

    async def take_lease(self, scope: str, limit: int, seconds: float) -> str | None:
        now = time.monotonic()
        held = self._leases.setdefault(scope, {})
        for lease in [lease for lease, expires in held.items() if expires <= now]:
            del held[lease]
        if len(held) >= limit:
            return None
        lease = uuid.uuid4().hex
        held[lease] = now + seconds
        return lease

    async def renew_leases(self, leases: Mapping[str, Collection[str]], seconds: float) -> None:
        expires = time.monotonic() + seconds
        for scope, ids in leases.items():
            held = self._leases.setdefault(scope, {})
            for lease in ids:
                held[lease] = expires

    async def drop_lease(self, scope: str, lease: str) -> None:
        held = self._leases.get(scope)
        if held is not None:
            held.pop(lease, None)
            if not held:
                del self._leases[scope]
