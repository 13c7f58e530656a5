"""A project's at-rest encryption, written as LangGraph's docs show it: per-key JSON encryption with a prefix,
blob encryption, a key per tenant taken from the encryption context. The "cipher" is a keyed XOR: enough
that no plaintext reaches the database, and that a value decrypted with another tenant's key is garbage."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from langgraph_sdk import Encryption, EncryptionContext

encryption = Encryption()
PREFIX = "enc:"
SEEN: list[tuple[str, str | None, str | None]] = []  # (encrypt|decrypt, model, field), in call order
TENANTS: list[Any] = []  # the tenant of each call's context


def _xor(data: bytes, ctx: EncryptionContext) -> bytes:
    TENANTS.append((ctx.metadata.get("tenant"), SEEN[-1]))
    key = hashlib.sha256(f"key-of-{ctx.metadata.get('tenant')}".encode()).digest()
    return bytes(b ^ key[i % len(key)] for i, b in enumerate(data))


@encryption.encrypt.json
async def encrypt_json(ctx: EncryptionContext, data: dict[str, Any]) -> dict[str, Any]:
    SEEN.append(("encrypt", ctx.model, ctx.field))
    return {k: PREFIX + base64.b64encode(_xor(json.dumps(v).encode(), ctx)).decode() for k, v in data.items()}


@encryption.decrypt.json
async def decrypt_json(ctx: EncryptionContext, data: dict[str, Any]) -> dict[str, Any]:
    SEEN.append(("decrypt", ctx.model, ctx.field))
    return {k: json.loads(_xor(base64.b64decode(v[len(PREFIX):]), ctx))
            if isinstance(v, str) and v.startswith(PREFIX) else v for k, v in data.items()}


@encryption.encrypt.blob
async def encrypt_blob(ctx: EncryptionContext, blob: bytes) -> bytes:
    SEEN.append(("encrypt", ctx.model, "blob"))
    return b"ENC" + _xor(blob, ctx)


@encryption.decrypt.blob
async def decrypt_blob(ctx: EncryptionContext, blob: bytes) -> bytes:
    SEEN.append(("decrypt", ctx.model, "blob"))
    assert blob.startswith(b"ENC")
    return _xor(blob[3:], ctx)
