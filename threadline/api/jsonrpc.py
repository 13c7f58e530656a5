"""JSON-RPC 2.0 framing shared by the protocol endpoints (A2A, MCP): parse a request, build responses.

Transport-neutral: it knows nothing of HTTP, A2A or MCP. Each endpoint decides what a notification
or a posted response means for it, and how to send what these functions build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from threadline.api import bounds

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_ERROR = -32000  # the first of the codes the spec reserves for implementation-defined server errors

RequestId = str | int | float | None


class RpcError(Exception):
    """A JSON-RPC error: `code`, `message` and optional `data`, answered to request `id`."""

    def __init__(self, code: int, message: str, data: Any = None, *, id: RequestId = None) -> None:
        self.code = code
        self.message = message
        self.data = data
        self.id = id
        super().__init__(message)

    def response(self) -> dict[str, Any]:
        return error(self.id, self.code, self.message, self.data)


@dataclass
class Incoming:
    """One parsed JSON-RPC message.

    `kind` is "request" (has an id), "notification" (no id) or "response" (a client answering a
    server-initiated request: `result` or `error` instead of `method`).
    """

    kind: Literal["request", "notification", "response"]
    id: RequestId = None
    method: str = ""
    params: Any = field(default=None)


def parse(body: bytes | str) -> Incoming:
    """Parse one JSON-RPC 2.0 message; raise RpcError (-32700 / -32600) when it is not one.

    Batches (a JSON array) are refused with -32600: neither A2A nor current MCP uses them.
    """
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise RpcError(PARSE_ERROR, "Invalid JSON payload") from None
    if not isinstance(obj, dict):
        raise RpcError(INVALID_REQUEST, "Invalid Request: the body must be a JSON-RPC 2.0 object")
    req_id = obj.get("id")
    if req_id is not None and (isinstance(req_id, bool) or not isinstance(req_id, (str, int, float))):
        raise RpcError(INVALID_REQUEST, "Invalid Request: 'id' must be a string, a number or null")
    if obj.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "Invalid Request: 'jsonrpc' must be exactly \"2.0\"", id=req_id)
    if "method" not in obj and "id" in obj and ("result" in obj or "error" in obj):
        return Incoming("response", id=req_id)
    method = obj.get("method")
    if not isinstance(method, str) or not method:
        raise RpcError(INVALID_REQUEST, "Invalid Request: 'method' must be a non-empty string", id=req_id)
    params = obj.get("params")
    if params is not None and not isinstance(params, (dict, list)):
        raise RpcError(INVALID_PARAMS, "Invalid params: 'params' must be an object or an array", id=req_id)
    found = bounds.problem(params)  # what storage cannot hold (`threadline.api.bounds`), named
    if found is not None:
        raise RpcError(INVALID_PARAMS, f"Invalid params: params.{bounds.dotted(found[0])}: {found[1]}", id=req_id)
    return Incoming("request" if "id" in obj else "notification", id=req_id, method=method, params=params)


def result(id: RequestId, value: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "result": value}


def error(id: RequestId, code: int, message: str, data: Any = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": id, "error": err}


def accepts(header: str | None, *media_types: str) -> bool:
    """Whether an `Accept` header admits one of `media_types` (no header admits everything)."""
    if not header:
        return True
    ranges = {r.split(";", 1)[0].strip().lower() for r in header.split(",")}
    wanted = {"*/*", *media_types, *(m.split("/")[0] + "/*" for m in media_types)}
    return bool(ranges & wanted)
