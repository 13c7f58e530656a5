"""Protocol v2 over HTTP, SSE and WebSocket: `/threads/{id}/commands` and `/threads/{id}/stream/events`.

Command answers are protocol envelopes, not HTTP errors: HTTP 200 with `{"type":"error",…}` for a
command that failed, and 400 only for a request that is not a command at all (as the reference). The
envelopes are built here; a Threadline error's code in them is `threadline.api.errors.protocol_error`'s.
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

from threadline.api import bounds
from threadline.api.common import JSON, Router, runtime
from threadline.api.errors import ProtocolCode, deny_handshake, protocol_error
from threadline.api.ratelimit import identity_of
from threadline.api.sse import event_response, stream_slot
from threadline.broker.base import StreamEvent
from threadline.core.protocol import Commands, EventFilter, check_resumable, follow_events, replay_events, since_of
from threadline.core.runtime import Runtime
from threadline.errors import BadRequest, InvalidInput, NoSuchSubscription, NotFound, ThreadlineError, TooManyStreams
from threadline.storage.records import ThreadEventRecord

log = logging.getLogger("threadline.api")
router = Router(prefix="/threads", tags=["Protocol v2"])

INVALID_ENVELOPE = "Protocol commands must include an integer id and string method."
SUBSCRIPTION_METHODS = ("subscription.subscribe", "subscription.unsubscribe", "subscription.reconnect")


# --- envelopes ----------------------------------------------------------------------------------------------------

def success(command_id: int, result: dict[str, Any], applied_through_seq: int) -> dict[str, Any]:
    return {"type": "success", "id": command_id, "result": result, "meta": {"applied_through_seq": applied_through_seq}}


def failure(command_id: int | None, code: ProtocolCode, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "id": command_id, "error": code, "message": message, **extra}


def error_envelope(command_id: int | None, exc: ThreadlineError) -> dict[str, Any]:
    code, message, extra = protocol_error(exc)
    return failure(command_id, code, message, **extra)


def envelope(row: ThreadEventRecord) -> bytes:
    """The wire envelope of a stored event, assembled from its stored JSON without re-encoding it."""
    event_id = f"{row['run_id']}:{row['seq']}"
    return (f'{{"type":"event","event_id":"{event_id}","seq":{row["seq"]},"method":"{row["method"]}",'
            f'"params":{row["params"]}}}').encode()


async def execute(commands: Commands, thread_id: str, command_id: int, method: str, params: Any) -> dict[str, Any]:
    """Answer one thread command with its envelope. `subscription.*` belong to a connection (see `_Session`)."""
    handler = commands.by_method(method)
    if handler is None:
        return failure(command_id, "unknown_command", f"Unknown protocol command: {method}")
    if not isinstance(params, dict):
        return failure(command_id, "invalid_argument", "params must be an object")
    try:
        result = await handler(thread_id, params)
    except ThreadlineError as exc:
        return error_envelope(command_id, exc)
    return success(command_id, result, await commands.latest_seq(thread_id))


# --- routes -------------------------------------------------------------------------------------------------------


async def _json_body(request: Request) -> Any:
    try:
        return bounds.loads(await request.body())
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
    return JSON(await execute(Commands(rt.runs, identity_of(request)), str(thread_id), cid, method, params))


@router.post("/{thread_id}/stream/events")
async def stream_events(request: Request, thread_id: UUID) -> Response:
    """The thread's events as SSE, from `since` (or all kept) on, for as long as the client listens."""
    body = await _json_body(request)
    if not isinstance(body, dict):
        raise BadRequest("The body must be an object with channels")
    flt = EventFilter.parse(body)
    rt = runtime(request)
    await rt.threads.get(str(thread_id), values=False)
    return event_response(_frames(rt, str(thread_id), flt, since_of(body)), heartbeat=rt.settings.heartbeat_seconds,
                          draining=rt.draining)


async def _frames(rt: Runtime, thread_id: str, flt: EventFilter, since: int | None) -> AsyncIterator[StreamEvent]:
    async for row in follow_events(rt.runs, thread_id, flt, since):
        yield StreamEvent(str(row["seq"]), row["method"], envelope(row))


@router.websocket("/{thread_id}/stream/events")
async def stream_events_ws(websocket: WebSocket, thread_id: UUID) -> None:
    """Commands in, answers and subscribed events out. Someone else's thread is refused at the handshake (404,
    as a missing one is on the SSE route; a thread no one has made yet may be made by this session's
    `run.start`). The socket holds one of its identity's stream places (`max_streams_per_identity`, shared
    with SSE streams): past the cap, the handshake is refused with 429. A client that takes no frame for
    `stream_send_timeout_seconds` is dropped; its runs go on, and a new socket resumes with `since`."""
    rt: Runtime = websocket.app.state.runtime
    tid = str(thread_id)
    if (rt.access.enabled and await rt.storage.get_thread(tid, values=False) is not None
            and not await rt.threads.visible(tid)):
        await deny_handshake(websocket.scope, websocket.send, NotFound(f"Thread with ID {tid} not found"),
                             accept_first=True)
        return
    try:
        release = await stream_slot(websocket)
    except TooManyStreams as exc:
        await deny_handshake(websocket.scope, websocket.send, exc, accept_first=True)
        return
    try:
        await websocket.accept()
        with rt.metrics.stream_open():
            await _Session(websocket, rt, tid, rt.settings.stream_send_timeout_seconds or None).serve()
    finally:
        if release is not None:
            await release()


