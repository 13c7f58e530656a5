"""Threads and their state: LangGraph's paths and the Agent Protocol's (which differ only in history)."""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from fastapi import Header, Query, Request
from starlette.responses import Response

from threadline.api.common import JSON, Router, no_content, paginated, runtime, select
from threadline.api.models import (
    HistoryQuery,
    StateAtCheckpoint,
    StateUpdate,
    ThreadCount,
    ThreadCreate,
    ThreadPatch,
    ThreadPrune,
    ThreadSearch,
    ttl_minutes,
)
from threadline.api.sse import event_response
from threadline.core.thread_stream import follow_thread
from threadline.errors import NotFound
from threadline.shapes import thread_out

router = Router(prefix="/threads", tags=["Threads"])


@router.post("")
async def create_thread(request: Request, body: ThreadCreate) -> JSON:
    row = await runtime(request).threads.create(
        thread_id=str(body.thread_id) if body.thread_id else None, metadata=body.metadata, if_exists=body.if_exists,
        graph_id=body.graph_id,
        supersteps=[s.model_dump() for s in body.supersteps] if body.supersteps else None,
        ttl=ttl_minutes(body.ttl),
    )
    return JSON(thread_out(row))


@router.post("/search")
async def search_threads(request: Request, body: ThreadSearch) -> JSON:
    rows = await runtime(request).threads.search(
        ids=body.ids, metadata=body.metadata, values=body.values, status=body.status, limit=body.limit + 1,
        offset=body.offset, sort_by=body.sort_by or "updated_at", sort_order=body.sort_order or "desc",
        with_values="text" if not body.select or "values" in body.select else False,
    )
    page, headers = paginated(rows, body.limit, body.offset)
    return JSON([select(thread_out(r), body.select) for r in page], headers=headers)


@router.post("/count")
async def count_threads(request: Request, body: ThreadCount) -> JSON:
    return JSON(await runtime(request).threads.count(metadata=body.metadata, values=body.values,
                                                     status=body.status))


@router.post("/prune")
async def prune_threads(request: Request, body: ThreadPrune) -> JSON:
    """`delete` (the default) deletes the threads, as the SDK documents; `keep_latest` keeps each thread and
    its latest checkpoint only."""
    rt = runtime(request)
    if body.strategy == "delete":
        pruned = await rt.runs.delete_threads([str(t) for t in body.thread_ids])
    else:
        pruned = await rt.threads.prune_checkpoints([str(t) for t in body.thread_ids])
    return JSON({"pruned_count": pruned})


@router.get("/{thread_id}")
async def get_thread(request: Request, thread_id: UUID, include: str | None = None) -> JSON:
    """`include=ttl` adds the thread's TTL: `{strategy, ttl_minutes, expires_at}`, or null without one."""
    row = await runtime(request).threads.get(str(thread_id), values="text")
    out = thread_out(row)
    if "ttl" in (include or "").split(","):
        out["ttl"] = ({"strategy": row["ttl_strategy"], "ttl_minutes": row["ttl_minutes"],
                       "expires_at": row["expires_at"]} if row.get("ttl_minutes") is not None else None)
    return JSON(out)


@router.patch("/{thread_id}")
async def patch_thread(request: Request, thread_id: UUID, body: ThreadPatch) -> JSON:
    """Metadata is merged; the Agent Protocol's `values` (and `checkpoint`) write a new state revision."""
    threads = runtime(request).threads
    tid = str(thread_id)  # `update_state` and `patch` each find the thread (404) as the caller may update it
    if body.values is not None or body.messages is not None:
        values = dict(body.values or {})
        if body.messages is not None:
            values["messages"] = body.messages
        await threads.update_state(tid, values=values, checkpoint=body.checkpoint)
    row = await threads.patch(tid, metadata=body.metadata, ttl=ttl_minutes(body.ttl))
    return JSON(thread_out(row))


@router.delete("/{thread_id}", status_code=204)
async def delete_thread(request: Request, thread_id: UUID) -> Response:
    if not await runtime(request).runs.delete_threads([str(thread_id)]):
        raise NotFound(f"Thread with ID {thread_id} not found")
    return no_content()


@router.post("/{thread_id}/copy")
async def copy_thread(request: Request, thread_id: UUID) -> JSON:
    return JSON(thread_out(await runtime(request).threads.copy(str(thread_id))))


@router.get("/{thread_id}/state")
async def get_state(request: Request, thread_id: UUID, subgraphs: bool = False) -> JSON:
    return JSON(await runtime(request).threads.get_state(str(thread_id), subgraphs=subgraphs))


@router.post("/{thread_id}/state")
async def update_state(request: Request, thread_id: UUID, body: StateUpdate) -> JSON:
    checkpoint = dict(body.checkpoint or {})
    if body.checkpoint_id:
        checkpoint["checkpoint_id"] = body.checkpoint_id
    result = await runtime(request).threads.update_state(
        str(thread_id), values=body.values, as_node=body.as_node, checkpoint=checkpoint or None,
    )
    return JSON(result)


@router.get("/{thread_id}/state/{checkpoint_id}")
async def get_state_at(request: Request, thread_id: UUID, checkpoint_id: str, subgraphs: bool = False) -> JSON:
    return JSON(await runtime(request).threads.get_state(
        str(thread_id), checkpoint={"checkpoint_id": checkpoint_id}, subgraphs=subgraphs))


@router.post("/{thread_id}/state/checkpoint")
async def get_state_at_checkpoint(request: Request, thread_id: UUID, body: StateAtCheckpoint) -> JSON:
    checkpoint = body.checkpoint.model_dump(exclude_none=True)
    return JSON(await runtime(request).threads.get_state(str(thread_id), checkpoint=checkpoint,
                                                         subgraphs=body.subgraphs))


@router.get("/{thread_id}/history")
async def get_history(request: Request, thread_id: UUID, limit: int = Query(10, ge=1, le=1000),
                      before: str | None = None) -> JSON:
    return JSON(await runtime(request).threads.history(str(thread_id), limit=limit, before=before))


@router.post("/{thread_id}/history")
async def post_history(request: Request, thread_id: UUID, body: HistoryQuery) -> JSON:
    return JSON(await runtime(request).threads.history(
        str(thread_id), limit=body.limit, before=body.before, metadata=body.metadata, checkpoint=body.checkpoint,
    ))



@router.get("/{thread_id}/stream")
async def join_thread_stream(
    request: Request, thread_id: UUID,
    stream_mode: list[Literal["run_modes", "lifecycle", "state_update"]] = Query(["run_modes"]),  # noqa: B008
    last_event_id: str | None = Header(None),
) -> Response:
    """Every run of the thread in turn, until the client leaves; `Last-Event-ID` resumes across runs."""
    rt = runtime(request)
    await rt.threads.get(str(thread_id), values=False)
    return event_response(
        await follow_thread(rt.runs, str(thread_id), modes=stream_mode, last_event_id=last_event_id),
        heartbeat=rt.settings.heartbeat_seconds, draining=rt.draining,
    )
