"""langgraph.json `encryption`: the project's `langgraph_sdk.Encryption`, and the encryption context of what a
request writes (`X-Encryption-Context`, then the project's `@encryption.context` handler).

Storage applies the handlers (`threadline/storage/encryption.py`); this module loads them and sets the
request's context for it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from threadline.core.auth import current_user
from threadline.errors import ConfigError, InvalidInput
from threadline.loader import load_object
from threadline.storage.encryption import current_context, reset_context, use_context

__all__ = ["current_context", "load_encryption", "request_context", "reset_context", "use_context"]


def load_encryption(project: Any) -> Any | None:
    """The project's `Encryption` instance (`encryption.path`), or None without one."""
    if getattr(project, "encryption", None) is None:
        return None
    from langgraph_sdk.encryption import Encryption

    spec = project.encryption.path
    found = load_object(spec, project.root, what="encryption.path")
    if not isinstance(found, Encryption):
        raise ConfigError(f"encryption.path '{spec}' must be a langgraph_sdk Encryption instance, "
                          f"got {type(found).__name__}")
    return found


def decode_header(value: str | None) -> dict[str, Any]:
    """`X-Encryption-Context`: a JSON object, base64-encoded (as LangGraph's server reads it); InvalidInput
    (422) otherwise."""
    if not value:
        return {}
    try:
        decoded = orjson.loads(base64.b64decode(value.encode(), validate=True))
    except (binascii.Error, ValueError) as exc:
        raise InvalidInput(f"Invalid X-Encryption-Context header: expected base64-encoded JSON object ({exc})") \
            from exc
    if not isinstance(decoded, dict):
        raise InvalidInput("Invalid X-Encryption-Context header: expected base64-encoded JSON object")
    return decoded


async def request_context(encryption: Any, header: str | None) -> dict[str, Any] | None:
    """The request's encryption context: the header's, then what the project's context handler makes of it
    for the authenticated caller (LangGraph's server calls it only for an authenticated request). None when
    the request gives neither: the context it is served in stays (an agent's in-process call to this server,
    `langgraph_sdk.get_client()`, writes with its run's)."""
    metadata = decode_header(header)
    handler = encryption._context_handler
    user = current_user()
    if header is None and (handler is None or user is None):
        return None
    if handler is not None and user is not None:
        from langgraph_sdk.encryption.types import EncryptionContext

        returned = await handler(user, EncryptionContext(model=None, field=None, metadata=metadata))
        metadata = dict(returned or {})
    return metadata