class SlowReader(Exception):
    """The client took no frame for the send timeout."""


class _Session:
    """One WebSocket: commands in; answers and the events of its subscriptions out."""

    def __init__(self, websocket: WebSocket, rt: Runtime, thread_id: str, send_timeout: float | None) -> None:
        self.websocket, self.rt, self.thread_id = websocket, rt, thread_id
        self.send_timeout = send_timeout
        self.commands = Commands(rt.runs, identity_of(websocket))
        self.subscriptions: dict[str, asyncio.Task[None]] = {}
        self._send_lock = asyncio.Lock()
        self._over = asyncio.Event()  # the client left, or stopped reading
        self._slow = False

    async def serve(self) -> None:
        """Until the client leaves or stops reading. A dropped socket is not sent a close frame (the client
        would not read it): the server closes the connection once its buffers are written, or lost."""
        reading = asyncio.create_task(self._read())
        reading.add_done_callback(lambda _: self._over.set())
        try:
            await self._over.wait()
        finally:
            reading.cancel()
            await self.close()
        if self._slow:
            log.warning("dropped a protocol WebSocket on thread %s whose client stopped reading for %g s",
                        self.thread_id, self.send_timeout or 0)
            self.rt.metrics.stream_slow_disconnect()
        elif not reading.cancelled() and (failed := reading.exception()) is not None:
            raise failed

    async def _read(self) -> None:
        try:
            while True:
                await self.handle(await self.websocket.receive_text())
        except WebSocketDisconnect:
            pass
        except SlowReader:
            self._drop()

    def _drop(self) -> None:
        self._slow = True
        self._over.set()

    async def send(self, data: bytes | dict[str, Any]) -> None:
        """Raises SlowReader when the client has taken no frame for `send_timeout` (the server's buffers for
        the socket are full)."""
        text = data.decode() if isinstance(data, bytes) else json.dumps(data, separators=(",", ":"))
        async with self._send_lock:
            try:
                async with asyncio.timeout(self.send_timeout):
                    await self.websocket.send_text(text)
            except TimeoutError:
                raise SlowReader() from None

    async def handle(self, text: str) -> None:
        try:
            body = bounds.loads(text)
        except ValueError:
            await self.send(failure(None, "invalid_argument", "Invalid JSON"))
            return
        except InvalidInput as exc:
            await self.send(error_envelope(None, exc))
            return
        cid = _command_id(body)
        if cid is None:
            await self.send(_bad_envelope(body))
            return
        method, params = body["method"], body.get("params", {})
        if not method.startswith("subscription."):
            await self.send(await execute(self.commands, self.thread_id, cid, method, params))
            return
        if not isinstance(params, dict):
            await self.send(failure(cid, "invalid_argument", "params must be an object"))
            return
        if method not in SUBSCRIPTION_METHODS:
            await self.send(failure(cid, "unknown_command", f"Unknown protocol command: {method}"))
            return
        try:
            result, ready = await self._subscription(method, params)
        except ThreadlineError as exc:
            await self.send(error_envelope(cid, exc))
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
                raise NoSuchSubscription(f"No subscription {sid}")
            task.cancel()
            done = asyncio.Event()
            done.set()
            return {}, done
        flt = EventFilter.parse(params)
        since = since_of(params)
        sid = str(uuid.uuid4())
        if method == "subscription.reconnect":
            if since is None:
                raise InvalidInput("subscription.reconnect needs since (an integer >= 0)")
            await check_resumable(self.rt.runs, self.thread_id, since)
            old = str(params.get("subscription_id", params.get("subscriptionId")) or "")
            if old in self.subscriptions:
                self.subscriptions.pop(old).cancel()
                sid = old
        replayed = await replay_events(self.rt.runs, self.thread_id, flt, since)
        ready = asyncio.Event()
        self.subscriptions[sid] = asyncio.create_task(self._pump(flt, since, ready))
        return {"subscription_id": sid, "replayed_events": replayed}, ready

    async def _pump(self, flt: EventFilter, since: int | None, ready: asyncio.Event) -> None:
        await ready.wait()
        try:  # the replayed events, read again as they are sent (not held), then live ones
            async for row in follow_events(self.rt.runs, self.thread_id, flt, since):
                await self.send(envelope(row))
        except (WebSocketDisconnect, RuntimeError):
            return  # the socket closed under us
        except SlowReader:
            self._drop()
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

