"""The Agent Protocol's `/agents` paths, answered from the same assistants."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import Request

from threadline.api.common import JSON, Router, runtime
from threadline.api.models import AgentSearch

router = Router(prefix="/agents", tags=["Agents"])


def agent_out(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "agent_id": row["assistant_id"],
        "name": row["name"],
        "description": row.get("description"),
        "metadata": row.get("metadata") or {},
        "capabilities": {"ap.io.messages": False, "ap.io.streaming": True},
    }


@router.post("/search")
async def search_agents(request: Request, body: AgentSearch) -> JSON:
    rows = await runtime(request).assistants.search(name=body.name, metadata=body.metadata, limit=body.limit,
                                                    offset=body.offset)
    return JSON([agent_out(r) for r in rows])


@router.get("/{agent_id}")
async def get_agent(request: Request, agent_id: str) -> JSON:
    return JSON(agent_out(await runtime(request).assistants.get(agent_id)))


@router.get("/{agent_id}/schemas")
async def get_agent_schemas(request: Request, agent_id: str) -> JSON:
    schemas = await runtime(request).assistants.schemas(agent_id)
    return JSON({
        "agent_id": (await runtime(request).assistants.get(agent_id))["assistant_id"],
        "input_schema": schemas["input_schema"] or {},
        "output_schema": schemas["output_schema"] or {},
        "state_schema": schemas["state_schema"],
        "config_schema": schemas["config_schema"],
    })
