"""A2A's wire, for `threadline.api.a2a`: JSON-RPC params (either version's JSON) to the protobuf types, those
types back to a version's JSON, and the method table. Imported at the first A2A call, not at startup: the A2A
SDK's types and protobuf cost some 10 MB of RSS in every API process that never serves A2A (issue 24)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from a2a.compat.v0_3 import conversions
from a2a.compat.v0_3 import types as v03
from a2a.types import a2a_pb2 as pb
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message import Message as Proto
from pydantic import ValidationError

from threadline import errors
from threadline.core.a2a import plain
from threadline.core.a2a_tasks import A2ATasks

V03, V10 = "0.3", "1.0"
ROLES = {"user": pb.Role.ROLE_USER, "ROLE_USER": pb.Role.ROLE_USER,
         "agent": pb.Role.ROLE_AGENT, "ROLE_AGENT": pb.Role.ROLE_AGENT}
PUSH_CONFIG = ("CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
               "ListTaskPushNotificationConfig", "DeleteTaskPushNotificationConfig", "tasks/pushNotificationConfig/set",
               "tasks/pushNotificationConfig/get", "tasks/pushNotificationConfig/list",
               "tasks/pushNotificationConfig/delete")


# --- the wire: JSON params -> protobuf, protobuf -> JSON of one version ----------------------------------------

def _message(raw: Any) -> pb.Message:
    """`params.message` in either version's form (parts detected by key; roles `user` or `ROLE_USER`)."""
    if not isinstance(raw, dict):
        raise errors.InvalidInput("params.message is required and must be an object")
    if not isinstance(raw.get("messageId"), str) or not raw["messageId"]:
        raise errors.InvalidInput("message.messageId is required")
    if raw.get("role") not in ROLES:
        raise errors.InvalidInput("message.role must be user or agent (ROLE_USER or ROLE_AGENT)")
    if not isinstance(raw.get("parts"), list) or not raw["parts"]:
        raise errors.InvalidInput("message.parts must be a non-empty list")
    for key in ("contextId", "taskId"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise errors.InvalidInput(f"message.{key} must be a string")
    message = pb.Message(message_id=raw["messageId"], role=ROLES[raw["role"]], context_id=raw.get("contextId") or "",
                         task_id=raw.get("taskId") or "", parts=[_part(p) for p in raw["parts"]])
    try:
        if isinstance(raw.get("metadata"), dict):
            ParseDict(raw["metadata"], message.metadata)
        message.reference_task_ids.extend(raw.get("referenceTaskIds") or [])
        message.extensions.extend(raw.get("extensions") or [])
    except (ParseError, TypeError) as exc:
        raise errors.InvalidInput(f"Invalid message: {exc}") from None
    return message


def _part(raw: Any) -> pb.Part:
    if not isinstance(raw, dict):
        raise errors.InvalidInput("Each message part must be an object")
    try:
        if "kind" in raw or "file" in raw:  # 0.3: {"kind": "text"|"data"|"file", ...}
            return conversions.to_core_part(v03.Part.model_validate(raw))
        part = pb.Part()
        ParseDict(raw, part)
    except (ValidationError, ParseError, ValueError, TypeError) as exc:
        raise errors.InvalidInput(f"Invalid message part: {exc}") from None
    if part.WhichOneof("content") is None:
        raise errors.InvalidInput("A message part needs text, data, raw, url (1.0) or a kind (0.3)")
    return part


def render(obj: Proto, version: str) -> Any:
    """A Task, StreamResponse or ListTasksResponse as the version's JSON."""
    if version == V10:
        return plain(MessageToDict(obj))
    if isinstance(obj, pb.Task):
        compat: Any = conversions.to_compat_task(obj)
    else:
        compat = conversions.to_compat_stream_response(obj).result
    out = plain(compat.model_dump(mode="json", by_alias=True, exclude_none=True))
    if out.get("kind") == "status-update":  # the stream ends after any state but submitted/working
        out["final"] = obj.status_update.status.state not in (pb.TaskState.TASK_STATE_SUBMITTED,
                                                              pb.TaskState.TASK_STATE_WORKING)
    return out


def _history_length(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise errors.InvalidInput("historyLength must be a non-negative integer")
    return value


def _task_id(params: dict[str, Any]) -> str:
    if not isinstance(params.get("id"), str) or not params["id"]:
        raise errors.InvalidInput("params.id (the task id) is required")
    return str(params["id"])


def _context_id(params: dict[str, Any]) -> str | None:
    value = params.get("contextId")
    if value is not None and not isinstance(value, str):
        raise errors.InvalidInput("contextId must be a string")
    return value or None


# --- methods ----------------------------------------------------------------------------------------------------

async def _send(tasks: A2ATasks, params: dict[str, Any], version: str) -> Any:
    config = params.get("configuration") or {}
    if not isinstance(config, dict):
        raise errors.InvalidInput("params.configuration must be an object")
    # 0.3 `blocking: false` and 1.0 `returnImmediately: true` both answer at once with the submitted task.
    blocking = config.get("blocking") is not False and config.get("returnImmediately") is not True
    task = await tasks.send(_message(params.get("message")), blocking=blocking,
                            history_length=_history_length(config.get("historyLength")))
    return {"task": render(task, V10)} if version == V10 else render(task, V03)


async def _get(tasks: A2ATasks, params: dict[str, Any], version: str) -> Any:
    task = await tasks.get(_task_id(params), context_id=_context_id(params),
                           history_length=_history_length(params.get("historyLength")))
    return render(task, version)


async def _cancel(tasks: A2ATasks, params: dict[str, Any], version: str) -> Any:
    return render(await tasks.cancel(_task_id(params), context_id=_context_id(params)), version)


async def _list(tasks: A2ATasks, params: dict[str, Any], version: str) -> Any:
    status = params.get("status")
    if isinstance(status, str) and not status.startswith("TASK_STATE_"):  # accept the 0.3 spelling too
        status = "TASK_STATE_" + status.upper().replace("-", "_")
    try:
        request = ParseDict({**params, "status": status} if status else params, pb.ListTasksRequest(),
                            ignore_unknown_fields=True)
    except ParseError as exc:
        raise errors.InvalidInput(f"Invalid ListTasks params: {exc}") from None
    if request.page_size and not 1 <= request.page_size <= 100:
        raise errors.InvalidInput("pageSize must be between 1 and 100")
    if request.page_token and not request.page_token.isdigit():
        raise errors.InvalidInput("pageToken must be a token from a previous nextPageToken")
    after = request.status_timestamp_after.ToDatetime(tzinfo=UTC) \
        if request.HasField("status_timestamp_after") else None
    found = await tasks.list_tasks(
        context_id=request.context_id or None, state=request.status or None, page_size=request.page_size or 50,
        offset=int(request.page_token or 0), include_artifacts=request.include_artifacts,
        history_length=request.history_length if request.HasField("history_length") else 0,
        updated_after=after if isinstance(after, datetime) else None,
    )
    return render(found, V10)


async def _stream(tasks: A2ATasks, params: dict[str, Any], version: str) -> AsyncIterator[pb.StreamResponse]:
    return tasks.stream(await tasks.start(_message(params.get("message"))))


async def _subscribe(tasks: A2ATasks, params: dict[str, Any], version: str) -> AsyncIterator[pb.StreamResponse]:
    return await tasks.subscribe(_task_id(params))


async def _push_config(tasks: A2ATasks, params: dict[str, Any], version: str) -> Any:
    raise errors.PushNotificationNotSupported()


async def _extended_card(tasks: A2ATasks, params: dict[str, Any], version: str) -> Any:
    raise errors.ExtendedCardNotConfigured()


Handler = Callable[[A2ATasks, dict[str, Any], str], Awaitable[Any]]
METHODS: dict[str, tuple[Handler, str]] = {
    "SendMessage": (_send, V10), "message/send": (_send, V03),
    "SendStreamingMessage": (_stream, V10), "message/stream": (_stream, V03),
    "GetTask": (_get, V10), "tasks/get": (_get, V03),
    "CancelTask": (_cancel, V10), "tasks/cancel": (_cancel, V03),
    "ListTasks": (_list, V10),
    "SubscribeToTask": (_subscribe, V10), "tasks/resubscribe": (_subscribe, V03),
    "GetExtendedAgentCard": (_extended_card, V10), "agent/getAuthenticatedExtendedCard": (_extended_card, V03),
    **{name: (_push_config, V10 if "/" not in name else V03) for name in PUSH_CONFIG},
}
STREAMING = (_stream, _subscribe)
