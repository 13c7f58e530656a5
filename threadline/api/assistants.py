"""LangGraph's `/assistants` paths."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from threadline.api.common import JSON, Router, no_content, paginated, runtime, select
from threadline.api.models import (
    AssistantCount,
    AssistantCreate,
    AssistantPatch,
    AssistantSearch,
    AssistantVersions,
    SetLatest,
)
from threadline.shapes import assistant_out, version_out

router = Router(prefix="/assistants", tags=["Assistants"])


@router.post("")
async def create_assistant(request: Request, body: AssistantCreate) -> JSON:
    row = await runtime(request).assistants.create(**body.model_dump())
    return JSON(assistant_out(row))


@router.post("/search")
async def search_assistants(request: Request, body: AssistantSearch) -> JSON:
    rows = await runtime(request).assistants.search(
        graph_id=body.graph_id, name=body.name, metadata=body.metadata, limit=body.limit + 1, offset=body.offset,
        sort_by=body.sort_by or "created_at", sort_order=body.sort_order or "desc",
    )
    page, headers = paginated(rows, body.limit, body.offset)
    return JSON([select(assistant_out(r), body.select) for r in page], headers=headers)


@router.post("/count")
async def count_assistants(request: Request, body: AssistantCount) -> JSON:
    return JSON(await runtime(request).assistants.count(**body.model_dump()))


@router.get("/{assistant_id}")
async def get_assistant(request: Request, assistant_id: str) -> JSON:
    return JSON(assistant_out(await runtime(request).assistants.get(assistant_id)))


@router.patch("/{assistant_id}")
async def patch_assistant(request: Request, assistant_id: str, body: AssistantPatch) -> JSON:
    row = await runtime(request).assistants.patch(assistant_id, **body.model_dump())
    return JSON(assistant_out(row))


@router.delete("/{assistant_id}", status_code=204)
async def delete_assistant(request: Request, assistant_id: str,
                           delete_threads: bool = False) -> Response:
    """Its pending and running runs are cancelled; with `delete_threads`, the threads it ran on last go too."""
    await runtime(request).runs.delete_assistant(assistant_id, delete_threads=delete_threads)
    return no_content()


@router.post("/{assistant_id}/versions")
async def list_versions(request: Request, assistant_id: str, body: AssistantVersions) -> JSON:
    rows = await runtime(request).assistants.versions(assistant_id, **body.model_dump())
    return JSON([version_out(r) for r in rows])


@router.post("/{assistant_id}/latest")
async def set_latest(request: Request, assistant_id: str, body: SetLatest) -> JSON:
    return JSON(assistant_out(await runtime(request).assistants.set_latest(assistant_id, body.version)))


@router.get("/{assistant_id}/schemas")
async def get_schemas(request: Request, assistant_id: str) -> JSON:
    return JSON(await runtime(request).assistants.schemas(assistant_id))


@router.get("/{assistant_id}/graph")
async def get_graph(request: Request, assistant_id: str, xray: str = "false") -> JSON:
    level: int | bool = int(xray) if xray.isdigit() else xray.lower() in ("true", "1")
    return JSON(await runtime(request).assistants.drawing(assistant_id, level))


@router.get("/{assistant_id}/subgraphs")
@router.get("/{assistant_id}/subgraphs/{namespace}")
async def get_subgraphs(request: Request, assistant_id: str, namespace: str | None = None,
                        recurse: bool = False) -> JSON:
    return JSON(await runtime(request).assistants.subgraphs(assistant_id, namespace, recurse))
