"""Who is calling: the project's `langgraph_sdk.Auth` authenticator, or built-in API keys.

The web layer (`threadline.api.auth`) gathers what a handler asks for from the request and calls
`authenticate` here; the caller it returns is the `current_user()` of the request's context, and every run the
request creates carries it in `config["configurable"]` (`auth_configurable`), stored with the run, so a worker
in another process runs the agent as the same caller. Nothing here imports the web framework.
"""

from __future__ import annotations

import builtins
import contextvars
import hmac
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from threadline.core.auth_cache import AuthCache
from threadline.errors import ConfigError, Unauthorized
from threadline.loader import load_object
from threadline.storage.sql import filter_terms

log = logging.getLogger("threadline.auth")

#: The parameters an `@auth.authenticate` handler may take, by name, as on LangGraph's server.
HANDLER_PARAMETERS = frozenset({
    "request", "body", "path", "method", "path_params", "query_params", "headers", "authorization", "scope",
})
#: The keys of `config["configurable"]` a run gets from its caller (the server's, whatever the client sent).
CONFIGURABLE_KEYS = ("langgraph_auth_user", "langgraph_auth_user_id", "langgraph_auth_permissions", "user_id")


class AuthUser(builtins.dict[str, Any]):
    """The authenticated caller, as a run's `config["configurable"]["langgraph_auth_user"]` holds it.

    A plain dict (so it is stored with the run and serializes anywhere) whose keys also read as attributes,
    as the user object of LangGraph's server does: `user.identity`, `user["identity"]`, `user.get("x")`,
    `user.dict()`. It always has `identity`, `is_authenticated` and `display_name`, then whatever else the
    authenticator returned (`permissions`, custom fields).
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def identity(self) -> str:
        return str(self["identity"])

    @property
    def permissions(self) -> list[str]:
        return list(self.get("permissions") or [])

    @property
    def display_name(self) -> str:
        return str(self.get("display_name") or self["identity"])

    @property
    def is_authenticated(self) -> bool:
        return bool(self.get("is_authenticated", True))

    def dict(self) -> builtins.dict[str, Any]:
        return builtins.dict(self)

    def model_dump(self) -> builtins.dict[str, Any]:
        return builtins.dict(self)


def as_user(returned: Any) -> AuthUser:
    """What an authenticator returned (an identity string, a dict with `identity`, or an object with an
    `identity` attribute) as an `AuthUser`; anything else refuses the request (the handler is wrong, and the
    caller learns nothing of it)."""
    if isinstance(returned, str) and returned:
        fields: dict[str, Any] = {"identity": returned}
    elif isinstance(returned, Mapping) and isinstance(returned.get("identity"), str) and returned["identity"]:
        fields = builtins.dict(returned)
    elif isinstance(getattr(returned, "identity", None), str) and returned.identity:
        fields = {"identity": returned.identity}
        for name in ("is_authenticated", "display_name", "permissions"):
            value = getattr(returned, name, None)
            if value is not None:
                fields[name] = value
    else:
        log.error("the authenticator returned %s, not an identity string, a dict with 'identity' or a user "
                  "object: the request is refused", type(returned).__name__)
        raise Unauthorized()
    user = AuthUser(identity=fields.pop("identity"), is_authenticated=bool(fields.pop("is_authenticated", True)))
    user["display_name"] = fields.pop("display_name", None) or user["identity"]
    if "permissions" in fields:
        fields["permissions"] = [str(p) for p in fields["permissions"] or []]
    user.update(fields)
    return user


_current: contextvars.ContextVar[AuthUser | None] = contextvars.ContextVar("threadline_auth_user", default=None)


def current_user() -> AuthUser | None:
    """The caller of the request being served (None without authentication, or outside a request)."""
    return _current.get()


def set_current_user(user: AuthUser | None) -> contextvars.Token[AuthUser | None]:
    return _current.set(user)


def reset_current_user(token: contextvars.Token[AuthUser | None]) -> None:
    _current.reset(token)


def auth_configurable(user: AuthUser) -> dict[str, Any]:
    """What a run started by `user` carries in `config["configurable"]`, as on LangGraph's server."""
    return {"langgraph_auth_user": user, "langgraph_auth_user_id": user.identity,
            "langgraph_auth_permissions": user.permissions, "user_id": user.identity}


def with_caller(body: dict[str, Any]) -> dict[str, Any]:
    """A run request with the current caller in `config.configurable` (the server's keys win over the
    client's: a client cannot run an agent as someone else); unchanged without a caller."""
    user = current_user()
    if user is None:
        return body
    config = builtins.dict(body.get("config") or {})
    config["configurable"] = {**(config.get("configurable") or {}), **auth_configurable(user)}
    return {**body, "config": config}


def user_in_config(configurable: dict[str, Any]) -> dict[str, Any]:
    """A stored run's configurable with its caller as an `AuthUser` again (attribute access in the graph)."""
    stored = configurable.get("langgraph_auth_user")
    if isinstance(stored, dict) and not isinstance(stored, AuthUser) and "identity" in stored:
        return {**configurable, "langgraph_auth_user": AuthUser(stored)}
    return configurable


