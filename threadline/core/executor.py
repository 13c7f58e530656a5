"""Executing one claimed run: the graph with the thread's checkpointer, its events onto the broker."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

from langgraph.types import Command

from threadline.broker.base import Broker
from threadline.core.auth import set_current_user, user_in_config
from threadline.core.graphs import GraphRegistry
from threadline.core.lease import FencedCheckpointer, Lease, LeaseLost
from threadline.core.messages import MessageStreamer
from threadline.core.metrics import Metrics
from threadline.core.partials import Held
from threadline.core.protocol_events import ProtocolRun
from threadline.core.state import bind, debug_json, run_output, snapshot_json, thread_config, thread_fields
from threadline.core.threads import Threads
from threadline.core.webhooks import Webhooks
from threadline.errors import Unavailable
from threadline.serde import dumps
from threadline.shapes import run_out
from threadline.storage.base import Row, Storage
from threadline.storage.rules import timed_out

log = logging.getLogger("threadline.executor")

INFRA_RETRY_FIRST = 0.2  # seconds before a run goes on after the database or broker failed under it
INFRA_RETRY_MAX = 5.0

# Stream modes a client may ask for, and the LangGraph stream mode that feeds each.
STREAM_MODES = {
    "values": "values", "updates": "updates", "custom": "custom", "debug": "debug", "tasks": "tasks",
    "checkpoints": "checkpoints", "messages": "messages", "messages-tuple": "messages", "events": None,
}


class StopSignal:
    """Set by the worker before it cancels a run's task, so the task knows why it was cancelled."""

    def __init__(self) -> None:
        self.action: str | None = None
        # Set by the run's task when it starts: a task cancelled before its first step never runs its own
        # handlers, so until then a cancel only sets `action` and the task applies it when it starts.
        self.started = False


def requested_modes(kwargs: dict[str, Any]) -> list[str]:
    modes = kwargs.get("stream_mode") or ["values"]
    return [modes] if isinstance(modes, str) else list(modes)


def build_config(run: Row, assistant: Row, thread_id: str) -> dict[str, Any]:
    kwargs = run["kwargs"]
    base = assistant.get("config") or {}
    given = kwargs.get("config") or {}
    config: dict[str, Any] = {**base, **{k: v for k, v in given.items() if k != "configurable"}}
    config["tags"] = list(dict.fromkeys([*(base.get("tags") or []), *(given.get("tags") or [])]))
    # As LangGraph's server: the request's context is mirrored into `configurable` (the assistant's already is).
    configurable = {**(base.get("configurable") or {}), **(kwargs.get("context") or {}),
                    **(given.get("configurable") or {})}
    configurable.update({
        "thread_id": thread_id, "run_id": run["run_id"], "assistant_id": assistant["assistant_id"],
        "graph_id": assistant["graph_id"], "run_attempt": run.get("attempt", 1),
    })
    checkpoint = dict(kwargs.get("checkpoint") or {})
    if kwargs.get("checkpoint_id"):
        checkpoint["checkpoint_id"] = kwargs["checkpoint_id"]
    for key in ("checkpoint_id", "checkpoint_ns", "checkpoint_map"):
        if checkpoint.get(key) is not None:
            configurable[key] = checkpoint[key]
    configurable.setdefault("checkpoint_ns", "")
    config["configurable"] = user_in_config(configurable)
    config["metadata"] = {**(base.get("metadata") or {}), **(given.get("metadata") or {}), **run["metadata"],
                          "run_id": run["run_id"], "thread_id": thread_id,
                          "assistant_id": assistant["assistant_id"], "graph_id": assistant["graph_id"]}
    config["run_id"] = run["run_id"]
    return config


