"""Request bodies, validated at the edge.

As LangGraph's server, a field no model declares is ignored (logged once per name at debug level): clients
written against it send fields it ignores (Aegra's tests send `order_by` to thread search). A field LangGraph's
server honours and Threadline cannot is refused instead (422 naming it), never silently dropped: each model
lists those in `unsupported`. Wrong types and bad values are refused as before.
"""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    ModelWrapValidatorHandler,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from threadline.api.bounds import INT_MAX, MAX_SECONDS, printable, problem
from threadline.shapes import (
    AssistantSortBy,
    CancelStatus,
    Durability,
    IfExists,
    IfNotExists,
    MultitaskStrategy,
    OnCompletion,
    OnDisconnect,
    RunStatus,
    SortOrder,
    StreamMode,
    ThreadSortBy,
    ThreadStatus,
)

log = logging.getLogger("threadline.api")
_ignored: set[str] = set()  # the unknown field names already logged (at most _IGNORED_LOGGED: clients choose them)
_IGNORED_LOGGED = 1000


class Body(BaseModel):
    """A request body: unknown fields are ignored, those in `unsupported` refused."""

    model_config = ConfigDict(extra="ignore")
    #: Fields LangGraph's server honours on this body and Threadline does not: field -> why (the 422's text).
    unsupported: ClassVar[dict[str, str]] = {}

    @model_validator(mode="before")
    @classmethod
    def _unknown_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict) or cls.model_config.get("extra") == "allow":
            return data
        for name in data.keys() - cls.model_fields.keys():
            if name in cls.unsupported and data[name] is not None:  # null: as if absent
                raise PydanticCustomError("unsupported_field", "{field}: not supported by Threadline ({why})",
                                          {"field": name, "why": cls.unsupported[name]})
            if name not in _ignored and len(_ignored) < _IGNORED_LOGGED:
                _ignored.add(name)
                log.debug("ignoring the request field %r (%s declares no such field)", name, cls.__name__)
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _storable(cls, data: Any, handler: ModelWrapValidatorHandler[Any]) -> Any:
        """Every value in the body is one storage can hold (`threadline.api.bounds`), checked before any field:
        a 422 naming where it is, instead of a 500 from deep inside a transaction."""
        found = problem(data)
        if found is not None:
            raise invalid_at(printable(found[0]), "unstorable", found[1])
        return handler(data)


def invalid_at(loc: tuple[str | int, ...], kind: str, message: str) -> ValidationError:
    """A validation error at `loc` inside the value being validated (pydantic prefixes the field's own)."""
    error = InitErrorDetails(type=PydanticCustomError(kind, message), loc=loc, input=None)
    return ValidationError.from_exception_data("Body", [error])


#: The longest time to live in minutes (`ttl` on threads and store items): what the clock can add to now.
MAX_MINUTES = MAX_SECONDS / 60


def _runnable_config(config: dict[str, Any]) -> dict[str, Any]:
    configurable = config.get("configurable")
    if configurable is not None and not isinstance(configurable, dict):
        raise invalid_at(("configurable",), "dict_type",
                         f"Input should be an object, not {type(configurable).__name__}")
    return config


#: A RunnableConfig as sent: an object, whose `configurable` (if any) is an object too.
RunnableConfig = Annotated[dict[str, Any], AfterValidator(_runnable_config)]


def _path_keys(value: dict[str, Any]) -> dict[str, Any]:
    """Keys a search's `metadata` / `values` filter may use, at any depth: each becomes a step of a JSON path
    on SQLite, where a key holding `"`, `\\` or a control character cannot be named (a path error, or nothing
    found where PostgreSQL finds it). Refused on every backend, so both answer the same."""
    stack: list[tuple[dict[str, Any], tuple[str, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        for key, child in item.items():
            if '"' in key or "\\" in key or any(ord(c) < 0x20 for c in key):
                raise invalid_at(printable((*path, key)), "filter_key",
                                 "A filter key may not hold '\"', '\\' or a control character")
            if isinstance(child, dict):
                stack.append((child, (*path, key)))
    return value


#: A search's filter on a JSON column (`metadata`, `values`): top-level key equality, keys checked.
JSONFilter = Annotated[dict[str, Any], AfterValidator(_path_keys)]


_FILTER_KEY = re.compile(r"^[a-zA-Z0-9_.-]+$")


def _filter_keys(value: dict[str, Any]) -> dict[str, Any]:
    """The keys LangGraph's stores and checkpointers accept as JSON paths (else they raise ValueError in the
    query): a store search's `filter`, a thread history's `metadata`."""
    for key in value:
        if not _FILTER_KEY.match(key):
            raise invalid_at((key,), "filter_key", "A filter key may hold only letters, digits, '_', '.' and '-'")
    return value


LangGraphFilter = Annotated[dict[str, Any], AfterValidator(_filter_keys)]


class AssistantCreate(Body):
    graph_id: str
    assistant_id: str | None = None
    config: RunnableConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None
    if_exists: IfExists = "raise"


class AssistantPatch(Body):
    graph_id: str | None = None
    config: RunnableConfig | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None


class AssistantSearch(Body):
    graph_id: str | None = None
    name: str | None = None
    metadata: JSONFilter | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=INT_MAX)
    sort_by: AssistantSortBy | None = None
    sort_order: SortOrder | None = None
    select: list[str] | None = None


class AssistantCount(Body):
    graph_id: str | None = None
    name: str | None = None
    metadata: JSONFilter | None = None


class AssistantVersions(Body):
    metadata: JSONFilter | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=INT_MAX)


class SetLatest(Body):
    version: int = Field(ge=1)


class AgentSearch(Body):
    name: str | None = None
    metadata: JSONFilter | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=INT_MAX)


