"""Server-sent event responses for run streams, framed as LangGraph's server frames them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.requests import Request

from threadline.api.errors import error_response
from threadline.api.metrics import metrics_of
from threadline.broker.base import Broker, StreamEvent
from threadline.broker.leases import Leases, Release
from threadline.core.metrics import Metrics
from threadline.core.runtime import Draining
from threadline.errors import TooManyStreams, Unavailable
from threadline.serde import dumps

log = logging.getLogger("threadline.api")


#: The last frame of a stream open when this process stops: a comment and the reconnection time, and no
#: event, so no client takes it for the run's end. langgraph-sdk, seeing the stream close without `end`
#: or `error`, asks for the run (`pending` again: it went back to the queue) and reconnects to the
#: response's `Location` with `Last-Event-ID`, as after a restart; EventSource clients reconnect on their own.
RECONNECT = (b": the server is stopping; the run goes on: reconnect with Last-Event-ID to resume\r\n"
             b"retry: 1000\r\n\r\n")


class StreamSlots:
    """Open event streams per identity against `max_streams_per_identity`, counted as leases in the deployment's
    broker (`threadline.broker.leases`), so that every API process of a deployment draws on one cap, and a
    process killed with streams open holds their places for `lease_seconds` at most."""

    def __init__(self, per_identity: int, lease_seconds: float = 30.0) -> None:
        self.per_identity, self.lease_seconds = per_identity, max(lease_seconds, 0.5)  # renewed every third
        self._leases: Leases | None = None

    def leases(self, broker: Broker) -> Leases:
        if self._leases is None or self._leases.broker is not broker:  # (a new runtime: a restarted app)
            self._leases = Leases(broker, self.lease_seconds)
        return self._leases

    async def close(self) -> None:
        """Stop renewing this process's places (at shutdown; its streams have ended or expire by themselves)."""
        if self._leases is not None:
            await self._leases.close()

    async def take(self, identity: str, broker: Broker) -> Release:
        """A place for one more stream of `identity` (TooManyStreams past the cap); returns its release. When
        the broker cannot answer, the stream is let through uncounted (as a rate limit lets a request through:
        a limiter must not fail what the rest of the server can still serve)."""
        try:
            release = await self.leases(broker).take(f"streams:{identity}", self.per_identity)
        except Unavailable as exc:  # the broker's outage record logs it
            log.debug("stream cap not checked (%s); stream allowed", exc)
            return _nothing
        if release is None:
            raise TooManyStreams(f"Too many open event streams for this client (the cap is {self.per_identity}): "
                                 "close one, or try again later.")
        return release


async def _nothing() -> None:
    return None


async def stream_slot(request: Any) -> Release | None:
    """Take a stream place for the request's (or WebSocket's) identity now (before a run is created for the
    stream), or None when the app has no cap. Raises TooManyStreams (429)."""
    slots: StreamSlots | None = getattr(request.app.state, "stream_slots", None)
    if slots is None or not slots.per_identity:
        return None
    from threadline.api.ratelimit import identity_of

    return await slots.take(identity_of(request), request.app.state.runtime.broker)


