"""Protocol v2 (thread-centric event streaming): the commands that act on a thread, event filters and following
a thread's log.

Commands raise Threadline's errors (`threadline.errors`); their envelopes and error codes are the wire's
(`threadline.api.protocol` carries them over HTTP and WebSocket, `threadline.api.errors` picks the codes).
Events come from the thread's persisted log (`threadline.core.protocol_events` writes it), so `since` means
the same thing in every process and after a restart.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from threadline.core.protocol_events import thread_events_signal
from threadline.core.runs import Runs
from threadline.errors import BadRequest, EventsExpired, InvalidInput, NoSuchInterrupt, NoSuchRun
from threadline.ids import is_uuid
from threadline.shapes import MultitaskStrategy
from threadline.storage.records import RunRecord, ThreadEventRecord, ThreadRecord

CHANNELS = ("values", "updates", "messages", "tools", "lifecycle", "input", "tasks", "custom", "checkpoints")
#: In the order the reference lists them in its error message.
STRATEGIES: tuple[MultitaskStrategy, ...] = ("reject", "rollback", "interrupt", "enqueue")
#: How long a follower sleeps between checks of the log when no wake-up arrives (a lost wake-up's cost).
IDLE_RECHECK_SECONDS = 5.0
READ_BATCH = 500


# --- filters -------------------------------------------------------------------------
@dataclass(frozen=True)
class EventFilter:
    """Which events a subscription wants: channels, namespace prefixes and how deep below them."""

    channels: frozenset[str]
    namespaces: tuple[tuple[str, ...], ...] | None = None
    depth: int | None = None

    @classmethod
    def parse(cls, params: dict[str, Any]) -> EventFilter:
        """Channels are checked (BadRequest); malformed namespaces or depth are ignored, as the reference."""
        channels = params.get("channels")
        if not isinstance(channels, list) or not channels:
            raise BadRequest("channels must be a non-empty list")
        bad = [c for c in channels if not isinstance(c, str) or not (c in CHANNELS or _named_custom(c))]
        if bad:
            raise BadRequest(f"channels contains unsupported entries: {', '.join(map(str, bad))}. "
                               f"Allowed: {', '.join(CHANNELS)}, custom:<name>")
        namespaces = params.get("namespaces")
        prefixes = None
        if isinstance(namespaces, list) and all(
                isinstance(ns, list) and all(isinstance(s, str) for s in ns) for ns in namespaces) and namespaces:
            prefixes = tuple(tuple(ns) for ns in namespaces)
        depth = params.get("depth")
        return cls(frozenset(channels), prefixes, depth if _uint(depth) else None)

    def matches(self, channel: str, namespace: list[str]) -> bool:
        if channel not in self.channels and not (channel.startswith("custom:") and "custom" in self.channels):
            return False
        if self.namespaces is None:
            return True
        return any(_prefix(namespace, p) and (self.depth is None or len(namespace) - len(p) <= self.depth)
                   for p in self.namespaces)


def _named_custom(channel: str) -> bool:
    return channel.startswith("custom:") and len(channel) > len("custom:")


def _uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def since_of(params: dict[str, Any]) -> int | None:
    since = params.get("since")
    return since if _uint(since) else None


def _prefix(namespace: list[str], prefix: tuple[str, ...]) -> bool:
    """`prefix` starts `namespace`; a prefix segment without `:` also matches `<segment>:<task id>`."""
    if len(prefix) > len(namespace):
        return False
    return all(seg == got or (":" not in seg and got.partition(":")[0] == seg)
               for seg, got in zip(prefix, namespace, strict=False))


async def follow_events(runs: Runs, thread_id: str, flt: EventFilter,
                        since: int | None) -> AsyncIterator[ThreadEventRecord]:
    """The thread's events after `since` (all kept ones when None) that pass `flt`, then live ones, forever."""
    storage, broker = runs.storage, runs.broker
    cursor = since or 0
    while True:
        # Listen before reading, so events written in between still wake us.
        listen = broker.listen_run_done(thread_events_signal(thread_id))
        rows = await storage.read_thread_events(thread_id, after=cursor, limit=READ_BATCH)
        for row in rows:
            cursor = row["seq"]
            if flt.matches(row["channel"], _namespace(row)):
                yield row
        if len(rows) < READ_BATCH:
            await listen(IDLE_RECHECK_SECONDS)


async def replay_events(runs: Runs, thread_id: str, flt: EventFilter, since: int | None) -> int:
    """How many kept events after `since` pass `flt` (what a subscription replays). Counted a batch at a time
    and not held: the subscription reads them again as it sends them (`follow_events` from `since`), so a
    long log costs one batch of memory, not the whole log per subscriber."""
    cursor, count = since or 0, 0
    while True:
        rows = await runs.storage.read_thread_events(thread_id, after=cursor, limit=READ_BATCH)
        for row in rows:
            cursor = row["seq"]
            count += flt.matches(row["channel"], _namespace(row))
        if len(rows) < READ_BATCH:
            return count


