"""A2A tasks over LangGraph runs: messages in, tasks and stream events out.

A context is a thread (`contextId` = `thread_id`). A task is the run a message started, with the id
`{thread_id}:{run_id}`, followed by the runs that answered its interrupts (tagged `metadata.a2a_task_id`),
so the id stays stable across resumes and `GetTask` needs no contextId. Conversions between A2A's data model
and LangGraph's are `threadline.core.a2a`'s; JSON-RPC, the two JSON wire versions and HTTP are
`threadline.api.a2a`'s.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from a2a.types import a2a_pb2 as pb

from threadline.core.a2a import (
    RUN_STATES,
    S,
    a2a_message,
    delta_message,
    graph_input,
    interrupt_artifact,
    messages_of,
    response_artifact,
    resume_value,
    stamp,
    state_label,
    status_event,
    text_message,
)
from threadline.core.runtime import Runtime
from threadline.errors import InvalidInput, NotFound, TaskNotCancelable, TaskNotFound, UnsupportedOperation
from threadline.ids import is_uuid
from threadline.serde import loads
from threadline.storage.records import AssistantRecord, RunRecord

log = logging.getLogger("threadline.a2a")

#: Run metadata key naming the task a follow-up run (an interrupt's answer, a cancel marker) belongs to.
TASK_KEY = "a2a_task_id"


@dataclass
class Started:
    """A message's run, enqueued: the task it belongs to, and the request message with its ids filled in."""

    task_id: str
    run: RunRecord
    message: pb.Message


