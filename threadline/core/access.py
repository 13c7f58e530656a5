"""Authorization of core operations: the project's `@auth.on…` handlers, asked for the current caller.

Every surface (REST, A2A, MCP, Protocol v2, crons) reaches threads, runs, assistants, crons and the store through
the core services, and each service asks `Access` before it reads or writes: so a check is written once, here
and in the service, not once per wire. `Access.filters` answers with a filter on the resource's metadata that the
service hands to the storage query (`sql.filter_terms`, applied inside the SQL on both backends), so searches,
counts and pages hold only what the caller may see, and a resource filtered out is `NotFound`, never revealed.

Without authorization handlers, or outside a request (a worker running a run, the cron scheduler between its
runs, the TTL sweeper), there is no caller and nothing is checked: those are the server's own operations.
"""

from __future__ import annotations

from typing import Any

from threadline.core.auth import Authorizer, current_user
from threadline.errors import Unauthorized

#: The store's actions, as LangGraph's server names them.
STORE_ACTIONS = frozenset({"put", "get", "search", "list_namespaces", "delete"})


class Access:
    """The authorization every core service asks (see the module docstring). `authorizer` is None when the
    project registers no `@auth.on` handler: every check then allows, at the cost of one attribute read."""

    def __init__(self, authorizer: Authorizer | None = None) -> None:
        self.authorizer = authorizer

    @classmethod
    def of(cls, auth: Any) -> Access:
        """For a project's `langgraph_sdk.Auth` (or None): its `@auth.on…` handlers, if it registers any."""
        return cls(Authorizer.of(auth))

    @property
    def enabled(self) -> bool:
        return self.authorizer is not None

    async def filters(self, resource: str, action: str, value: dict[str, Any]) -> dict[str, Any] | None:
        """Run the handler for (`resource`, `action`) with `value` (which it may change in place: the caller
        uses `value` afterwards). None: allowed with nothing to filter; a dict: the metadata filter the storage
        query must apply. Refusals raise `Unauthorized` (403, or the handler's own status)."""
        if self.authorizer is None:
            return None
        user = current_user()
        if user is None:
            return None
        return await self.authorizer.authorize(user, resource, action, value)

    async def store(self, action: str, value: dict[str, Any]) -> tuple[str, ...]:
        """The namespace a store operation may use: the handler may rewrite `value["namespace"]` (a user's
        items under their own prefix) or refuse. A store handler cannot filter (items have no metadata to
        filter on): one that returns a filter is refused, so a filter is never silently ignored."""
        assert action in STORE_ACTIONS, action
        if await self.filters("store", action, value):
            raise Unauthorized("Forbidden: a store authorization handler must rewrite the namespace or refuse, "
                               "not return a filter", status=403)
        namespace = value.get("namespace") or ()
        if not isinstance(namespace, (tuple, list)) or not all(isinstance(n, str) and n for n in namespace):
            raise Unauthorized("Forbidden: the store authorization handler left an invalid namespace", status=403)
        return tuple(namespace)

