"""Executing one claimed run: the graph with the thread's checkpointer, its events onto the broker."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal, cast

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
from threadline.serde import dumps_kept
from threadline.shapes import FinalRunStatus, StreamMode, requested_modes, run_durability, run_out
from threadline.storage.base import Storage
from threadline.storage.records import AssistantRecord, RunKwargs, RunRecord
from threadline.storage.rules import timed_out

log = logging.getLogger("threadline.executor")

INFRA_RETRY_FIRST = 0.2  # seconds before a run goes on after the database or broker failed under it
INFRA_RETRY_MAX = 5.0

# Stream modes a client may ask for (`shapes.StreamMode`), and the LangGraph stream mode that feeds each.
STREAM_MODES: dict[StreamMode, str | None] = {
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


#: The tag LangGraph gives its own steps (and a project its runs) to keep them out of traces and `events`.
HIDDEN = "langsmith:hidden"


def build_config(run: RunRecord, assistant: AssistantRecord, thread_id: str) -> dict[str, Any]:
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
    config["configurable"] = user_in_config(configurable)
    config["metadata"] = {**(base.get("metadata") or {}), **(given.get("metadata") or {}), **run["metadata"],
                          "run_id": run["run_id"], "thread_id": thread_id,
                          "assistant_id": assistant["assistant_id"], "graph_id": assistant["graph_id"]}
    config["run_id"] = run["run_id"]
    return config


def run_context(run: RunRecord, assistant: AssistantRecord) -> dict[str, Any]:
    """The run's context over the assistant's. Always a dict, `{}` when neither gives one, as on LangGraph's
    server: a graph's `context_schema` (a dataclass or pydantic model) is then built from its defaults, so
    `runtime.context.field` works in a run that sent no context."""
    return {**(assistant.get("context") or {}), **((run["kwargs"] or {}).get("context") or {})}


def graph_input(kwargs: RunKwargs) -> Any:
    command = kwargs.get("command")
    if command:
        goto = command.get("goto")
        if isinstance(goto, dict) or (isinstance(goto, list) and goto and isinstance(goto[0], dict)):
            from langgraph.types import Send

            sends = [goto] if isinstance(goto, dict) else goto
            goto = [Send(s["node"], s.get("input")) if isinstance(s, dict) else s for s in sends]
        return Command(resume=command.get("resume"), update=command.get("update"), goto=goto or ())
    return kwargs.get("input")


class AssistantGone(LookupError):
    """The run's assistant was deleted before the run started."""


@dataclass(frozen=True)
class Outcome:
    """How a run ended, as this worker records it: the run's status, error and output, what its thread becomes,
    and the stop that ended it (`StopSignal.action`: "interrupt", "rollback", "timeout"; None when the graph
    ran to its end or failed)."""

    status: FinalRunStatus
    thread_changes: dict[str, Any]
    output: Any = None
    error: dict[str, Any] | None = None
    action: str | None = None
    failure: BaseException | None = None  # the agent's own exception: logged with its traceback


def succeeded(state: dict[str, Any]) -> Outcome:
    """A graph that ran to its end (or to an interrupt): its output, and its thread's state after it."""
    return Outcome("success", {**thread_fields(state), "error": None}, output=run_output(state))


def stopped(action: str, run_id: str, thread_now: dict[str, Any]) -> Outcome:
    """A run cancelled by `action`; `thread_now`: its thread's fields at its last checkpoint."""
    changes = dict(thread_now)
    if action == "timeout":
        # As LangGraph's server: the run `timeout`, its thread `error` at its last checkpoint, and waiters
        # answered with the thread's values; the stream just ends (no `error` event).
        error = timed_out()
        changes.update(status="error", error=error)
        return Outcome("timeout", changes, output=changes.get("values"), error=error, action=action)
    if action == "interrupt":
        # As LangGraph's server does: the thread shows it was stopped by the user.
        changes.update(status="interrupted", error={
            "error": "UserInterrupt", "message": f"interrupt requested for run {run_id}"})
    return Outcome("interrupted", changes, action=action)


#: Whose failure an exception out of a run is: `lease` (another worker holds the run now: nothing to record),
#: `infrastructure` (the database or broker failed, not the agent: the run goes back to the queue), `agent`.
FailureKind = Literal["lease", "infrastructure", "agent"]


def failure_kind(exc: Exception, lease_valid: bool) -> FailureKind:
    if isinstance(exc, LeaseLost) or not lease_valid:
        return "lease"
    return "infrastructure" if isinstance(exc, Unavailable) else "agent"


def error_of(exc: BaseException) -> dict[str, Any]:
    """The error a failed run records and streams: the exception's type and message."""
    return {"error": type(exc).__name__, "message": str(exc)}