def run_context(run: Row, assistant: Row) -> dict[str, Any]:
    """The run's context over the assistant's. Always a dict, `{}` when neither gives one, as on LangGraph's
    server: a graph's `context_schema` (a dataclass or pydantic model) is then built from its defaults, so
    `runtime.context.field` works in a run that sent no context."""
    return {**(assistant.get("context") or {}), **((run["kwargs"] or {}).get("context") or {})}


def run_durability(kwargs: dict[str, Any]) -> str:
    """The run's `durability`, else the legacy `checkpoint_during` (false: "exit"), else LangGraph's default,
    "async"."""
    if kwargs.get("durability"):
        return kwargs["durability"]
    return "exit" if kwargs.get("checkpoint_during") is False else "async"


def graph_input(kwargs: dict[str, Any]) -> Any:
    command = kwargs.get("command")
    if command:
        goto = command.get("goto")
        if isinstance(goto, dict) or (isinstance(goto, list) and goto and isinstance(goto[0], dict)):
            from langgraph.types import Send

            sends = [goto] if isinstance(goto, dict) else goto
            goto = [Send(s["node"], s.get("input")) if isinstance(s, dict) else s for s in sends]
        return Command(resume=command.get("resume"), update=command.get("update"), goto=goto or ())
    return kwargs.get("input")


_RUN: ContextVar[str | None] = ContextVar("threadline_run", default=None)  # the run this task executes


