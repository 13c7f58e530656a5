"""Each user sees only what they made: the owner-only authorization of LangGraph's custom-auth guide.

Tokens are `Bearer user-<name>`. Every thread, run, assistant and cron created is stamped with its
creator's identity in `metadata.owner`, and every read, update, delete and search is filtered to the
caller's own; store namespaces are prefixed with the caller's identity.
"""

from __future__ import annotations

from typing import Any

from langgraph_sdk import Auth

auth = Auth()


@auth.authenticate
async def authenticate(authorization: str | None) -> Auth.types.MinimalUserDict:
    if authorization and authorization.startswith("Bearer user-"):
        name = authorization.removeprefix("Bearer user-")
        return {"identity": name, "permissions": ["threads:write", "threads:read"]}
    raise Auth.exceptions.HTTPException(status_code=401, detail="Missing or bad token")


@auth.on
async def owner_only(ctx: Auth.types.AuthContext, value: Any) -> dict[str, str]:
    """Creates (threads, assistants, crons, runs) are stamped with their owner; everything is filtered by it."""
    if isinstance(value, dict) and "metadata" in value:
        if value["metadata"] is None:
            value["metadata"] = {}
        value["metadata"]["owner"] = ctx.user.identity
    return {"owner": ctx.user.identity}


@auth.on.store
async def own_namespace(ctx: Auth.types.AuthContext, value: Any) -> None:
    """A user's items live under their identity: ("docs",) is stored as ("<identity>", "docs")."""
    value["namespace"] = (ctx.user.identity, *(value.get("namespace") or ()))
