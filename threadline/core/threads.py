"""Threads: containers of state across runs, with their checkpoint history."""

from __future__ import annotations

import uuid
from typing import Any, Literal

from threadline.core.graphs import GraphRegistry
from threadline.core.state import bind, empty_state, pending_interrupts, snapshot_json, thread_config
from threadline.errors import BadRequest, NotFound
from threadline.storage.base import Row, Storage
from threadline.storage.sql import now_iso


class Threads:
    """Thread operations; state reads and writes go through the thread's graph and LangGraph's checkpointer."""

    def __init__(self, storage: Storage, graphs: GraphRegistry) -> None:
        self.storage = storage
        self.graphs = graphs

    async def create(self, *, thread_id: str | None = None, metadata: dict | None = None,
                     if_exists: Literal["raise", "do_nothing"] = "raise",
                     supersteps: list[dict[str, Any]] | None = None, graph_id: str | None = None) -> Row:
        now = now_iso()
        meta = dict(metadata or {})
        if graph_id:
            meta.setdefault("graph_id", graph_id)
        row = {"thread_id": thread_id or str(uuid.uuid4()), "status": "idle", "metadata": meta, "config": {},
               "values": None, "interrupts": {}, "created_at": now, "updated_at": now}
        thread = await self.storage.create_thread(row, if_exists=if_exists)
        if supersteps:
            thread = await self._apply_supersteps(thread, supersteps)
        return thread

    async def _apply_supersteps(self, thread: Row, supersteps: list[dict[str, Any]]) -> Row:
        graph_id = thread["metadata"].get("graph_id")
        if not graph_id:
            raise BadRequest("supersteps need a graph: give metadata.graph_id when creating the thread")
        async with self.graphs.graph(graph_id) as graph:
            bound = bind(graph, self.storage.checkpointer, self.storage.store)
            config = thread_config(thread["thread_id"])
            for step in supersteps:
                updates = [(u.get("values"), u.get("as_node")) for u in step.get("updates", [])]
                config = await bound.abulk_update_state(config, [[
                    _state_update(values, as_node) for values, as_node in updates
                ]])
        return await self.refresh(thread["thread_id"])

    async def get(self, thread_id: str) -> Row:
        found = await self.storage.get_thread(thread_id)
        if found is None:
            raise NotFound(f"Thread {thread_id} not found")
        return found

    async def patch(self, thread_id: str, *, metadata: dict | None = None) -> Row:
        await self.get(thread_id)
        found = await self.storage.update_thread(thread_id, {}, merge_metadata=metadata or {})
        assert found is not None
        return found

    async def delete(self, thread_id: str) -> None:
        if not await self.storage.delete_thread(thread_id):
            raise NotFound(f"Thread {thread_id} not found")

    async def search(self, **filters: Any) -> list[Row]:
        return await self.storage.search_threads(**filters)

    async def count(self, **filters: Any) -> int:
        return await self.storage.count_threads(**filters)

    async def copy(self, thread_id: str) -> Row:
        source = await self.get(thread_id)
        new = await self.create(metadata=source["metadata"])
        await self.storage.copy_checkpoints(thread_id, new["thread_id"])
        return await self.refresh(new["thread_id"])

    async def prune(self, thread_ids: list[str], strategy: Literal["delete", "keep_latest"]) -> int:
        pruned = 0
        for thread_id in thread_ids:
            if await self.storage.get_thread(thread_id) is None:
                continue
            await self.storage.prune_checkpoints(thread_id, strategy)
            await self.refresh(thread_id)
            pruned += 1
        return pruned

    # --- state -------------------------------------------------------------------
    async def _graph_id(self, thread: Row) -> str | None:
        graph_id = thread["metadata"].get("graph_id")
        return graph_id if graph_id in self.graphs.entries else None

    async def get_state(self, thread_id: str, *, checkpoint: dict[str, Any] | None = None,
                        subgraphs: bool = False) -> dict[str, Any]:
        thread = await self.get(thread_id)
        graph_id = await self._graph_id(thread)
        if graph_id is None:
            return empty_state()
        async with self.graphs.graph(graph_id, thread_config(thread_id)) as graph:
            bound = bind(graph, self.storage.checkpointer, self.storage.store)
            snap = await bound.aget_state(thread_config(thread_id, checkpoint), subgraphs=subgraphs)
        if checkpoint and checkpoint.get("checkpoint_id") and not snap.config:
            raise NotFound(f"Checkpoint {checkpoint['checkpoint_id']} not found in thread {thread_id}")
        return snapshot_json(snap)

    async def update_state(self, thread_id: str, *, values: Any, as_node: str | None = None,
                           checkpoint: dict[str, Any] | None = None) -> dict[str, Any]:
        thread = await self.get(thread_id)
        graph_id = await self._graph_id(thread)
        if graph_id is None:
            raise BadRequest(f"Thread {thread_id} has no graph yet: run it once, or create it with "
                             "metadata.graph_id, before updating its state")
        async with self.graphs.graph(graph_id, thread_config(thread_id)) as graph:
            bound = bind(graph, self.storage.checkpointer, self.storage.store)
            try:
                config = await bound.aupdate_state(thread_config(thread_id, checkpoint), values, as_node=as_node)
            except Exception as exc:  # LangGraph raises InvalidUpdateError/ValueError for bad updates
                raise BadRequest(f"{type(exc).__name__}: {exc}") from exc
        await self.refresh(thread_id)
        from threadline.core.state import checkpoint_ref

        return {"checkpoint": checkpoint_ref(config)}

    async def history(self, thread_id: str, *, limit: int = 10, before: dict[str, Any] | str | None = None,
                      metadata: dict | None = None, checkpoint: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        thread = await self.get(thread_id)
        graph_id = await self._graph_id(thread)
        if graph_id is None:
            return []
        if isinstance(before, str):
            before = {"checkpoint_id": before}
        elif isinstance(before, dict) and isinstance(before.get("configurable"), dict):
            before = before["configurable"]  # a RunnableConfig, as LangGraph's own history returns
        out = []
        async with self.graphs.graph(graph_id, thread_config(thread_id)) as graph:
            bound = bind(graph, self.storage.checkpointer, self.storage.store)
            async for snap in bound.aget_state_history(
                thread_config(thread_id, checkpoint), limit=limit, filter=metadata or None,
                before=thread_config(thread_id, before) if before else None,
            ):
                out.append(snapshot_json(snap))
        return out

    async def refresh(self, thread_id: str, status: str | None = None) -> Row:
        """Re-read the latest state into the thread row (`values`, `interrupts`, and status when idle)."""
        thread = await self.get(thread_id)
        state = await self.get_state(thread_id)
        interrupts = pending_interrupts(state)
        changes: dict[str, Any] = {"values": state["values"] if state["checkpoint"] else None,
                                   "interrupts": interrupts}
        if thread["status"] != "busy":
            changes["status"] = status or ("interrupted" if interrupts else "idle")
        found = await self.storage.update_thread(thread_id, changes)
        assert found is not None
        return found


def _state_update(values: Any, as_node: str | None) -> Any:
    from langgraph.types import StateUpdate

    return StateUpdate(values, as_node)