async def check_resumable(runs: Runs, thread_id: str, since: int) -> None:
    """EventsExpired (with `since` and `min_available_seq`) when events after `since` were already dropped by
    retention."""
    oldest, _ = await runs.storage.thread_event_bounds(thread_id)
    if oldest > since + 1:
        raise EventsExpired(f"Events after {since} are no longer kept; the oldest kept is {oldest}",
                            since=since, min_available_seq=oldest)


def _namespace(row: ThreadEventRecord) -> list[str]:
    return json.loads(row["namespace"]) if row["namespace"] != "[]" else []


# --- commands ------------------------------------------------------------------------
class Commands:
    """The commands that act on a thread: `run.start`, `input.respond`, `agent.getTree` (`by_method`). The runs
    they create count against `identity` (the caller's: quotas)."""

    def __init__(self, runs: Runs, identity: str | None = None) -> None:
        self.runs = runs
        self.storage = runs.storage
        self.identity = identity

    def by_method(self, method: str) -> Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]] | None:
        """The command named `method` (called with the thread id and the params), None for an unknown one."""
        return {"run.start": self.run_start, "input.respond": self.input_respond,
                "agent.getTree": self.get_tree}.get(method)

    async def latest_seq(self, thread_id: str) -> int:
        return (await self.storage.thread_event_bounds(thread_id))[1]

    async def run_start(self, thread_id: str, params: dict[str, Any]) -> dict[str, Any]:
        assistant_id = params.get("assistant_id", params.get("assistantId"))
        if not isinstance(assistant_id, str) or not assistant_id:
            raise InvalidInput("run.start needs assistant_id (a string)")
        config, metadata = _optional_dict(params, "config"), _optional_dict(params, "metadata")
        checkpoint_id = ((config or {}).get("configurable") or {}).get("checkpoint_id")
        if checkpoint_id is not None and not is_uuid(checkpoint_id):
            raise InvalidInput("config.configurable.checkpoint_id must be a UUID")
        strategy = params.get("multitask_strategy", params.get("multitaskStrategy")) or "enqueue"
        if strategy not in STRATEGIES:
            raise InvalidInput(f"multitask_strategy must be one of {', '.join(STRATEGIES)}")
        body: dict[str, Any] = {"assistant_id": assistant_id, "config": config, "metadata": metadata,
                                "multitask_strategy": strategy, "if_not_exists": "create", **_protocol_run()}
        given = params.get("input")
        if given is not None and await self._waiting_for_input(thread_id):
            body["command"] = {"resume": given}  # input on an interrupted thread answers it
        else:
            body["input"] = given
        run = await self.runs.create(thread_id, body, identity=self.identity)
        return {"run_id": run["run_id"]}

    async def input_respond(self, thread_id: str, params: dict[str, Any]) -> dict[str, Any]:
        responses = params.get("responses")
        if responses is None:
            responses = [params]
        if not isinstance(responses, list) or not responses or not all(isinstance(r, dict) for r in responses):
            raise InvalidInput("responses must be a non-empty list of objects")
        for r in responses:
            if not isinstance(r.get("interrupt_id", r.get("interruptId")), str):
                raise InvalidInput("interrupt_id must be a string")
            ns = r.get("namespace", [])
            if not isinstance(ns, list) or not all(isinstance(s, str) for s in ns):
                raise InvalidInput("namespace must be a list of strings")
        await self._readable(thread_id)
        thread = await self.storage.get_thread(thread_id, values=False)
        assistant_id = thread["metadata"].get("assistant_id") if thread is not None else None
        if thread is None or not assistant_id:
            raise NoSuchRun(f"Thread {thread_id} has no run to resume")
        pending = await self._pending_interrupts(thread_id, thread)
        resume: dict[str, Any] = {}
        for r in responses:
            interrupt_id = r.get("interrupt_id", r.get("interruptId"))
            if interrupt_id not in pending or (pending[interrupt_id] is not None
                                               and pending[interrupt_id] != r.get("namespace", [])):
                raise NoSuchInterrupt(f"No pending interrupt {interrupt_id} on this thread")
            resume[interrupt_id] = r.get("response")
        command: dict[str, Any] = {"resume": resume}
        if isinstance(params.get("update"), dict):
            command["update"] = params["update"]
        if params.get("goto") is not None:
            command["goto"] = params["goto"]
        await self.runs.create(thread_id, {
            "assistant_id": assistant_id, "command": command, "config": _optional_dict(params, "config"),
            "metadata": _optional_dict(params, "metadata"), **_protocol_run()}, identity=self.identity)
        return {}

    async def get_tree(self, thread_id: str, params: dict[str, Any]) -> dict[str, Any]:
        """The agent tree of a run (the thread's latest by default), from its stored lifecycle events."""
        await self._readable(thread_id)
        run_id = params.get("run_id", params.get("runId"))
        if run_id is not None:
            run = await self.storage.get_run(str(run_id), output=False)
            run = run if run is not None and run["thread_id"] == thread_id else None
        else:
            found = await self.storage.search_runs(thread_id=thread_id, assistant_id=None, status=None,
                                                   metadata=None, limit=1, offset=0, with_output=False)
            run = found[0] if found else None
        if run is None:
            raise NoSuchRun(f"No run{' ' + str(run_id) if run_id else ''} on thread {thread_id}")
        states: dict[tuple[str, ...], dict[str, Any]] = {}
        after = 0
        while True:
            rows = await self.storage.read_thread_events(thread_id, after=after, run_id=run["run_id"],
                                                         method="lifecycle", limit=READ_BATCH)
            for row in rows:
                params_ = json.loads(row["params"])
                states[tuple(params_["namespace"])] = params_["data"]
                after = row["seq"]
            if len(rows) < READ_BATCH:
                break
        assistant = await self.storage.get_assistant(run["assistant_id"])
        root: dict[str, Any] = {"namespace": [],
                                "status": _tree_status(run, states.get(()), await self._waiting_for_input(thread_id)),
                "graph_name": assistant["graph_id"] if assistant is not None else run["assistant_id"]}
        return {"tree": _tree(root, states)}

    async def _readable(self, thread_id: str) -> None:
        """A thread the caller may not read (`threads.read`) has no run to show or answer, as a missing one.
        (`run.start` needs no such check: `Runs.create` authorizes it as the thread's `create_run`.)"""
        threads = self.runs.threads
        if threads.access.enabled and not await threads.visible(thread_id):
            raise NoSuchRun(f"No run on thread {thread_id}")

    async def _waiting_for_input(self, thread_id: str) -> bool:
        thread = await self.storage.get_thread(thread_id, values=False)
        if thread is None:
            return False
        return bool(thread.get("interrupts")) or bool(await self._requested_by_latest_run(thread_id))

    async def _pending_interrupts(self, thread_id: str, thread: ThreadRecord) -> dict[str, list[str] | None]:
        """Interrupt ids awaiting an answer -> their namespace (None: unknown, any is accepted).

        The thread row learns of interrupts when the run has finished; the latest run's
        `input.requested` events know as soon as they are written (a client may answer before then).
        """
        pending: dict[str, list[str] | None] = {
            i["id"]: None for group in (thread.get("interrupts") or {}).values() for i in group if i.get("id")}
        pending.update(await self._requested_by_latest_run(thread_id))
        return pending

    async def _requested_by_latest_run(self, thread_id: str) -> dict[str, list[str]]:
        """Interrupts the thread's latest run asked for, while that run is running or ended waiting."""
        found = await self.storage.search_runs(thread_id=thread_id, assistant_id=None, status=None,
                                               metadata=None, limit=1, offset=0)
        run = found[0] if found else None
        if run is None or not (run["status"] == "running" or (
                run["status"] == "success" and isinstance(run.get("output"), dict)
                and run["output"].get("__interrupt__"))):
            return {}
        rows = await self.storage.read_thread_events(thread_id, run_id=run["run_id"], method="input.requested",
                                                     limit=READ_BATCH)
        return {json.loads(r["params"])["data"]["interrupt_id"]: json.loads(r["namespace"]) for r in rows}