def failed(exc: Exception, thread_now: dict[str, Any] | None) -> Outcome:
    """A run whose agent raised `exc`; `thread_now`: its thread's fields, None when they could not be read."""
    error = error_of(exc)
    return Outcome("error", {"error": error, **(thread_now or {}), "status": "error"}, error=error, failure=exc)


def rolled_back(thread_now: dict[str, Any], run_id: str) -> dict[str, Any]:
    """The thread after a rollback deleted the run's checkpoints: its fields now, and why."""
    return {**thread_now, "error": {"error": "UserRollback", "message": f"rollback requested for run {run_id}"}}


@dataclass(frozen=True)
class Claim:
    """One run as a worker holds it while executing it."""

    run: RunRecord
    worker_id: str
    stop: StopSignal
    lease: Lease
    #: The run's log fields; `graph_id` joins them once the assistant is read.
    fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, run: RunRecord, worker_id: str, stop: StopSignal, lease: Lease) -> Claim:
        return cls(run, worker_id, stop, lease, {"run_id": run["run_id"], "thread_id": run["thread_id"],
                                                 "assistant_id": run["assistant_id"],
                                                 "attempt": run.get("attempt", 1)})


#: The calls to the node threads that the run this task executes has submitted and that have not returned.
_RUN: ContextVar[set[Future[Any]] | None] = ContextVar("threadline_run", default=None)


class NodeThreads(ThreadPoolExecutor):
    """The loop's default thread pool, where LangGraph runs synchronous nodes: it remembers which run
    submitted each call, so that a cancelled run ends only once its nodes' threads have returned (a thread
    cannot be stopped: cancelling the node's task only stops waiting for it). Per call (a model that streams
    from a thread submits one per token), one `set.add` and one `set.discard` on the run's own set: no lock
    (each is atomic under the GIL), no table of runs."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="threadline-node")

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future = super().submit(fn, *args, **kwargs)
        running = _RUN.get()
        if running is not None:
            running.add(future)
            future.add_done_callback(running.discard)
        return future

    @staticmethod
    def track() -> set[Future[Any]]:
        """From now on, this task's (and its children's) calls count as the run's; the set of those running."""
        running: set[Future[Any]] = set()
        _RUN.set(running)
        return running

    @staticmethod
    async def settled(run_id: str, running: set[Future[Any]] | None = None) -> None:
        """Return once no call the run submitted (`running`, by default this task's) is still running."""
        running = _RUN.get() if running is None else running
        pending = list(running.copy()) if running is not None else []
        if pending:
            log.info("run %s: cancelled; waiting for %d synchronous node(s) to return", run_id, len(pending))
            await asyncio.wait([asyncio.wrap_future(f) for f in pending])


