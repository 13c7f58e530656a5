"""`langgraph_sdk.get_client()` without a URL, called by an agent this server runs, reaches this server
in-process, as on LangGraph's server (deepagents' async subagents without `url` do exactly this).

The SDK gives such a client an ASGI transport with no app yet and keeps it in a module list that LangGraph's
server fills in (`configure_loopback_transports`). While a Threadline app is up, that list is replaced by one
that points every transport added to it at the app at once, and transports made before startup (a client
made when a graph module is imported) are pointed at it by the SDK's own function. At shutdown the SDK's list
comes back and the transports that pointed at this app point where they did before (no app: the SDK's own
error for a client used outside a server).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import weakref
from collections.abc import Iterator
from typing import Any

from threadline.api.auth import AUTHENTICATED, LOOPBACK
from threadline.core.auth import AuthUser, set_current_user
from threadline.core.encryption import current_context, use_context

log = logging.getLogger("threadline.loopback")


class _Transports(list[Any]):
    """The SDK's list of loopback transports while an app is up: what is added is pointed at the app.

    Transports added meanwhile are held weakly (a client made per call would otherwise pile up forever)."""

    def __init__(self, app: Any, before: list[Any]) -> None:
        super().__init__(before)
        self.app = app
        self.added: weakref.WeakSet[Any] = weakref.WeakSet()

    def append(self, transport: Any) -> None:
        transport.app = self.app
        self.added.add(transport)


def _run_caller() -> AuthUser | None:
    """The user the calling code's run runs as (its config's `langgraph_auth_user`), if it is in a run."""
    try:
        from langgraph.config import get_config

        stored = (get_config().get("configurable") or {}).get("langgraph_auth_user")
    except Exception:  # noqa: BLE001 - not inside a run (LangGraph raises outside a runnable context)
        return None
    return AuthUser(stored) if isinstance(stored, dict) and stored.get("identity") else None


def isolated(app: Any) -> Any:
    """`app`, each request handled in a task with a fresh context: the calling node's context variables (its
    LangGraph config, callbacks and stream handlers) must not leak into the runs the request starts.

    As on LangGraph's server, such a request is not authenticated (its headers name no one) and is authorized
    as the user the calling run runs as: what an agent reads and makes through `get_client()` is its caller's,
    filtered and stamped by the project's `@auth.on` handlers like the caller's own requests. Code outside any
    run (the project's own routes or lifespan) calls as the server itself, unchecked, as there."""

    async def call(scope: Any, receive: Any, send: Any) -> None:
        caller = _run_caller()
        scope = {**scope, LOOPBACK: True}
        context = contextvars.Context()
        context.run(use_context, current_context())  # what it stores is encrypted with its run's context
        if caller is not None:
            scope[AUTHENTICATED] = caller  # who rate limits count, and what the middleware takes as done
            context.run(set_current_user, caller)
        task = asyncio.get_running_loop().create_task(app(scope, receive, send), context=context)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            raise

    return call


@contextlib.contextmanager
def serving_loopback(app: Any) -> Iterator[None]:
    """While open, in-process SDK clients reach `app`."""
    try:
        from langgraph_sdk._async import client as sdk_client
        from langgraph_sdk._shared import utilities
    except ImportError:  # an SDK without in-process clients (or a layout we do not know): nothing to wire
        yield
        return
    previous = getattr(utilities, "_registered_transports", None)
    if getattr(sdk_client, "_registered_transports", None) is not previous or not isinstance(previous, list):
        log.warning("langgraph_sdk's in-process transports were not found: get_client() without a URL "
                    "will not reach this server")
        yield
        return
    target = isolated(app)
    before = {id(t): getattr(t, "app", None) for t in previous}
    mine = _Transports(target, list(previous))
    utilities._registered_transports = sdk_client._registered_transports = mine
    utilities.configure_loopback_transports(target)
    try:
        yield
    finally:
        utilities._registered_transports = sdk_client._registered_transports = previous
        for transport in [*mine, *mine.added]:
            if transport.app is target:
                transport.app = before.get(id(transport))
