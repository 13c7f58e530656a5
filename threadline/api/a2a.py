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
from collections.abc import AsyncIterator, Collection
from typing import TYPE_CHECKING, Any

from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.responses import Response

from threadline import __version__, errors
from threadline.api import jsonrpc
from threadline.api.common import JSON, Router, runtime
from threadline.api.errors import rpc_error
from threadline.api.ratelimit import identity_of
from threadline.api.sse import CountedEventSource
from threadline.core.runtime import Runtime
from threadline.serde import dumps
from threadline.storage.records import AssistantRecord

if TYPE_CHECKING:
    from a2a.types import a2a_pb2 as pb

log = logging.getLogger("threadline.api")
router = Router(tags=["A2A"])

#: Domain errors that reach here mean the request named something wrong.
PARAM_ERRORS = (errors.InvalidInput, errors.BadRequest, errors.NotFound, errors.Conflict)



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
    from threadline.api import a2a_wire as wire

    async def events() -> AsyncIterator[ServerSentEvent]:
        try:
            async for frame in frames:
                yield ServerSentEvent(data=dumps(jsonrpc.result(req_id, wire.render(frame, version))).decode())
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
    from threadline.api import a2a_wire as wire  # A2A's types load here, at the first call (a2a_wire.py)
    from threadline.core.a2a_tasks import A2ATasks

    found = wire.METHODS.get(call.method)
    if found is None:
        return JSON(jsonrpc.error(call.id, jsonrpc.METHOD_NOT_FOUND, f"Method not found: {call.method}"))
    handler, version = found
    wanted = "text/event-stream" if handler in wire.STREAMING else "application/json"
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
    if handler in wire.STREAMING:
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
    from threadline.core.a2a_tasks import A2ATasks  # A2A's types load at the first use (api/a2a_wire.py)

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
