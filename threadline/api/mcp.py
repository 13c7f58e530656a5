"""MCP at `/mcp`: stateless Streamable HTTP, one JSON-RPC message per POST, answered with JSON.

Every assistant is a tool: `tools/list` describes it from its input schema, `tools/call` runs it as a
stateless run through the same core as `POST /runs/wait`. No session is kept (no `Mcp-Session-Id`), so
clients never open the GET stream. The official `mcp_types` validate each request's params and shape
each result for the negotiated protocol version; the HTTP handling is ours.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

from fastapi import Request
from pydantic import ValidationError
from starlette.responses import Response

from threadline import __version__
from threadline.api import jsonrpc
from threadline.api.common import JSON, Router, runtime
from threadline.api.errors import rpc_error
from threadline.api.ratelimit import identity_of
from threadline.api.runs import wait_done
from threadline.core.runtime import Runtime
from threadline.serde import dumps
from threadline.storage.records import AssistantRecord

log = logging.getLogger("threadline.api")
router = Router(tags=["MCP"])

VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST = VERSIONS[-1]
PAGE_SIZE = 100  # tools per `tools/list` page, as LangGraph's server
ANNOTATIONS = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False, "openWorldHint": True}
# LangChain message types in an input schema: a tool caller sends the user's message as a plain string.
MESSAGE_DEFS = frozenset({
    *(f"{kind}Message{chunk}" for kind in ("AI", "Human", "Chat", "System", "Function", "Tool")
      for chunk in ("", "Chunk")),
    "ToolCall", "ToolCallChunk", "InvalidToolCall", "UsageMetadata", "InputTokenDetails", "OutputTokenDetails",
})


async def post(request: Request) -> Response:
    """One JSON-RPC message. Framing errors get HTTP 400 with a JSON-RPC error body; a request always gets
    HTTP 200 with its result or error; notifications and responses get 202 with no body."""
    if not jsonrpc.accepts(request.headers.get("accept"), "application/json", "text/event-stream"):
        return JSON(jsonrpc.error(None, jsonrpc.INVALID_REQUEST,
                                  "Not Acceptable: accept application/json or text/event-stream"), status_code=400)
    try:
        message = jsonrpc.parse(await request.body())
    except jsonrpc.RpcError as exc:
        framing = exc.code in (jsonrpc.PARSE_ERROR, jsonrpc.INVALID_REQUEST)
        return JSON(exc.response(), status_code=400 if framing else 200)
    if message.kind != "request":
        return Response(status_code=202)
    header = request.headers.get("mcp-protocol-version")
    try:
        value = await _dispatch(request, message, header if header in VERSIONS else LATEST)
    except jsonrpc.RpcError as exc:
        return JSON(jsonrpc.error(message.id, exc.code, exc.message, exc.data))
    return JSON(jsonrpc.result(message.id, value))


async def delete(request: Request) -> Response:
    """Session termination: a no-op, since no session is ever opened."""
    return Response(status_code=204)


for _path in ("/mcp", "/mcp/"):
    router.add_api_route(_path, post, methods=["POST"], include_in_schema=_path == "/mcp", summary="MCP (JSON-RPC)")
    router.add_api_route(_path, delete, methods=["DELETE"], include_in_schema=_path == "/mcp",
                         summary="End an MCP session (no-op)")


async def _dispatch(request: Request, message: jsonrpc.Incoming, version: str) -> Any:
    handler = HANDLERS.get(message.method)
    if handler is None:
        raise jsonrpc.RpcError(jsonrpc.METHOD_NOT_FOUND, f"Method not found: {message.method}")
    if message.params is not None and not isinstance(message.params, dict):
        raise jsonrpc.RpcError(jsonrpc.INVALID_PARAMS, "Invalid params: 'params' must be an object")
    from mcp_types import methods as mcp_methods  # MCP's types load here, at the first call (issue 24: RSS at rest)

    try:
        parsed = mcp_methods.parse_client_request(message.method, version, message.params)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'][1:]))}: {e['msg']}" for e in exc.errors())
        raise jsonrpc.RpcError(jsonrpc.INVALID_PARAMS, f"Invalid params: {problems}") from None
    try:
        value = await handler(request, runtime(request), parsed.params, message.params or {})
        if message.method == "initialize":
            version = value["protocolVersion"]
        return mcp_methods.serialize_server_result(message.method, version, value)
    except jsonrpc.RpcError:
        raise
    except Exception as exc:  # noqa: BLE001 - the code and message as every JSON-RPC endpoint answers them (api/errors.py)
        raise jsonrpc.RpcError(*rpc_error(exc)) from None


async def _initialize(request: Request, rt: Runtime, params: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """Answer the client's version when we speak it, else our latest (the client then decides)."""
    version = params.protocol_version if params.protocol_version in VERSIONS else LATEST
    return {"protocolVersion": version, "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "Threadline", "version": __version__}}


async def _ping(request: Request, rt: Runtime, params: Any, raw: dict[str, Any]) -> dict[str, Any]:
    return {}


async def _list_tools(request: Request, rt: Runtime, params: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """One page of tools. The cursor is an opaque string (an offset into the tools in creation order)."""
    cursor = params.cursor if params is not None else None
    offset = _offset(cursor)
    named = await _tools_by_name(rt)
    schemas: dict[str, Any] = {}
    tools = []
    for name, row in list(named.items())[offset:offset + PAGE_SIZE]:
        tool = await _describe(rt, name, row, schemas)
        if tool is not None:
            tools.append(tool)
    page: dict[str, Any] = {"tools": tools}
    if offset + PAGE_SIZE < len(named):
        page["nextCursor"] = str(offset + PAGE_SIZE)
    return page


async def _call_tool(request: Request, rt: Runtime, params: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """Run the tool's assistant statelessly and answer its final state (or its error, with `isError`)."""
    row = (await _tools_by_name(rt)).get(params.name)
    if row is None:
        raise jsonrpc.RpcError(jsonrpc.INVALID_PARAMS, f"Unknown tool: {params.name}")
    body: dict[str, Any] = {"assistant_id": row["assistant_id"], "input": params.arguments or {}}
    if isinstance(raw.get("context"), dict):  # LangGraph's extension: the run's context
        body["context"] = raw["context"]
    run = await rt.runs.create(None, body, start_here=True, identity=identity_of(request))
    # Unlike a run API request (whose default is `continue`), a caller that leaves cancels the run: on this
    # stateless transport its result can only ever reach it on this response (docs/compatibility.md, MCP).
    done = await wait_done(request, rt, run, cancel_on_disconnect=True)
    output = await rt.runs.output(done)
    if done["status"] == "error":
        problem = output["__error__"]
        return _text(f"{problem.get('error', 'Error')}: {problem.get('message', '')}", is_error=True)
    if done["status"] != "success":
        return _text(f"The run ended as {done['status']}", is_error=True)
    result = _text(dumps(output).decode())
    if isinstance(output, dict):
        result["structuredContent"] = output
    return result


HANDLERS = {"initialize": _initialize, "ping": _ping, "tools/list": _list_tools, "tools/call": _call_tool}


def _text(text: str, *, is_error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def _offset(cursor: str | None) -> int:
    if cursor is None:
        return 0
    if not cursor.isdigit():
        raise jsonrpc.RpcError(jsonrpc.INVALID_PARAMS, f"Invalid cursor: {cursor!r}")
    return int(cursor)


def tool_name(assistant_name: str) -> str:
    """The assistant's name as a tool name: whitespace runs become `_`, other characters outside
    `[A-Za-z0-9_.-]` go, at most 128 characters."""
    name = re.sub(r"\s+", "_", assistant_name.strip())
    return re.sub(r"[^A-Za-z0-9_.-]", "", name)[:128]


async def _tools_by_name(rt: Runtime) -> dict[str, AssistantRecord]:
    """Every assistant by tool name, oldest first; of two with the same tool name the older one wins."""
    named: dict[str, AssistantRecord] = {}
    offset, chunk = 0, 1000
    while True:
        rows = await rt.assistants.search(limit=chunk, offset=offset, sort_by="created_at", sort_order="asc")
        for row in rows:
            name = tool_name(row.get("name") or "")
            if name and name not in named:
                named[name] = row
        if len(rows) < chunk:
            return named
        offset += chunk


async def _describe(rt: Runtime, name: str, row: AssistantRecord, schemas: dict[str, Any]) -> dict[str, Any] | None:
    """The tool for one assistant; None when its input schema is unknown or not an object schema."""
    key = f"{row['graph_id']}\0{dumps(row.get('config')).decode()}\0{dumps(row.get('context')).decode()}"
    if key not in schemas:  # assistants sharing a graph and configuration share a schema
        try:
            schemas[key] = (await rt.assistants.schemas(row["assistant_id"]))["input_schema"]
        except Exception:
            log.warning("MCP: no input schema for assistant %s; it is not listed", row["assistant_id"], exc_info=True)
            schemas[key] = None
    if not isinstance(schemas[key], dict):
        return None
    tool = {"name": name, "title": row["name"], "inputSchema": simplify_schema(schemas[key]),
            "description": row.get("description") or f"Tool based on the {row['name']} assistant",
            "annotations": ANNOTATIONS}
    from mcp_types import Tool

    try:
        Tool.model_validate(tool)  # e.g. a graph whose input is not an object cannot be a tool
    except ValidationError:
        log.warning("MCP: assistant %s has no object input schema; it is not listed", row["assistant_id"])
        return None
    return tool


def simplify_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A list of LangChain messages becomes one string (the user's message): what a tool caller can send,
    and what `add_messages` turns into a human message. The message definitions are dropped."""
    schema = copy.deepcopy(schema)
    defs = schema.get("$defs") or {}
    if MESSAGE_DEFS & defs.keys():
        for key, prop in (schema.get("properties") or {}).items():
            if isinstance(prop, dict) and prop.get("type") == "array" and _lists_messages(prop.get("items")):
                schema["properties"][key] = {"type": "string", "title": prop.get("title", key),
                                             "description": "The user message to send to the agent."}
        for def_name in MESSAGE_DEFS & defs.keys():
            del defs[def_name]
        if not defs:
            schema.pop("$defs", None)
    schema.setdefault("type", "object")
    return schema


def _lists_messages(items: Any) -> bool:
    if not isinstance(items, dict):
        return False
    options = items.get("oneOf") or items.get("anyOf") or [items]
    return any(isinstance(o, dict) and str(o.get("$ref", "")).rsplit("/", 1)[-1] in MESSAGE_DEFS for o in options)