def _protocol_run() -> dict[str, Any]:
    """What marks a run as a protocol run: its events go to the thread's log (see core/protocol_events.py)."""
    return {"protocol": True, "stream_subgraphs": True, "stream_resumable": True}


def _optional_dict(params: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = params.get(key)
    if value is not None and not isinstance(value, dict):
        raise InvalidInput(f"{key} must be an object")
    return value



def _tree_status(run: RunRecord, root_event: dict[str, Any] | None, waiting: bool) -> str:
    """The root's last lifecycle event when it ended the run (written before the run row is), else the run's."""
    if root_event and root_event.get("event") in ("completed", "failed", "interrupted"):
        return str(root_event["event"])
    status = run["status"]
    if status == "success":
        return "interrupted" if waiting else "completed"
    if status in ("error", "timeout"):
        return "failed"
    if status == "interrupted":
        return "interrupted"
    return "running" if root_event else "started"


def _tree(root: dict[str, Any], states: dict[tuple[str, ...], dict[str, Any]]) -> dict[str, Any]:
    nodes: dict[tuple[str, ...], dict[str, Any]] = {(): root}
    for ns in sorted(k for k in states if k):
        data = states[ns]
        node = {"namespace": list(ns), "status": data.get("event", "running"),
                "graph_name": data.get("graph_name") or ns[-1].partition(":")[0]}
        nodes[ns] = node
        parent = nodes.get(ns[:-1], root)
        parent.setdefault("children", []).append(node)
    return root
