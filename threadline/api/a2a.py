"""A2A over JSON-RPC at `POST /a2a/{assistant_id}`, and each assistant's agent card.

One endpoint speaks both wire versions; the method name picks the shapes. A2A 1.0 names (`SendMessage`,
`SendStreamingMessage`, `GetTask`, `CancelTask`, `ListTasks`, `SubscribeToTask`) are answered in proto-JSON
(`{"task": …}`, `{"statusUpdate": …}`, `TASK_STATE_*`, `ROLE_*`); the 0.3 names (`message/send`,
`message/stream`, `tasks/get`, `tasks/cancel`, `tasks/resubscribe`) in 0.3 JSON (`kind`, lowercase states,
`final`). The `A2A-Version` header is not required. Messages are accepted in either part form on either
method family. JSON-RPC errors are HTTP 200 bodies; only a refused `Accept` header is an HTTP 400.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from datetime import UTC, datetime
from typing import Any

from a2a.compat.v0_3 import conversions
from a2a.compat.v0_3 import types as v03
from a2a.types import a2a_pb2 as pb
from fastapi import Request
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from google.protobuf.message import Message as Proto
from pydantic import ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import Response

from threadline import __version__, errors
from threadline.api import jsonrpc
from threadline.api.common import JSON, Router, runtime
from threadline.api.errors import rpc_error
from threadline.api.ratelimit import identity_of
from threadline.api.sse import CountedEventSource
from threadline.core.a2a import plain
from threadline.core.a2a_tasks import A2ATasks
from threadline.core.runtime import Runtime
from threadline.serde import dumps
from threadline.storage.records import AssistantRecord

log = logging.getLogger("threadline.api")
router = Router(tags=["A2A"])

V03, V10 = "0.3", "1.0"
ROLES = {"user": pb.Role.ROLE_USER, "ROLE_USER": pb.Role.ROLE_USER,
         "agent": pb.Role.ROLE_AGENT, "ROLE_AGENT": pb.Role.ROLE_AGENT}
PUSH_CONFIG = ("CreateTaskPushNotificationConfig", "GetTaskPushNotificationConfig", "ListTaskPushNotificationConfigs",
               "ListTaskPushNotificationConfig", "DeleteTaskPushNotificationConfig", "tasks/pushNotificationConfig/set",
               "tasks/pushNotificationConfig/get", "tasks/pushNotificationConfig/list",
               "tasks/pushNotificationConfig/delete")
#: Domain errors that reach here mean the request named something wrong.
PARAM_ERRORS = (errors.InvalidInput, errors.BadRequest, errors.NotFound, errors.Conflict)


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


def _render(obj: Proto, version: str) -> Any:
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
    return {"task": _render(task, V10)} if version == V10 else _render(task, V03)


async def _get(tasks: A2ATasks, params: dict[str, Any], version: str) -> Any:
    task = await tasks.get(_task_id(params), context_id=_context_id(params),
                           history_length=_history_length(params.get("historyLength")))
    return _render(task, version)


async def _cancel(tasks: A2ATasks, params: dict[str, Any], version: str) -> Any:
    return _render(await tasks.cancel(_task_id(params), context_id=_context_id(params)), version)


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
    return _render(found, V10)


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


# --- HTTP ---------------------------------------------------------------------------------------------------------


def _error(req_id: jsonrpc.RequestId, exc: Exception) -> dict[str, Any]:
    """A JSON-RPC error body (`threadline.api.errors.rpc_error` picks code and message): nothing here becomes an
    HTTP 500."""
    return jsonrpc.error(req_id, *rpc_error(exc))


async def _assistant(rt: Runtime, assistant_id: str) -> AssistantRecord:
    try:
        return await rt.assistants.runnable(assistant_id)
    except PARAM_ERRORS:
        raise errors.InvalidInput(f"Assistant '{assistant_id}' not found") from None


def _sse(rt: Runtime, req_id: jsonrpc.RequestId, version: str,
         frames: AsyncIterator[pb.StreamResponse]) -> EventSourceResponse:
    async def events() -> AsyncIterator[ServerSentEvent]:
        try:
            async for frame in frames:
                yield ServerSentEvent(data=dumps(jsonrpc.result(req_id, _render(frame, version))).decode())
        except Exception as exc:  # noqa: BLE001 - after the 200 is sent, an error is the stream's last frame
            yield ServerSentEvent(data=dumps(_error(req_id, exc)).decode())

    # A client that leaves does not cancel the task: it can read it later (GetTask) or cancel it (CancelTask).
    return CountedEventSource(events(), ping=rt.settings.heartbeat_seconds)


@router.post("/a2a/{assistant_id}")
@router.post("/a2a/{assistant_id}/", include_in_schema=False)
async def a2a_rpc(request: Request, assistant_id: str) -> Response:
    """A2A JSON-RPC: messages (blocking or streamed as SSE), tasks get/list/cancel/subscribe."""
    try:
        call = jsonrpc.parse(await request.body())
    except jsonrpc.RpcError as exc:
        return JSON(exc.response())
    if call.kind == "response":  # nothing of ours awaits an answer
        return Response(status_code=202)
    if call.kind == "notification":
        return JSON(jsonrpc.error(None, jsonrpc.INVALID_REQUEST, "Invalid Request: A2A requests need an id"))
    found = METHODS.get(call.method)
    if found is None:
        return JSON(jsonrpc.error(call.id, jsonrpc.METHOD_NOT_FOUND, f"Method not found: {call.method}"))
    handler, version = found
    wanted = "text/event-stream" if handler in STREAMING else "application/json"
    if not jsonrpc.accepts(request.headers.get("accept"), wanted):
        raise errors.BadRequest(f"Accept header must include {wanted} for {call.method}")
    log.debug("A2A %s (A2A-Version: %s)", call.method, request.headers.get("a2a-version"))
    rt = runtime(request)
    try:
        params = {} if call.params is None else call.params
        if not isinstance(params, dict):
            raise errors.InvalidInput("params must be an object")
        tasks = A2ATasks(rt, await _assistant(rt, assistant_id), identity_of(request))
        outcome = await handler(tasks, params, version)
    except Exception as exc:  # noqa: BLE001 - every error is a JSON-RPC error answer (api/errors.py)
        return JSON(_error(call.id, exc))
    if handler in STREAMING:
        return _sse(rt, call.id, version, outcome)
    return JSON(jsonrpc.result(call.id, outcome))


# --- agent cards ----------------------------------------------------------------------------------------------------

def agent_card(assistant: AssistantRecord, input_fields: Collection[str], url: str, version: str) -> dict[str, Any]:
    """The assistant's agent card, readable by A2A 1.0 clients (`supportedInterfaces`) and 0.3 clients (`url`,
    `preferredTransport`, `protocolVersion`; a 1.0 parser drops those when `supportedInterfaces` is present)."""
    name = assistant.get("name") or assistant["graph_id"]
    messages = "messages" in input_fields
    a2a_meta = (assistant.get("metadata") or {}).get("a2a") or {}
    inputs = ["text/plain", "application/json"] if messages else ["application/json"]
    outputs = ["text/plain", "application/json"]
    for key, default in (("input_modes", inputs), ("output_modes", outputs)):
        given = a2a_meta.get(key) if isinstance(a2a_meta, dict) else None
        if isinstance(given, list) and given and all(isinstance(m, str) for m in given):
            default[:] = given
    fields = ", ".join(sorted(input_fields)) or "none"
    how = ("Text and files become one human message; data parts (JSON objects) set input fields" if messages
           else "Send a data part (a JSON object) holding input fields")
    return {
        "name": name,
        "description": assistant.get("description") or f"{name} assistant",
        "url": url, "preferredTransport": "JSONRPC", "protocolVersion": "0.3.0",
        "supportedInterfaces": [{"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
                                {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"}],
        "capabilities": {"streaming": True, "pushNotifications": False, "stateTransitionHistory": False,
                         "extendedAgentCard": False},
        "defaultInputModes": inputs, "defaultOutputModes": outputs,
        "skills": [{"id": f"{assistant['assistant_id']}-main", "name": f"{name} Capabilities",
                    "description": f"{how}. Input fields: {fields}.", "tags": ["assistant", "langgraph"],
                    "examples": [], "inputModes": inputs, "outputModes": outputs}],
        "version": version,
    }


async def _card(request: Request, assistant_id: str) -> JSON:
    rt = runtime(request)
    assistant = await rt.assistants.runnable(assistant_id)  # an agent the caller may run shows its card
    url = f"{str(request.base_url).rstrip('/')}/a2a/{assistant['assistant_id']}"
    fields = await A2ATasks(rt, assistant).input_fields()
    return JSON(agent_card(assistant, fields, url, __version__))


@router.get("/a2a/{assistant_id}")
@router.get("/a2a/{assistant_id}/", include_in_schema=False)
@router.get("/a2a/{assistant_id}/.well-known/agent-card.json")
@router.get("/a2a/{assistant_id}/.well-known/agent.json")
async def get_agent_card(request: Request, assistant_id: str) -> JSON:
    """The assistant's A2A agent card (advertises A2A 1.0 and 0.3 on the same URL)."""
    return await _card(request, assistant_id)


@router.get("/.well-known/agent-card.json")
async def get_root_agent_card(request: Request, assistant_id: str | None = None) -> JSON:
    """The card of `?assistant_id=`, or of the default agent when none is given."""
    chosen = assistant_id or runtime(request).graphs.default_agent
    if not chosen:
        raise errors.BadRequest("Missing required query parameter: assistant_id (this server has no default agent)")
    return await _card(request, chosen)
