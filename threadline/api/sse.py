"""Server-sent event responses for run streams, framed as LangGraph's server frames them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent

from threadline.api.metrics import metrics_of
from threadline.broker.base import StreamEvent
from threadline.core.runtime import Draining
from threadline.serde import dumps

log = logging.getLogger("threadline.api")


#: The last frame of a stream open when this process stops: a comment and the reconnection time, and no
#: event, so no client takes it for the run's end. langgraph-sdk, seeing the stream close without `end`
#: or `error`, asks for the run (`pending` again: it went back to the queue) and reconnects to the
#: response's `Location` with `Last-Event-ID`, as after a restart; EventSource clients reconnect on their own.
RECONNECT = (b": the server is stopping; the run goes on: reconnect with Last-Event-ID to resume\r\n"
             b"retry: 1000\r\n\r\n")


def event_response(
    events: AsyncIterator[StreamEvent], *, heartbeat: float, headers: dict[str, str] | None = None,
    on_disconnect: Callable[[], Awaitable[Any]] | None = None, draining: Draining | None = None,
) -> EventSourceResponse:
    """Relay `events`; `on_disconnect` runs when the client leaves before the stream ends. When `draining`
    is set (this process is stopping), the stream ends at once with `RECONNECT`, the response completes,
    and `on_disconnect` does not run: the run is not the client's to stop, it goes back to the queue."""

    async def frames() -> AsyncIterator[bytes | ServerSentEvent]:
        left = True  # until the events end or fail, stopping early means the client went away
        waiting: list[asyncio.Timeout] = []  # the scope of the wait for the next event, while in it

        def stop_waiting() -> None:
            for scope in waiting:
                scope.reschedule(asyncio.get_running_loop().time())  # expires now: the wait ends

        unwatch = draining.watch(stop_waiting) if draining is not None else None
        source = aiter(events)
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
                            ev = await anext(source)
                        finally:
                            waiting.clear()
                except StopAsyncIteration:  # the run's stream ended
                    left = False
                    break
                except TimeoutError:
                    if not scope.expired():
                        raise
                    continue  # draining: the loop ends the stream
                yield frame(ev)
        except Exception as exc:  # our side failed (the broker, say): tell the client; the run goes on
            left = False
            log.warning("event stream failed: %s: %s", type(exc).__name__, exc)
            yield ServerSentEvent(event="error", data=dumps({"error": type(exc).__name__, "message": str(exc)}).decode())
        finally:
            if unwatch is not None:
                unwatch()
            if left and on_disconnect is not None and not (draining is not None and draining.is_set()):
                # The client went away mid-run: shielded so the cancel survives our own cancellation.
                try:
                    await asyncio.shield(on_disconnect())
                except Exception:
                    log.exception("on_disconnect handler failed")

    return CountedEventSource(frames(), ping=heartbeat, headers=headers)


def frame(ev: StreamEvent) -> bytes | ServerSentEvent:
    """One event as `ServerSentEvent` frames it (`id`, `event`, `data` lines, CRLF), built directly when no
    part has a line break to split on, as JSON from `threadline.serde` never has."""
    if "\n" in ev.event or "\r" in ev.event or "\n" in ev.id or "\r" in ev.id or b"\n" in ev.data or b"\r" in ev.data:
        return ServerSentEvent(data=ev.data.decode(), event=ev.event, id=ev.id)
    return b"id: %b\r\nevent: %b\r\ndata: %b\r\n\r\n" % (ev.id.encode(), ev.event.encode(), ev.data)


class CountedEventSource(EventSourceResponse):
    """Counted among the app's open stream subscribers for as long as it is being served."""

    async def _send_with_timeout(self, send: Any, message: Any) -> None:
        # sse-starlette opens an anyio cancel scope around every send to apply `send_timeout`; with none set
        # (ours), the scope only costs: about a sixth of a 17-token stream's Python time outside LangGraph.
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        metrics = metrics_of(scope)
        if metrics is None:
            await super().__call__(scope, receive, send)
            return
        with metrics.stream_open():
            await super().__call__(scope, receive, send)