def event_response(
    events: AsyncIterator[StreamEvent] | None = None, *, heartbeat: float, headers: dict[str, str] | None = None,
    on_disconnect: Callable[[], Awaitable[Any]] | None = None, draining: Draining | None = None,
    slot: Release | None = None, send_timeout: float | None = None,
    batches: AsyncIterator[list[StreamEvent]] | None = None,
) -> EventSourceResponse:
    """Relay `events` (read ahead by a `Pump`), or `batches` (a broker's lists of what was ready, taken on the
    response's own task: `Batches`); `on_disconnect` runs when the client leaves before the stream ends. When
    `draining` is set (this process is stopping), the stream ends at once with `RECONNECT`, the response
    completes, and `on_disconnect` does not run: the run is not the client's to stop, it goes back to the queue."""

    async def frames() -> AsyncIterator[bytes | ServerSentEvent]:
        left = True  # until the events end or fail, stopping early means the client went away
        waiting: list[asyncio.Timeout] = []  # the scope of the wait for the next events, while in it

        def stop_waiting() -> None:
            for scope in waiting:
                scope.reschedule(asyncio.get_running_loop().time())  # expires now: the wait ends

        unwatch = draining.watch(stop_waiting) if draining is not None else None
        pump: Pump | Batches = Batches(batches) if batches is not None else Pump(events)  # type: ignore[arg-type]
        if response.metrics is not None:
            response.metrics.track_read_ahead(pump)
        loop = asyncio.get_running_loop()
        pace = Pace(response.coalesce, response.coalesce_most)  # (a `most` below `base` is `base`)
        try:
            while True:
                if draining is not None and draining.is_set():
                    left = False
                    yield RECONNECT
                    break
                try:
                    async with asyncio.timeout(None) as scope:
                        waiting.append(scope)
                        try:
                            # Within the window of the last write, wait for its end: what comes meanwhile goes
                            # out in one write (a pass through the middleware and one wake-up for them all);
                            # after a quiet spell, the next event goes out at once (`Pace`).
                            if (pause := pace.pause(loop.time())) > 0:
                                await asyncio.sleep(pause)
                            asked = loop.time()
                            batch = await pump.take()
                        finally:
                            waiting.clear()
                except TimeoutError:
                    if not scope.expired():
                        raise
                    continue  # draining: the loop ends the stream
                if not batch:  # the run's stream ended
                    left = False
                    break
                pace.wrote(asked, loop.time())
                yield b"".join(map(frame_bytes, batch))  # whatever is ready: one send, one socket write
        except Exception as exc:  # noqa: BLE001 - our side failed (the broker, say): tell the client; the run goes on
            left = False
            # A broker outage is logged once by the broker (broker/outage.py), not once per stream.
            log.log(logging.DEBUG if isinstance(exc, Unavailable) else logging.WARNING,
                    "event stream failed: %s: %s", type(exc).__name__, exc)
            yield ServerSentEvent(event="error",
                                  data=dumps({"error": type(exc).__name__, "message": str(exc)}).decode())
        finally:
            pump.close()
            if unwatch is not None:
                unwatch()
            if left and on_disconnect is not None and not (draining is not None and draining.is_set()):
                # The client went away mid-run: shielded so the cancel survives our own cancellation.
                try:
                    await asyncio.shield(on_disconnect())
                except Exception:
                    log.exception("on_disconnect handler failed")

    response = CountedEventSource(frames(), ping=heartbeat, headers=headers, send_timeout=send_timeout or None)
    response.slot = slot
    return response


class Pump:
    """Reads a stream's events ahead of the response, into a buffer bounded by bytes, so that the response sends
    everything that is ready in one frame batch: under load, a run's tokens arrive faster than one send each can
    go out, and every send costs a pass through the middleware and a socket write. A full buffer stops the
    reading, so a slow client holds at most `max_bytes` here (the broker's buffer holds the rest, bounded)."""

    max_bytes = 256 * 1024

    def __init__(self, events: AsyncIterator[StreamEvent]) -> None:
        self._events: list[StreamEvent] = []
        self._bytes = 0
        self._ended = False
        self._error: BaseException | None = None
        self._ready = asyncio.Event()  # something to take, or the end
        self._room = asyncio.Event()  # under `max_bytes`: reading goes on
        self._room.set()
        self._task = asyncio.create_task(self._read(events))

    async def _read(self, events: AsyncIterator[StreamEvent]) -> None:
        try:
            async for ev in events:
                self._events.append(ev)
                self._bytes += len(ev.data)
                self._ready.set()
                if self._bytes >= self.max_bytes:
                    self._room.clear()
                    await self._room.wait()
        except Exception as exc:  # noqa: BLE001 - given to the response, which tells the client
            self._error = exc
        finally:
            self._ended = True
            self._ready.set()

    async def take(self) -> list[StreamEvent]:
        """Every event read so far (at least one), or [] once the events have ended; raises what reading
        raised, after the events read before it."""
        while not self._events:
            if self._ended:
                if self._error is not None:
                    raise self._error
                return []
            self._ready.clear()
            await self._ready.wait()
        batch, self._events, self._bytes = self._events, [], 0
        self._room.set()
        return batch

    @property
    def held(self) -> int:
        """Bytes of events read and not yet taken (under `max_bytes` and one event)."""
        return self._bytes

    def close(self) -> None:
        """Stop reading: the events' generator is closed in the reading task, as it ends. Not awaited: the
        response closing this may itself be cancelled (its client left), and must still reach its own end."""
        self._task.cancel()


