"""Assistants: a graph plus a saved configuration, versioned on every change."""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from threadline.core.access import Access
from threadline.core.graphs import CompiledGraph, GraphRegistry, describe_schemas, draw, subgraph_schemas
from threadline.errors import BadRequest, Conflict, InvalidInput, NotFound
from threadline.ids import is_uuid
from threadline.shapes import AssistantSortBy, IfExists, SortOrder
from threadline.storage.base import Storage
from threadline.storage.records import AssistantRecord
from threadline.storage.sql import now_iso

# LangGraph's server derives each system assistant's id from its graph id this way, so ids that
# clients stored against it stay valid here.
SYSTEM_NAMESPACE = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")


@functools.lru_cache(maxsize=1024)
def system_assistant_id(graph_id: str) -> str:
    return str(uuid.uuid5(SYSTEM_NAMESPACE, graph_id))



class Assistants:
    """Assistant operations over storage and the graph registry, each authorized by `access` (the project's
    `@auth.on.assistants…` handlers, whose filters apply to the assistant's metadata)."""

    def __init__(self, storage: Storage, graphs: GraphRegistry, access: Access | None = None) -> None:
        self.storage = storage
        self.graphs = graphs
        self.access = access or Access()

    async def ensure_system_assistants(self) -> list[AssistantRecord]:
        """One assistant per configured graph, with the reference server's deterministic id; one that is stored
        already stays as it is. All in one transaction (once, at every start: it was one for each graph)."""
        # Stamped a microsecond apart, in the graphs' order: sorted by `created_at` they are listed as configured
        # (one at a time, each took a round trip to make).
        start = datetime.now(UTC)
        return await self.storage.ensure_assistants([
            self._new_row(system_assistant_id(graph_id), graph_id, name=graph_id, metadata={"created_by": "system"},
                          now=(start + timedelta(microseconds=i)).isoformat(timespec="microseconds"))
            for i, graph_id in enumerate(self.graphs.ids())])

    def _new_row(self, assistant_id: str, graph_id: str, *, name: str | None = None, description: str | None = None,
                 config: dict[str, Any] | None = None, context: dict[str, Any] | None = None,
                 metadata: dict[str, Any] | None = None, now: str | None = None) -> AssistantRecord:
        now = now or now_iso()
        return {
            "assistant_id": assistant_id, "graph_id": graph_id, "name": name or "Untitled",
            "description": description, "config": config or {}, "context": context or {},
            "metadata": metadata or {}, "version": 1, "created_at": now, "updated_at": now,
        }

    async def create(self, *, graph_id: str, assistant_id: str | None = None, config: dict[str, Any] | None = None,
                     context: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None,
                     name: str | None = None, description: str | None = None,
                     if_exists: IfExists = "raise") -> AssistantRecord:
        self.graphs.entry(graph_id)  # 404 for an unknown graph
        value: dict[str, Any] = {"assistant_id": assistant_id, "graph_id": graph_id, "config": config,
                                 "context": context, "metadata": dict(metadata or {}), "name": name,
                                 "description": description, "if_exists": if_exists}
        filters = await self.access.filters("assistants", "create", value)
        config, context = _mirror_context(value["config"], value["context"])
        row = self._new_row(value["assistant_id"] or str(uuid.uuid4()), graph_id, name=value["name"],
                            description=value["description"], config=config, context=context,
                            metadata=value["metadata"])
        created = await self.storage.create_assistant(row, if_exists=if_exists)
        if filters and await self.storage.get_assistant(created["assistant_id"], filters=filters) is None:
            # `do_nothing` found someone else's assistant: never hand it back.
            raise Conflict(f"Assistant {created['assistant_id']} already exists")
        return created

    async def _find(self, assistant_id: str, filters: dict[str, Any] | None = None) -> AssistantRecord | None:
        found = await self.storage.get_assistant(assistant_id, filters=filters) if is_uuid(assistant_id) else None
        if found is None and assistant_id in self.graphs.entries:
            found = await self.storage.get_assistant(system_assistant_id(assistant_id), filters=filters)
        return found

    async def get(self, assistant_id: str, *, action: str = "read", value: dict[str,
                  Any] | None = None) -> AssistantRecord:
        """By id, or by graph id (which names the graph's system assistant), as LangGraph allows; one the
        caller may not `action` (`@auth.on.assistants.<action>`'s filter) is not found."""
        filters = await self.access.filters("assistants", action, value or {"assistant_id": assistant_id})
        found = await self._find(assistant_id, filters)
        if found is None:
            raise NotFound(f"Assistant {assistant_id} not found")
        return found

    async def resolve(self, assistant_id: str) -> AssistantRecord:
        """An assistant named in a request: a UUID, or a graph id naming its system assistant (unchecked: see
        `runnable`)."""
        if not is_uuid(assistant_id) and assistant_id not in self.graphs.entries:
            raise InvalidInput(
                f"Invalid assistant: '{assistant_id}'. Must be either a valid assistant UUID or one of the "
                f"registered graphs: {', '.join(self.graphs.ids())}", choices=self.graphs.ids())
        found = await self._find(assistant_id)
        if found is None:
            raise NotFound(f"Assistant {assistant_id} not found")
        return found

    async def runnable(self, assistant_id: str) -> AssistantRecord:
        """The assistant a run or cron names (`resolve`), if the caller may use it: a graph's system assistant
        is everyone's, an assistant someone created needs `assistants.read` of it, as on LangGraph's server."""
        found = await self.resolve(assistant_id)
        if self.access.enabled and (found.get("metadata") or {}).get("created_by") != "system":
            await self.get(found["assistant_id"])
        return found

    async def _search_filters(self, graph_id: str | None, name: str | None, metadata: dict[str, Any] | None,
                              limit: int = 0, offset: int = 0) -> dict[str, Any] | None:
        if graph_id is not None:
            self.graphs.entry(graph_id)  # 404 for a graph the server does not have, as LangGraph's server answers
        return await self.access.filters("assistants", "search", {
            "graph_id": graph_id, "name": name, "metadata": metadata, "limit": limit, "offset": offset})

    async def search(self, *, graph_id: str | None = None, name: str | None = None,
                     metadata: dict[str, Any] | None = None, limit: int = 10, offset: int = 0,
                     sort_by: AssistantSortBy = "created_at", sort_order: SortOrder = "desc") -> list[AssistantRecord]:
        filters = await self._search_filters(graph_id, name, metadata, limit, offset)
        return await self.storage.search_assistants(graph_id=graph_id, name=name, metadata=metadata, limit=limit,
                                                    offset=offset, sort_by=sort_by, sort_order=sort_order,
                                                    filters=filters)

    async def count(self, *, graph_id: str | None = None, name: str | None = None,
                    metadata: dict[str, Any] | None = None) -> int:
        filters = await self._search_filters(graph_id, name, metadata)
        return await self.storage.count_assistants(graph_id=graph_id, name=name, metadata=metadata, filters=filters)

    async def patch(self, assistant_id: str, *, graph_id: str | None = None, config: dict[str, Any] | None = None,
                    context: dict[str, Any] | None = None, metadata: dict[str, Any] | None = None,
                    name: str | None = None, description: str | None = None) -> AssistantRecord:
        value: dict[str, Any] = {"assistant_id": assistant_id, "graph_id": graph_id, "config": config,
                                 "context": context, "metadata": metadata, "name": name, "description": description}
        current = await self.get(assistant_id, action="update", value=value)
        metadata = value["metadata"]  # as the handler left it (it may stamp its own keys)
        changes: dict[str, Any] = {}
        if graph_id is not None:
            self.graphs.entry(graph_id)
            changes["graph_id"] = graph_id
        if config is not None or context is not None:
            config, context = _mirror_context(config, context)
            changes["config"] = config
            changes["context"] = context
        if metadata is not None:
            changes["metadata"] = {**current["metadata"], **metadata}
        if name is not None:
            changes["name"] = name
        if description is not None:
            changes["description"] = description
        return await self.storage.update_assistant(current["assistant_id"], changes)

    async def delete(self, assistant_id: str) -> None:
        current = await self.get(assistant_id, action="delete")
        await self.storage.delete_assistant(current["assistant_id"])

    async def versions(self, assistant_id: str, *, metadata: dict[str, Any] | None = None, limit: int = 10,
                       offset: int = 0) -> list[AssistantRecord]:
        current = await self.get(assistant_id)
        return await self.storage.list_assistant_versions(current["assistant_id"], metadata=metadata,
                                                          limit=limit, offset=offset)

    async def set_latest(self, assistant_id: str, version: int) -> AssistantRecord:
        current = await self.get(assistant_id, action="update", value={"assistant_id": assistant_id,
                                                                       "version": version})
        found = await self.storage.set_assistant_version(current["assistant_id"], version)
        if found is None:
            raise NotFound(f"Version {version} not found for assistant {assistant_id}")
        return found

    @contextlib.asynccontextmanager
    async def _graph(self, assistant_id: str | AssistantRecord) -> AsyncIterator[tuple[AssistantRecord, CompiledGraph]]:
        """The assistant (by id, which the caller must be allowed to read, or as a row already authorized) and
        its graph (a factory gets the assistant's config, as it would in a run)."""
        assistant = await self.get(assistant_id) if isinstance(assistant_id, str) else assistant_id
        async with self.graphs.graph(assistant["graph_id"], factory_config(assistant),
                                     store=self.storage.store) as graph:
            yield assistant, graph

    async def schemas(self, assistant_id: str | AssistantRecord) -> dict[str, Any]:
        async with self._graph(assistant_id) as (assistant, graph):
            return describe_schemas(graph, assistant["graph_id"])

    async def drawing(self, assistant_id: str, xray: int | bool = False) -> dict[str, Any]:
        async with self._graph(assistant_id) as (_, graph):
            return draw(graph, xray)

    async def subgraphs(self, assistant_id: str, namespace: str | None = None, recurse: bool = False) -> dict[str, Any]:
        async with self._graph(assistant_id) as (_, graph):
            return subgraph_schemas(graph, namespace, recurse)


def factory_config(assistant: AssistantRecord, thread_id: str | None = None) -> dict[str, Any]:
    """The config a graph factory gets outside a run: the assistant's (its context as `configurable`), with
    the thread's id when the graph is used for a thread's state."""
    configurable = {**(assistant.get("context") or {}), **({"thread_id": thread_id} if thread_id else {})}
    return {**(assistant.get("config") or {}), "configurable": configurable}


def _mirror_context(config: dict[str, Any] | None,
                    context: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """LangGraph keeps `context` and `config.configurable` as mirrors of each other; giving both is an error."""
    config = dict(config or {})
    configurable = config.get("configurable")
    if configurable and context:
        raise BadRequest("Cannot specify both configurable and context. Prefer setting context alone.")
    if context:
        config["configurable"] = dict(context)
        return config, dict(context)
    if configurable:
        return config, dict(configurable)
    return config, {}
