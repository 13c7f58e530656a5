"""Protocol v2 events of one run: LangGraph's stream turned into the thread's persisted event log.

A run started through `/commands` (`run.start`, `input.respond`) is streamed here instead of onto its
run stream. Each LangGraph stream part becomes zero or more protocol events (`values`, `updates`,
`messages`, `tools`, `custom`, `tasks`, `checkpoints`, `input.requested`, `lifecycle`), written to
storage, which numbers them per thread, and announced on the broker so followers in any process wake
and read them from storage. Storage is the source of truth; the broker only wakes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from langchain_core.messages import AIMessageChunk, BaseMessage, ToolMessage

from threadline.broker.base import Broker
from threadline.core.lease import Lease
from threadline.errors import BrokerUnavailable
from threadline.serde import dumps, to_jsonable
from threadline.storage.base import NewThreadEvent, Storage
from threadline.storage.records import RunRecord

try:  # LangGraph's own switch to content-block ("v3") message events, as its astream_events(version="v3")
    from langgraph._internal._constants import CONFIG_KEY_STREAM_MESSAGES_V2
except ImportError:  # pragma: no cover - older LangGraph: messages arrive as whole messages only
    CONFIG_KEY_STREAM_MESSAGES_V2 = "__pregel_stream_messages_v2"

try:
    from langchain_core.language_models._compat_bridge import message_to_events
except ImportError:  # pragma: no cover - langchain-core < 1.4
    message_to_events = None  # type: ignore[assignment]

#: LangGraph stream modes a protocol run asks for (`lifecycle` and `input` are ours).
PROTOCOL_STREAM_MODES = ["values", "updates", "messages", "tools", "custom", "tasks", "checkpoints"]
#: Events written per storage transaction at most; a faster graph waits for the writer beyond twice this.
BATCH_MAX = 500

Event = tuple[str, list[str], Any, str | None]  # (method, namespace, data, node)

log = logging.getLogger("threadline.runs")


def thread_events_signal(thread_id: str) -> str:
    """The broker signal key (run-done space) that announces new protocol events on a thread."""
    return f"proto:{thread_id}"


def channel_of(method: str, data: Any) -> str:
    """The subscription channel of an event: its method, `input` for input.requested, custom[:<name>]."""
    if method == "input.requested":
        return "input"
    if method == "custom" and isinstance(data, dict) and isinstance(data.get("name"), str) and data["name"]:
        return f"custom:{data['name']}"
    return method


class StreamConverter:
    """Turns LangGraph v2 stream parts (`{"type", "ns", "data", "interrupts"?}`) into protocol events."""

    def __init__(self, graph_name: str) -> None:
        self.graph_name = graph_name
        self.root_interrupts: list[str] = []
        self.ended = False  # the root's terminal lifecycle event was made
        self._interrupts_seen: set[str] = set()
        self._message_ids: dict[str, str] = {}  # LangChain run id of a model call -> its message id
        self._subgraphs: dict[tuple[str, ...], str] = {}  # started namespaces -> their task id

    def convert(self, part: dict[str, Any]) -> list[Event]:
        mode, data = part["type"], part["data"]
        ns = [str(s) for s in part.get("ns") or ()]
        out = self._subgraph_starts(ns)
        if mode == "values":
            values = to_jsonable(data)
            if isinstance(values, dict):
                values.pop("__interrupt__", None)
            interrupts = part.get("interrupts") or ()
            # As LangGraph's server: the state at an interrupt comes after its `input.requested` and, at the root,
            # after the run's `interrupted` (the run stops there).
            out += self._interrupts(ns, interrupts)
            if interrupts and not ns and self.root_interrupts and not self.ended:
                out.append(self.finished("interrupted"))
            out.append(("values", ns, values, None))
        elif mode == "updates":
            for node, delta in (data or {}).items():
                if node != "__interrupt__":  # interrupts are announced as input.requested (from values)
                    out.append(("updates", ns, to_jsonable(delta), str(node)))
        elif mode == "messages":
            out += self._messages(ns, *data)
        elif mode == "custom":
            out.append(("custom", ns, _custom(data), None))
        elif mode == "tasks":
            out.append(("tasks", ns, to_jsonable(data), None))
            out += self._subgraph_ends(ns, data)
        elif mode == "checkpoints":
            out.append(("checkpoints", ns, _checkpoint(data), None))
        elif mode == "tools":
            out.append(("tools", ns, to_jsonable(data), None))
        return out

    def started(self) -> Event:
        """The root's first lifecycle event: `running`, as LangGraph's server (a subgraph's is `started`)."""
        return ("lifecycle", [], {"event": "running", "graph_name": self.graph_name}, None)

    def finished(self, status: str, error: str | None = None) -> Event:
        """The root's terminal lifecycle event (once: `ended` says whether it was made)."""
        self.ended = True
        data: dict[str, Any] = {"event": status, "graph_name": self.graph_name}
        if error is not None:
            data["error"] = error
        return ("lifecycle", [], data, None)

    def _interrupts(self, ns: list[str], interrupts: Any) -> list[Event]:
        out: list[Event] = []
        for item in interrupts:
            interrupt_id = getattr(item, "id", None) or (item.get("id") if isinstance(item, dict) else None)
            if interrupt_id is None or interrupt_id in self._interrupts_seen:
                continue
            self._interrupts_seen.add(interrupt_id)
            value = to_jsonable(getattr(item, "value", None) if not isinstance(item, dict) else item.get("value"))
            # `payload` is the spec's field; langgraph-sdk 0.4.14 reads `value`.
            out.append(("input.requested", ns, {"interrupt_id": interrupt_id, "payload": value, "value": value}, None))
            if not ns:
                self.root_interrupts.append(interrupt_id)
        return out

    def _messages(self, ns: list[str], payload: Any, meta: dict[str, Any]) -> list[Event]:
        node = meta.get("langgraph_node")
        call = str(meta.get("run_id") or "")
        if isinstance(payload, dict) and "event" in payload:
            event = dict(payload)
            if event["event"] == "message-start":
                self._message_ids[call] = str(event.get("message_id") or event.get("id") or call)
                event["metadata"] = _message_metadata(meta)
            message_id = self._message_ids.get(call, call)
            if event["event"] in ("message-finish", "error"):
                self._message_ids.pop(call, None)
            return [("messages", ns, to_jsonable({**event, "message_id": message_id}), node)]
        if isinstance(payload, BaseMessage) and not isinstance(payload, (AIMessageChunk, ToolMessage)):
            return [("messages", ns, data, node) for data in _whole_message(payload, meta)]
        return []  # token chunks of the v1 callback: not used when LangGraph emits content-block events

    def _subgraph_starts(self, ns: list[str]) -> list[Event]:
        out: list[Event] = []
        for depth in range(1, len(ns) + 1):
            key = tuple(ns[:depth])
            if key not in self._subgraphs:
                name, _, task_id = key[-1].partition(":")
                self._subgraphs[key] = task_id
                out.append(("lifecycle", list(key), {"event": "started", "graph_name": name}, None))
        return out

    def _subgraph_ends(self, ns: list[str], data: Any) -> list[Event]:
        """A task's result in the parent ends the subgraph it ran (namespace `<name>:<task id>`)."""
        if not isinstance(data, dict) or "result" not in data:
            return []
        for key, task_id in list(self._subgraphs.items()):
            if task_id == data.get("id") and list(key[:-1]) == ns:
                del self._subgraphs[key]
                status = "interrupted" if data.get("interrupts") else "failed" if data.get("error") else "completed"
                body: dict[str, Any] = {"event": status, "graph_name": key[-1].partition(":")[0]}
                if data.get("error"):
                    body["error"] = str(data["error"])
                return [("lifecycle", list(key), body, None)]
        return []


def _message_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Concise scalars only, as the spec asks of message metadata."""
    keep = ("langgraph_node", "langgraph_step", "ls_provider", "ls_model_name", "thread_id")
    return {k: meta[k] for k in keep if isinstance(meta.get(k), (str, int, float, bool))}


def _whole_message(message: BaseMessage, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """A message a node returned whole, replayed as a start/blocks/finish sequence."""
    message_id = message.id or str(meta.get("run_id") or "")
    if message_to_events is not None:
        events = [dict(e) for e in message_to_events(message, message_id=message_id)]
    else:  # pragma: no cover
        text = message.text if isinstance(message.text, str) else str(message.content)
        block = {"type": "text", "text": text}
        events = [{"event": "message-start", "role": message.type}, {"event": "content-block-start", "index": 0,
                  "content": {"type": "text", "text": ""}}, {"event": "content-block-delta", "index": 0, "delta": {
                  "type": "text-delta", "text": text}}, {"event": "content-block-finish", "index": 0, "content": block},
                  {"event": "message-finish"}]
    events[0]["metadata"] = _message_metadata(meta)
    return [to_jsonable({**e, "message_id": message_id}) for e in events]


def _custom(data: Any) -> dict[str, Any]:
    """`{"name": str, "payload": …}` written by a node is a named channel (`custom:<name>`)."""
    if isinstance(data, dict) and set(data) == {"name", "payload"} and isinstance(data["name"], str):
        return {"name": data["name"], "payload": to_jsonable(data["payload"])}
    return {"payload": to_jsonable(data)}


def _checkpoint(data: dict[str, Any]) -> dict[str, Any]:
    conf = (data.get("config") or {}).get("configurable") or {}
    parent = ((data.get("parent_config") or {}).get("configurable") or {}).get("checkpoint_id")
    meta = data.get("metadata") or {}
    out = {"id": conf.get("checkpoint_id"), "step": meta.get("step"), "source": meta.get("source")}
    if parent:
        out["parent_id"] = parent
    jsonable: dict[str, Any] = to_jsonable(out)
    return jsonable


class EventWriter:
    """Group commit: events wait while one write is in flight, then go in the next transaction together; and
    events that come within `coalesce` seconds of the last write began wait for that time, so that a graph
    streaming tokens writes a transaction per few milliseconds, not per loop pass (a 4,000-token reply: about
    1,000 transactions of 4 events, against about 250 with 2 ms). The first event after a quiet spell is
    written at once.

    Every write checks the lease first: a worker that lost its run writes nothing more into the log.
    """

    def __init__(self, storage: Storage, broker: Broker, thread_id: str, run_id: str, lease: Lease,
                 coalesce: float = 0.0) -> None:
        self.storage, self.broker, self.lease = storage, broker, lease
        self.thread_id, self.run_id = thread_id, run_id
        self.coalesce = coalesce
        self._pending: list[NewThreadEvent] = []
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._last_write = float("-inf")  # when the last write began (the loop's clock)

    async def add(self, events: list[Event]) -> None:
        if self._error is not None:
            raise self._error
        now = int(time.time() * 1000)
        for method, ns, data, node in events:
            params: dict[str, Any] = {"namespace": ns, "timestamp": now, "data": data}
            if node is not None:
                params["node"] = node
            self._pending.append(NewThreadEvent(method, channel_of(method, data), dumps(ns).decode(),
                                                dumps(params).decode()))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())
        elif len(self._pending) > 2 * BATCH_MAX:  # backpressure: the graph outruns the database
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                wait = self.coalesce - (loop.time() - self._last_write)
                if wait > 0 and len(self._pending) < BATCH_MAX:
                    await asyncio.sleep(wait)  # events are coming: those of the next moment join this write
                batch, self._pending = self._pending[:BATCH_MAX], self._pending[BATCH_MAX:]
                self.lease.check()
                self._last_write = loop.time()
                await self.storage.append_thread_events(self.thread_id, self.run_id, batch)
                await self.broker.notify_run_done(thread_events_signal(self.thread_id))
        except BaseException as exc:  # noqa: BLE001 - surfaced to the run at its next add/flush
            self._error = exc

    async def flush(self) -> None:
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        if self._error is not None:
            raise self._error


class ProtocolRun:
    """One run's protocol lifecycle: `started`, its graph's events, then exactly one root terminal event.

    The graph's own end (`completed`, or `interrupted` when it waits for input) is written by `stream`; an
    end the executor decides (cancelled by a user, failed) by `end`. A run stopped by a shutdown or a lost
    lease gets neither: whoever runs it next writes its end.
    """

    def __init__(self, storage: Storage, broker: Broker, run: RunRecord, lease: Lease, graph_name: str,
                 coalesce: float = 0.0) -> None:
        self.converter = StreamConverter(graph_name)
        self.writer = EventWriter(storage, broker, run["thread_id"], run["run_id"], lease, coalesce)
        self.started = self.ended = False

    def named(self, graph_name: str) -> None:
        """The graph is known once the assistant is read (before that, the assistant id stands in)."""
        self.converter.graph_name = graph_name

    async def stream(self, graph: Any, graph_input: Any, config: dict[str, Any], options: dict[str, Any]) -> None:
        options = {**options, "stream_mode": PROTOCOL_STREAM_MODES, "subgraphs": True}
        config = {**config, "configurable": {**config["configurable"], CONFIG_KEY_STREAM_MESSAGES_V2: True}}
        await self.writer.add([self.converter.started()])
        self.started = True
        async for part in _parts(graph.astream(graph_input, config, version="v2", **options)):
            await self.writer.add(self.converter.convert(part))
        await self._finish("interrupted" if self.converter.root_interrupts else "completed")

    async def end(self, status: str, error: str | None = None) -> None:
        """The run ended other than by its graph finishing: `interrupted` (cancelled) or `failed`."""
        if not self.ended:
            await self._finish(status, error)

    async def _finish(self, status: str, error: str | None = None) -> None:
        events = [] if self.started else [self.converter.started()]
        if not self.converter.ended:  # else the graph's stream made it (`interrupted`, at the root's interrupt)
            events.append(self.converter.finished(status, error))
        await self.writer.add(events)
        await self.writer.flush()
        self.started = self.ended = True


class _Unleased:
    """For a run no worker holds (cancelled while queued): nothing to check."""

    def check(self) -> None:
        return None


async def end_without_worker(storage: Storage, broker: Broker, run: RunRecord, status: str,
                             error: Any = None) -> None:
    """A run that ended with no worker to tell its story (cancelled while queued; failed when its worker died
    and no retries were left) still ends its stream, wakes its waiters and, when started through the
    protocol, gets `started` and a root terminal event: clients wait for that event.

    Called once the run's end is in storage, which is the truth: the broker's part only wakes those who
    follow it, and a waiter or a join reads the run's status from storage when it (re)subscribes. So with
    the broker away the end still stands, and its signals are dropped with a warning (`signal`) rather than
    failing the request (a cancel that took effect answering 503) or the sweep (the next runs left
    without their ends)."""
    try:
        if (run.get("kwargs") or {}).get("protocol"):
            assistant = await storage.get_assistant(run["assistant_id"])
            writer = EventWriter(storage, broker, run["thread_id"], run["run_id"], _Unleased())  # type: ignore[arg-type]
            converter = StreamConverter((assistant["graph_id"] if assistant else None) or run["assistant_id"])
            message = f"{error['error']}: {error['message']}" if error else None
            # A run whose worker died had usually written `started` already (its first lifecycle event).
            began = await storage.read_thread_events(run["thread_id"], run_id=run["run_id"], method="lifecycle",
                                                     limit=1)
            await writer.add([*([] if began else [converter.started()]), converter.finished(status, message)])
            # The events are in storage before their broker signal is sent (`EventWriter._drain`).
            await signal(writer.flush(), f"run {run['run_id']}'s end events")
    finally:
        await signal(broker.end_stream(run["run_id"]), f"run {run['run_id']}'s stream end")
        await signal(broker.notify_run_done(run["run_id"]), f"run {run['run_id']}'s end")


async def signal(send: Awaitable[None], what: str) -> None:
    """A broker signal about a change already in storage: sent if the broker is there; otherwise dropped,
    with a warning, since storage holds the change and those who follow re-read it."""
    try:
        await send
    except BrokerUnavailable as exc:
        log.warning("the broker is unavailable: %s not signalled (%s)", what, exc)


async def _parts(stream: AsyncIterator[Any]) -> AsyncIterator[dict[str, Any]]:
    async for part in stream:
        yield part if isinstance(part, dict) else {"type": part[1], "ns": part[0], "data": part[2]}