class Authenticator:
    """Turns what a request shows into its caller, or raises `Unauthorized` (with the status, detail and
    headers to answer with). `wants` names the request facts `authenticate` needs, so the web layer gathers
    only those."""

    wants: frozenset[str] = frozenset()

    async def authenticate(self, facts: dict[str, Any]) -> AuthUser:
        raise NotImplementedError


class CustomAuth(Authenticator):
    """langgraph.json's `auth.path`: a `langgraph_sdk.Auth` whose `@auth.authenticate` handler is called with
    the parameters it names (`request`, `headers`, `authorization`, …). `Auth.exceptions.HTTPException` is
    answered with its status, detail and headers; any other exception is logged with its traceback and
    answered 401 `Unauthorized`, saying nothing of the handler. With `cache` (langgraph.json `auth.cache`), an
    accepted caller is kept and given again to requests showing the same `cache_keys` headers."""

    def __init__(self, auth: Any, spec: str, cache: AuthCache | None = None) -> None:
        handler = getattr(auth, "_authenticate_handler", None)
        if handler is None:
            raise ConfigError(f"auth.path '{spec}': the Auth object has no @auth.authenticate handler")
        if not inspect.iscoroutinefunction(handler):
            raise ConfigError(f"auth.path '{spec}': the @auth.authenticate handler must be an async function")
        params = inspect.signature(handler).parameters
        unknown = [n for n, p in params.items() if n not in HANDLER_PARAMETERS and p.default is p.empty
                   and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        if unknown:
            raise ConfigError(f"auth.path '{spec}': the @auth.authenticate handler takes {', '.join(unknown)}; "
                              f"it may take {', '.join(sorted(HANDLER_PARAMETERS))}")
        self.auth = auth
        self.handler: Callable[..., Awaitable[Any]] = handler
        self.params = frozenset(n for n in params if n in HANDLER_PARAMETERS)
        self.cache = cache
        self.wants = self.params | {"headers"} if cache is not None else self.params

    async def authenticate(self, facts: dict[str, Any]) -> AuthUser:
        from langgraph_sdk.auth.exceptions import HTTPException

        key = self.cache.key(facts["headers"]) if self.cache is not None else None
        if key is not None and self.cache is not None and (kept := self.cache.get(key)) is not None:
            return cast(AuthUser, kept)
        try:
            returned = await self.handler(**{name: facts[name] for name in self.params})
        except HTTPException as exc:
            raise Unauthorized(exc.detail, status=exc.status_code, headers=dict(exc.headers or {})) from None
        except Exception:
            log.exception("the @auth.authenticate handler raised; the request is refused with 401")
            raise Unauthorized() from None
        user = as_user(returned)
        if key is not None and self.cache is not None:
            self.cache.put(key, user)
        return user


@dataclass(frozen=True)
class ApiKey:
    key: str
    user: AuthUser


class ApiKeys(Authenticator):
    """Built-in API keys (`THREADLINE_API_KEYS`, `THREADLINE_API_KEYS_FILE`), for projects without an
    `auth.py`: a request shows one in `x-api-key` or `Authorization: Bearer <key>`; keys are compared in
    constant time (`hmac.compare_digest`), every configured key each time, so timing says nothing."""

    wants = frozenset({"headers"})

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self.keys = [(k.key.encode(), k.user) for k in keys]
        if not self.keys:
            raise ConfigError("no API keys configured")

    @classmethod
    def from_settings(cls, inline: str | None, file: str | None) -> ApiKeys | None:
        keys = [*parse_inline_keys(inline or ""), *(load_keys_file(Path(file)) if file else [])]
        return cls(keys) if keys else None

    async def authenticate(self, facts: dict[str, Any]) -> AuthUser:
        headers: dict[bytes, bytes] = facts["headers"]
        shown = headers.get(b"x-api-key")
        if shown is None:
            scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
            shown = token.strip() if scheme.lower() == b"bearer" else None
        if not shown:
            raise Unauthorized("Missing API key", headers={"www-authenticate": "Bearer"})
        found = None
        for key, user in self.keys:
            if hmac.compare_digest(key, shown):
                found = user
        if found is None:
            raise Unauthorized("Invalid API key", headers={"www-authenticate": "Bearer"})
        return found


def parse_inline_keys(text: str) -> list[ApiKey]:
    """`THREADLINE_API_KEYS`: comma-separated `identity=key` entries (a bare `key` is `api-key-<n>`)."""
    keys = []
    for n, entry in enumerate((e.strip() for e in text.split(",")), start=1):
        if not entry:
            continue
        identity, sep, key = entry.partition("=")
        if not sep:
            identity, key = f"api-key-{n}", entry
        if not identity.strip() or not key.strip():
            raise ConfigError(f"THREADLINE_API_KEYS entry {n} must be 'identity=key' or 'key'")
        keys.append(_key(key.strip(), {"identity": identity.strip()}, f"THREADLINE_API_KEYS entry {n}"))
    return keys


def load_keys_file(path: Path) -> list[ApiKey]:
    """`THREADLINE_API_KEYS_FILE`: a JSON list of `{"key", "identity", "permissions"?, "display_name"?, …}`."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the API keys file {path}: {exc}") from exc
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: the API keys file must be a JSON list of objects with 'key' and 'identity'")
    keys = []
    for n, entry in enumerate(raw, start=1):
        where = f"{path}: entry {n}"
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str) or not entry["key"]:
            raise ConfigError(f"{where} must be an object with a non-empty string 'key'")
        fields = {k: v for k, v in entry.items() if k != "key"}
        perms = fields.get("permissions", [])
        if not isinstance(perms, list) or not all(isinstance(p, str) for p in perms):
            raise ConfigError(f"{where}: 'permissions' must be a list of strings")
        keys.append(_key(entry["key"], fields, where))
    return keys


def _key(key: str, fields: dict[str, Any], where: str) -> ApiKey:
    if not isinstance(fields.get("identity"), str) or not fields["identity"]:
        raise ConfigError(f"{where} needs a non-empty string 'identity'")
    if len(key) < 16:
        raise ConfigError(f"{where}: an API key must be at least 16 characters long")
    return ApiKey(key, as_user(fields))


def load_auth(project: Any) -> Any | None:
    """langgraph.json `auth.path`: the project's `langgraph_sdk.Auth` instance, or None without one."""
    if project.auth is None:
        return None
    from langgraph_sdk import Auth

    auth = load_object(project.auth.path, project.root, what="auth.path")
    if not isinstance(auth, Auth):
        raise ConfigError(f"auth.path '{project.auth.path}' must be a langgraph_sdk.Auth instance, "
                          f"got {type(auth).__name__}")
    return auth


def auth_configured(project: Any, settings: Any) -> bool:
    """Whether requests are authenticated: langgraph.json has `auth`, or API keys are configured."""
    return project.auth is not None or bool(settings.api_keys or settings.api_keys_file)


class Authorizer:
    """The project's `@auth.on…` handlers, dispatched as LangGraph's server does: for (resource, action) the
    most specific one registered runs: `@auth.on.<resource>.<action>`, else `@auth.on.<resource>`, else one
    registered for the action on every resource (`@auth.on(actions=...)`), else `@auth.on`; none at all
    allows. The handler may change `value` in place (stamp `metadata.owner`); it allows with None or True,
    refuses with False (`Unauthorized`, 403), or returns a filter on the resource's metadata for the storage
    query (`sql.filter_terms`); `threadline.core.access` asks it for every operation. A failed `assert` in a
    handler refuses with 403 and the assertion's message (as LangGraph's server); any other exception but
    `Auth.exceptions.HTTPException` refuses with 403 and a log line (LangGraph's server answers 500): its
    internals stay in the log, and a broken handler never lets a request through."""

    def __init__(self, auth: Any) -> None:
        self.handlers: dict[tuple[str, str], Any] = {k: v[0] for k, v in getattr(auth, "_handlers", {}).items()}
        globals_ = getattr(auth, "_global_handlers", None) or []
        self.fallback = globals_[0] if globals_ else None

    @classmethod
    def of(cls, auth: Any) -> Authorizer | None:
        """The authorizer of a `langgraph_sdk.Auth` that registers any `@auth.on…` handler, else None."""
        if auth is None or not (getattr(auth, "_handlers", None) or getattr(auth, "_global_handlers", None)):
            return None
        return cls(auth)

    def handler(self, resource: str, action: str) -> Any:
        for key in ((resource, action), (resource, "*"), ("*", action)):
            if key in self.handlers:
                return self.handlers[key]
        return self.fallback

    async def authorize(self, user: AuthUser, resource: str, action: str,
                        value: dict[str, Any]) -> dict[str, Any] | None:
        """None (allowed, nothing to filter) or the filter to apply inside the query; raises when refused."""
        handler = self.handler(resource, action)
        if handler is None:
            return None
        from langgraph_sdk.auth.exceptions import HTTPException
        from langgraph_sdk.auth.types import AuthContext

        ctx = AuthContext(permissions=user.permissions, user=user,
                          resource=resource, action=action)  # type: ignore[arg-type]
        try:
            result = await handler(ctx=ctx, value=value)
        except HTTPException as exc:
            raise Unauthorized(exc.detail, status=exc.status_code, headers=dict(exc.headers or {})) from None
        # LangGraph's documented `assert ..., "Not authorized"`: its message is for the caller
        except AssertionError as exc:
            raise Unauthorized(str(exc) or "Forbidden", status=403) from None
        except Exception:
            log.exception("@auth.on handler for %s.%s raised; the request is refused with 403", resource, action)
            raise Unauthorized("Forbidden", status=403) from None
        if result is None or result is True:
            return None
        if result is False:
            raise Unauthorized("Forbidden", status=403)
        if isinstance(result, dict):
            try:
                filter_terms(result)
            except ValueError:
                log.exception("@auth.on handler for %s.%s returned a filter that cannot be applied", resource, action)
                raise Unauthorized("Forbidden", status=403) from None
            return result or None
        log.error("@auth.on handler for %s.%s returned %s, not None, a bool or a filter: refused",
                  resource, action, type(result).__name__)
        raise Unauthorized("Forbidden", status=403)
