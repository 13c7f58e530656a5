"""At-rest encryption with the project's `langgraph_sdk.Encryption` handlers (langgraph.json `encryption`).

`Codec` applies them as LangGraph's server does: a JSON field (a dict) goes through the project's JSON
encryptor with an `EncryptionContext(model, field, metadata)`, and is stored with the context's `metadata` as
plain JSON under `CONTEXT_KEY`, so the decryptor gets it back whatever request, worker or process reads the
row; a checkpoint blob goes through the blob encryptor and is stored in an envelope (`BLOB_MAGIC`, the
context, the ciphertext). Rows that carry no marker (written before encryption was configured) are read as
they are. The keys LangGraph never encrypts (ids, its system fields, checkpoint bookkeeping) are kept out of
the handler's sight, so the SQL that finds rows by them still works.

The context's `metadata` is the request's (`X-Encryption-Context` and `@encryption.context`, set by the API
through `use_context`); a worker executing a run uses the context its run was stored with.
"""

from __future__ import annotations

import contextvars
from typing import Any

import orjson

from threadline.errors import EncryptionFailed

__all__ = ["CONTEXT_KEY", "Codec", "EncryptionFailed", "current_context", "reset_context", "stored_context",
           "use_context"]

#: Where a JSON field keeps its encryption context (the name LangGraph's server uses, so the two read each other's).
CONTEXT_KEY = "langchain.dev/encryption_context/v1"
#: A JSON field that is not an object (a list of values, a string error) is encrypted as {"value": it}.
_WRAPPED = "threadline/encrypted_value"
#: The start of an encrypted blob: the magic, then the context's JSON length (4 bytes) and the context.
BLOB_MAGIC = b"\x00threadline-enc1\x00"

#: Keys LangGraph documents as never encrypted (and Threadline's own ids), at the top level of every JSON field.
SYSTEM_KEYS = frozenset({
    "thread_id", "run_id", "assistant_id", "graph_id", "checkpoint_id", "task_id", "cron_id",
    "langgraph_version", "langgraph_api_version", "langgraph_plan", "langgraph_host", "langgraph_api_url",
    "langgraph_request_id", "langgraph_auth_user", "langgraph_auth_user_id", "langgraph_auth_permissions",
    "source", "step", "parents", "run_attempt", "checkpoint_ns",
    "__after_seconds__", "__request_start_time_ms__", "max_concurrency", "recursion_limit",
    "a2a_task_id",  # ours: the A2A task a run belongs to, which runs are searched by
})

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("threadline_encryption_context",
                                                                                 default=None)


def use_context(metadata: dict[str, Any] | None) -> contextvars.Token[dict[str, Any] | None]:
    """Make `metadata` the encryption context of what this task (and the tasks it starts) writes."""
    return _context.set(metadata)


def reset_context(token: contextvars.Token[dict[str, Any] | None]) -> None:
    _context.reset(token)


def current_context() -> dict[str, Any]:
    return _context.get() or {}


