"""A2A tasks over LangGraph runs: messages in, tasks and stream events out.

A context is a thread (`contextId` = `thread_id`). A task is the run a message started, with the id
`{thread_id}:{run_id}`, followed by the runs that answered its interrupts (tagged `metadata.a2a_task_id`),
so the id stays stable across resumes and `GetTask` needs no contextId. This module speaks A2A 1.0's data
model (a2a-sdk's protobuf types); JSON-RPC, the two JSON wire versions and HTTP are `threadline.api.a2a`'s.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import MessageToDict, ParseDict

from threadline.ids import is_uuid
from threadline.core.runtime import Runtime
from threadline.errors import NotFound
from threadline.serde import loads, to_jsonable
from threadline.storage.base import Row

log = logging.getLogger("threadline.a2a")

S = pb.TaskState
TERMINAL = frozenset({S.TASK_STATE_COMPLETED, S.TASK_STATE_FAILED, S.TASK_STATE_CANCELED, S.TASK_STATE_REJECTED})
RUN_STATES = {"pending": S.TASK_STATE_SUBMITTED, "running": S.TASK_STATE_WORKING, "success": S.TASK_STATE_COMPLETED,
              "interrupted": S.TASK_STATE_CANCELED, "error": S.TASK_STATE_FAILED, "timeout": S.TASK_STATE_FAILED}
#: Run metadata key naming the task a follow-up run (an interrupt's answer, a cancel marker) belongs to.
TASK_KEY = "a2a_task_id"
FILE_BLOCKS = ("image", "audio", "video", "file")


# --- errors: each carries its JSON-RPC code (the A2A spec's); the docstring is the default message --------------

class A2AError(Exception):
    """Internal error."""

    code = -32603

    def __init__(self, message: str | None = None) -> None:
        self.message = message or (self.__doc__ or "").strip()
        super().__init__(self.message)


class InvalidParams(A2AError):
    """Invalid params."""

    code = -32602


class TaskNotFound(A2AError):
    """Task not found."""

    code = -32001


class TaskNotCancelable(A2AError):
    """Task cannot be canceled."""

    code = -32002


class PushNotificationNotSupported(A2AError):
    """Push notifications are not supported."""

    code = -32003


class UnsupportedOperation(A2AError):
    """This operation is not supported."""

    code = -32004


class ContentTypeNotSupported(A2AError):
    """Incompatible content types."""

    code = -32005


class ExtendedCardNotConfigured(A2AError):
    """No authenticated extended agent card is configured."""

    code = -32007


# --- small conversions --------------------------------------------------------------------------------------------

def state_label(state: pb.TaskState) -> str:
    """`TASK_STATE_INPUT_REQUIRED` -> `input-required` (the 0.3 spelling, for messages)."""
    return str(pb.TaskState.Name(state)).removeprefix("TASK_STATE_").lower().replace("_", "-")


def plain(value: Any) -> Any:
    """JSON from protobuf with its integers back: `Value` holds every number as a double (1 -> 1.0)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def data_part(value: Any) -> pb.Part:
    part = pb.Part()
    ParseDict(to_jsonable(value), part.data)
    return part


def text_message(message_id: str, text: str, context_id: str, task_id: str) -> pb.Message:
    return pb.Message(message_id=message_id, role=pb.Role.ROLE_AGENT, context_id=context_id, task_id=task_id,
                      parts=[pb.Part(text=text)])


def _stamp(status: pb.TaskStatus, iso: str | None) -> None:
    try:
        status.timestamp.FromJsonString((iso or "").replace("+00:00", "Z"))
    except ValueError:
        status.timestamp.GetCurrentTime()


def _split(message: pb.Message) -> tuple[list[str], list[pb.Part], list[Any]]:
    """The message's text, file (raw/url) and data parts, data as plain JSON."""
    texts, files, data = [], [], []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind in ("raw", "url"):
            files.append(part)
        elif kind == "data":
            data.append(plain(MessageToDict(part.data)))
    return texts, files, data


# --- A2A message -> graph input --------------------------------------------------------------------------------

