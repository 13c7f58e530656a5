"""Protocol v2 over HTTP, SSE and WebSocket: `/threads/{id}/commands` and `/threads/{id}/stream/events`.

Command answers are protocol envelopes, not HTTP errors: HTTP 200 with `{"type":"error",…}` for a
command that failed, and 400 only for a request that is not a command at all (as the reference).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

from fastapi import Request, WebSocket, WebSocketDisconnect
from starlette.responses import JSONResponse, Response

from threadline.api.common import JSON, Router, runtime
from threadline.api.sse import event_response
from threadline.broker.base import StreamEvent
from threadline.core.protocol import (
    CommandError,
    Commands,
    EventFilter,
    check_resumable,
    envelope,
    failure,
    follow_events,
    replay_events,
    since_of,
    success,
)
from threadline.core.runtime import Runtime
from threadline.errors import BadRequest

log = logging.getLogger("threadline.api")
router = Router(prefix="/threads", tags=["Protocol v2"])

INVALID_ENVELOPE = "Protocol commands must include an integer id and string method."


async def _json_body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        raise BadRequest("Invalid JSON body") from None


def _command_id(body: Any) -> int | None:
    """The command's id when the envelope is valid (an integer ≥ 0 and a string method), else None."""
    if not isinstance(body, dict):
        return None
    cid = body.get("id")
    if not isinstance(cid, int) or isinstance(cid, bool) or cid < 0 or not isinstance(body.get("method"), str):
        return None
    return cid


def _bad_envelope(body: Any) -> dict[str, Any]:
    cid = body.get("id") if isinstance(body, dict) and isinstance(body.get("id"), int) else None
    return failure(cid, "invalid_argument", INVALID_ENVELOPE)


@router.post("/{thread_id}/commands")
async def command(request: Request, thread_id: UUID) -> Response:
    body = await _json_body(request)
    cid = _command_id(body)
    if cid is None:
        return JSONResponse(_bad_envelope(body), status_code=400)  # the protocol's own 400 body
    method, params = body["method"], body.get("params", {})
    rt = runtime(request)
    if method.startswith("subscription."):
        # A subscription belongs to a connection; over stateless HTTP there is none to attach it to.
        return JSON(failure(cid, "not_supported", f"{method} needs the WebSocket at "
                            f"/threads/{thread_id}/stream/events; over HTTP, open the SSE stream there instead"))
    return JSON(await Commands(rt.runs).execute(str(thread_id), cid, method, params))


@router.post("/{thread_id}/stream/events")
async def stream_events(request: Request, thread_id: UUID) -> Response:
    """The thread's events as SSE, from `since` (or all kept) on, for as long as the client listens."""
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise BadRequest("The body must be an object with channels")
    flt = EventFilter.parse(body)
    rt = runtime(request)
    await rt.threads.get(str(thread_id))
    return event_response(_frames(rt, str(thread_id), flt, since_of(body)), heartbeat=rt.settings.heartbeat_seconds,
                          draining=rt.draining)


async def _frames(rt: Runtime, thread_id: str, flt: EventFilter, since: int | None) -> AsyncIterator[StreamEvent]:
    async for row in follow_events(rt.runs, thread_id, flt, since):
        yield StreamEvent(str(row["seq"]), row["method"], envelope(row))


@router.websocket("/{thread_id}/stream/events")
async def stream_events_ws(websocket: WebSocket, thread_id: UUID) -> None:
    await websocket.accept()
    session = _Session(websocket, websocket.app.state.runtime, str(thread_id))
    try:
        while True:
            await session.handle(await websocket.receive_text())
    except WebSocketDisconnect:
        pass
    finally:
        await session.close()


class _Session:
    """One WebSocket: commands in; answers and the events of its subscriptions out."""

    def __init__(self, websocket: WebSocket, rt: Runtime, thread_id: str) -> None:
        self.websocket, self.rt, self.thread_id = websocket, rt, thread_id
        self.commands = Commands(rt.runs)
        self.subscriptions: dict[str, asyncio.Task[None]] = {}
        self._send_lock = asyncio.Lock()

    async def send(self, data: bytes | dict[str, Any]) -> None:
        text = data.decode() if isinstance(data, bytes) else json.dumps(data, separators=(",", ":"))
        async with self._send_lock:
            await self.websocket.send_text(text)

    async def handle(self, text: str) -> None:
        try:
            body = json.loads(text)
        except ValueError:
            await self.send(failure(None, "invalid_argument", "Invalid JSON"))
            return
        cid = _command_id(body)
        if cid is None:
            await self.send(_bad_envelope(body))
            return
        method, params = body["method"], body.get("params", {})
        if not method.startswith("subscription."):
            await self.send(await self.commands.execute(self.thread_id, cid, method, params))
            return
        try:
            if not isinstance(params, dict):
                raise CommandError("invalid_argument", "params must be an object")
            result, ready = await self._subscription(method, params)
        except CommandError as exc:
            await self.send(failure(cid, exc.code, exc.message, **exc.extra))
            return
        except BadRequest as exc:
            await self.send(failure(cid, "invalid_argument", exc.message))
            return
        try:
            await self.send(success(cid, result, await self.commands.latest_seq(self.thread_id)))
        finally:
            ready.set()  # the client knows the subscription id before its first event

    async def _subscription(self, method: str, params: dict[str, Any]) -> tuple[dict[str, Any], asyncio.Event]:
        if method == "subscription.unsubscribe":
            sid = params.get("subscription_id", params.get("subscriptionId"))
            task = self.subscriptions.pop(str(sid), None)
            if task is None:
                raise CommandError("no_such_subscription", f"No subscription {sid}")
            task.cancel()
            done = asyncio.Event()
            done.set()
            return {}, done
        if method not in ("subscription.subscribe", "subscription.reconnect"):
            raise CommandError("unknown_command", f"Unknown protocol command: {method}")
        flt = EventFilter.parse(params)
        since = since_of(params)
        sid = str(uuid.uuid4())
        if method == "subscription.reconnect":
            if since is None:
                raise CommandError("invalid_argument", "subscription.reconnect needs since (an integer >= 0)")
            await check_resumable(self.rt.runs, self.thread_id, since)
            old = str(params.get("subscription_id", params.get("subscriptionId")) or "")
            if old in self.subscriptions:
                self.subscriptions.pop(old).cancel()
                sid = old
        replayed, cursor = await replay_events(self.rt.runs, self.thread_id, flt, since)
        ready = asyncio.Event()
        self.subscriptions[sid] = asyncio.create_task(self._pump(flt, replayed, cursor, ready))
        return {"subscription_id": sid, "replayed_events": len(replayed)}, ready

    async def _pump(self, flt: EventFilter, replayed: list[dict[str, Any]], cursor: int, ready: asyncio.Event) -> None:
        await ready.wait()
        try:
            for row in replayed:
                await self.send(envelope(row))
            async for row in follow_events(self.rt.runs, self.thread_id, flt, cursor):
                await self.send(envelope(row))
        except (WebSocketDisconnect, RuntimeError):
            return  # the socket closed under us
        except Exception:
            log.exception("protocol subscription on thread %s failed", self.thread_id)
            with contextlib.suppress(Exception):
                await self.websocket.close(code=1011)

    async def close(self) -> None:
        for task in self.subscriptions.values():
            task.cancel()
        for task in self.subscriptions.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.subscriptions.clear()
