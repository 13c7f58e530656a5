"""The public shape of each stored resource, as clients see it (routes and webhooks alike): the fields each
shows, and the closed sets of values its fields and requests take, declared once here as `Literal` types for
the API's request models (`threadline.api.models`), the core's signatures and storage alike.

A leaf: it imports nothing of Threadline's, so any layer may import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast, get_args

# --- closed sets ------------------------------------------------------------------------------------------------
# The order of each is the order pydantic names them in a 422 ("Input should be 'raise' or 'do_nothing'").

RunStatus = Literal["pending", "running", "error", "success", "timeout", "interrupted"]
#: What a run has ended as: every status but those of a run still queued or running.
FinalRunStatus = Literal["success", "error", "timeout", "interrupted"]
FINAL_RUN_STATUSES: tuple[FinalRunStatus, ...] = get_args(FinalRunStatus)
#: Which runs a bulk cancel takes when it names none: pending, running, or both (`all`).
CancelStatus = Literal["pending", "running", "all"]
ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
MultitaskStrategy = Literal["reject", "interrupt", "rollback", "enqueue"]
#: How a run is cancelled: `interrupt` keeps what it checkpointed, `rollback` deletes the run and its checkpoints.
CancelAction = Literal["interrupt", "rollback"]
OnDisconnect = Literal["cancel", "continue"]
OnCompletion = Literal["delete", "keep"]
IfExists = Literal["raise", "do_nothing"]
IfNotExists = Literal["create", "reject"]
Durability = Literal["sync", "async", "exit"]
StreamMode = Literal["values", "updates", "messages", "messages-tuple", "custom", "events", "debug", "tasks",
                     "checkpoints"]
SortOrder = Literal["asc", "desc"]
AssistantSortBy = Literal["assistant_id", "graph_id", "name", "created_at", "updated_at"]
ThreadSortBy = Literal["thread_id", "status", "created_at", "updated_at", "state_updated_at"]

ASSISTANT_FIELDS = ("assistant_id", "graph_id", "config", "context", "created_at", "updated_at", "metadata",
                    "version", "name", "description")
THREAD_FIELDS = ("thread_id", "created_at", "updated_at", "state_updated_at", "metadata", "status", "config",
                 "values", "interrupts", "error")
RUN_FIELDS = ("run_id", "thread_id", "assistant_id", "created_at", "updated_at", "status", "metadata", "kwargs",
              "multitask_strategy")
#: The request fields a run's public `kwargs` carries as LangGraph's server shows them, with their defaults.
RUN_KWARGS_DEFAULTS: dict[str, Any] = {
    "input": None, "command": None, "context": {}, "interrupt_before": None, "interrupt_after": None,
    "webhook": None, "feedback_keys": None, "checkpoint_during": True,
}


# --- the rules a run's request is read by, the same for what the worker runs and what clients are shown ----------
def requested_modes(kwargs: Mapping[str, Any]) -> list[StreamMode]:
    """The stream modes a run asked for: its `stream_mode`, one or a list; `["values"]` when it named none."""
    modes = kwargs.get("stream_mode") or ["values"]
    return cast("list[StreamMode]", [modes] if isinstance(modes, str) else list(modes))


def run_durability(kwargs: Mapping[str, Any]) -> Durability:
    """The run's `durability`, else the legacy `checkpoint_during` (false: "exit"), else LangGraph's default,
    "async"."""
    if kwargs.get("durability"):
        return cast(Durability, kwargs["durability"])  # the request's, one of Durability's (checked at the API)
    return "exit" if kwargs.get("checkpoint_during") is False else "async"


def assistant_out(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in ASSISTANT_FIELDS}


def version_out(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: row.get(k) for k in ASSISTANT_FIELDS if k != "updated_at"}
    return out


def thread_out(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: row.get(k) for k in THREAD_FIELDS}


def run_out(row: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: row.get(k) for k in RUN_FIELDS}
    out["kwargs"] = run_kwargs_out(row)
    out["langsmith_session_name"] = None  # LangGraph's server names the run's LangSmith project; none here
    return out


def run_kwargs_out(row: Mapping[str, Any]) -> dict[str, Any]:
    """A run's `kwargs` as LangGraph's server shows them: the run resolved rather than the request's fields.
    Every field is there with its default; `stream_mode` is a list (`["values"]` by default); `subgraphs`,
    `resumable` and `temporary` (a stateless run whose thread goes with it) replace `stream_subgraphs` and
    `stream_resumable`; `durability` is the one the run has; `config` names the run (`configurable`: the
    request's context and configurable, `assistant_id`, `graph_id`, `run_id`, `thread_id`; `metadata`: the
    run's). The stored request (what the worker runs) is not changed."""
    kwargs = row.get("kwargs") or {}
    out = {key: kwargs.get(key, default) for key, default in RUN_KWARGS_DEFAULTS.items()}
    if out["context"] is None:
        out["context"] = {}
    out["stream_mode"] = requested_modes(kwargs)
    out["subgraphs"] = bool(kwargs.get("stream_subgraphs"))
    out["resumable"] = bool(kwargs.get("stream_resumable"))
    out["temporary"] = bool(kwargs.get("temporary"))
    out["durability"] = run_durability(kwargs)
    for key in ("checkpoint", "checkpoint_id"):
        if kwargs.get(key) is not None:
            out[key] = kwargs[key]
    given = kwargs.get("config") or {}
    metadata = row.get("metadata") or {}
    configurable = {**(kwargs.get("context") or {}), **(given.get("configurable") or {}),
                    "assistant_id": row.get("assistant_id"), "run_id": row.get("run_id"),
                    "thread_id": row.get("thread_id")}
    if metadata.get("graph_id") is not None:
        configurable["graph_id"] = metadata["graph_id"]
    out["config"] = {**given, "configurable": configurable, "metadata": {**(given.get("metadata") or {}), **metadata}}
    return out
