"""The test project's authenticator: tokens name their outcome (`Bearer user-<name>`, `Bearer boom`, ...)."""

from __future__ import annotations

from typing import Any

from langgraph_sdk import Auth

auth = Auth()
#: What the last call was given, by parameter name (the tests read it).
LAST: dict[str, Any] = {}


@auth.authenticate
async def authenticate(request: Any, authorization: str | None, headers: dict[bytes, bytes], path: str,
                       method: str, path_params: dict[str, str], query_params: Any, body: Any) -> Any:
    LAST.clear()
    LAST.update(request=request, authorization=authorization, headers=headers, path=path, method=method,
                path_params=path_params, query_params=query_params, body=body)
    token = authorization or (f"Bearer {query_params['token']}" if "token" in query_params else None)
    if token == "Bearer boom":
        raise RuntimeError("secret internals xyz")
    if token == "Bearer teapot":
        raise Auth.exceptions.HTTPException(status_code=418, detail="short and stout", headers={"x-why": "tea"})
    if token == "Bearer none":
        return None
    if token == "Bearer alice":
        return "alice"
    if token and token.startswith("Bearer user-"):
        name = token.removeprefix("Bearer user-")
        return {"identity": name, "permissions": ["threads:read", "runs:create"], "display_name": name.title(),
                "team": "blue"}
    raise Auth.exceptions.HTTPException(status_code=401, detail="Missing or bad token",
                                        headers={"WWW-Authenticate": "Bearer"})
