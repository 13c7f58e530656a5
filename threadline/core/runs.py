"""Runs: creating them (with multitask strategies), reading, waiting, joining and cancelling."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, cast

from threadline.broker.base import Broker, StreamEvent
from threadline.core.assistants import Assistants
from threadline.core.auth import with_caller
from threadline.core.metrics import Metrics
from threadline.core.partials import PartialDecoder, is_partial
from threadline.core.protocol_events import end_without_worker, signal
from threadline.core.threads import Threads
from threadline.core.webhook_policy import WebhookGuard
from threadline.core.worker import WorkerPool
from threadline.errors import BadRequest, Conflict, InvalidInput, NotFound
from threadline.shapes import FINAL_RUN_STATUSES, CancelAction, CancelStatus, MultitaskStrategy, RunStatus
from threadline.storage.base import Claim, JsonRead, Quota, RunMetadata, Storage
from threadline.storage.records import AssistantRecord, NewRun, RunKwargs, RunRecord
from threadline.tracing import TRACE_KEY, carrier

TERMINAL = FINAL_RUN_STATUSES
#: How long a client's cancel waits for the run to have ended before it answers (see `Runs._settle`).
CANCEL_SETTLE_SECONDS = 5.0


def thread_signal(thread_id: str) -> str:
    """The key, in the broker's run-done signal space, that announces a new run on a thread."""
    return f"thread:{thread_id}"

# Keys of a run request kept in the run's `kwargs` and read by the executor.
KWARG_KEYS = (
    "input", "command", "config", "context", "stream_mode", "stream_subgraphs", "stream_resumable",
    "interrupt_before", "interrupt_after", "checkpoint", "checkpoint_id", "webhook", "on_completion",
    "on_disconnect", "after_seconds", "durability", "feedback_keys", "checkpoint_during", "langsmith_tracer",
    "protocol",  # set by Protocol v2 commands (core/protocol.py): the run's events go to the thread's log
)


def run_metadata(assistant: AssistantRecord, body: dict[str, Any]) -> RunMetadata:
    """As LangGraph's server: the assistant's metadata, then the thread's (nothing when the run creates the
    thread; the thread as the run tags it, with `run_thread_metadata`), then the run config's, then the
    request's, and the assistant id. Clients find a run's context there (deepagents finds the launching agent
    of a subagent's run in its thread's metadata)."""
    return RunMetadata(dict(assistant.get("metadata") or {}),
                       {**((body.get("config") or {}).get("metadata") or {}), **(body.get("metadata") or {}),
                        "assistant_id": assistant["assistant_id"]})


def run_thread_metadata(assistant: AssistantRecord) -> dict[str, Any]:
    """What a run merges into its thread's metadata as it is enqueued."""
    return {"graph_id": assistant["graph_id"], "assistant_id": assistant["assistant_id"]}


def check_command(body: dict[str, Any], *, stateless: bool) -> None:
    """A run's `command`, as LangGraph's server takes it: beside an `input` (any input: Agent Chat UI sends
    `input: {}` with the answer to an interrupt), a command that says anything wins and the input is not used
    (`executor.graph_input`); an empty command (`{}`) leaves the input. Only a stateless run cannot resume: it
    has no interrupt to answer."""
    command = body.get("command") or {}
    if stateless and command.get("resume") is not None:
        raise BadRequest("You must provide a thread_id when resuming.")


def check_run_timeout(config: Any) -> None:
    """A run's (or assistant's) `config.configurable.run_timeout_seconds`, when given, is a positive number."""
    given = ((config or {}).get("configurable") or {}).get("run_timeout_seconds") if isinstance(config, dict) \
        else None
    if given is None:
        return
    if isinstance(given, bool) or not isinstance(given, (int, float)) or not given > 0:
        raise InvalidInput(f"config.configurable.run_timeout_seconds must be a positive number of seconds, "
                           f"not {given!r}")


class RunRequest(NamedTuple):
    """A run request as admitted (authorized, validated): what `Runs.create` enqueues."""

    body: dict[str, Any]  # as the authorization handler left it, with the caller's identity
    assistant: AssistantRecord
    thread_id: str  # a new one for a stateless run
    create_thread: bool  # the enqueue creates the thread when it is missing
    kwargs: RunKwargs  # what the executor reads (`KWARG_KEYS`, the trace)
    strategy: MultitaskStrategy
    delay: float  # `after_seconds`