class StateUpdateItem(Body):
    # langgraph-sdk always sends `command` (null: as if absent).
    unsupported = {"command": "a command in a superstep is not supported yet"}

    values: Any = None
    as_node: str | None = None


class Superstep(Body):
    updates: list[StateUpdateItem]


class ThreadTTL(Body):
    """A thread's time to live, as langgraph-sdk sends it: deleted `ttl` minutes after its last update."""

    strategy: Literal["delete"] = "delete"
    ttl: float = Field(gt=0, le=MAX_MINUTES)


#: `ttl` on thread create and update: the object, or just the minutes (an error names which it was taken for).
TTLField = Annotated[Annotated[ThreadTTL, Tag("object")]
                     | Annotated[float, Field(gt=0, le=MAX_MINUTES), Tag("minutes")],
                     Discriminator(lambda v: "object" if isinstance(v, (dict, ThreadTTL)) else "minutes")] | None


def ttl_minutes(ttl: ThreadTTL | float | None) -> float | None:
    return ttl.ttl if isinstance(ttl, ThreadTTL) else ttl


def _blank_as_none(value: Any) -> Any:
    return None if value == "" else value


class ThreadCreate(Body):
    #: `""` is no id (a new one is made), as LangGraph's server takes it.
    thread_id: Annotated[UUID | None, BeforeValidator(_blank_as_none)] = None
    metadata: dict[str, Any] | None = None
    if_exists: IfExists = "raise"
    supersteps: list[Superstep] | None = None
    graph_id: str | None = None
    ttl: TTLField = None


class ThreadPatch(Body):
    metadata: dict[str, Any] | None = None
    ttl: TTLField = None
    values: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = None


#: What `select` on a thread search may name: LangGraph's server's list (a thread has no `context` here, so
#: selecting it selects nothing), and our `state_updated_at`.
ThreadField = Literal["thread_id", "created_at", "updated_at", "state_updated_at", "metadata", "config", "context",
                      "status", "values", "interrupts", "error"]


class ThreadSearch(Body):
    unsupported = {"extract": "values extracted from each thread by path are not implemented"}

    ids: list[str] | None = None
    metadata: JSONFilter | None = None
    values: JSONFilter | None = None
    status: ThreadStatus | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=INT_MAX)
    sort_by: ThreadSortBy | None = None
    sort_order: SortOrder | None = None
    select: list[ThreadField] | None = None


class ThreadCount(Body):
    metadata: JSONFilter | None = None
    values: JSONFilter | None = None
    status: ThreadStatus | None = None


class ThreadPrune(Body):
    thread_ids: list[UUID]
    strategy: Literal["delete", "keep_latest"] = "delete"


class StateUpdate(Body):
    values: Any = None
    as_node: str | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None


class CheckpointRef(Body):
    model_config = ConfigDict(extra="allow")
    checkpoint_id: str | None = None
    checkpoint_ns: str | None = None
    checkpoint_map: dict[str, Any] | None = None
    thread_id: str | None = None


class StateAtCheckpoint(Body):
    checkpoint: CheckpointRef
    subgraphs: bool = False


class HistoryQuery(Body):
    limit: int = Field(10, ge=1, le=1000)
    before: str | dict[str, Any] | None = None
    metadata: LangGraphFilter | None = None
    checkpoint: dict[str, Any] | None = None


class Command(Body):
    resume: Any = None
    update: Any = None
    goto: Any = None


def _webhook_url(url: str) -> str:
    """An absolute http(s) URL, or a path on this server (`/hooks/done`: POSTed to the app in-process)."""
    parts = urlsplit(url)
    if (url.startswith("/") and not url.startswith("//")) or (parts.scheme.lower() in ("http", "https")
                                                                and parts.netloc):
        return url
    raise ValueError("must be an http(s) URL or a path starting with '/'")


