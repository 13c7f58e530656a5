"""Reading and writing a thread's checkpointed state through LangGraph, shaped as LangGraph's server shows it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.types import StateSnapshot
from pydantic import TypeAdapter

from threadline.core.graphs import CompiledGraph, pydantic_compatible
from threadline.serde import to_jsonable


def bind(graph: CompiledGraph, checkpointer: Any, store: Any) -> CompiledGraph:
    """The graph wired to our checkpointer and store: a shallow copy with those two attributes replaced.
    `graph.copy(update=...)` would build the graph anew and validate it again, once per run."""
    bound = copy.copy(graph)
    bound.checkpointer, bound.store = checkpointer, store
    return bound


def thread_config(thread_id: str, checkpoint: Mapping[str, Any] | None = None) -> RunnableConfig:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
    for key, value in (checkpoint or {}).items():
        if value is not None and key in ("checkpoint_id", "checkpoint_ns", "checkpoint_map"):
            configurable[key] = value
    return {"configurable": configurable}


def checkpoint_ref(config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A checkpoint as LangGraph's server names it: `thread_id`, `checkpoint_ns`, and `checkpoint_id` /
    `checkpoint_map` only when the config has them (a subgraph task's checkpoint has no id yet)."""
    if not config:
        return None
    c = config.get("configurable", {})
    ref = {"thread_id": c.get("thread_id"), "checkpoint_ns": c.get("checkpoint_ns", "")}
    for key in ("checkpoint_id", "checkpoint_map"):
        if c.get(key) is not None:
            ref[key] = c[key]
    return ref


def _checkpoint_id(config: Mapping[str, Any] | None) -> str | None:
    found: str | None = (config or {}).get("configurable", {}).get("checkpoint_id")
    return found


def snapshot_json(snap: StateSnapshot, *, values: bool = True) -> dict[str, Any]:
    """A state snapshot as the API shows it; with `values=False`, its `values` None (not converted: a caller
    that needs only some of them, converted apart)."""
    tasks = []
    for t in snap.tasks:
        state = t.state
        tasks.append({
            "id": t.id,
            "name": t.name,
            "path": to_jsonable(t.path),
            "error": to_jsonable(t.error) if t.error is not None else None,
            "interrupts": [interrupt_json(i) for i in t.interrupts],
            "checkpoint": checkpoint_ref(state) if isinstance(state, dict) else None,
            "state": snapshot_json(state) if isinstance(state, StateSnapshot) else None,
            "result": to_jsonable(getattr(t, "result", None)),
        })
    return {
        "values": to_jsonable(snap.values) if values else None,
        "next": list(snap.next),
        "tasks": tasks,
        "metadata": to_jsonable(snap.metadata or {}),
        "created_at": snap.created_at,
        "checkpoint": checkpoint_ref(snap.config),
        "parent_checkpoint": checkpoint_ref(snap.parent_config),
        "interrupts": [interrupt_json(i) for i in getattr(snap, "interrupts", ())],
        "checkpoint_id": _checkpoint_id(snap.config),
        "parent_checkpoint_id": _checkpoint_id(snap.parent_config),
    }


def debug_json(chunk: Any) -> Any:
    """A `debug` stream event as LangGraph's server sends it: a `checkpoint` event's payload also names its
    checkpoint and parent (`checkpoint`, `parent_checkpoint`), and a task whose state is a subgraph's config
    gives it as `checkpoint` instead of `state`."""
    if not isinstance(chunk, dict) or chunk.get("type") != "checkpoint" or not isinstance(chunk.get("payload"), dict):
        return chunk
    payload = dict(chunk["payload"])
    tasks = []
    for task in payload.get("tasks") or []:
        state = task.get("state") if isinstance(task, dict) else None
        if isinstance(state, dict) and "configurable" in state:
            task = {k: v for k, v in task.items() if k != "state"}
            task["checkpoint"] = checkpoint_ref(state)
        tasks.append(task)
    payload["tasks"] = tasks
    payload["checkpoint"] = checkpoint_ref(payload.get("config"))
    payload["parent_checkpoint"] = checkpoint_ref(payload.get("parent_config"))
    return {**chunk, "payload": payload}


def interrupt_json(interrupt: Any) -> dict[str, Any]:
    """An interrupt as a thread or state shows it: `value`, `id`, and `response_schema` when it has one."""
    out = {"value": to_jsonable(interrupt.value), "id": getattr(interrupt, "id", None)}
    schema = response_schema(interrupt)
    if schema is not None:
        out["response_schema"] = schema
    return out


def response_schema(interrupt: Any) -> Any:
    """The JSON Schema of the answer an `interrupt(..., response_schema=...)` asks for: a dict as given, a type
    (a pydantic model, a TypedDict) described by pydantic; None when there is none or it cannot be described."""
    schema = getattr(interrupt, "response_schema", None)
    if schema is None or isinstance(schema, dict):
        return schema
    try:
        return TypeAdapter(pydantic_compatible(schema)).json_schema()
    except Exception:  # noqa: BLE001 - a type pydantic cannot describe: the interrupt is still answered, without a schema
        return None


def empty_state() -> dict[str, Any]:
    return {"values": {}, "next": [], "tasks": [], "metadata": None, "created_at": None,
            "checkpoint": None, "parent_checkpoint": None, "interrupts": [],
            "checkpoint_id": None, "parent_checkpoint_id": None}


def pending_interrupts(state: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Interrupts awaiting an answer, keyed by task id, as the thread's `interrupts` field shows them."""
    return {t["id"]: t["interrupts"] for t in state.get("tasks", []) if t.get("interrupts")}


def thread_fields(state: dict[str, Any]) -> dict[str, Any]:
    """What a thread row caches of its latest state: values, pending interrupts, and the status they imply:
    `interrupted` while the graph has tasks left to run (an `interrupt()`, a static breakpoint, a state
    update made as a node with successors), as on LangGraph's server; otherwise `idle`."""
    interrupts = pending_interrupts(state)
    return {"values": state["values"] if state["checkpoint"] else None, "interrupts": interrupts,
            "status": "interrupted" if interrupts or state.get("next") else "idle"}


def run_output(state: dict[str, Any]) -> Any:
    """A finished run's output: the state values, with `__interrupt__` when the graph is waiting for input
    (each with `response_schema`, null when the interrupt has none, as LangGraph's server answers). An
    `@entrypoint` stopped before it returned has no values yet: its output is the interrupts alone."""
    values = state["values"]
    interrupts = [{"response_schema": None, **i}
                  for group in pending_interrupts(state).values() for i in group]
    if interrupts and values is None:
        return {"__interrupt__": interrupts}
    if interrupts and isinstance(values, dict):
        return {**values, "__interrupt__": interrupts}
    return values