class Batches:
    """A stream's events as its source hands them over, a list of what was ready at a time (a broker's
    `subscribe_batches`), taken on the response's own task: no reading task between the broker and the
    response, so an event costs one task wake-up less than through a `Pump`. While the response sends a
    batch, what comes next waits in the run's buffer (bounded by the broker), not here."""

    def __init__(self, batches: AsyncIterator[list[StreamEvent]]) -> None:
        self._batches = batches
        self._batch: list[StreamEvent] = []
        self._closing: asyncio.Future[Any] | None = None

    async def take(self) -> list[StreamEvent]:
        """The next batch (at least one event), or [] once the events have ended."""
        self._batch = []
        self._batch = await anext(self._batches, [])
        return self._batch

    @property
    def held(self) -> int:
        """Bytes of the batch being sent (counted when scraped, nothing per event)."""
        return sum(len(ev.data) for ev in self._batch)

    def close(self) -> None:
        """Close the source (a generator stopped at a yield; one that raised is closed already), not awaited,
        as `Pump.close`."""
        self._batch = []
        aclose = getattr(self._batches, "aclose", None)
        if aclose is not None:
            self._closing = asyncio.ensure_future(aclose())


_NEVER = -1e9


class Pace:
    """When a stream's response takes its next batch to write: not before `window` seconds after its last write,
    so what comes meanwhile goes out in one write. The window is `base` at first and after a quiet spell (the
    first event then goes out at once: a stream's first token is not delayed more than before), and doubles,
    up to `most`, each time the next batch came sooner than the doubled window would last (the stream is busy:
    its events come faster than it writes) once the stream has been busy for `settle` seconds; a batch the
    response waited for longer than that halves it (a hiccup of a loaded machine, a slower spell), and a wait
    of `settle` or more (a pause) sets it back to `base`, to be earned again. The `settle` keeps a short reply (a few
    dozen tokens at once) as it was: the last write of a stream, its end, waits its window too, so a window
    grown on a short reply would delay the reply's end by up to `most`; on a long one, that is 16 ms of seconds.
    (The wait for a batch includes the broker's read: a Redis `XREAD`'s round trip counts as waiting.) So a
    busy stream writes at most every `most` seconds, and no event waits longer than that for its write."""

    __slots__ = ("base", "busy_since", "most", "settle", "window", "written")

    def __init__(self, base: float, most: float, settle: float = 0.1) -> None:
        self.base, self.most, self.settle = base, max(most, base), settle
        self.window = base
        self.written = _NEVER  # when the last batch was taken to be written
        self.busy_since: float | None = None  # since when each batch came sooner than the doubled wait

    def pause(self, now: float) -> float:
        """Seconds to wait before taking the next batch (0 or less: take it now)."""
        return self.written + self.window - now

    def wrote(self, asked: float, now: float) -> None:
        """A batch asked for at `asked` was taken at `now`, to be written. Busy: not the stream's first batch,
        and it came sooner than the longer wait would have lasted (so that wait joins more in one write)."""
        longer, waited = min(self.window * 2, self.most), now - asked
        if self.written > _NEVER and waited < longer:
            if self.busy_since is None:
                self.busy_since = now
            if now - self.busy_since >= self.settle:
                self.window = longer
        else:  # a slower spell halves the window; a pause of `settle` or more starts the stream over
            self.window = max(self.window / 2, self.base)
            if waited >= self.settle or self.written <= _NEVER:
                self.busy_since, self.window = None, self.base
        self.written = now