class NodeThreads(ThreadPoolExecutor):
    """The loop's default thread pool, where LangGraph runs synchronous nodes: it remembers which run
    submitted each call, so that a cancelled run ends only once its nodes' threads have returned (a thread
    cannot be stopped: cancelling the node's task only stops waiting for it)."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="threadline-node")
        self._lock = threading.Lock()
        self._by_run: dict[str, set[Future[Any]]] = {}

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        run_id = _RUN.get()
        if run_id is not None:
            with self._lock:
                self._by_run.setdefault(run_id, set()).add(future)
            future.add_done_callback(lambda f: self._forget(run_id, f))
        return future

    def _forget(self, run_id: str, future: Future[Any]) -> None:
        with self._lock:
            futures = self._by_run.get(run_id)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._by_run[run_id]

    async def settled(self, run_id: str) -> None:
        """Return once no call `run_id` submitted is still running."""
        with self._lock:
            running = list(self._by_run.get(run_id, ()))
        if running:
            log.info("run %s: cancelled; waiting for %d synchronous node(s) to return", run_id, len(running))
            await asyncio.wait([asyncio.wrap_future(f) for f in running])


class Executor:
    """Runs one run to its end and records the outcome. Used by the worker pool."""

    def __init__(self, storage: Storage, broker: Broker, graphs: GraphRegistry, threads: Threads,
                 metrics: Metrics, webhooks: Webhooks | None = None, *, run_timeout: float = 0.0) -> None:
        self.metrics = metrics
        self.run_timeout = run_timeout  # seconds a run may execute unless its config says otherwise; 0: none
        self.node_threads = NodeThreads()  # installed as the loop's default executor by the worker pool
        self.webhooks = webhooks or Webhooks()
        self.storage = storage
        self.broker = broker
        self.graphs = graphs
        self.threads = threads

    async def execute(self, run: Row, worker_id: str, stop: StopSignal, lease: Lease,
                      assistant: Row | None = None) -> Row | None:
        """Execute `run`; returns it as finished, or None when this worker wrote no outcome (its lease was
        lost, or it no longer held the run) or the run is gone (rolled back). `assistant`: the run's, when
        the caller has just read it (a run started as it was created); else it is read here.

        A cancel arrives as CancelledError with `stop.action` set; without it (shutdown, lost lease) the
        error propagates and the run's fate is left to whoever holds it next.
        """
        # This task's own context: a run started by a request (`Runs.create(start_here=True)`) would inherit its
        # caller, and the server's bookkeeping must not be authorized as that caller (`core/access.py`). The
        # agent still runs as the caller: its identity travels in the run's `config["configurable"]`.
        set_current_user(None)
        run_id, thread_id = run["run_id"], run["thread_id"]
        status, error, output, action, failure = "success", None, None, None, None
        started = time.monotonic()
        deadline: list[asyncio.TimerHandle] = []  # the run's timeout, armed once its config is known
        fields = {"run_id": run_id, "thread_id": thread_id, "assistant_id": run["assistant_id"],
                  "attempt": run.get("attempt", 1)}
        _RUN.set(run_id)  # this task's own context: the node threads it starts are counted as the run's
        protocol = ProtocolRun(self.storage, self.broker, run, lease, run["assistant_id"]) \
            if (run["kwargs"] or {}).get("protocol") else None  # started through /commands
        try:
            # First, even when a cancel is already waiting: a claimed run's stream always starts with it.
            await self._publish(lease, "metadata", {"run_id": run_id, "attempt": run.get("attempt", 1)})
            stop.started = True
            if stop.action is not None:
                raise asyncio.CancelledError
            if assistant is None:
                assistant = await self.storage.get_assistant(run["assistant_id"])
            if assistant is None:
                raise LookupError(f"Assistant {run['assistant_id']} no longer exists")
            fields["graph_id"] = assistant["graph_id"]
            log.info("run started", extra=fields)
            if protocol is not None:
                protocol.named(assistant["graph_id"])
            config = build_config(run, assistant, thread_id)
            await self._arm_deadline(run_id, config, stop, deadline)
            state = await self._run_graph(run, config, assistant, lease, protocol)
            _disarm(deadline)
            output = run_output(state)
            thread_changes: dict[str, Any] = {**thread_fields(state), "error": None}
        except asyncio.CancelledError:
            _disarm(deadline)
            action = stop.action
            if action is None:
                raise
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()
            # A synchronous node goes on in its thread: the run is not over until it returns (another
            # cancel, a shutdown, stops this wait; the run then goes back to the queue as usual).
            await self.node_threads.settled(run_id)
            status = "interrupted"
            thread_changes = await self.threads.current_fields(thread_id)
            if action == "interrupt":
                # As LangGraph's server does: the thread shows it was stopped by the user.
                thread_changes.update(status="interrupted", error={
                    "error": "UserInterrupt", "message": f"interrupt requested for run {run_id}"})
            elif action == "timeout":
                # As LangGraph's server: the run `timeout`, its thread `error` at its last checkpoint, and
                # waiters answered with the thread's values; the stream just ends (no `error` event).
                status, error = "timeout", timed_out()
                thread_changes.update(status="error", error=error)
                output = thread_changes.get("values")
                log.warning("run %s passed its timeout and was cancelled", run_id, extra=fields)
        except Exception as exc:  # noqa: BLE001 - the agent's own failure: recorded on the run, shown to the client
            _disarm(deadline)
            if isinstance(exc, LeaseLost) or not lease.valid():
                log.warning("run %s: lease lost (%s); leaving it to the worker that holds it now", run_id, exc)
                return None
            if isinstance(exc, Unavailable):  # the database or broker failed, not the agent: another go later
                await self._release(run, worker_id, exc)
                return None
            status, failure = "error", exc
            error = {"error": type(exc).__name__, "message": str(exc)}
            await self._publish(lease, "error", error)
            thread_changes = {"error": error}
            try:
                thread_changes.update(await self.threads.current_fields(thread_id))
            except Exception:
                log.exception("could not read state of thread %s after a failed run", thread_id)
            thread_changes["status"] = "error"
        if not lease.valid():
            log.warning("run %s ended after its lease lapsed; its result is discarded", run_id)
            return None
        if protocol is not None and status != "success":
            await self._protocol_end(protocol, run_id, status, error)
        lease.finishing = True

        def ended() -> None:
            # A failed run's line carries its traceback: the one place a person sees where the agent broke.
            log.info("run ended" if failure is None else f"run ended: {type(failure).__name__}: {failure}",
                     exc_info=failure, extra={**fields, "status": status, **({"action": action} if action else {}),
                                              "duration_ms": round((time.monotonic() - started) * 1000, 1)})

        finished = await self._finish(run, lease, worker_id, status, error, output, thread_changes, action, ended)
        self.metrics.run_finished(status, time.monotonic() - started)
        return finished

    async def _arm_deadline(self, run_id: str, config: dict[str, Any], stop: StopSignal,
                            armed: list[asyncio.TimerHandle]) -> None:
        """Cancel this run's task, as a cancel does (`stop.action = "timeout"`), once its deadline passes. The
        deadline is stored on the run when it first starts and kept when it is retried, so the time a run
        spent on a worker that died counts too (and the sweeper ends it if no worker holds it then)."""
        seconds = run_timeout(config, self.run_timeout)
        if not seconds:
            return
        # Written again at the storage edge if the connection is lost under it (the write is idempotent).
        remaining = await self.storage.set_run_deadline(run_id, seconds)
        task = asyncio.current_task()

        def expire() -> None:
            if stop.action is None and task is not None:
                stop.action = "timeout"
                task.cancel()

        armed.append(asyncio.get_running_loop().call_later(max(remaining, 0.0), expire))

    async def _run_graph(self, run: Row, config: dict[str, Any], assistant: Row, lease: Lease,
                         protocol: ProtocolRun | None) -> dict[str, Any]:
        """The graph run to its end; the thread's state after it. When the database or the broker fails
        under it (`Unavailable`: a connection lost, a restart), that is no failure of the agent's: the run
        goes on, after a pause, from the last checkpoint it saved, on this worker and under the same claim,
        as long as the lease holds (a worker that cannot renew it past `lease_seconds` stops, and the
        sweeper gives the run to another)."""
        thread_id, given = run["thread_id"], graph_input(run["kwargs"] or {})
        delay = INFRA_RETRY_FIRST
        while True:
            try:
                async with self.graphs.graph(assistant["graph_id"], config, access="threads.create_run",
                                             store=self.storage.store, context=run_context(run, assistant)) as graph:
                    checkpointer = self.storage.run_checkpointer(run_durability(run["kwargs"] or {}))
                    bound = bind(graph, FencedCheckpointer(checkpointer, lease), self.storage.store)
                    await self._stream(bound, run, config, assistant, lease, protocol, given)
                    snap = await bound.aget_state(thread_config(thread_id))
                return snapshot_json(snap)
            except Unavailable as exc:
                if not lease.valid():
                    raise LeaseLost(f"lease on run {run['run_id']} lapsed while {exc.message}") from exc
                log.warning("run %s: %s Going on from its last checkpoint in %.1f s.", run["run_id"], exc.message,
                            delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, INFRA_RETRY_MAX)
                config, given = await self._resume_point(run, config, given)

    async def _release(self, run: Row, worker_id: str, exc: Unavailable) -> None:
        """Put the run back in the queue without spending an attempt (if that fails too, its lease lapses
        and the sweeper requeues it)."""
        log.warning("run %s: %s Back to the queue.", run["run_id"], exc.message)
        try:
            if await self.storage.release_runs(worker_id, {run["run_id"]: run["attempt"]}):
                await self.broker.wake_workers()
        except Unavailable as again:
            log.warning("run %s could not be put back in the queue (%s); it is retried when its lease lapses",
                        run["run_id"], again.message)

    async def _resume_point(self, run: Row, config: dict[str, Any], given: Any) -> tuple[dict[str, Any], Any]:
        """Where a run interrupted by an infrastructure failure goes on: from the thread's latest checkpoint
        with no input, when this run saved it (LangGraph runs what that checkpoint has left to do); else from
        where it started, with its input (nothing of it was saved)."""
        latest = await self.storage.checkpointer.aget_tuple(thread_config(run["thread_id"]))
        if latest is None or (latest.metadata or {}).get("run_id") != run["run_id"]:
            return config, given
        configurable = {k: v for k, v in config["configurable"].items()
                        if k not in ("checkpoint_id", "checkpoint_map")}
        return {**config, "configurable": configurable}, None

    async def _protocol_end(self, protocol: ProtocolRun, run_id: str, status: str, error: Any) -> None:
        """A protocol run cancelled by a user or failed: its clients wait for the root terminal event."""
        message = f"{error['error']}: {error['message']}".rstrip(": ") if error else None
        try:
            await protocol.end("failed" if status in ("error", "timeout") else "interrupted", message)
        except Unavailable:  # the broker's outage is logged, and counted, by the broker
            log.debug("run %s: its terminal lifecycle event was not written (the broker is unavailable)", run_id)
        except Exception:
            log.exception("could not write the terminal lifecycle event of run %s", run_id)

    async def _announce_end(self, run_id: str) -> None:
        # Waiters first: they read the run from storage, where it has ended; the stream's end follows, and
        # the Redis broker sends both in one round trip.
        try:
            await self.broker.notify_run_done(run_id)
            await self.broker.end_stream(run_id)
        except Unavailable:
            # The run's end is stored: waiters re-check storage, and the broker logs (and counts) its outage;
            # a traceback per run would say nothing more.
            log.debug("run %s: its end was not announced (the broker is unavailable)", run_id)

    async def _publish(self, lease: Lease, event: str, data: Any) -> None:
        lease.check()  # a worker that lost the run must not write into the stream its successor owns
        await self.broker.post(lease.run_id, event, data if isinstance(data, Held) else dumps(data))

    async def _finish_run(self, run: Row, lease: Lease, status: str, **outcome: Any) -> Row | None:
        """`storage.finish_run`, again on a fresh connection while the database is unavailable and the lease
        holds: fenced by worker and attempt, so a write that did commit before its connection was lost is
        found ended (not ours to end again), and the run is never left `running` until its lease lapses."""
        delay, retried = INFRA_RETRY_FIRST, False
        while True:
            try:
                finished = await self.storage.finish_run(run["run_id"], status, **outcome)
            except Unavailable as exc:
                if not lease.valid():
                    raise
                log.warning("run %s: writing its outcome failed: %s Again in %.1f s.", run["run_id"], exc.message,
                            delay)
                await asyncio.sleep(delay)
                delay, retried = min(delay * 2, INFRA_RETRY_MAX), True
                continue
            if finished is None and retried:  # the lost write may have committed: then the run is ended as ours
                found = await self.storage.get_run(run["run_id"])
                if found is not None and found["status"] == status and found.get("worker_id") == outcome["worker_id"] \
                        and found.get("attempt") == outcome["attempt"]:
                    return found
            return finished

    async def _finish(self, run: Row, lease: Lease, worker_id: str, status: str, error: Any, output: Any,
                      thread_changes: dict[str, Any], action: str | None, ended: Callable[[], None]) -> Row | None:
        """Write the outcome, call `ended` (it logs), and announce the end, so the log says a run ended before its
        waiters hear it; the finished run (None if it was not ours, or rolled back)."""
        run_id, thread_id = run["run_id"], run["thread_id"]
        finished = None
        try:
            if action == "rollback":
                await self.storage.delete_checkpoints_for_run(thread_id, run_id)
                thread_changes = {**await self.threads.current_fields(thread_id), "error": {
                    "error": "UserRollback", "message": f"rollback requested for run {run_id}"}}
            # A stateless run's temporary thread goes with the run's end (not when another worker holds it).
            finished = await self._finish_run(run, lease, status, error=error, output=output,
                                              thread_changes=thread_changes, worker_id=worker_id,
                                              attempt=run["attempt"],
                                              delete_thread=bool((run["kwargs"] or {}).get("temporary")))
            if finished is None:
                log.warning("run %s was no longer held by %s; its result was discarded", run_id, worker_id)
            else:
                ended()
            if action == "rollback":
                await self.storage.delete_run(run_id)
        finally:
            # Whatever failed above (or cancelled us), nobody is left waiting on this run.
            await asyncio.shield(self._announce_end(run_id))
        if finished is not None and run["kwargs"].get("webhook"):
            payload = {**run_out(finished), "values": finished.get("output"), "error": finished.get("error")}
            self.webhooks.send(run["kwargs"]["webhook"], payload)
        return None if action == "rollback" else finished

    async def _stream(self, graph: Any, run: Row, config: dict[str, Any], assistant: Row, lease: Lease,
                      protocol: ProtocolRun | None, given: Any) -> None:
        kwargs = run["kwargs"]
        modes = requested_modes(kwargs)
        lg_modes = sorted({lg for m in modes if (lg := STREAM_MODES.get(m))})
        subgraphs = bool(kwargs.get("stream_subgraphs"))
        options: dict[str, Any] = {
            "stream_mode": lg_modes or ["values"], "subgraphs": subgraphs,
            "interrupt_before": kwargs.get("interrupt_before"), "interrupt_after": kwargs.get("interrupt_after"),
            "context": run_context(run, assistant),
        }
        options["durability"] = run_durability(kwargs)
        # Asked for both, `messages` and `messages-tuple` are the tuple form alone, as on LangGraph's server.
        messages = MessageStreamer(legacy="messages" in modes and "messages-tuple" not in modes,
                                   tuples="messages-tuple" in modes)
        # A stateless run's checkpoints are its temporary thread's, gone with the run: as LangGraph's server,
        # no `checkpoints` events and no `checkpoint` debug events (the debug stream keeps its tasks).
        stateless = bool(kwargs.get("temporary"))

        async def publish(event: str, data: Any) -> None:
            await self._publish(lease, event, data)

        if "events" in modes:
            await self._stream_events(graph, given, config, options, publish)
            return
        if protocol is not None:  # Protocol v2 events go into the thread's log
            await protocol.stream(graph, given, config, options)
            return
        async for part in graph.astream(given, config, **options):
            ns, mode, chunk = part if subgraphs else ((), *part)
            suffix = "|" + "|".join(ns) if ns else ""
            if mode == "messages":
                for event, data in messages.feed(chunk):
                    await publish(event + suffix, data)
            elif stateless and (mode == "checkpoints" or (mode == "debug" and _is_checkpoint(chunk))):
                continue
            elif mode == "debug":
                await publish(mode + suffix, debug_json(chunk))
            elif mode in modes:
                await publish(mode + suffix, chunk)

    async def _stream_events(self, graph: Any, given: Any, config: dict[str, Any], options: dict[str, Any],
                             publish: Any) -> None:
        options = {k: v for k, v in options.items() if k not in ("stream_mode", "subgraphs")}
        async for event in graph.astream_events(given, config, version="v2", **options):
            await publish("events", event)


def run_timeout(config: dict[str, Any], default: float) -> float:
    """Seconds the run may execute: `configurable.run_timeout_seconds` of its config (the run's over its
    assistant's), else the server's `run_timeout_seconds`; 0 for no limit."""
    given = (config.get("configurable") or {}).get("run_timeout_seconds")
    if given is None:
        return max(default, 0.0)
    try:
        seconds = float(given)
    except (TypeError, ValueError):
        log.warning("ignoring run_timeout_seconds %r: not a number", given)
        return max(default, 0.0)
    return seconds if seconds > 0 else max(default, 0.0)


def _disarm(armed: list[asyncio.TimerHandle]) -> None:
    for handle in armed:
        handle.cancel()


def _is_checkpoint(chunk: Any) -> bool:
    return isinstance(chunk, dict) and chunk.get("type") == "checkpoint"