def graph_input(message: pb.Message, input_fields: Collection[str]) -> dict[str, Any]:
    """The graph input a message becomes.

    Data parts (JSON objects) are merged into the input's top level. Text parts, joined with newlines, and
    file parts (as LangChain content blocks) become ONE message in `messages`, for graphs whose input has it.
    """
    texts, files, data = _split(message)
    values: dict[str, Any] = {}
    for item in data:
        if not isinstance(item, dict):
            raise InvalidParams("A data part becomes graph input fields, so it must hold a JSON object")
        values.update(item)
    if texts or files:
        if "messages" not in input_fields:
            fields = ", ".join(sorted(input_fields)) or "none"
            raise InvalidParams("This assistant's graph takes no `messages` input, so text and file parts cannot be "
                                f"mapped to it: send a data part holding its input fields ({fields})")
        text = "\n".join(texts)
        content: Any = text
        if files:
            content = ([{"type": "text", "text": text}] if text else []) + [_file_block(p) for p in files]
        role = "ai" if message.role == pb.Role.ROLE_AGENT else "human"
        new = {"role": role, "content": content, **({"id": message.message_id} if message.message_id else {})}
        values["messages"] = [*(values.get("messages") or []), new]
    return values


def _file_block(part: pb.Part) -> dict[str, Any]:
    """A LangChain content block for a file part. URLs are passed on, never fetched."""
    mime = part.media_type or "application/octet-stream"
    kind = mime.split("/", 1)[0] if mime.split("/", 1)[0] in ("image", "audio", "video") else "file"
    block: dict[str, Any] = {"type": kind, "mime_type": mime}
    if part.WhichOneof("content") == "raw":
        block["base64"] = base64.b64encode(part.raw).decode()
    else:
        block["url"] = part.url
    if part.filename:
        block["extras"] = {"filename": part.filename}
    return block


def resume_value(message: pb.Message) -> Any:
    """What a message answering an interrupt resumes the graph with (`Command(resume=...)`).

    A data part `{"resume": X}` gives X; else the text parts joined with newlines; else the data itself.
    """
    texts, files, data = _split(message)
    if files:
        raise ContentTypeNotSupported("File parts cannot answer an interrupt: send text or a data part")
    for item in data:
        if isinstance(item, dict) and "resume" in item:
            return item["resume"]
    if texts:
        return "\n".join(texts)
    if len(data) == 1:
        return data[0]
    if all(isinstance(item, dict) for item in data):
        return {k: v for item in data for k, v in item.items()}
    return data


# --- graph state -> A2A messages and artifacts ----------------------------------------------------------------

def _messages(values: Any) -> list[dict[str, Any]]:
    found = values.get("messages") if isinstance(values, dict) else None
    return [m for m in found if isinstance(m, dict)] if isinstance(found, list) else []


def _kind(message: dict[str, Any]) -> str:
    kind = str(message.get("type") or message.get("role") or "")
    return {"AIMessageChunk": "ai", "assistant": "ai", "HumanMessageChunk": "human", "user": "human",
            "ToolMessageChunk": "tool"}.get(kind, kind)


