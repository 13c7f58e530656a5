"""Crons, as LangGraph's server serves them: `/threads/{id}/runs/crons` and `/runs/crons…`."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from fastapi import Request
from starlette.responses import Response

from threadline.api.common import JSON, Router, no_content, paginated, runtime, select
from threadline.api.models import CronCount, CronCreate, CronPatch, CronSearch
from threadline.api.ratelimit import identity_of
from threadline.core.crons import Crons

router = Router(tags=["Crons"])

#: A cron's fields in the order LangGraph's server sends them.
FIELDS = ("cron_id", "assistant_id", "thread_id", "user_id", "end_time", "schedule", "timezone", "payload",
          "next_run_date", "metadata", "on_run_completed", "enabled", "created_at", "updated_at")


def _crons(request: Request) -> Crons:
    crons = runtime(request).crons
    assert crons is not None
    return crons


def _moment(value: str | None) -> str | None:
    """A stored timestamp as LangGraph's server writes it (`…T20:10:00+00:00`: no zero microseconds)."""
    return datetime.fromisoformat(value).isoformat() if value else None


def cron_out(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: row.get(k) for k in FIELDS}
    out["end_time"] = _moment(row.get("end_time"))
    out["next_run_date"] = _moment(row.get("next_run_date"))
    out["user_id"] = row.get("user_id") or ""  # as LangGraph's server without authentication
    return out


@router.post("/threads/{thread_id}/runs/crons")
async def create_thread_cron(request: Request, thread_id: UUID, body: CronCreate) -> JSON:
    return JSON(cron_out(await _crons(request).create(str(thread_id), body.model_dump(mode="json", exclude_none=True),
                                                      identity=identity_of(request))))


@router.post("/runs/crons")
async def create_cron(request: Request, body: CronCreate) -> JSON:
    return JSON(cron_out(await _crons(request).create(None, body.model_dump(mode="json", exclude_none=True),
                                                      identity=identity_of(request))))


@router.post("/runs/crons/search")
async def search_crons(request: Request, body: CronSearch) -> JSON:
    rows = await _crons(request).search(
        assistant_id=str(body.assistant_id) if body.assistant_id else None,
        thread_id=str(body.thread_id) if body.thread_id else None, enabled=body.enabled, metadata=body.metadata,
        limit=body.limit + 1, offset=body.offset, sort_by=body.sort_by, sort_order=body.sort_order)
    page, headers = paginated(rows, body.limit, body.offset)
    return JSON([select(cron_out(r), list(body.select or ())) for r in page], headers=headers)


@router.post("/runs/crons/count")
async def count_crons(request: Request, body: CronCount) -> JSON:
    return JSON(await _crons(request).count(
        assistant_id=str(body.assistant_id) if body.assistant_id else None,
        thread_id=str(body.thread_id) if body.thread_id else None, enabled=body.enabled, metadata=body.metadata))


@router.get("/runs/crons/{cron_id}")
async def get_cron(request: Request, cron_id: UUID) -> JSON:
    return JSON(cron_out(await _crons(request).get(str(cron_id))))


@router.patch("/runs/crons/{cron_id}")
async def update_cron(request: Request, cron_id: UUID, body: CronPatch) -> JSON:
    return JSON(cron_out(await _crons(request).update(str(cron_id), body.changes())))


@router.delete("/runs/crons/{cron_id}", status_code=204)
async def delete_cron(request: Request, cron_id: UUID) -> Response:
    await _crons(request).delete(str(cron_id))
    return no_content()