def frame_bytes(ev: StreamEvent) -> bytes:
    framed = frame(ev)
    return framed if isinstance(framed, bytes) else framed.encode()


def frame(ev: StreamEvent) -> bytes | ServerSentEvent:
    """One event as `ServerSentEvent` frames it (`id`, `event`, `data` lines, CRLF), built directly when no
    part has a line break to split on, as JSON from `threadline.serde` never has."""
    if "\n" in ev.event or "\r" in ev.event or "\n" in ev.id or "\r" in ev.id or b"\n" in ev.data or b"\r" in ev.data:
        return ServerSentEvent(data=ev.data.decode(), event=ev.event, id=ev.id)
    return b"id: %b\r\nevent: %b\r\ndata: %b\r\n\r\n" % (ev.id.encode(), ev.event.encode(), ev.data)


class CountedEventSource(EventSourceResponse):
    """Counted among the app's open stream subscribers for as long as it is being served; holds one of its
    identity's stream places (`StreamSlots`) meanwhile; closed when its client stops reading (`send_timeout`:
    no frame taken for that long), so a slow reader holds at most its connection's buffers, never a backlog."""

    slot: Release | None = None
    metrics: Metrics | None = None  # the app's, once served (its streams' read-ahead is counted there)
    coalesce = 0.0  # seconds: the app's `stream_coalesce_ms`, once served
    coalesce_most = 0.0  # seconds: the app's `stream_coalesce_max_ms`, once served

    _sender: asyncio.Task[Any] | None = None  # the task that sends the frames
    _send_started: float | None = None  # when the send in progress began (None: none in progress)
    _timed_out = False

    async def _send_with_timeout(self, send: Any, message: Any) -> None:
        # sse-starlette opens an anyio cancel scope (a timer) around every send to apply `send_timeout`: per
        # event, most of what the send path costs of its own. Instead a send notes when it began, and one
        # watchdog per stream (`_watch`) cancels a send that has waited for longer than `send_timeout`.
        if self.send_timeout is None:
            await send(message)
            return
        self._sender = asyncio.current_task()
        self._send_started = asyncio.get_running_loop().time()
        try:
            await send(message)
        except asyncio.CancelledError:
            if not self._timed_out:
                raise
            self._sender.uncancel()  # type: ignore[union-attr]
            raise SendTimeoutError() from None
        finally:
            self._send_started = None

    async def _watch(self, timeout: float) -> None:
        """Cancel the send in progress once it has waited `timeout` seconds (checked every quarter of it: a
        stuck client is closed between `timeout` and 1.25 times it)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(timeout / 4)
            started = self._send_started
            if started is not None and loop.time() - started >= timeout and self._sender is not None:
                self._timed_out = True
                self._sender.cancel()  # it waits inside `send`: the cancel lands there
                return

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        settings = getattr(getattr(scope.get("app"), "state", None), "settings", None)
        if self.send_timeout is None:  # the app's `stream_send_timeout_seconds` (0: never)
            self.send_timeout = getattr(settings, "stream_send_timeout_seconds", 0) or None
        self.coalesce = getattr(settings, "stream_coalesce_ms", 0) / 1000
        self.coalesce_most = getattr(settings, "stream_coalesce_max_ms", 0) / 1000
        if self.slot is None:
            try:
                self.slot = await stream_slot(Request(scope))
            except TooManyStreams as exc:
                await error_response(exc)(scope, receive, send)
                return
        metrics = self.metrics = metrics_of(scope)
        watchdog = asyncio.create_task(self._watch(self.send_timeout)) if self.send_timeout else None
        try:
            if metrics is None:
                await super().__call__(scope, receive, send)
                return
            with metrics.stream_open():
                await super().__call__(scope, receive, send)
        except SendTimeoutError:
            # The client took no frame for `send_timeout` s: its connection is closed (the server logs that
            # the response did not complete); the run goes on, and a resume with Last-Event-ID gets the rest.
            log.warning("closed an event stream whose client stopped reading for %g s", self.send_timeout or 0)
            if metrics is not None:
                metrics.stream_slow_disconnect()
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if self.slot is not None:
                await self.slot()
