"""The public shape of each stored resource, as clients see it (routes and webhooks alike)."""

from __future__ import annotations

from typing import Any

ASSISTANT_FIELDS = ("assistant_id", "graph_id", "config", "context", "created_at", "updated_at", "metadata",
                    "version", "name", "description")
THREAD_FIELDS = ("thread_id", "created_at", "updated_at", "metadata", "status", "config", "values",
                 "interrupts", "error")
RUN_FIELDS = ("run_id", "thread_id", "assistant_id", "created_at", "updated_at", "status", "metadata", "kwargs",
              "multitask_strategy")


def assistant_out(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in ASSISTANT_FIELDS}


def version_out(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: row.get(k) for k in ASSISTANT_FIELDS if k != "updated_at"}
    return out


def thread_out(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in THREAD_FIELDS}


def run_out(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in RUN_FIELDS}
