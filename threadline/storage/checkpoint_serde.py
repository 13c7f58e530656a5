"""The serializer LangGraph's checkpointer writes and reads checkpoints with, as langgraph.json's
`checkpointer.serde` sets it (LangGraph's server hands the same three settings to the same serializer)."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer


def checkpoint_serializer(options: dict[str, Any]) -> JsonPlusSerializer:
    """`options`: the `checkpointer.serde` keys given (`allowed_json_modules`, `allowed_msgpack_modules`,
    `pickle_fallback`); a key not given keeps LangGraph's own default for it."""
    given = dict(options)
    for key in ("allowed_json_modules", "allowed_msgpack_modules"):
        if isinstance(given.get(key), (list, tuple)):
            given[key] = [tuple(path) for path in given[key]]
    return JsonPlusSerializer(**given)