WebhookURL = Annotated[str, Field(min_length=1, max_length=65536), AfterValidator(_webhook_url)]


class LangSmithTracer(Body):
    """As LangGraph's server: trace this run to another LangSmith project too (and link it to a dataset example)."""

    project_name: str | None = None
    example_id: str | None = None


class RunCreate(Body):
    """A run request: LangGraph's fields, plus the Agent Protocol's `agent_id` and `thread_id`."""

    assistant_id: str | None = None
    agent_id: str | None = None
    thread_id: UUID | None = None
    input: Any = None
    command: Command | None = None
    metadata: dict[str, Any] | None = None
    config: RunnableConfig | None = None
    context: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    checkpoint_id: str | None = None
    checkpoint_during: bool | None = None
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None
    stream_mode: StreamMode | list[StreamMode] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    on_disconnect: OnDisconnect | None = None
    on_completion: OnCompletion | None = None
    multitask_strategy: MultitaskStrategy | None = None
    if_not_exists: IfNotExists | None = None
    after_seconds: float | None = Field(None, ge=0, le=MAX_SECONDS)
    webhook: WebhookURL | None = None
    durability: Durability | None = None
    feedback_keys: list[str] | None = None
    langsmith_tracer: LangSmithTracer | None = None
    strict_resume: bool | None = None
    messages: list[dict[str, Any]] | None = None

    def core_body(self) -> dict[str, Any]:
        body = self.model_dump(exclude_none=True)
        if "agent_id" in body:
            body.setdefault("assistant_id", body.pop("agent_id"))
        return body


class RunSearch(Body):
    thread_id: str | None = None
    agent_id: str | None = None
    assistant_id: str | None = None
    status: RunStatus | None = None
    metadata: JSONFilter | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=INT_MAX)


class RunCancelMany(Body):
    thread_id: str | None = None
    run_ids: list[str] | None = None
    status: CancelStatus | None = None


class StorePut(Body):
    namespace: list[str]
    key: str
    value: dict[str, Any]
    index: Literal[False] | list[str] | None = None
    ttl: float | None = Field(None, ge=0, le=MAX_MINUTES)


class StoreDelete(Body):
    namespace: list[str] | None = None
    key: str


class StoreSearch(Body):
    namespace_prefix: list[str] | None = None
    filter: LangGraphFilter | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=INT_MAX)
    query: str | None = None
    refresh_ttl: bool | None = None


class StoreNamespaces(Body):
    prefix: list[str] | None = None
    suffix: list[str] | None = None
    max_depth: int | None = Field(None, ge=1, le=2**31 - 1)  # a PostgreSQL integer
    limit: int = Field(100, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=INT_MAX)


# --- crons -------------------------------------------------------------------------------------
CronSortBy = Literal["cron_id", "assistant_id", "thread_id", "created_at", "updated_at", "next_run_date",
                     "end_time"]
CronField = Literal["cron_id", "assistant_id", "thread_id", "end_time", "schedule", "timezone", "created_at",
                    "updated_at", "user_id", "payload", "next_run_date", "metadata", "on_run_completed", "enabled"]


class CronRunFields(Body):
    """The fields of a cron's runs, as langgraph-sdk's `crons.create` / `create_for_thread` / `update` send them."""

    input: Any = None
    metadata: dict[str, Any] | None = None
    config: RunnableConfig | None = None
    context: dict[str, Any] | None = None
    checkpoint_during: bool | None = None
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None
    webhook: WebhookURL | None = None
    stream_mode: StreamMode | list[StreamMode] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    durability: Literal["sync", "async", "exit"] | None = None
    on_run_completed: Literal["delete", "keep"] | None = None
    enabled: bool | None = None
    timezone: str | None = None
    end_time: datetime | None = None


class CronCreate(CronRunFields):
    schedule: str
    assistant_id: str
    multitask_strategy: Literal["reject", "interrupt", "rollback", "enqueue"] | None = None


class CronPatch(CronRunFields):
    schedule: str | None = None

    def changes(self) -> dict[str, Any]:
        """The fields sent: those not null, and `end_time` also when null (no end)."""
        out = self.model_dump(mode="json", exclude_none=True)
        if "end_time" in self.model_fields_set and self.end_time is None:
            out["end_time"] = None
        return out


class CronSearch(Body):
    assistant_id: UUID | None = None
    thread_id: UUID | None = None
    enabled: bool | None = None
    metadata: JSONFilter | None = None
    limit: int = Field(10, ge=1, le=1000)
    offset: int = Field(0, ge=0, le=INT_MAX)
    sort_by: CronSortBy | None = None
    sort_order: SortOrder | None = None
    select: list[CronField] | None = None


class CronCount(Body):
    assistant_id: UUID | None = None
    thread_id: UUID | None = None
    enabled: bool | None = None
    metadata: JSONFilter | None = None
