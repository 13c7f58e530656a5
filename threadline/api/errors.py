"""Every error becomes a wire's error here, and only here: an HTTP response (`STATUS`, `install`), a JSON-RPC
error for A2A and MCP (`rpc_error`) and a Protocol v2 error envelope's code (`protocol_error`)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from langgraph.store.base import InvalidNamespaceError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from threadline import errors
from threadline.api import bounds, jsonrpc

log = logging.getLogger("threadline.api")

STATUS = {
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.InvalidInput: 422,
    errors.BadRequest: 400,
    errors.PayloadTooLarge: 413,
    errors.ConfigError: 500,
    errors.Unavailable: 503,
    errors.QuotaExceeded: 429,
    errors.ClientGone: 499,  # nobody reads it; the status is for logs and metrics
    errors.EventsExpired: 410,
    errors.Unauthorized: 401,  # or the status the project's authenticator chose: `refusal`
}

# JSON-RPC (A2A and MCP), first match wins: the A2A spec's own codes, then the generic ones. Any other error is
# an internal error (-32603).
RPC_CODES: dict[type[errors.ThreadlineError], int] = {
    errors.TaskNotFound: -32001,
    errors.TaskNotCancelable: -32002,
    errors.PushNotificationNotSupported: -32003,
    errors.UnsupportedOperation: -32004,
    errors.ContentTypeNotSupported: -32005,
    errors.ExtendedCardNotConfigured: -32007,
    errors.NotFound: jsonrpc.INVALID_PARAMS,
    errors.InvalidInput: jsonrpc.INVALID_PARAMS,
    errors.BadRequest: jsonrpc.INVALID_PARAMS,
    errors.Conflict: jsonrpc.INVALID_PARAMS,
    # A cap reached (quotas, limits): the first of JSON-RPC's implementation-defined server errors, neither spec
    # naming one; the error's `data` says when to try again (`rpc_error`).
    errors.QuotaExceeded: jsonrpc.SERVER_ERROR,
}

#: The error codes of Protocol v2 command answers (`{"type": "error", "error": <code>}`).
ProtocolCode = Literal["invalid_argument", "unknown_command", "not_supported", "no_such_run", "no_such_interrupt",
                       "no_such_subscription", "resume_gap", "quota_exceeded", "unknown_error"]

# Which code each error answers with, first match wins; any other Threadline error is `unknown_error`.
PROTOCOL_CODES: dict[type[errors.ThreadlineError], ProtocolCode] = {
    errors.NoSuchRun: "no_such_run",
    errors.NoSuchInterrupt: "no_such_interrupt",
    errors.NoSuchSubscription: "no_such_subscription",
    errors.EventsExpired: "resume_gap",
    errors.QuotaExceeded: "quota_exceeded",  # ours, as `resume_gap`: the protocol names no such error
    errors.InvalidInput: "invalid_argument",
    errors.BadRequest: "invalid_argument",
    errors.Conflict: "invalid_argument",
    errors.NotFound: "invalid_argument",
}


def error_body(status: int, message: str, code: str, **extra: Any) -> JSONResponse:
    """`detail` is what langgraph-sdk shows users; `code` and `message` are the Agent Protocol's."""
    return JSONResponse({"detail": message, "code": code, "message": message, **extra}, status_code=status)


def refusal(exc: errors.Unauthorized) -> JSONResponse:
    """A request its credentials do not admit: 401 (or the status the project's authenticator chose),
    `{"detail": ...}` and the authenticator's headers (`WWW-Authenticate`)."""
    code = {401: "unauthorized", 403: "forbidden"}.get(exc.status, "unauthorized")
    response = error_body(exc.status, exc.message, code)
    response.headers.update(exc.headers)
    return response


def late_error(exc: Exception) -> dict[str, Any]:
    """An error that happens after a 200 has been sent (a long `/runs/wait`): the body a failed run's wait
    answers, `{"__error__": {"error", "message"}}`, which langgraph-sdk's `runs.wait` / `runs.join` raise on."""
    if isinstance(exc, errors.ThreadlineError):
        return {"__error__": {"error": type(exc).__name__, "message": exc.message}}
    log.error("error after the response started", exc_info=exc)
    return {"__error__": {"error": type(exc).__name__, "message": f"Internal server error: {type(exc).__name__}"}}