class Codec:
    """The project's handlers, applied to JSON fields (`seal`/`open`) and blobs (`seal_blob`/`open_blob`)."""

    def __init__(self, encryption: Any) -> None:
        self.encryption = encryption
        self._json_enc = encryption._json_encryptor
        self._json_dec = encryption._json_decryptor
        self._blob_enc = encryption._blob_encryptor
        self._blob_dec = encryption._blob_decryptor
        self.context_handler = encryption._context_handler

    @staticmethod
    def _ctx(model: str, field: str | None, metadata: dict[str, Any]) -> Any:
        from langgraph_sdk.encryption.types import EncryptionContext

        return EncryptionContext(model=model, field=field, metadata=metadata)

    async def seal(self, model: str, field: str, data: Any) -> Any:
        """`data` as stored: encrypted by the project's JSON encryptor, with its context. None stays None."""
        if data is None or self._json_enc is None:
            return data
        if not isinstance(data, dict):
            return {**await self.seal(model, field, {"value": data}), _WRAPPED: True}
        metadata = current_context()
        kept = {k: v for k, v in data.items() if k in SYSTEM_KEYS}
        given = {k: v for k, v in data.items() if k not in SYSTEM_KEYS and k != CONTEXT_KEY}
        if not given:  # nothing to encrypt: no context either (a merge of it leaves the stored one)
            return kept
        sealed = await self._json_enc(self._ctx(model, field, metadata), given)
        if not isinstance(sealed, dict) or set(sealed) != set(given):
            raise EncryptionFailed(f"the encryption handler must keep the keys of the {model} {field} it encrypts "
                                   "and change only their values")
        return {**sealed, **kept, CONTEXT_KEY: orjson.dumps(metadata).decode()}

    async def open(self, model: str, field: str, data: Any) -> Any:
        """`data` as read: decrypted when it was stored encrypted, else as it is."""
        if not isinstance(data, dict) or CONTEXT_KEY not in data:
            return data
        wrapped = data.get(_WRAPPED) is True
        metadata = _loads_context(data[CONTEXT_KEY])
        kept = {k: v for k, v in data.items() if k in SYSTEM_KEYS}
        given = {k: v for k, v in data.items() if k not in SYSTEM_KEYS and k not in (CONTEXT_KEY, _WRAPPED)}
        opened = given
        if given and self._json_dec is not None:
            opened = _plaintext(await self._json_dec(self._ctx(model, field, metadata), given))
        result = {**opened, **kept}
        result.pop(CONTEXT_KEY, None)
        return result.get("value") if wrapped else result

    async def seal_blob(self, model: str, data: bytes) -> bytes:
        if self._blob_enc is None:
            return data
        metadata = current_context()
        context = orjson.dumps(metadata)
        sealed = await self._blob_enc(self._ctx(model, None, metadata), data)
        return BLOB_MAGIC + len(context).to_bytes(4, "big") + context + bytes(sealed)

    async def open_blob(self, model: str, data: bytes) -> bytes:
        if not data.startswith(BLOB_MAGIC) or self._blob_dec is None:
            return data
        start = len(BLOB_MAGIC) + 4
        size = int.from_bytes(data[len(BLOB_MAGIC):start], "big")
        metadata = _loads_context(data[start:start + size])
        return bytes(_plaintext(await self._blob_dec(self._ctx(model, None, metadata), data[start + size:])))

    async def seal_kwargs(self, kwargs: Any) -> Any:
        """A run's `kwargs`: its `input`, `config`, `context` and `command` each, then the whole."""
        if not isinstance(kwargs, dict) or self._json_enc is None:
            return kwargs
        inner = {k: await self.seal("run", k, kwargs[k]) for k in ("input", "config", "context", "command")
                 if isinstance(kwargs.get(k), dict)}
        return await self.seal("run", "kwargs", {**kwargs, **inner})

    async def open_kwargs(self, kwargs: Any) -> Any:
        opened = await self.open("run", "kwargs", kwargs)
        if not isinstance(opened, dict):
            return opened
        return {**opened, **{k: await self.open("run", k, v) for k, v in opened.items()
                             if isinstance(v, dict) and CONTEXT_KEY in v}}


def _plaintext(result: Any) -> Any:
    """A decryptor's answer: the value, or a `DecryptResult`'s `plaintext` (its re-encrypted `replacement` is
    not written back: Threadline does not rotate keys lazily)."""
    return getattr(result, "plaintext", result) if type(result).__name__ == "DecryptResult" else result


def stored_context(sealed: Any) -> dict[str, Any]:
    """The encryption context a sealed field was stored with ({} for one stored in plain text)."""
    return _loads_context(sealed[CONTEXT_KEY]) if isinstance(sealed, dict) and CONTEXT_KEY in sealed else {}


def _loads_context(raw: Any) -> dict[str, Any]:
    try:
        loaded = orjson.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except orjson.JSONDecodeError:
        return {}
    return loaded if isinstance(loaded, dict) else {}