class A2ATasks:
    """A2A task operations for one assistant, over the runtime's runs and threads. The runs a message starts
    count against `identity` (the caller's: quotas)."""

    def __init__(self, rt: Runtime, assistant: AssistantRecord, identity: str | None = None) -> None:
        self.rt = rt
        self.identity = identity
        self.assistant = assistant
        self.assistant_id: str = assistant["assistant_id"]

    async def input_fields(self) -> set[str]:
        schemas = await self.rt.assistants.schemas(self.assistant)  # the row `runnable` gave: no second check
        return set(((schemas.get("input_schema") or {}).get("properties") or {}).keys())

    # --- reading tasks -----------------------------------------------------------------------
    async def _newest_run(self, thread_id: str, **filters: Any) -> RunRecord | None:
        found = await self.rt.runs.search(thread_id=thread_id, assistant_id=None, status=None,
                                          metadata=filters or None, limit=1, offset=0)
        return found[0] if found else None

    async def locate(self, task_id: str, context_id: str | None = None) -> tuple[str, RunRecord]:
        """The task's canonical id and its latest run. Tasks of other assistants are not found.

        Accepts `{thread_id}:{run_id}` or a bare run id (with `context_id` naming its thread, optionally).
        """
        thread_id, _, run_id = task_id.rpartition(":")
        try:
            run = await self.rt.runs.get(run_id) if run_id else None
        except NotFound:
            run = None
        if (run is None or run["assistant_id"] != self.assistant_id or (thread_id and run["thread_id"] != thread_id)
                or (context_id and run["thread_id"] != context_id)):
            raise TaskNotFound(f"Task not found: {task_id}")
        root = (run.get("metadata") or {}).get(TASK_KEY) or f"{run['thread_id']}:{run['run_id']}"
        latest = await self._newest_run(run["thread_id"], **{TASK_KEY: root})
        return root, latest or run

    async def state_of(self, run: RunRecord) -> pb.TaskState:
        """The task state a run shows: a finished run stopped at `interrupt()` is input-required while its
        thread still waits for the answer (no later run on the thread)."""
        state = RUN_STATES.get(run["status"], S.TASK_STATE_SUBMITTED)
        output = run.get("output")
        if state == S.TASK_STATE_COMPLETED and isinstance(output, dict) and output.get("__interrupt__"):
            newest = await self._newest_run(run["thread_id"])
            thread = await self.rt.storage.get_thread(run["thread_id"], values=False)
            if newest is not None and newest["run_id"] == run["run_id"] and thread and thread.get("interrupts"):
                return S.TASK_STATE_INPUT_REQUIRED
        return state

    async def task(self, task_id: str, run: RunRecord, *, state: pb.TaskState | None = None,
                   history_length: int | None = None, artifacts: bool = True,
                   request: pb.Message | None = None) -> pb.Task:
        """The task as of `run` (its latest run). History is the thread's messages as this run left them;
        before the run has any, the request message when known. `history_length` keeps the last n (0: none)."""
        state = await self.state_of(run) if state is None else state
        context_id = run["thread_id"]
        task = pb.Task(id=task_id, context_id=context_id)
        task.status.state = state
        stamp(task.status, run.get("updated_at"))
        if state == S.TASK_STATE_COMPLETED:
            answer = response_artifact(run)
            if answer is not None:
                task.artifacts.append(answer)
        elif state == S.TASK_STATE_INPUT_REQUIRED:
            asked, prompt = interrupt_artifact(run, task_id)
            task.artifacts.append(asked)
            task.status.message.CopyFrom(prompt)
        elif state == S.TASK_STATE_FAILED:
            error = run.get("error") or {}
            detail = f"{error.get('error', 'Error')}: {error.get('message', '')}" if error else run["status"]
            task.status.message.CopyFrom(text_message(f"{run['run_id']}-status", f"Error executing assistant: {detail}",
                                                      context_id, task_id))
        elif state == S.TASK_STATE_CANCELED:
            task.status.message.CopyFrom(text_message(f"{run['run_id']}-status", "Task was canceled", context_id,
                                                      task_id))
        if not artifacts:
            del task.artifacts[:]
        if history_length != 0:
            found = [m for m in (a2a_message(x, context_id) for x in messages_of(run.get("output"))) if m is not None]
            if not found and request is not None:
                found = [request]
            task.history.extend(found[-history_length:] if history_length else found)
            for message in task.history:  # each message of a task's history is the task's (as LangGraph's server)
                message.task_id = task_id
        return task

    async def get(self, task_id: str, *, context_id: str | None = None, history_length: int | None = None) -> pb.Task:
        task_id, latest = await self.locate(task_id, context_id)
        return await self.task(task_id, latest, history_length=history_length)

    async def list_tasks(self, *, context_id: str | None = None, state: pb.TaskState | None = None,
                         page_size: int = 50, offset: int = 0, history_length: int | None = 0,
                         include_artifacts: bool = False,
                         updated_after: datetime | None = None) -> pb.ListTasksResponse:
        """This assistant's tasks, newest first (one per message that started a task)."""
        runs = await self.rt.runs.search(thread_id=context_id, assistant_id=self.assistant_id, status=None,
                                         metadata=None, limit=10_000, offset=0)
        found: list[tuple[str, RunRecord, pb.TaskState]] = []
        for root in runs:
            if TASK_KEY in (root.get("metadata") or {}):
                continue
            task_id, latest = await self.locate(f"{root['thread_id']}:{root['run_id']}")
            current = await self.state_of(latest)
            if state is not None and current != state:
                continue
            if updated_after is not None and datetime.fromisoformat(latest["updated_at"]) <= updated_after:
                continue
            found.append((task_id, latest, current))
        page = found[offset:offset + page_size]
        more = offset + page_size < len(found)
        response = pb.ListTasksResponse(page_size=page_size, total_size=len(found),
                                        next_page_token=str(offset + page_size) if more else "")
        for task_id, latest, current in page:
            response.tasks.append(await self.task(task_id, latest, state=current, history_length=history_length,
                                                  artifacts=include_artifacts))
        return response

    # --- messages ------------------------------------------------------------------------------
    async def start(self, message: pb.Message, *, streamed: bool = True) -> Started:
        """Enqueue the run a message asks for: a new task, or the answer to the interrupt its task waits on.
        `streamed`: its events may be followed (a streaming message, a task sent without blocking, which may be
        subscribed to), so the run streams message deltas; a blocking send only waits for the end, as LangGraph's
        server runs it (and the chat model then answers in one piece: its message ids are the same as there).

        A message answers an interrupt when its `taskId` names an input-required task, or when it has no
        `taskId` and the newest task on its context is input-required (the next message on the context).
        """
        if not message.parts:
            raise InvalidInput("message.parts must not be empty")
        if message.role == pb.Role.ROLE_UNSPECIFIED:
            raise InvalidInput("message.role is required")
        context_id = message.context_id
        if context_id and not is_uuid(context_id):
            raise InvalidInput(f"contextId must be a UUID: it is the thread id (got {context_id!r})")
        task_id = None
        if message.task_id:
            task_id, latest = await self.locate(message.task_id, context_id or None)
            state = await self.state_of(latest)
            if state != S.TASK_STATE_INPUT_REQUIRED:
                raise UnsupportedOperation(f"Task {task_id} is {state_label(state)}: only a task waiting for input "
                                           "(input-required) accepts another message")
            context_id = latest["thread_id"]
        elif context_id:
            if await self.rt.storage.get_thread(context_id, values=False) is None:
                # A context no one has used yet: the caller's new thread (`threads.create`, as on the thread API);
                # someone else's context is not found when the run is created (`threads.create_run`).
                await self.rt.threads.create(thread_id=context_id, if_exists="do_nothing")
            newest = await self._newest_run(context_id)
            if newest is not None and newest["assistant_id"] == self.assistant_id \
                    and await self.state_of(newest) == S.TASK_STATE_INPUT_REQUIRED:
                task_id = (newest.get("metadata") or {}).get(TASK_KEY) or f"{context_id}:{newest['run_id']}"
        body: dict[str, Any] = {"assistant_id": self.assistant_id, "if_not_exists": "create",
                                **({"stream_mode": ["messages-tuple"]} if streamed else {})}
        if task_id:
            body.update(command={"resume": resume_value(message)}, metadata={TASK_KEY: task_id})
        else:
            body["input"] = graph_input(message, await self.input_fields())
        run = await self.rt.runs.create(context_id or str(uuid.uuid4()), body, identity=self.identity)
        task_id = task_id or f"{run['thread_id']}:{run['run_id']}"
        echoed = pb.Message()
        echoed.CopyFrom(message)
        echoed.context_id, echoed.task_id = run["thread_id"], task_id
        return Started(task_id, run, echoed)

    async def send(self, message: pb.Message, *, blocking: bool = True,
                   history_length: int | None = None) -> pb.Task:
        """`SendMessage`: the task once its run ends (or at once, submitted, when not `blocking`)."""
        started = await self.start(message, streamed=not blocking)
        run = started.run
        if blocking:
            run = await self.rt.runs.wait(run["run_id"]) or run
        return await self.task(started.task_id, run, history_length=history_length, request=started.message)

    async def stream(self, started: Started) -> AsyncIterator[pb.StreamResponse]:
        """`SendStreamingMessage`: the submitted task, then status and artifact updates until the run ends."""
        first = pb.StreamResponse()
        first.task.CopyFrom(await self.task(started.task_id, started.run, state=S.TASK_STATE_SUBMITTED,
                                            request=started.message))
        yield first
        async for event in self._relay(started.task_id, started.run, replay=True):
            yield event

    async def subscribe(self, task_id: str) -> AsyncIterator[pb.StreamResponse]:
        """`SubscribeToTask`: checked now (a task that is not running is refused), streamed when iterated."""
        task_id, latest = await self.locate(task_id)
        if (state := await self.state_of(latest)) not in (S.TASK_STATE_SUBMITTED, S.TASK_STATE_WORKING):
            raise UnsupportedOperation(f"Task {task_id} is {state_label(state)}: only a running task can be "
                                       "subscribed to")
        current = pb.StreamResponse()
        current.task.CopyFrom(await self.task(task_id, latest, state=state))
        return self._follow(current, self._relay(task_id, latest, replay=False))

    @staticmethod
    async def _follow(first: pb.StreamResponse,
                      rest: AsyncIterator[pb.StreamResponse]) -> AsyncIterator[pb.StreamResponse]:
        yield first
        async for event in rest:
            yield event

    async def _relay(self, task_id: str, run: RunRecord, *, replay: bool) -> AsyncIterator[pb.StreamResponse]:
        """The run's events as A2A updates: working, one working update per AI text or tool result chunk,
        then the final artifact and the final status (completed, input-required, failed or canceled)."""
        context_id, working = run["thread_id"], False
        async for event in self.rt.runs.stream(run["run_id"], replay=replay):
            if not working and event.event in ("metadata", "messages"):
                working = True
                yield status_event(task_id, context_id, S.TASK_STATE_WORKING)
            if event.event == "messages":
                delta = delta_message(loads(event.data), context_id, task_id)
                if delta is not None:
                    yield status_event(task_id, context_id, S.TASK_STATE_WORKING, delta)
        done = await self.rt.runs.wait(run["run_id"]) or run
        final = await self.task(task_id, done, history_length=0)
        for artifact in final.artifacts:
            event = pb.StreamResponse()
            update = event.artifact_update
            update.task_id, update.context_id, update.last_chunk = task_id, context_id, True
            update.artifact.CopyFrom(artifact)
            yield event
        event = pb.StreamResponse()
        event.status_update.task_id, event.status_update.context_id = task_id, context_id
        event.status_update.status.CopyFrom(final.status)
        yield event

    # --- cancel ------------------------------------------------------------------------------
    async def cancel(self, task_id: str, *, context_id: str | None = None) -> pb.Task:
        """Cancel for real: a submitted or working task's run is cancelled (and awaited); an input-required
        task gets a cancelled marker run (so it reads as canceled) and its thread's interrupt is ended."""
        task_id, latest = await self.locate(task_id, context_id)
        state = await self.state_of(latest)
        if state in (S.TASK_STATE_SUBMITTED, S.TASK_STATE_WORKING):
            await self.rt.runs.stop(latest["run_id"], wait=True)  # one that finished meanwhile stays as it is
            latest = await self.rt.runs.get(latest["run_id"])
        elif state == S.TASK_STATE_INPUT_REQUIRED:
            latest = await self._cancel_waiting(task_id, latest)
        else:
            raise TaskNotCancelable(f"Task {task_id} is already {state_label(state)}")
        state = await self.state_of(latest)
        if state != S.TASK_STATE_CANCELED:
            raise TaskNotCancelable(f"Task {task_id} ended ({state_label(state)}) before it could be canceled")
        return await self.task(task_id, latest, state=state)

    async def _cancel_waiting(self, task_id: str, latest: RunRecord) -> RunRecord:
        thread_id = latest["thread_id"]
        # A marker run that never becomes available to workers, cancelled at once: the task's latest run. It is
        # no run of the caller's (no identity): a caller at its cap can still cancel.
        marker = await self.rt.runs.create(thread_id, {"assistant_id": self.assistant_id, "after_seconds": 86_400,
                                                       "metadata": {TASK_KEY: task_id}})
        await self.rt.runs.stop(marker["run_id"])
        try:  # as the reference: the graph ends here, so the thread no longer shows a pending interrupt
            await self.rt.threads.update_state(thread_id, values=None, as_node="__end__")
        except Exception:
            log.warning("could not end the interrupted thread %s after cancelling task %s", thread_id, task_id,
                        exc_info=True)
        return await self.rt.runs.get(marker["run_id"])

