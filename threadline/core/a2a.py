"""A2A's data model and LangGraph's, converted both ways: a message becomes graph input (or an interrupt's
resume value); a thread's messages, a run's answer and its interrupts become A2A messages, artifacts and
status updates.

This module speaks A2A 1.0's data model (a2a-sdk's protobuf types); the task service over runs is
`threadline.core.a2a_tasks`; JSON-RPC, its error codes, the two JSON wire versions and HTTP are
`threadline.api.a2a`'s (and `threadline.api.errors`').
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Collection
from typing import Any

from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import MessageToDict, ParseDict

from threadline.errors import ContentTypeNotSupported, InvalidInput
from threadline.serde import to_jsonable
from threadline.storage.records import RunRecord

S = pb.TaskState
TERMINAL = frozenset({S.TASK_STATE_COMPLETED, S.TASK_STATE_FAILED, S.TASK_STATE_CANCELED, S.TASK_STATE_REJECTED})
RUN_STATES = {"pending": S.TASK_STATE_SUBMITTED, "running": S.TASK_STATE_WORKING, "success": S.TASK_STATE_COMPLETED,
              "interrupted": S.TASK_STATE_CANCELED, "error": S.TASK_STATE_FAILED, "timeout": S.TASK_STATE_FAILED}
FILE_BLOCKS = ("image", "audio", "video", "file")


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


def stamp(status: pb.TaskStatus, iso: str | None) -> None:
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
            raise InvalidInput("A data part becomes graph input fields, so it must hold a JSON object")
        values.update(item)
    if texts or files:
        if "messages" not in input_fields:
            fields = ", ".join(sorted(input_fields)) or "none"
            raise InvalidInput("This assistant's graph takes no `messages` input, so text and file parts cannot be "
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

def messages_of(values: Any) -> list[dict[str, Any]]:
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


def response_artifact(run: RunRecord) -> pb.Artifact | None:
    """The run's answer: the last AI message of the turn, else the state values as data."""
    values = run.get("output")
    if isinstance(values, dict):
        values = {k: v for k, v in values.items() if k != "__interrupt__"}
    parts: list[pb.Part] = []
    for message in reversed(messages_of(values)):
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


def interrupt_artifact(run: RunRecord, task_id: str) -> tuple[pb.Artifact, pb.Message]:
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


def delta_message(chunk: Any, context_id: str, task_id: str) -> pb.Message | None:
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


def status_event(task_id: str, context_id: str, state: pb.TaskState,
                  message: pb.Message | None = None) -> pb.StreamResponse:
    event = pb.StreamResponse()
    update = event.status_update
    update.task_id, update.context_id = task_id, context_id
    update.status.state = state
    update.status.timestamp.GetCurrentTime()
    if message is not None:
        update.status.message.CopyFrom(message)
    return event