def content_parts(content: Any) -> list[pb.Part]:
    """Parts for LangChain message content: text blocks joined into one text part, media blocks as files."""
    if isinstance(content, str):
        return [pb.Part(text=content)] if content else []
    if not isinstance(content, list):
        return []
    text = "".join(b if isinstance(b, str) else str(b.get("text") or "") for b in content
                   if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text"))
    parts = [pb.Part(text=text)] if text else []
    for block in content:
        if isinstance(block, dict) and (block.get("type") in FILE_BLOCKS or block.get("type") == "image_url"):
            parts.extend(_block_part(block))
    return parts


def _block_part(block: dict[str, Any]) -> list[pb.Part]:
    part = pb.Part(media_type=str(block.get("mime_type") or ""))
    name = (block.get("extras") or {}).get("filename") or block.get("filename")
    if name:
        part.filename = str(name)
    url, image_url = block.get("url"), block.get("image_url")
    if not url and image_url:  # the OpenAI-style block older LangChain messages carry
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if block.get("base64"):
        part.raw = base64.b64decode(block["base64"])
    elif url:
        part.url = str(url)
    else:
        return []
    return [part]


def a2a_message(message: dict[str, Any], context_id: str) -> pb.Message | None:
    """A thread message as A2A shows it: human -> user; AI and tool results -> agent; others dropped."""
    kind = _kind(message)
    parts: list[pb.Part] = []
    role = pb.Role.ROLE_AGENT
    if kind == "human":
        role, parts = pb.Role.ROLE_USER, content_parts(message.get("content"))
    elif kind == "ai":
        parts = content_parts(message.get("content"))
        calls = [{"id": c.get("id"), "name": c.get("name"), "args": c.get("args")}
                 for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        if calls:
            parts.append(data_part({"tool_calls": calls}))
    elif kind == "tool":
        parts = [data_part({"tool_results": [{
            "toolCallId": message.get("tool_call_id"), "content": message.get("content"),
            "name": message.get("name"), "status": message.get("status"),
        }]})]
    if not parts:
        return None
    return pb.Message(message_id=str(message.get("id") or ""), role=role, context_id=context_id, parts=parts)


def response_artifact(run: Row) -> pb.Artifact | None:
    """The run's answer: the last AI message of the turn, else the state values as data."""
    values = run.get("output")
    if isinstance(values, dict):
        values = {k: v for k, v in values.items() if k != "__interrupt__"}
    parts: list[pb.Part] = []
    for message in reversed(_messages(values)):
        if _kind(message) == "human":
            break
        if _kind(message) == "ai":
            parts = content_parts(message.get("content"))
            if parts:
                break
    if not parts and values not in (None, {}, []):
        parts = [data_part(values)]
    if not parts:
        return None
    return pb.Artifact(artifact_id=run["run_id"], name="Assistant Response",
                       description=f"Response from assistant {run['assistant_id']}", parts=parts)


def interrupt_artifact(run: Row, task_id: str) -> tuple[pb.Artifact, pb.Message]:
    """What an interrupted run asks: an `Interrupt` artifact (id and value of each) and a prompt message."""
    interrupts = [i for i in (run.get("output") or {}).get("__interrupt__") or [] if isinstance(i, dict)]
    artifact = pb.Artifact(artifact_id=f"{run['run_id']}-interrupt", name="Interrupt",
                           description="Agent requires input to continue",
                           parts=[data_part({"id": i.get("id"), "value": i.get("value")}) for i in interrupts])
    prompt = pb.Message(message_id=f"{run['run_id']}-interrupt", role=pb.Role.ROLE_AGENT,
                        context_id=run["thread_id"], task_id=task_id)
    for i in interrupts:
        value = i.get("value")
        prompt.parts.append(pb.Part(text=value) if isinstance(value, str) else data_part(value))
    return artifact, prompt


def _delta(chunk: Any, context_id: str, task_id: str) -> pb.Message | None:
    """A streamed message chunk (`messages-tuple` event) as an agent message, for AI text and tool results."""
    message = chunk[0] if isinstance(chunk, list) and chunk else None
    if not isinstance(message, dict) or _kind(message) not in ("ai", "tool"):
        return None
    found: pb.Message | None
    if _kind(message) == "ai":
        found = pb.Message(role=pb.Role.ROLE_AGENT, parts=content_parts(message.get("content")))
    else:
        found = a2a_message(message, context_id)
    if found is None or not found.parts:
        return None
    found.message_id, found.context_id, found.task_id = str(uuid.uuid4()), context_id, task_id
    return found


def _status_event(task_id: str, context_id: str, state: pb.TaskState,
                  message: pb.Message | None = None) -> pb.StreamResponse:
    event = pb.StreamResponse()
    update = event.status_update
    update.task_id, update.context_id = task_id, context_id
    update.status.state = state
    update.status.timestamp.GetCurrentTime()
    if message is not None:
        update.status.message.CopyFrom(message)
    return event



@dataclass
class Started:
    """A message's run, enqueued: the task it belongs to, and the request message with its ids filled in."""

    task_id: str
    run: Row
    message: pb.Message


class A2ATasks:
    """A2A task operations for one assistant, over the runtime's runs and threads."""

    def __init__(self, rt: Runtime, assistant: Row) -> None:
        self.rt = rt
        self.assistant = assistant
        self.assistant_id: str = assistant["assistant_id"]

    async def input_fields(self) -> set[str]:
        schemas = await self.rt.assistants.schemas(self.assistant_id)
        return set(((schemas.get("input_schema") or {}).get("properties") or {}).keys())

    # --- reading tasks -----------------------------------------------------------------------
    async def _newest_run(self, thread_id: str, **filters: Any) -> Row | None:
        found = await self.rt.runs.search(thread_id=thread_id, assistant_id=None, status=None,
                                          metadata=filters or None, limit=1, offset=0)
        return found[0] if found else None

    async def locate(self, task_id: str, context_id: str | None = None) -> tuple[str, Row]:
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

    async def state_of(self, run: Row) -> pb.TaskState:
        """The task state a run shows: a finished run stopped at `interrupt()` is input-required while its
        thread still waits for the answer (no later run on the thread)."""
        state = RUN_STATES.get(run["status"], S.TASK_STATE_SUBMITTED)
        output = run.get("output")
        if state == S.TASK_STATE_COMPLETED and isinstance(output, dict) and output.get("__interrupt__"):
            newest = await self._newest_run(run["thread_id"])
            thread = await self.rt.storage.get_thread(run["thread_id"])
            if newest is not None and newest["run_id"] == run["run_id"] and thread and thread.get("interrupts"):
                return S.TASK_STATE_INPUT_REQUIRED
        return state

    async def task(self, task_id: str, run: Row, *, state: pb.TaskState | None = None,
                   history_length: int | None = None, artifacts: bool = True,
                   request: pb.Message | None = None) -> pb.Task:
        """The task as of `run` (its latest run). History is the thread's messages as this run left them;
        before the run has any, the request message when known. `history_length` keeps the last n (0: none)."""
        state = await self.state_of(run) if state is None else state
        context_id = run["thread_id"]
        task = pb.Task(id=task_id, context_id=context_id)
        task.status.state = state
        _stamp(task.status, run.get("updated_at"))
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
            found = [m for m in (a2a_message(x, context_id) for x in _messages(run.get("output"))) if m is not None]
            if not found and request is not None:
                found = [request]
            task.history.extend(found[-history_length:] if history_length else found)
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
        found: list[tuple[str, Row, pb.TaskState]] = []
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
    async def start(self, message: pb.Message) -> Started:
        """Enqueue the run a message asks for: a new task, or the answer to the interrupt its task waits on.

        A message answers an interrupt when its `taskId` names an input-required task, or when it has no
        `taskId` and the newest task on its context is input-required (the next message on the context).
        """
        if not message.parts:
            raise InvalidParams("message.parts must not be empty")
        if message.role == pb.Role.ROLE_UNSPECIFIED:
            raise InvalidParams("message.role is required")
        context_id = message.context_id
        if context_id and not is_uuid(context_id):
            raise InvalidParams(f"contextId must be a UUID: it is the thread id (got {context_id!r})")
        task_id = None
        if message.task_id:
            task_id, latest = await self.locate(message.task_id, context_id or None)
            state = await self.state_of(latest)
            if state != S.TASK_STATE_INPUT_REQUIRED:
                raise UnsupportedOperation(f"Task {task_id} is {state_label(state)}: only a task waiting for input "
                                           "(input-required) accepts another message")
            context_id = latest["thread_id"]
        elif context_id:
            newest = await self._newest_run(context_id)
            if newest is not None and newest["assistant_id"] == self.assistant_id \
                    and await self.state_of(newest) == S.TASK_STATE_INPUT_REQUIRED:
                task_id = (newest.get("metadata") or {}).get(TASK_KEY) or f"{context_id}:{newest['run_id']}"
        body: dict[str, Any] = {"assistant_id": self.assistant_id, "if_not_exists": "create",
                                "stream_mode": ["messages-tuple"]}
        if task_id:
            body.update(command={"resume": resume_value(message)}, metadata={TASK_KEY: task_id})
        else:
            body["input"] = graph_input(message, await self.input_fields())
        run = await self.rt.runs.create(context_id or str(uuid.uuid4()), body)
        task_id = task_id or f"{run['thread_id']}:{run['run_id']}"
        echoed = pb.Message()
        echoed.CopyFrom(message)
        echoed.context_id, echoed.task_id = run["thread_id"], task_id
        return Started(task_id, run, echoed)

    async def send(self, message: pb.Message, *, blocking: bool = True,
                   history_length: int | None = None) -> pb.Task:
        """`SendMessage`: the task once its run ends (or at once, submitted, when not `blocking`)."""
        started = await self.start(message)
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

    async def _relay(self, task_id: str, run: Row, *, replay: bool) -> AsyncIterator[pb.StreamResponse]:
        """The run's events as A2A updates: working, one working update per AI text or tool result chunk,
        then the final artifact and the final status (completed, input-required, failed or canceled)."""
        context_id, working = run["thread_id"], False
        async for event in self.rt.runs.stream(run["run_id"], replay=replay):
            if not working and event.event in ("metadata", "messages"):
                working = True
                yield _status_event(task_id, context_id, S.TASK_STATE_WORKING)
            if event.event == "messages":
                delta = _delta(loads(event.data), context_id, task_id)
                if delta is not None:
                    yield _status_event(task_id, context_id, S.TASK_STATE_WORKING, delta)
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

    async def _cancel_waiting(self, task_id: str, latest: Row) -> Row:
        thread_id = latest["thread_id"]
        # A marker run that never becomes available to workers, cancelled at once: the task's latest run.
        marker = await self.rt.runs.create(thread_id, {"assistant_id": self.assistant_id, "after_seconds": 86_400,
                                                       "metadata": {TASK_KEY: task_id}})
        await self.rt.runs.stop(marker["run_id"])
        try:  # as the reference: the graph ends here, so the thread no longer shows a pending interrupt
            await self.rt.threads.update_state(thread_id, values=None, as_node="__end__")
        except Exception:
            log.warning("could not end the interrupted thread %s after cancelling task %s", thread_id, task_id,
                        exc_info=True)
        return await self.rt.runs.get(marker["run_id"])