def rpc_error(exc: Exception) -> tuple[int, str, dict[str, Any] | None]:
    """A JSON-RPC error's code, message and data for `exc`. Threadline's errors keep their message, and one the
    client may retry has data `{"code", "retry_after"}` (seconds, as HTTP's `Retry-After`); any other exception
    is logged here in full and answered as "Internal error" (no database or Redis internals reach the client)."""
    if isinstance(exc, errors.ThreadlineError):
        code = next((c for cls, c in RPC_CODES.items() if isinstance(exc, cls)), jsonrpc.INTERNAL_ERROR)
        if isinstance(exc, (errors.Unavailable, errors.QuotaExceeded)):
            return code, exc.message, {"code": exc.code, "retry_after": exc.retry_after}
        return code, exc.message, None
    log.error("JSON-RPC request failed", exc_info=exc)
    return jsonrpc.INTERNAL_ERROR, "Internal error", None


def protocol_error(exc: errors.ThreadlineError) -> tuple[ProtocolCode, str, dict[str, Any]]:
    """A Protocol v2 error envelope's code, message and extra fields (`resume_gap`'s `since`, …; `retry_after`,
    in seconds, when trying again later may succeed) for `exc`."""
    code: ProtocolCode = next((c for cls, c in PROTOCOL_CODES.items() if isinstance(exc, cls)), "unknown_error")
    extra = dict(exc.metadata)
    if isinstance(exc, (errors.Unavailable, errors.QuotaExceeded)):
        extra["retry_after"] = exc.retry_after
    return code, exc.message, extra


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "body"


def _json_problem(error: dict[str, Any], body: Any) -> str:
    """`Invalid JSON in request body: Expecting value at line 2, column 7`: FastAPI reports a character offset
    (as the error's location, which is no field of the body); a person looks for a line and a column."""
    reason = (error.get("ctx") or {}).get("error") or error.get("msg") or "JSON decode error"
    loc = error.get("loc") or ()
    offset = loc[-1] if loc and isinstance(loc[-1], int) else None
    if offset is None or not isinstance(body, (str, bytes)):
        return f"Invalid JSON in request body: {reason}"
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"Invalid JSON in request body: {reason} at line {line}, column {column} (character {offset + 1})"


#: The resources whose id in a path must be a UUID, as LangGraph's server names them in its 422.
PATH_IDS = {"thread_id": "thread", "run_id": "run", "cron_id": "cron", "assistant_id": "assistant"}


def _bad_id(problems: Sequence[Any]) -> str | None:
    """`Invalid run ID: must be a UUID`: LangGraph's server's text for an id in the path that is not a UUID,
    the same on every deployment (the `errors` list still names the field, `path.run_id`)."""
    first = problems[0] if problems else {}
    loc = tuple(first.get("loc", ()))
    if len(loc) == 2 and loc[0] == "path" and loc[1] in PATH_IDS and str(first.get("type", "")).startswith("uuid"):
        return f"Invalid {PATH_IDS[loc[1]]} ID: must be a UUID"
    return None


def error_response(exc: errors.ThreadlineError) -> JSONResponse:
    """The HTTP answer to a Threadline error: its status (`STATUS`), its JSON body, and `Retry-After` when
    trying again later may succeed (a refusal of credentials: `refusal`, with the authenticator's headers)."""
    if isinstance(exc, errors.Unauthorized):
        return refusal(exc)
    status = next((s for cls, s in STATUS.items() if isinstance(exc, cls)), 500)
    extra = {"metadata": exc.metadata} if exc.metadata else {}
    response = error_body(status, exc.message, exc.code, **extra)
    if isinstance(exc, (errors.Unavailable, errors.QuotaExceeded)):
        # The database or Redis is away (restarting, failing over), or a cap is reached: the client may try
        # again, so the answer says when (`Retry-After`, as RFC 9110 has it for 503 and RFC 6585 for 429).
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


#: The WebSocket close code of an error, when a handshake is refused on a server without the ASGI
#: denial-response extension (RFC 6455: 1008 policy violation; 1013 try again later).
WS_CLOSE_CODES = {errors.Unauthorized: 1008, errors.NotFound: 1008, errors.QuotaExceeded: 1013}