def _new_run(request: RunRequest, run_id: str | None) -> NewRun:
    """The run's row, pending, available after the request's delay."""
    now = datetime.now(UTC)
    return {
        "run_id": run_id or str(uuid.uuid4()), "thread_id": request.thread_id,
        "assistant_id": request.assistant["assistant_id"], "status": "pending", "kwargs": request.kwargs,
        "metadata": {}, "multitask_strategy": request.strategy,
        "available_at": (now + timedelta(seconds=request.delay)).isoformat(),
        "created_at": now.isoformat(), "updated_at": now.isoformat(),
    }


def _cancel_value(action: CancelAction, run_ids: list[str] | None, status: str | None) -> dict[str, Any]:
    """What a cancel's `@auth.on.threads.update` handler is given beside the thread, as LangGraph's server
    gives it: the action, and the runs asked for in `metadata`."""
    return {"action": action, "metadata": {"run_ids": run_ids, "status": status}}


class Runs:
    """Run operations. Execution itself is the worker's (see `threadline.core.worker`)."""

    def __init__(self, storage: Storage, broker: Broker, assistants: Assistants, threads: Threads,
                 workers: WorkerPool | None = None, webhooks: WebhookGuard | None = None, *,
                 max_per_identity: int = 0, max_active: int = 0, metrics: Metrics | None = None) -> None:
        self.storage = storage
        self.webhooks = webhooks  # langgraph.json `webhooks.url`: a run's webhook is checked when it is created
        self.metrics = metrics
        self.max_per_identity = max_per_identity  # caps on active runs (limits): 0 for none
        self.max_active = max_active
        self.broker = broker
        self.assistants = assistants
        self.threads = threads
        self.workers = workers  # this process's pool, if it has one: see `create(start_here=True)`

    async def _resolve_assistant(self, assistant_id: str | None) -> AssistantRecord:
        if assistant_id:
            return await self.assistants.runnable(assistant_id)
        graphs = self.assistants.graphs
        default = graphs.default_agent or (graphs.ids()[0] if len(graphs.ids()) == 1 else None)
        if default is None:
            raise InvalidInput(
                f"assistant_id is required: this server serves several agents ({', '.join(graphs.ids())}) "
                "and its config names no default (threadline.default_agent in langgraph.json)",
                choices=graphs.ids(),
            )
        return await self.assistants.resolve(default)

    async def create(self, thread_id: str | None, body: dict[str, Any], *, start_here: bool = False,
                     identity: str | None = None, run_id: str | None = None) -> RunRecord:
        """Validate, apply the multitask strategy and enqueue; returns the run as created.

        `thread_id=None` is a stateless run on a temporary thread. With `start_here` (the caller waits for the
        run: `/wait`, `/stream`), a run that can start now, on a thread with no other active run, while this
        process has a free worker slot, is created already claimed by that slot and starts at once, with no
        queue hop (`WorkerPool.create_here`); `wait` then takes its outcome from the slot. Otherwise the run
        is created pending. `run_id`: the new run's id (a cron's tick derives it), else a new one.
        """
        request = await self._admit(thread_id, with_caller(body), run_id)
        await self._apply_strategy(request)
        run = _new_run(request, run_id)
        pool = self.workers if start_here and request.delay <= 0 else None

        def enqueue(claim: Claim | None) -> Awaitable[RunRecord]:
            return self._enqueue(request, run, identity, claim)

        created = await (pool.create_here(enqueue, assistant=request.assistant) if pool is not None
                         else enqueue(None))
        if created["status"] != "running":  # not started here: a worker claims it from the queue
            await self.broker.wake_workers()
        await self.broker.notify_run_done(thread_signal(request.thread_id))  # wakes followers of the thread
        return created

    async def _admit(self, thread_id: str | None, body: dict[str, Any], run_id: str | None) -> RunRequest:
        """The request authorized (`@auth.on.threads.create_run`) and checked; what the run will be."""
        body, filters = await self._authorize_create(thread_id, body, run_id)
        assistant = await self._resolve_assistant(body.get("assistant_id"))
        if body.get("webhook") and self.webhooks is not None:
            await self.webhooks.check(body["webhook"])
        check_command(body, stateless=thread_id is None)
        check_run_timeout(body.get("config"))
        kwargs = cast("RunKwargs", {k: body[k] for k in KWARG_KEYS if body.get(k) is not None})
        if trace := carrier():  # the worker that executes the run continues the caller's trace
            kwargs[TRACE_KEY] = trace
        if thread_id is None:  # stateless: a temporary thread, deleted once the run completes (by default)
            kwargs.setdefault("on_completion", "delete")
            kwargs["temporary"] = kwargs["on_completion"] == "delete"
            thread_id, create_thread = str(uuid.uuid4()), True
        else:
            create_thread = body.get("if_not_exists") == "create"
            await self._check_thread(thread_id, filters, may_create=create_thread)
            resuming = body.get("strict_resume") and (body.get("command") or {}).get("resume") is not None
            if resuming and not (await self.threads.get(thread_id, values=False)).get("interrupts"):
                raise InvalidInput("strict_resume: the thread has no interrupt waiting for an answer")
        # LangGraph's server defaults to enqueue; clients written against it rely on that.
        strategy: MultitaskStrategy = body.get("multitask_strategy") or "enqueue"
        return RunRequest(body, assistant, thread_id, create_thread, kwargs, strategy,
                          float(body.get("after_seconds") or 0))

    async def _apply_strategy(self, request: RunRequest) -> None:
        """`interrupt` and `rollback` stop the thread's active runs first; `reject` is decided by the enqueue
        (in its transaction), `enqueue` queues behind them."""
        if request.strategy in ("interrupt", "rollback"):
            for active in await self.storage.active_runs(request.thread_id):
                await self.stop(active["run_id"], action=request.strategy)

    async def _enqueue(self, request: RunRequest, run: NewRun, identity: str | None, claim: Claim | None) -> RunRecord:
        """The run stored and queued (claimed with `claim`, if it can start at once) in one transaction,
        under the caps on active runs (limits)."""
        assistant, body = request.assistant, request.body
        return await self.storage.enqueue_run(
            run, thread_metadata=run_thread_metadata(assistant),
            create_thread=request.create_thread, reject_if_active=request.strategy == "reject",
            thread_ttl_minutes=self.threads.default_ttl,
            # As the reference: a thread a run creates also carries the run's metadata.
            new_thread_metadata={**((body.get("config") or {}).get("metadata") or {}), **(body.get("metadata") or {})},
            claim_for=claim, run_metadata=run_metadata(assistant, body),
            quota=Quota(identity, self.max_per_identity, self.max_active)
            if self.max_per_identity or self.max_active else None,
        )

    async def _authorize_create(self, thread_id: str | None, body: dict[str, Any],
                                run_id: str | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """`@auth.on.threads.create_run`: the request as its handler left it (it may stamp the run's metadata,
        which a thread the run creates carries too) and the filter the run's thread must pass."""
        access = self.threads.access
        if not access.enabled:
            return body, None
        value: dict[str, Any] = {
            "thread_id": thread_id, "assistant_id": body.get("assistant_id"), "run_id": run_id, "status": "pending",
            "metadata": dict(body.get("metadata") or {}), "kwargs": {k: body[k] for k in KWARG_KEYS if k in body},
            "prevent_insert_if_inflight": body.get("multitask_strategy") == "reject",
            "multitask_strategy": body.get("multitask_strategy") or "enqueue",
            "if_not_exists": body.get("if_not_exists"), "after_seconds": body.get("after_seconds"),
        }
        filters = await access.filters("threads", "create_run", value)
        return {**body, "metadata": value["metadata"]}, filters

    async def _check_thread(self, thread_id: str, filters: dict[str, Any] | None, *, may_create: bool) -> None:
        """A run on someone else's thread is refused as if the thread did not exist (before any effect: a
        multitask strategy must not stop their runs); one the run would create is the caller's."""
        if not filters or await self.storage.get_thread(thread_id, filters=filters, values=False) is not None:
            return
        if not may_create or await self.storage.get_thread(thread_id, values=False) is not None:
            raise NotFound(f"Thread with ID {thread_id} not found")

    async def get(self, run_id: str, thread_id: str | None = None, *, action: str = "read",
                  value: dict[str, Any] | None = None, output: bool = True) -> RunRecord:
        """The run, if the caller may `action` its thread (`@auth.on.threads.<action>`, given the run's thread
        and id, and `value`'s fields: a run is its thread's, as on LangGraph's server); otherwise, as when there
        is no such run, `NotFound`. `output`: whether it is read with its output (`Storage.get_run`)."""
        run = await self.storage.get_run(run_id, output=output)
        if run is None or (thread_id is not None and run["thread_id"] != thread_id):
            raise NotFound("Run not found")
        access = self.threads.access
        if access.enabled:
            filters = await access.filters("threads", action,
                                           {"thread_id": run["thread_id"], "run_id": run_id, **(value or {})})
            if filters and await self.storage.get_thread(run["thread_id"], filters=filters, values=False) is None:
                raise NotFound("Run not found")
        return run

    async def search(self, **query: Any) -> list[RunRecord]:
        """Runs, newest first: of one thread (`threads.read` of it), or across threads (`threads.search`),
        only those on threads the caller may see."""
        action = "read" if query.get("thread_id") else "search"
        value = {k: query.get(k) for k in ("thread_id", "assistant_id", "status", "limit", "offset")}
        thread_filters = await self.threads.access.filters("threads", action, value)
        return await self.storage.search_runs(**query, thread_filters=thread_filters)

    async def delete(self, run_id: str, thread_id: str | None = None) -> None:
        run = await self.get(run_id, thread_id, action="delete")
        if run["status"] not in TERMINAL:
            raise Conflict(f"Run {run_id} is {run['status']}: cancel it before deleting it")
        await self.storage.delete_run(run_id)

    async def wait(self, run_id: str, thread_id: str | None = None, *,
                   output: JsonRead = True) -> RunRecord | None:
        """Return the run once it is terminal (None if it was deleted meanwhile, as by a rollback).

        Woken by the run ending, not by polling: the 30 s re-check only guards against a lost wake-up. A run
        this process started itself (`create(start_here=True)`) is awaited on its slot. `output` as
        `Storage.get_run`'s, for a run read from storage (`"text"`: for an answer that writes it out as it is).
        """
        here = self.workers.started_here(run_id) if self.workers is not None else None
        if here is not None:
            try:
                finished = await asyncio.shield(here)
            except asyncio.CancelledError:
                if not here.cancelled():
                    raise  # this waiter was cancelled, not the run
                finished = None  # the pool stopped (shutdown) and put the run back in the queue
            if finished is not None and (thread_id is None or finished["thread_id"] == thread_id):
                return finished
        first = True
        while True:
            listen = self.broker.listen_run_done(run_id)
            run = await self.storage.get_run(run_id, output=output)
            if first and (run is None or (thread_id is not None and run["thread_id"] != thread_id)):
                raise NotFound("Run not found")
            first = False
            if run is None or run["status"] in TERMINAL:
                return run
            await listen(30.0)

    async def cancel(self, run_id: str, thread_id: str | None = None, *, wait: bool = False,
                     action: CancelAction = "interrupt") -> RunRecord | None:
        """A client's cancel: 404 when the run has already finished (as the reference), else `stop`."""
        run = await self.get(run_id, thread_id, action="update", value=_cancel_value(action, [run_id], None))
        if run["status"] in TERMINAL:
            raise NotFound("No matching runs to cancel: the run has already finished")
        stopped = await self._stop(run, wait=wait, action=action)
        if not wait:
            await self._settle([run_id])
        return stopped

    async def _settle(self, run_ids: list[str]) -> None:
        """Wait, `CANCEL_SETTLE_SECONDS` at most in all, until runs sent a cancel have ended in storage.

        So a client's cancel answers once a read shows the run stopped, as LangGraph's server's does, whichever
        process runs it: the worker that holds the run records its end (and its thread's) when its task stops,
        at its next await, usually within milliseconds. The run is not marked ended here, before its task has
        stopped: a thread's next run would start while the cancelled one still writes. A run that does not
        stop in time (an agent that blocks the event loop) is answered as it stands: still `running`."""
        try:
            async with asyncio.timeout(CANCEL_SETTLE_SECONDS):
                for run_id in run_ids:
                    with contextlib.suppress(NotFound):  # rolled back: deleted with its end
                        await self.wait(run_id)
        except TimeoutError:
            pass

    async def stop(self, run_id: str, *, wait: bool = False,
                   action: CancelAction = "interrupt") -> RunRecord | None:
        """Stop the run if it is still active; a run that finished meanwhile is simply returned."""
        run = await self.storage.get_run(run_id)
        if run is None or run["status"] in TERMINAL:
            return run
        return await self._stop(run, wait=wait, action=action)

    async def _stop(self, run: RunRecord, *, wait: bool, action: CancelAction) -> RunRecord | None:
        """Pending runs never start; running ones are cancelled at their next await."""
        run_id = run["run_id"]
        if await self.storage.cancel_pending_runs([run_id], "interrupted"):
            await self._after_stop(run, action)
            return None if action == "rollback" else await self.storage.get_run(run_id)
        await self.broker.send_cancel(run_id, action)
        if wait:
            return await self.wait(run_id)
        return await self.storage.get_run(run_id)

    async def _after_stop(self, run: RunRecord, action: CancelAction) -> None:
        """Bookkeeping for a run that ended without a worker: rollback, signals, stream end. Its end is in
        storage already, so the signals are best effort: a cancel that took effect answers as such with the
        broker away, and a client that retries it is told the run has ended (404), as for any ended run."""
        if action == "rollback":
            await self.storage.delete_run(run["run_id"])
        await end_without_worker(self.storage, self.broker, run, "interrupted")
        # The thread's next pending run may now be claimable; without the wake-up a claimer's poll finds it.
        await signal(self.broker.wake_workers(), "a worker's wake-up")

    async def cancel_many(self, *, run_ids: list[str] | None = None, thread_id: str | None = None,
                          status: CancelStatus | None = None, action: CancelAction = "interrupt") -> int:
        targets: list[RunRecord] = []
        asked = _cancel_value(action, run_ids, status)
        if run_ids:
            for rid in run_ids:
                try:
                    targets.append(await self.get(rid, thread_id or None, action="update", value=asked))
                except NotFound:
                    raise NotFound(f"Run {rid} not found") from None
        else:
            if thread_id:
                await self.threads.get(thread_id, action="update", value={"thread_id": thread_id, **asked},
                                       values=False)
            thread_filters = await self.threads.access.filters("threads", "update", {"thread_id": thread_id, **asked})
            statuses = ["pending", "running"] if status in (None, "all") else [status]
            for st in statuses:
                targets += await self.storage.search_runs(thread_id=thread_id, assistant_id=None, status=st,
                                                          metadata=None, limit=10_000, offset=0,
                                                          thread_filters=thread_filters)
        targets = [r for r in targets if r["status"] not in TERMINAL]
        if not targets:
            raise NotFound("No runs found to cancel.")
        for run in targets:
            await self.stop(run["run_id"], action=action)  # one that finished meanwhile is left as it is
        await self._settle([run["run_id"] for run in targets])
        return len(targets)

    async def cancel_thread_runs(self, thread_id: str) -> None:
        for run in await self.storage.active_runs(thread_id):
            await self.stop(run["run_id"], action="interrupt", wait=True)

    async def delete_assistant(self, assistant_id: str, *, delete_threads: bool = False) -> None:
        """Delete the assistant and cancel its pending and running runs (they end `interrupted`, as on
        LangGraph's server, instead of failing later without their assistant).

        `delete_threads`: also delete the threads it ran on that it was the last to run on (their
        `metadata.assistant_id`), with their runs and checkpoints, as LangGraph's server does; a thread that
        only names it in its metadata, or that another assistant ran on since, is kept."""
        aid = (await self.assistants.get(assistant_id, action="delete"))["assistant_id"]
        await self.assistants.delete(aid)  # first: no new run can name it now (its runs' rows stay)
        active = [r["run_id"] for status in ("pending", "running") async for r in self._runs_of(aid, status)]
        for run_id in active:
            await self.stop(run_id, action="interrupt")
        await self._settle(active)
        if delete_threads:
            threads = []
            for thread_id in dict.fromkeys([r["thread_id"] async for r in self._runs_of(aid, None)]):
                thread = await self.storage.get_thread(thread_id, values=False)
                if thread is not None and thread["metadata"].get("assistant_id") == aid:
                    threads.append(thread_id)
            await self.delete_threads(threads)

    async def _runs_of(self, assistant_id: str, status: RunStatus | None, page: int = 500) -> AsyncIterator[RunRecord]:
        """Every run of the assistant (with `status`, if given), a page at a time: no cap, and only the
        active ones when that is all a caller needs (a finished run's row carries its output)."""
        offset = 0
        while True:
            rows = await self.storage.search_runs(thread_id=None, assistant_id=assistant_id, status=status,
                                                  metadata=None, limit=page, offset=offset)
            for row in rows:
                yield row
            if len(rows) < page:
                return
            offset += page

    async def delete_threads(self, thread_ids: list[str]) -> int:
        """Delete each thread with its checkpoints and runs, its active runs cancelled first (as
        `DELETE /threads/{id}`); unknown ones are skipped. Returns how many were deleted."""
        deleted = 0
        for thread_id in dict.fromkeys(thread_ids):
            if not await self.threads.visible(thread_id, action="delete"):
                continue
            await self.cancel_thread_runs(thread_id)
            deleted += await self.storage.delete_thread(thread_id)
        return deleted

    async def stream(self, run_id: str, *, last_event_id: str | None = None, replay: bool = False,
                     modes: list[str] | None = None) -> AsyncIterator[StreamEvent]:
        """The run's events, one by one (`stream_batches`, flattened)."""
        async for batch in self.stream_batches(run_id, last_event_id=last_event_id, replay=replay, modes=modes):
            for event in batch:
                yield event

    async def stream_batches(self, run_id: str, *, last_event_id: str | None = None, replay: bool = False,
                             modes: list[str] | None = None) -> AsyncIterator[list[StreamEvent]]:
        """The run's events, in the lists the broker hands them over in (never empty). A finished run whose
        events are no longer buffered has an empty stream.

        `modes` (a join's `stream_mode`): only the events of those modes, as LangGraph's server: `metadata` is
        one, `messages` takes every `messages/*` event, a subgraph's `updates|<ns>` counts as `updates`, and
        `messages-tuple` is sent as `messages`. An `error` event always passes: a client that asked for `values`
        must still learn that the run failed."""
        run = await self.storage.get_run(run_id, output=False)
        if run is not None and run["status"] in TERMINAL and not await self.broker.stream_started(run_id):
            return
        gap = False  # counted once per stream, whether events were dropped or a partial cannot be rebuilt
        if last_event_id is not None and self.metrics is not None and await self.broker.resume_gap(run_id,
                                                                                                  last_event_id):
            gap = True
            self.metrics.replay_gap()  # the client missed events the bounded buffer no longer holds
        modes = [m for m in modes or () if m]  # langgraph-sdk sends `stream_mode=` when it has none
        wanted = {"messages" if m == "messages-tuple" else m for m in modes} | {"error"}
        # Message events are held as deltas (`core/partials.py`): a stream that starts past the first event
        # rebuilds them from the buffered events before its cursor.
        context = (last_event_id is not None or not replay) and (not modes or "messages" in wanted) \
            and (run is None or _partial_messages(run))
        partials = PartialDecoder()
        async for batch in self.broker.subscribe_batches(run_id, after=last_event_id, replay=replay,
                                                         context=context):
            out = []
            for event in batch:
                if modes and event.event.split("|", 1)[0].split("/", 1)[0] not in wanted:
                    continue
                if is_partial(event.data):
                    data = partials.decode(event.data)
                    if data is None and not event.context and not gap and self.metrics is not None:
                        gap = True  # a partial it builds on was dropped: not sent rather than sent wrong
                        self.metrics.replay_gap()
                    if data is None or event.context:
                        continue
                    event = StreamEvent(event.id, event.event, data)
                elif event.context:
                    continue
                out.append(event)
            if out:
                yield out

    async def output(self, run: RunRecord) -> Any:
        """What /wait answers for a finished run: the thread's values, an error object, or interrupts."""
        if run["status"] == "error":
            return {"__error__": run.get("error") or {"error": "Error", "message": "run failed"}}
        return run.get("output") if run.get("output") is not None else {}


def _partial_messages(run: RunRecord) -> bool:
    """Whether the run streams message events held as deltas (the `messages` or `messages-tuple` mode)."""
    modes = (run.get("kwargs") or {}).get("stream_mode") or ["values"]
    modes = [modes] if isinstance(modes, str) else modes
    return "messages" in modes or "messages-tuple" in modes
