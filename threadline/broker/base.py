"""The broker contract."""

from __future__ import annotations

import abc
import functools
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any, NamedTuple

from limits.aio.storage import MemoryStorage, Storage


class StreamEvent(NamedTuple):
    """One event of a run's output stream; `id` orders events within the run. A named tuple: two are made
    per token (the broker's, the subscriber's rebuilt one), and a tuple is made in a quarter of a frozen
    dataclass's time."""

    id: str
    event: str
    data: bytes  # JSON
    #: Yielded by `subscribe(context=True)` from before the cursor: for the reader's state, not to be sent.
    context: bool = False


#: What one held event costs beyond its id, name and data (the Python objects around them), in the byte
#: budgets of the brokers' buffers.
EVENT_OVERHEAD = 160


def event_bytes(event: str, data: bytes) -> int:
    """The bytes one held event counts for in a byte budget (its id is counted in `EVENT_OVERHEAD`)."""
    return len(event) + len(data) + EVENT_OVERHEAD


class Broker(abc.ABC):
    """Per-run event streams with a bounded replay buffer, worker wake-ups, run-done and cancel signals.

    A run's buffer is bounded by events (`buffer_events`) and by bytes (`buffer_bytes`, the newest event is
    always kept); the buffers this process holds together by `total_bytes` (finished runs' buffers are
    dropped first, whole, oldest first; then the oldest events of the largest running one). Whatever is dropped is
    a gap for a resume from before it (`resume_gap`)."""

    @abc.abstractmethod
    async def publish(self, run_id: str, event: str, data: bytes) -> str:
        """Append an event to the run's stream; return its id."""

    async def post(self, run_id: str, event: str, data: bytes) -> None:
        """Append an event to the run's stream without waiting for it to be stored (a run's executor posts
        its events as they come). A run's posts are stored in order, and all of them before `end_stream` of
        that run returns; one that cannot be stored is logged, and the run goes on. By default, `publish`."""
        await self.publish(run_id, event, data)

    @abc.abstractmethod
    async def end_stream(self, run_id: str) -> None:
        """Mark the run's stream finished, after every event posted to it: subscribers drain what is
        buffered, then stop."""

    def subscribe(self, run_id: str, *, after: str | None = None, replay: bool = False,
                  context: bool = False) -> AsyncIterator[StreamEvent]:
        """Events of a run: those after `after` (or all buffered when `replay`), then live ones, until the end.
        With `context`, the events still buffered up to that cursor come first, marked `context=True`.
        One by one: `subscribe_batches`, flattened."""
        return _flattened(self.subscribe_batches(run_id, after=after, replay=replay, context=context))

    @abc.abstractmethod
    def subscribe_batches(self, run_id: str, *, after: str | None = None, replay: bool = False,
                          context: bool = False) -> AsyncIterator[list[StreamEvent]]:
        """`subscribe`'s events in lists (never empty), each what the broker had ready at once: a reader that
        relays them (an SSE response) wakes once and writes once per list, not per event."""

    async def resume_gap(self, run_id: str, after: str) -> bool:
        """Whether events after `after` (a client's Last-Event-ID) were dropped from the run's bounded buffer,
        so a resume from it misses some (counted as a replay gap). By default, never known."""
        return False

    @abc.abstractmethod
    async def buffered_bytes(self, run_id: str) -> int:
        """The bytes the run's buffer holds now, as its byte budget counts them (`event_bytes`)."""

    def queued_bytes(self) -> int:
        """Bytes of events this process posted that are not stored yet (bounded by the shared brokers'
        `outbox_bytes`: past it, a post waits). In process, events are stored as they are posted: 0."""
        return 0

    @abc.abstractmethod
    async def stream_started(self, run_id: str) -> bool:
        """Whether the run has published anything (its stream exists)."""

    @abc.abstractmethod
    async def wake_workers(self) -> None:
        """Wake the worker of every process (one waiter in each: the process's claimer)."""

    async def wake_here(self) -> None:
        """Wake this process's worker only (a run ended here: its thread's next run may now be claimable, and
        this process has the free slot). By default, `wake_workers`."""
        await self.wake_workers()

    @abc.abstractmethod
    async def wait_for_work(self, timeout: float) -> None:
        """Return when woken or after `timeout` seconds, whichever comes first. A waiter takes every wake-up
        that arrived while none was waiting: one claim that follows answers them all."""

    @abc.abstractmethod
    async def notify_run_done(self, run_id: str) -> None: ...

    @abc.abstractmethod
    def listen_run_done(self, run_id: str) -> Any:
        """Start listening for `notify_run_done(run_id)` now; return `async wait(timeout) -> bool`.

        Listen first, then check storage, then wait: a notification in between is not lost.
        """

    @abc.abstractmethod
    async def send_cancel(self, run_id: str, action: str) -> None:
        """Cancel `run_id` wherever it runs. A run held by a worker of this process is cancelled here, at once,
        and the broker's part is then best effort: it raises `BrokerUnavailable` only when the cancel has not
        taken effect (the run is another process's, or not yet registered), so a client that is told 503 can
        retry, and one whose cancel took effect is not told it failed."""

    @abc.abstractmethod
    async def on_cancel(self, run_id: str, callback: Any) -> Any:
        """Register `callback(action)` for cancel signals to `run_id`; returns a (sync) unregister function.

        A cancel sent before registration (between a worker's claim and its start) is applied at once.
        """

    # Leases: counts shared by every process of a deployment (the stream cap per identity), which a process that
    # dies cannot leak for longer than a lease lives. Kept and renewed by `threadline.broker.leases.Leases`.

    @abc.abstractmethod
    async def take_lease(self, scope: str, limit: int, seconds: float) -> str | None:
        """A new lease in `scope` if fewer than `limit` live ones are held there, by any process of the
        deployment: its id; else None. It lives `seconds` unless renewed. Raises Unavailable."""

    @abc.abstractmethod
    async def renew_leases(self, leases: Mapping[str, Collection[str]], seconds: float) -> None:
        """Let each of these leases (scope → ids) live `seconds` more from now; one that had expired is held
        again (its scope may then count past its limit until one is dropped). Raises Unavailable."""

    @abc.abstractmethod
    async def drop_lease(self, scope: str, lease: str) -> None:
        """Give a lease back (none left to drop is no error). Raises Unavailable."""

    # Rate limits (`threadline.api.ratelimit`): counted where every process of the deployment counts them.

    @functools.cached_property
    def rate_counters(self) -> Storage:
        """The `limits` storage of this deployment's rate limits: by default this process's memory (one process,
        the embedded default); Redis or PostgreSQL, shared by every process, on a scale-out broker."""
        return MemoryStorage()

    async def start(self) -> None:
        """Connect and start listening (called once before use)."""
        return None

    async def ping(self) -> None:
        """Raise Unavailable when the broker cannot answer."""
        return None

    async def close(self) -> None:
        return None


async def _flattened(batches: AsyncIterator[list[StreamEvent]]) -> AsyncIterator[StreamEvent]:
    try:
        async for batch in batches:
            for ev in batch:
                yield ev
    finally:
        await batches.aclose()  # type: ignore[attr-defined]  # an async generator's
