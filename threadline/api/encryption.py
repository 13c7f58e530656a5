"""The encryption context of each request (langgraph.json `encryption`): ASGI middleware inside
authentication, so the project's `@encryption.context` handler sees the caller (`core/encryption.py`)."""

from __future__ import annotations

from typing import Any

from threadline.api.errors import deny_handshake, error_response
from threadline.core.encryption import request_context, reset_context, use_context
from threadline.errors import ThreadlineError


class EncryptionContext:
    """Sets the request's encryption context for what it stores; a malformed `X-Encryption-Context` is 422."""

    def __init__(self, app: Any, encryption: Any) -> None:
        self.app = app
        self.encryption = encryption

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = next((v.decode("latin-1") for k, v in scope.get("headers") or [] if k == b"x-encryption-context"),
                      None)
        try:
            metadata = await request_context(self.encryption, header)
        except ThreadlineError as exc:
            response = error_response(exc)
            if scope["type"] == "http":
                await response(scope, receive, send)
            else:
                await deny_handshake(scope, send, exc, response)
            return
        if metadata is None:  # nothing given: the context the request is served in stays
            await self.app(scope, receive, send)
            return
        token = use_context(metadata)
        try:
            await self.app(scope, receive, send)
        finally:
            reset_context(token)