async def deny_handshake(scope: Any, send: Any, exc: errors.ThreadlineError, response: JSONResponse | None = None,
                         *, accept_first: bool = False) -> None:
    """Refuse a WebSocket handshake: with the HTTP answer (`response`, else `error_response(exc)`) where the
    server can (the ASGI denial-response extension; uvicorn has it); else by closing with `WS_CLOSE_CODES`'s
    code. With `accept_first`, that close follows an accept, so the client also sees the error's message as
    the close reason (a close before the accept is a bare 403 on the wire)."""
    response = response or error_response(exc)
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send({"type": "websocket.http.response.start", "status": response.status_code,
                    "headers": response.raw_headers})
        await send({"type": "websocket.http.response.body", "body": bytes(response.body)})
        return
    code = next((c for cls, c in WS_CLOSE_CODES.items() if isinstance(exc, cls)), 1011)
    if accept_first:
        await send({"type": "websocket.accept"})
        # A close reason is at most 123 bytes of UTF-8.
        reason = exc.message.encode()[:123].decode(errors="ignore")
        await send({"type": "websocket.close", "code": code, "reason": reason})
    else:
        await send({"type": "websocket.close", "code": code})


class Contained:
    """ASGI middleware, outermost: no exception reaches the server once a response is whole.

    Starlette answers an unhandled error with our 500 (`install`'s `_crash`) and then raises it again, for the
    server to log; uvicorn, seeing an exception after a response started, closes the connection, without
    `Connection: close`, so a pooled client's next request on it fails with a reset. Here an error after a
    whole response is logged (unless `_crash` did) and kept; one before any response becomes our 500; one in
    the middle of a body still reaches the server, which must then cut the connection (the body is short).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = "unanswered"

        async def tracking_send(message: Any) -> None:
            nonlocal state
            if message["type"] == "http.response.start":
                state = "started"
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state = "whole"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if state == "started":
                raise
            if not getattr(exc, "_threadline_logged", False):
                log.error("unhandled error", exc_info=exc)
            if state == "unanswered":
                await _crash_response(exc)(scope, receive, send)


def _crash_response(exc: Exception) -> JSONResponse:
    return error_body(500, f"Internal server error: {type(exc).__name__}", "internal_error")


def install(app: FastAPI) -> None:
    @app.exception_handler(errors.ThreadlineError)
    async def _domain(_: Request, exc: errors.ThreadlineError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(errors.Unauthorized)
    async def _refused(_: Request, exc: errors.Unauthorized) -> JSONResponse:
        return refusal(exc)

    @app.exception_handler(InvalidNamespaceError)
    async def _namespace(_: Request, exc: InvalidNamespaceError) -> JSONResponse:
        # LangGraph's store refusing a namespace the routes let through (its root label `langgraph`, say):
        # the client's mistake, a 422 as every other invalid namespace (the reference answers 400).
        return error_body(422, f"namespace: {exc}", "invalid_input")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if isinstance(exc.body, (bytes, bytearray)) and exc.body:
            # FastAPI parses a body as JSON only when it is labelled so; any other is left as bytes, which no
            # model takes. Said as it is (415), not as "Input should be a valid dictionary". Deliberately not
            # parsed anyway: a browser sends an unlabelled or text/plain body cross-site without a CORS
            # preflight, so a page could otherwise drive a server on localhost (docs/security.md).
            given = request.headers.get("content-type") or "none"
            message = f"Send the body as JSON with Content-Type: application/json (this request's: {given})"
            return error_body(415, message, "unsupported_media_type")
        bad_json = next((e for e in exc.errors() if e.get("type") == "json_invalid"), None)
        if bad_json is not None:
            return error_body(422, _json_problem(bad_json, exc.body), "invalid_json")
        problems = [
            {"field": _field(tuple(e.get("loc", ()))), "message": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        summary = _bad_id(exc.errors()) or "; ".join(f"{p['field']}: {p['message']}" for p in problems)
        return error_body(422, summary or "Invalid request", "invalid_input", errors=problems)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, RecursionError):  # FastAPI's "error parsing the body": nested too deep
            return error_body(422, f"body: Objects and arrays may nest at most {bounds.MAX_DEPTH} deep",
                              "invalid_input")
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        response = error_body(exc.status_code, message, code)
        response.headers.update(exc.headers or {})  # e.g. `Allow` on a 405
        return response

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        with contextlib.suppress(AttributeError):
            exc._threadline_logged = True  # type: ignore[attr-defined]  # Starlette raises it again: `Contained`
        return _crash_response(exc)
