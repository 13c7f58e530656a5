"""The records storage returns and the core reads: one `TypedDict` per table (runs, threads, assistants, crons)
and for the JSON objects stored in them that the server itself reads (a run's request, `RunKwargs`).

They cost nothing at runtime (a row is still the plain dict the driver gave), but a key typo or a wrong type is
mypy's to find. A key the database always returns is required; one a row may lack is `NotRequired` and is read
with `.get`. Values clients choose (metadata, config, state) stay `Any`-valued dicts: their keys are the user's.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

from threadline.shapes import Durability, MultitaskStrategy, OnCompletion, OnDisconnect, RunStatus, ThreadStatus

#: A JSON object whose keys are the client's (metadata, config, context, thread state).
JSONObject = dict[str, Any]


class RunKwargs(TypedDict, total=False):
    """A run's stored request (`runs.kwargs`): the request fields the executor reads (`core/runs.py:
    KWARG_KEYS`), each present only when the request gave it, plus what the server adds."""

    input: Any
    command: JSONObject
    config: JSONObject
    context: JSONObject
    stream_mode: str | list[str]
    stream_subgraphs: bool
    stream_resumable: bool
    interrupt_before: str | list[str]
    interrupt_after: str | list[str]
    checkpoint: JSONObject
    checkpoint_id: str
    webhook: str
    on_completion: OnCompletion
    on_disconnect: OnDisconnect
    after_seconds: float
    durability: Durability
    feedback_keys: list[str]
    checkpoint_during: bool
    langsmith_tracer: Any
    protocol: bool  # created by a Protocol v2 command: the run's events go to the thread's log
    temporary: bool  # a stateless run's thread, deleted when it completes (`on_completion: delete`)
    trace: dict[str, str]  # `tracing.TRACE_KEY`: the caller's trace context, continued by the worker


class NewRun(TypedDict):
    """A run as `Runs.create` makes it, before `enqueue_run` stores it (`core/runs.py: _new_run`)."""

    run_id: str
    thread_id: str
    assistant_id: str
    status: RunStatus
    kwargs: RunKwargs
    metadata: JSONObject
    multitask_strategy: MultitaskStrategy
    available_at: str
    created_at: str
    updated_at: str


class RunRecord(NewRun):
    """A stored run (the `runs` table): the queue's columns beside the request."""

    seq: int
    attempt: int  # the fencing token: each claim increments it
    worker_id: str | None
    lease_expires_at: str | None
    error: Any
    output: Any
    deadline_at: str | None  # limits (issue 16): stamped when the run first starts, kept when it is retried
    identity: str | None  # the creator, when a per-identity cap applies (else None: not counted)
    quota_slots: int  # how many caps on active runs count it (PostgreSQL: the quota slots it holds)
    past_deadline: NotRequired[bool]  # only on the rows `recover_runs` reads (`running_runs`, `lapsed_runs`)
    thread_busy: NotRequired[bool]  # only on the run `finish_run` returns: its thread has another active run


class ThreadRecord(TypedDict):
    """A stored thread (the `threads` table)."""

    thread_id: str
    status: ThreadStatus
    metadata: JSONObject
    config: JSONObject
    # Not read by `get_thread(..., values=False)`: the cache can be large. With `values="text"`, the JSON text
    # as stored (an `orjson.Fragment`, which an answer writes out as it is), else the parsed value.
    values: NotRequired[Any]
    interrupts: JSONObject
    error: Any
    created_at: str
    updated_at: str
    state_updated_at: str | None
    ttl_strategy: str | None  # "delete" when the thread has a TTL
    ttl_minutes: float | None
    expires_at: str | None  # kept by a trigger (PostgreSQL) or the writes (SQLite): `updated_at` + the TTL


class AssistantRecord(TypedDict):
    """A stored assistant, or one of its versions (`assistant_versions` has no `updated_at`)."""

    assistant_id: str
    graph_id: str
    name: str
    description: str | None
    config: JSONObject
    context: JSONObject
    metadata: JSONObject
    version: int
    created_at: str
    updated_at: NotRequired[str]


class CronRecord(TypedDict):
    """A stored cron (the `crons` table, without its claim lease: `storage/crons.py: cron_row`)."""

    cron_id: str
    assistant_id: str
    thread_id: str | None  # None: each tick is a stateless run
    user_id: str | None
    auth_user: JSONObject | None  # the creator as authentication gave it: the cron's runs run as that caller
    schedule: str
    timezone: str | None
    end_time: str | None
    enabled: bool
    on_run_completed: OnCompletion | None
    payload: JSONObject  # the run request each tick makes (as the client sent it, with the cron's config)
    metadata: JSONObject
    next_run_date: str | None
    created_at: str
    updated_at: str
    identity: str | None  # whose cap on active runs its runs count against


class ThreadEventRecord(TypedDict):
    """A stored Protocol v2 event of a thread's log (`thread_events`); `namespace` and `params` are JSON text."""

    thread_id: str
    seq: int
    run_id: str | None
    method: str
    channel: str
    namespace: str
    params: str
    created_at: str


class QueueStats(TypedDict):
    """`Storage.queue_stats`: the run queue at a glance."""

    pending: int
    running: int
    oldest_pending_at: str | None  # when the oldest pending run became available