class Executor:
    """Runs one run to its end and records the outcome. Used by the worker pool."""

    def __init__(self, storage: Storage, broker: Broker, graphs: GraphRegistry, threads: Threads,
                 metrics: Metrics, webhooks: Webhooks | None = None, *, run_timeout: float = 0.0,
                 log_coalesce: float = 0.0) -> None:
        self.metrics = metrics
        self.run_timeout = run_timeout  # seconds a run may execute unless its config says otherwise; 0: none
        self.log_coalesce = log_coalesce  # seconds a protocol run's events wait to share a write (`EventWriter`)
        self.node_threads = NodeThreads()  # installed as the loop's default executor by the worker pool
        self.webhooks = webhooks or Webhooks()
        self.storage = storage
        self.broker = broker
        self.graphs = graphs
        self.threads = threads

    async def execute(self, run: RunRecord, worker_id: str, stop: StopSignal, lease: Lease,
                      assistant: AssistantRecord | None = None) -> RunRecord | None:
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
        NodeThreads.track()  # this task's own context: the node threads it starts count as the run's
        claim, started = Claim.of(run, worker_id, stop, lease), time.monotonic()
        protocol = ProtocolRun(self.storage, self.broker, run, lease, run["assistant_id"], self.log_coalesce) \
            if (run["kwargs"] or {}).get("protocol") else None  # started through /commands
        outcome = await self._outcome(claim, assistant, protocol)
        if outcome is None:
            return None
        if not lease.valid():
            log.warning("run %s ended after its lease lapsed; its result is discarded", run["run_id"])
            return None
        if protocol is not None and outcome.status != "success":
            await self._protocol_end(protocol, run["run_id"], outcome.status, outcome.error)
        lease.finishing = True
        finished = await self._finish(claim, outcome, lambda: _log_end(claim, outcome, started))
        self.metrics.run_finished(outcome.status, time.monotonic() - started)
        return finished

    async def _outcome(self, claim: Claim, assistant: AssistantRecord | None,
                       protocol: ProtocolRun | None) -> Outcome | None:
        """Run the graph and say how the run ended; None when this worker has nothing to record."""
        try:
            return succeeded(await self._run(claim, assistant, protocol))
        except asyncio.CancelledError:
            if claim.stop.action is None:
                raise
            return await self._stopped(claim, claim.stop.action)
        except AssistantGone:
            # Deleted after this run was queued: deleting an assistant cancels its runs (`Runs.delete_assistant`),
            # and a run claimed between the delete and its cancel ends as the cancel would have ended it.
            return await self._stopped(claim, "interrupt")
        except Exception as exc:  # noqa: BLE001 - the agent's own failure: recorded on the run, shown to the client
            return await self._failed(claim, exc)

    async def _run(self, claim: Claim, assistant: AssistantRecord | None, protocol: ProtocolRun | None) -> dict[str,
                   Any]:
        """Start the run (its stream's first event, its assistant, its deadline) and run its graph; the thread's
        state after it."""
        run, stop = claim.run, claim.stop
        # First, even when a cancel is already waiting: a claimed run's stream always starts with it.
        await self._publish(claim.lease, "metadata", {"run_id": run["run_id"], "attempt": run.get("attempt", 1)})
        stop.started = True
        if stop.action is not None:
            raise asyncio.CancelledError
        if assistant is None:
            assistant = await self.storage.get_assistant(run["assistant_id"])
        if assistant is None:
            raise AssistantGone(f"Assistant {run['assistant_id']} no longer exists")
        claim.fields["graph_id"] = assistant["graph_id"]
        log.info("run started", extra=claim.fields)
        if protocol is not None:
            protocol.named(assistant["graph_id"])
        config = build_config(run, assistant, run["thread_id"])
        deadline = await self._arm_deadline(run["run_id"], config, stop)
        try:
            return await self._run_graph(run, config, assistant, claim.lease, protocol)
        finally:
            if deadline is not None:
                deadline.cancel()

    async def _stopped(self, claim: Claim, action: str) -> Outcome:
        """A run cancelled by a user (or its deadline): once its synchronous nodes have returned."""
        run_id = claim.run["run_id"]
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
        # A synchronous node goes on in its thread: the run is not over until it returns (another
        # cancel, a shutdown, stops this wait; the run then goes back to the queue as usual).
        await self.node_threads.settled(run_id)
        outcome = stopped(action, run_id, await self.threads.current_fields(claim.run["thread_id"]))
        if outcome.status == "timeout":
            log.warning("run %s passed its timeout and was cancelled", run_id, extra=claim.fields)
        return outcome

    async def _failed(self, claim: Claim, exc: Exception) -> Outcome | None:
        """A run that raised: the agent's failure, recorded; None when it is not this worker's to record."""
        run, kind = claim.run, failure_kind(exc, claim.lease.valid())
        if kind == "lease":
            log.warning("run %s: lease lost (%s); leaving it to the worker that holds it now", run["run_id"], exc)
            return None
        if kind == "infrastructure":  # the database or broker failed, not the agent: another go later
            await self._release(run, claim.worker_id, cast(Unavailable, exc))
            return None
        await self._publish(claim.lease, "error", error_of(exc))
        try:
            thread_now: dict[str, Any] | None = await self.threads.current_fields(run["thread_id"])
        except Exception:
            log.exception("could not read state of thread %s after a failed run", run["thread_id"])
            thread_now = None
        return failed(exc, thread_now)

    async def _arm_deadline(self, run_id: str, config: dict[str, Any],
                            stop: StopSignal) -> asyncio.TimerHandle | None:
        """Cancel this run's task, as a cancel does (`stop.action = "timeout"`), once its deadline passes; the
        timer (None without a deadline). The deadline is stored on the run when it first starts and kept when
        it is retried, so the time a run spent on a worker that died counts too (and the sweeper ends it if no
        worker holds it then)."""
        seconds = run_timeout(config, self.run_timeout)
        if not seconds:
            return None
        # Written again at the storage edge if the connection is lost under it (the write is idempotent).
        remaining = await self.storage.set_run_deadline(run_id, seconds)
        task = asyncio.current_task()

        def expire() -> None:
            if stop.action is None and task is not None:
                stop.action = "timeout"
                task.cancel()

        return asyncio.get_running_loop().call_later(max(remaining, 0.0), expire)

    async def _run_graph(self, run: RunRecord, config: dict[str, Any], assistant: AssistantRecord, lease: Lease,
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

    async def _release(self, run: RunRecord, worker_id: str, exc: Unavailable) -> None:
        """Put the run back in the queue without spending an attempt (if that fails too, its lease lapses
        and the sweeper requeues it)."""
        log.warning("run %s: %s Back to the queue.", run["run_id"], exc.message)
        try:
            if await self.storage.release_runs(worker_id, {run["run_id"]: run["attempt"]}):
                await self.broker.wake_workers()
        except Unavailable as again:
            log.warning("run %s could not be put back in the queue (%s); it is retried when its lease lapses",
                        run["run_id"], again.message)

    async def _resume_point(self, run: RunRecord, config: dict[str, Any], given: Any) -> tuple[dict[str, Any], Any]:
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
        # Held in the stream's buffer (and a Redis outbox) for as long as it is kept: its own length, not orjson's.
        await self.broker.post(lease.run_id, event, data if isinstance(data, Held) else dumps_kept(data))

    async def _finish_run(self, run: RunRecord, lease: Lease, status: FinalRunStatus,
                          **outcome: Any) -> RunRecord | None:
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

    async def _finish(self, claim: Claim, outcome: Outcome, ended: Callable[[], None]) -> RunRecord | None:
        """Write the outcome, call `ended` (it logs), and announce the end, so the log says a run ended before its
        waiters hear it; the finished run (None if it was not ours, or rolled back)."""
        run, worker_id = claim.run, claim.worker_id
        run_id, thread_id = run["run_id"], run["thread_id"]
        finished = None
        try:
            thread_changes = outcome.thread_changes
            if outcome.action == "rollback":
                await self.storage.delete_checkpoints_for_run(thread_id, run_id)
                thread_changes = rolled_back(await self.threads.current_fields(thread_id), run_id)
            # A stateless run's temporary thread goes with the run's end (not when another worker holds it).
            finished = await self._finish_run(run, claim.lease, outcome.status, error=outcome.error,
                                              output=outcome.output, thread_changes=thread_changes,
                                              worker_id=worker_id, attempt=run["attempt"],
                                              delete_thread=bool((run["kwargs"] or {}).get("temporary")))
            if finished is None:
                log.warning("run %s was no longer held by %s; its result was discarded", run_id, worker_id)
            else:
                ended()
            if outcome.action == "rollback":
                await self.storage.delete_run(run_id)
        finally:
            # Whatever failed above (or cancelled us), nobody is left waiting on this run.
            await asyncio.shield(self._announce_end(run_id))
        if finished is not None and run["kwargs"].get("webhook"):
            payload = {**run_out(finished), "values": finished.get("output"), "error": finished.get("error")}
            self.webhooks.send(run["kwargs"]["webhook"], payload)
        return None if outcome.action == "rollback" else finished

    async def _stream(self, graph: Any, run: RunRecord, config: dict[str, Any], assistant: AssistantRecord,
                      lease: Lease,
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

        publish = functools.partial(self._publish, lease)  # per token: no coroutine of its own around it
        if protocol is not None:  # Protocol v2 events go into the thread's log
            await protocol.stream(graph, given, config, options)
            return
        parts = (_with_events(graph, given, config, options, publish) if "events" in modes
                 else graph.astream(given, config, **options))
        async for part in parts:
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


async def _with_events(graph: Any, given: Any, config: dict[str, Any], options: dict[str, Any],
                       publish: Callable[[str, Any], Awaitable[None]]) -> AsyncIterator[Any]:
    """`events` mode as LangGraph's server streams it: the events of `astream_events` but those of runs tagged
    `langsmith:hidden` (LangGraph's own steps: `__start__`, routing functions) and the root's own
    `on_chain_stream`, whose chunks are what `astream` would yield for the run's other modes (yielded here)."""
    async for event in graph.astream_events(given, config, version="v2", **options):
        if event["event"] == "on_chain_stream" and not event.get("parent_ids"):
            yield event["data"]["chunk"]
        elif HIDDEN not in (event.get("tags") or ()):
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


def _log_end(claim: Claim, outcome: Outcome, started: float) -> None:
    # A failed run's line carries its traceback: the one place a person sees where the agent broke.
    failure = outcome.failure
    log.info("run ended" if failure is None else f"run ended: {type(failure).__name__}: {failure}",
             exc_info=failure, extra={**claim.fields, "status": outcome.status,
                                      **({"action": outcome.action} if outcome.action else {}),
                                      "duration_ms": round((time.monotonic() - started) * 1000, 1)})


def _is_checkpoint(chunk: Any) -> bool:
    return isinstance(chunk, dict) and chunk.get("type") == "checkpoint"
