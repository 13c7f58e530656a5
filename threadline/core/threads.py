"""Threads: containers of state across runs, with their checkpoint history."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.types import StateUpdate

from threadline.config import CheckpointerTTL
from threadline.core.access import Access
from threadline.core.assistants import factory_config, system_assistant_id
from threadline.core.graphs import AccessContext, CompiledGraph, GraphRegistry
from threadline.core.history import fast_history
from threadline.core.remembered import Remembering
from threadline.core.state import bind, checkpoint_ref, empty_state, snapshot_json, thread_config, thread_fields
from threadline.errors import BadRequest, Conflict, NotFound
from threadline.ids import is_uuid
from threadline.shapes import IfExists
from threadline.storage.base import JsonRead, Storage
from threadline.storage.records import AssistantRecord, ThreadRecord
from threadline.storage.sql import now_iso, thread_ttl_columns

log = logging.getLogger("threadline.threads")


class Threads:
    """Thread operations; state reads and writes go through the thread's graph and LangGraph's checkpointer.

    Each is authorized by `access` (the project's `@auth.on.threads…` handlers): a thread whose metadata the
    caller's filter excludes is not found, whatever the operation."""

    def __init__(self, storage: Storage, graphs: GraphRegistry, ttl: CheckpointerTTL | None = None,
                 access: Access | None = None) -> None:
        self.storage = storage
        self.graphs = graphs
        self.ttl = ttl
        self.access = access or Access()

    @property
    def default_ttl(self) -> float | None:
        """Minutes a new thread lives after its last update (`checkpointer.ttl.default_ttl`), None: forever."""
        return self.ttl.default_ttl if self.ttl else None

    async def create(self, *, thread_id: str | None = None, metadata: dict[str, Any] | None = None,
                     if_exists: IfExists = "raise",
                     supersteps: list[dict[str, Any]] | None = None, graph_id: str | None = None,
                     ttl: float | None = None) -> ThreadRecord:
        """A new thread; `supersteps` (state updates applied in order) seed its state through its graph.

        It expires `ttl` minutes (else the configured default) after its last update.
        """
        now = now_iso()
        value: dict[str, Any] = {"thread_id": thread_id, "metadata": dict(metadata or {}), "if_exists": if_exists,
                                 "ttl": ttl}
        filters = await self.access.filters("threads", "create", value)
        meta = dict(value["metadata"] or {})
        if graph_id:
            meta.setdefault("graph_id", graph_id)
        if supersteps and meta.get("graph_id") not in self.graphs.entries:
            raise BadRequest("supersteps need the thread's graph: give graph_id (or metadata.graph_id) naming "
                             f"one of {', '.join(self.graphs.ids())}")
        row = {"thread_id": thread_id or str(uuid.uuid4()), "status": "idle", "metadata": meta, "config": {},
               "values": None, "interrupts": {}, "created_at": now, "updated_at": now,
               **thread_ttl_columns(ttl if ttl is not None else self.default_ttl)}
        thread = await self.storage.create_thread(row, if_exists=if_exists)
        if filters and await self.storage.get_thread(thread["thread_id"], filters=filters, values=False) is None:
            # `do_nothing` found someone else's thread: never hand it back.
            raise Conflict(f"Thread {thread['thread_id']} already exists")
        if supersteps and thread["created_at"] == now:  # not an existing thread kept by if_exists=do_nothing
            async with self._graph(thread, "threads.update") as graph:
                assert graph is not None
                try:
                    await graph.abulk_update_state(thread_config(thread["thread_id"]), [
                        [StateUpdate(u.get("values"), u.get("as_node")) for u in step["updates"]]
                        for step in supersteps
                    ])
                except Exception as exc:  # LangGraph's InvalidUpdateError/ValueError for a bad update
                    await self.storage.delete_thread(thread["thread_id"])
                    raise BadRequest(f"supersteps: {type(exc).__name__}: {exc}") from exc
            # A TTL shorter than the request may have swept it already: then it is returned as it was created.
            with contextlib.suppress(NotFound):
                await self.refresh(thread)
                thread = await self._reread(thread["thread_id"])
        return thread

    async def get(self, thread_id: str, *, action: str = "read", value: dict[str, Any] | None = None,
                  values: JsonRead = True) -> ThreadRecord:
        """The thread, if the caller may `action` it (`@auth.on.threads.<action>`, given `value`, by default
        the thread's id); otherwise, as when there is no such thread, `NotFound`. Without `values`, the row
        has no `values` (see `Storage.get_thread`): for a caller that does not answer with them; with
        `values="text"`, they are the stored JSON text, for a caller that writes them out as they are."""
        filters = await self.access.filters("threads", action, value or {"thread_id": thread_id})
        found = await self.storage.get_thread(thread_id, filters=filters, values=values)
        if found is None:
            raise NotFound(f"Thread with ID {thread_id} not found")
        return found

    async def visible(self, thread_id: str, *, action: str = "read") -> bool:
        """Whether the thread exists and the caller may `action` it."""
        try:
            await self.get(thread_id, action=action, values=False)
        except NotFound:
            return False
        return True

    async def patch(self, thread_id: str, *, metadata: dict[str, Any] | None = None,
                    ttl: float | None = None) -> ThreadRecord:
        """Merge `metadata`; a `ttl` (minutes) replaces the thread's. Either way its TTL counts from now."""
        value: dict[str, Any] = {"thread_id": thread_id, "metadata": metadata}
        # Whether the caller may update it: the row without its values (the answer, read after the write, has them).
        await self.get(thread_id, action="update", value=value, values=False)
        found = await self.storage.update_thread(thread_id, thread_ttl_columns(ttl),
                                                 merge_metadata=value["metadata"] or {})
        assert found is not None
        return found

    async def sweep_expired(self, now: str | None = None) -> list[str]:
        """Delete threads whose TTL ran out (with their checkpoints and runs), a batch of `sweep_limit`.

        Threads with an active run are kept. `now` (ISO-8601) defaults to the database's clock.
        """
        limit = (self.ttl or CheckpointerTTL()).sweep_limit
        return await self.storage.delete_expired_threads(limit=limit, now=now)

    async def search(self, *, with_values: JsonRead = True, **query: Any) -> list[ThreadRecord]:
        """Matching threads; `with_values` as `get`'s `values` (a large state's values are the bulk of a row)."""
        filters = await self.access.filters("threads", "search", dict(query))
        return await self.storage.search_threads(**query, filters=filters, with_values=with_values)

    async def count(self, **query: Any) -> int:
        filters = await self.access.filters("threads", "search", dict(query))
        return await self.storage.count_threads(**query, filters=filters)

    async def copy(self, thread_id: str) -> ThreadRecord:
        """A new thread with the source's metadata and checkpoints: reading the source is `threads.read`, the
        copy is the caller's `threads.create` (whose handler may stamp it)."""
        source = await self.get(thread_id, values=False)
        new = await self.create(metadata=source["metadata"])
        await self.storage.copy_checkpoints(thread_id, new["thread_id"])
        await self.refresh(new)
        return await self._reread(new["thread_id"])

    async def prune_checkpoints(self, thread_ids: list[str]) -> int:
        """`keep_latest` (ours): each thread keeps only its latest checkpoint. Unknown threads are skipped;
        returns how many were pruned. (`delete`, which deletes the threads, is `Runs.delete_threads`.)"""
        pruned = 0
        for thread_id in thread_ids:
            try:
                thread = await self.get(thread_id, action="update", values=False)
            except NotFound:
                continue
            await self.storage.prune_checkpoints(thread_id, "keep_latest")
            with contextlib.suppress(NotFound):  # deleted meanwhile: pruned all the same
                await self.refresh(thread)
            pruned += 1
        return pruned

    # --- state -------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _graph(self, thread: ThreadRecord,
                     access: AccessContext = "threads.read") -> AsyncIterator[CompiledGraph | None]:
        """The thread's graph (from `metadata.graph_id`) bound to our checkpointer and store; None if it has none.

        A factory is called with the config of the assistant that last ran on the thread (its
        `metadata.assistant_id`), else of the graph's system assistant, so that it builds the graph the runs used.
        """
        graph_id = thread["metadata"].get("graph_id")
        if graph_id not in self.graphs.entries:
            yield None
            return
        config: Mapping[str, Any] = thread_config(thread["thread_id"])
        if self.graphs.entry(graph_id).is_factory:
            assistant = await self._assistant_of(thread, graph_id)
            if assistant is not None:
                config = factory_config(assistant, thread["thread_id"])
        async with self.graphs.graph(graph_id, config, access=access, store=self.storage.store) as graph:
            yield bind(graph, self.storage.checkpointer, self.storage.store)

    async def _assistant_of(self, thread: ThreadRecord, graph_id: str) -> AssistantRecord | None:
        named = thread["metadata"].get("assistant_id")
        found = await self.storage.get_assistant(named) if isinstance(named, str) and is_uuid(named) else None
        if found is None or found["graph_id"] != graph_id:
            found = await self.storage.get_assistant(system_assistant_id(graph_id))
        return found

    async def get_state(self, thread_id: str, *, checkpoint: dict[str, Any] | None = None,
                        subgraphs: bool = False) -> dict[str, Any]:
        """The latest state, or the state at `checkpoint` (an unknown checkpoint reads as empty, as on LangGraph)."""
        return await self._state(await self.get(thread_id, values=False), checkpoint=checkpoint,
                                 subgraphs=subgraphs)

    async def _state(self, thread: ThreadRecord, *, checkpoint: dict[str, Any] | None = None,
                     subgraphs: bool = False) -> dict[str, Any]:
        async with self._graph(thread) as graph:
            if graph is None:
                return empty_state()
            snap = await graph.aget_state(thread_config(thread["thread_id"], checkpoint), subgraphs=subgraphs)
        return snapshot_json(snap)

    async def update_state(self, thread_id: str, *, values: Any, as_node: str | None = None,
                           checkpoint: dict[str, Any] | None = None) -> dict[str, Any]:
        thread = await self.get(thread_id, action="update", value={"thread_id": thread_id, "values": values,
                                                                    "as_node": as_node}, values=False)
        # As LangGraph's server: a run would overwrite the update, or be overwritten by it.
        active = await self.storage.active_runs(thread_id)
        if active:
            raise Conflict(f"Thread {thread_id} has in-flight runs: {', '.join(r['run_id'] for r in active)}")
        async with self._graph(thread, "threads.update") as graph:
            if graph is None:
                raise BadRequest(f"Thread {thread_id} has no graph yet: run it once, or create it with "
                                 "metadata.graph_id, before updating its state")
            assert isinstance(graph.checkpointer, BaseCheckpointSaver)  # `bind` gave it the storage's
            graph.checkpointer = Remembering(graph.checkpointer)
            try:
                # As LangGraph's server: the update's checkpoint metadata names the graph (LangGraph copies
                # the config's metadata into it), as a run's does.
                update_config = thread_config(thread_id, checkpoint)
                update_config["metadata"] = {"graph_id": thread["metadata"].get("graph_id")}
                config = await graph.aupdate_state(update_config, values, as_node=as_node)
            except Exception as exc:  # LangGraph raises InvalidUpdateError/ValueError for bad updates
                raise BadRequest(f"{type(exc).__name__}: {exc}") from exc
            # The thread's fields from the checkpoint the update just wrote, without reading it back
            # (`core/remembered.py`).
            state = snapshot_json(await graph.aget_state(thread_config(thread_id)))
        await self._store(thread, state)
        # As LangGraph's server: the new checkpoint, also as `configurable` and by its id.
        ref = checkpoint_ref(config)
        return {"checkpoint": ref, "configurable": ref, "checkpoint_id": (ref or {}).get("checkpoint_id")}

    async def history(self, thread_id: str, *, limit: int = 10, before: dict[str, Any] | str | None = None,
                      metadata: dict[str, Any] | None = None,
                      checkpoint: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        start: dict[str, Any] | None
        if isinstance(before, str):
            start = {"checkpoint_id": before}
        elif isinstance(before, dict) and isinstance(before.get("configurable"), dict):
            start = before["configurable"]  # a RunnableConfig, as LangGraph's own history returns
        else:
            start = before
        async with self._graph(await self.get(thread_id, values=False)) as graph:
            if graph is None:
                return []
            return [snapshot_json(snap) async for snap in fast_history(graph).aget_state_history(
                thread_config(thread_id, checkpoint), limit=limit, filter=metadata or None,
                before=thread_config(thread_id, start) if start else None,
            )]

    async def current_fields(self, thread_id: str) -> dict[str, Any]:
        """`thread_fields` of the thread's latest state (idle and empty for a thread that is gone).

        Nothing (the cached fields stay) when the state cannot be read: a run's end is still recorded when the
        thread's graph factory fails for the config of the assistant that queued the latest run."""
        thread = await self.storage.get_thread(thread_id, values=False)
        if thread is None:
            return {"status": "idle"}
        try:
            return thread_fields(await self._state(thread))
        except Exception:
            log.warning("could not read the state of thread %s", thread_id, exc_info=True)
            return {}

    async def refresh(self, thread: ThreadRecord) -> None:
        """Write the latest state's values, interrupts and status into the thread's row (its status unless a
        run holds it busy), after a change to its checkpoints. `thread` is the row the caller read, for its
        graph; it is not read again, and nothing is read back. (The server's own bookkeeping after a change
        the caller was authorized for: not checked again.) `NotFound` when the thread is gone (the TTL
        sweeper, a concurrent DELETE)."""
        await self._store(thread, await self._state(thread))

    async def _store(self, thread: ThreadRecord, state: dict[str, Any]) -> None:
        """The thread's row from `state`."""
        if not await self.storage.store_thread_state(thread["thread_id"], thread_fields(state)):
            raise NotFound(f"Thread with ID {thread['thread_id']} not found")

    async def _reread(self, thread_id: str) -> ThreadRecord:
        found = await self.storage.get_thread(thread_id)
        if found is None:
            raise NotFound(f"Thread with ID {thread_id} not found")
        return found
