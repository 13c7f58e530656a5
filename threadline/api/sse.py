"""Server-sent event responses for run streams, framed as LangGraph's server frames them."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent

from threadline.api.metrics import metrics_of
from threadline.broker.base import StreamEvent
from threadline.serde import dumps

log = logging.getLogger("threadline.api")


def event_response(
    events: AsyncIterator[StreamEvent], *, heartbeat: float, headers: dict[str, str] | None = None,
    on_disconnect: Callable[[], Awaitable[Any]] | None = None,
) -> EventSourceResponse:
    """Relay `events`; `on_disconnect` runs when the client leaves before the stream ends."""

    async def frames() -> AsyncIterator[ServerSentEvent]:
        left = True  # until the events end or fail, stopping early means the client went away
        try:
            async for ev in events:
                yield frame(ev)
            left = False
        except Exception as exc:  # our side failed (the broker, say): tell the client; the run goes on
            left = False
            log.warning("event stream failed: %s: %s", type(exc).__name__, exc)
            yield ServerSentEvent(event="error", data=dumps({"error": type(exc).__name__, "message": str(exc)}).decode())
        finally:
            if left and on_disconnect is not None:
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
