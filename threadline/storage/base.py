"""The storage contract every backend implements.

Rows are plain dicts of JSON-ready values, typed per table (`records.py`). Timestamps are ISO-8601 strings in UTC.
The run queue is the runs table: creating a run and enqueuing it are one transaction.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from langgraph.checkpoint.base import BaseCheckpointSaver, get_checkpoint_metadata
from langgraph.store.base import BaseStore

from threadline.shapes import FinalRunStatus
from threadline.storage.records import (
    AssistantRecord,
    CronRecord,
    NewRun,
    QueueStats,
    RunRecord,
    ThreadEventRecord,
    ThreadRecord,
)

#: A row as the driver returns it, or the columns a write sets: the records below are what the contract returns.
Row = dict[str, Any]
SortOrder = Literal["asc", "desc"]

#: Protocol events kept per thread: appending more deletes the oldest (as LangGraph's server keeps a
#: 10,000-event buffer per thread). A `since` older than what is kept replays from the oldest kept.
THREAD_EVENTS_KEPT = 10_000


def checkpoint_metadata(config: Any, metadata: Any) -> dict[str, Any]:
    """A checkpoint's metadata as stored: LangGraph's (which leaves `thread_id` out), with the checkpoint's
    `thread_id`, as LangGraph's server keeps it (a copied thread's checkpoints name the copy)."""
    return {**get_checkpoint_metadata(config, metadata), "thread_id": str(config["configurable"]["thread_id"])}


#: How a read takes a large JSON column (a thread's values, a run's output): parsed (True), not at all (False),
#: or as the JSON text stored (`"text"`: an `orjson.Fragment`, for an answer that writes it out as it is: a
#: 1 MB state is neither parsed nor encoded again, 2-3 ms of CPU a read). A backend that must open it (sealed
#: values) parses it.
JsonRead = bool | Literal["text"]


class NewThreadEvent(NamedTuple):
    """A protocol event to append to a thread; `namespace` and `params` are JSON text."""

    method: str
    channel: str  # the subscription channel it belongs to: "values", "input", "custom:<name>", …
    namespace: str
    params: str


class Quota(NamedTuple):
    """Caps `enqueue_run` checks in its transaction (limits, issue 16); 0 means no cap. A run over one is
    not enqueued (`QuotaExceeded`) and nothing else changes."""

    identity: str | None  # the creator, stored on the run (`identity`) when `per_identity` applies
    per_identity: int  # pending + running runs of `identity`
    total: int  # pending + running runs of the whole deployment


class RunMetadata(NamedTuple):
    """A run's `metadata`, made in its enqueue's transaction (as LangGraph's server makes it): `base`, then its
    thread's metadata as the enqueue leaves it (the thread's before, `thread_metadata` merged in; nothing when
    the enqueue creates the thread), then `over`. Data, not a callback, so that a server can make it in the
    enqueue's one statement (PostgreSQL's `threadline_enqueue_run`)."""

    base: dict[str, Any]
    over: dict[str, Any]

    def made(self, thread_metadata: dict[str, Any] | None) -> dict[str, Any]:
        """The metadata, given the thread's as the enqueue leaves it (None: the enqueue creates it)."""
        return {**self.base, **(thread_metadata or {}), **self.over}


class Claim(NamedTuple):
    """A run claimed for a worker as it is enqueued (`enqueue_run(claim_for=...)`): as `claim_run` claims."""

    worker_id: str
    lease_seconds: float
    deadline_seconds: float = 0.0  # the run's deadline from now (limits); 0: none is stamped


class Storage(abc.ABC):
    """Durable state for one deployment: assistants, threads, runs, checkpoints and the store."""

    checkpointer: BaseCheckpointSaver[Any]
    store: BaseStore
    #: What this backend can do, declared up front (shown in /info).
    capabilities: dict[str, bool | str | None] = {}
    url: str
    #: The schema migrations opening this storage applied (empty when the schema was up to date).
    applied_migrations: list[str] = []

    # --- lifecycle ---------------------------------------------------------
    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    async def ping(self) -> None:
        """Run a real query; raise if the database cannot answer."""

    # --- assistants ----------------------------------------------------------
    @abc.abstractmethod
    async def create_assistant(self, row: AssistantRecord, *,
                               if_exists: Literal["raise", "do_nothing"]) -> AssistantRecord:
        """Insert an assistant and its version 1; on a duplicate id raise Conflict or return the existing one."""

    @abc.abstractmethod
    async def ensure_assistants(self, rows: list[AssistantRecord]) -> list[AssistantRecord]:
        """`create_assistant(row, if_exists="do_nothing")` of each row, in one transaction: each row inserted
        with its version 1 unless its id is stored already; each as stored, in the rows' order."""

    @abc.abstractmethod
    async def get_assistant(self, assistant_id: str, *,
                            filters: dict[str, Any] | None = None) -> AssistantRecord | None:
        """The assistant, or None; `filters` as in `get_thread`, on the assistant's metadata."""

    @abc.abstractmethod
    async def search_assistants(
        self, *, graph_id: str | None, name: str | None, metadata: dict[str, Any] | None,
        limit: int, offset: int, sort_by: str, sort_order: SortOrder, filters: dict[str, Any] | None = None,
    ) -> list[AssistantRecord]: ...

    @abc.abstractmethod
    async def count_assistants(
        self, *, graph_id: str | None, name: str | None, metadata: dict[str, Any] | None,
        filters: dict[str, Any] | None = None,
    ) -> int: ...

    @abc.abstractmethod
    async def update_assistant(self, assistant_id: str, changes: Row) -> AssistantRecord:
        """Write a new version with `changes` applied and make it the latest."""

    @abc.abstractmethod
    async def delete_assistant(self, assistant_id: str) -> bool: ...

    @abc.abstractmethod
    async def list_assistant_versions(
        self, assistant_id: str, *, metadata: dict[str, Any] | None, limit: int, offset: int
    ) -> list[AssistantRecord]: ...

    @abc.abstractmethod
    async def set_assistant_version(self, assistant_id: str, version: int) -> AssistantRecord | None: ...

    # --- threads -------------------------------------------------------------
    @abc.abstractmethod
    async def create_thread(self, row: Row, *, if_exists: Literal["raise", "do_nothing"]) -> ThreadRecord: ...

    @abc.abstractmethod
    async def get_thread(self, thread_id: str, *, filters: dict[str, Any] | None = None,
                         values: JsonRead = True) -> ThreadRecord | None:
        """The thread, or None. `filters` (an `@auth.on` handler's, on metadata; see `sql.filter_terms`) is
        part of the query: a thread it excludes is None, as a missing one. Without `values` the row has no
        `values` key: the cached state values, which can be large, are not read. With `values="text"` they
        are the JSON text stored, not parsed (see `JsonRead`)."""

    @abc.abstractmethod
    async def update_thread(self, thread_id: str, changes: Row, *,
                            merge_metadata: dict[str, Any] | None = None) -> ThreadRecord | None:
        """Set columns in `changes` and shallow-merge `merge_metadata` into metadata."""

    @abc.abstractmethod
    async def store_thread_state(self, thread_id: str, fields: Row) -> bool:
        """Write the thread's cache of its latest state (`values`, `interrupts`, and `status`, which a thread
        held busy by a run keeps) and stamp `updated_at`; False when there is no such thread. Returns no row:
        the values can be large, and the caller has them."""

    @abc.abstractmethod
    async def delete_thread(self, thread_id: str) -> bool:
        """Delete the thread with its runs and checkpoints."""

    @abc.abstractmethod
    async def delete_expired_threads(self, *, limit: int, now: str | None = None) -> list[str]:
        """Delete up to `limit` threads whose TTL ran out by `now`, as `delete_thread` does; return their ids.

        A thread expires `ttl_minutes` after its `updated_at` (the backend keeps `expires_at` in step).
        A thread with a pending or running run is never deleted, also when a run is enqueued concurrently.
        `now` is an ISO-8601 UTC timestamp, the database's clock when None. Safe to call from several
        processes at once: each expired thread is deleted once, and the other sweepers skip it.
        """

    @abc.abstractmethod
    async def search_threads(
        self, *, ids: list[str] | None, metadata: dict[str, Any] | None, values: dict[str, Any] | None,
        status: str | None, limit: int, offset: int, sort_by: str, sort_order: SortOrder,
        filters: dict[str, Any] | None = None, with_values: JsonRead = True,
    ) -> list[ThreadRecord]:
        """Matching threads, a page; `filters` as in `get_thread`, inside the query (so pages are full).
        `with_values` as `get_thread`'s `values`: without it, a search whose answer leaves them out never
        reads them."""

    @abc.abstractmethod
    async def count_threads(
        self, *, metadata: dict[str, Any] | None, values: dict[str, Any] | None, status: str | None,
        filters: dict[str, Any] | None = None,
    ) -> int:
        """How many threads match; `filters` as in `get_thread`."""

    # --- runs and the queue ----------------------------------------------------
    def run_checkpointer(self, durability: str) -> Any:
        """The checkpointer a run with this LangGraph `durability` writes through (by default, `checkpointer`)."""
        return self.checkpointer

    @abc.abstractmethod
    async def enqueue_run(self, run: NewRun, *, thread_metadata: dict[str, Any], create_thread: bool,
                          reject_if_active: bool, thread_ttl_minutes: float | None = None,
                          new_thread_metadata: dict[str, Any] | None = None,
                          claim_for: Claim | tuple[str, float] | None = None,
                          run_metadata: RunMetadata | None = None,
                          quota: Quota | None = None) -> RunRecord:
        """Insert a pending run, mark its thread busy and merge `thread_metadata` into it, atomically.

        `run_metadata`, when given, makes the run's `metadata` in the transaction (see `RunMetadata`).

        A missing thread is created (with `new_thread_metadata` under `thread_metadata`, expiring after
        `thread_ttl_minutes`) when `create_thread`, else
        NotFound. Raises Conflict when `reject_if_active` and the thread has a pending or running run.
        With `claim_for=(worker_id, lease_seconds[, deadline_seconds])`, a run available now on a thread with
        no other active run is inserted already claimed by that worker, as `claim_run` would (`running`,
        attempt 1, leased, its deadline stamped).
        With `quota`, raises QuotaExceeded when the run would pass one of its caps (race-free: see `Quota`).
        """

    @abc.abstractmethod
    async def claim_runs(self, worker_id: str, lease_seconds: float, deadline_seconds: float = 0.0, *,
                         limit: int = 1) -> list[RunRecord]:
        """Atomically take up to `limit` of the oldest pending, available runs whose threads have no running
        run, at most one per thread, oldest first (one worker process claims for all its free slots at once).

        Each claim increments `attempt` (the fencing token) and holds a lease for `lease_seconds`. With
        `deadline_seconds`, it stamps the run's deadline that far from now unless the run has one (see
        `set_run_deadline`), in the same statement: a run's start costs no write of its own.
        """

    async def claim_run(self, worker_id: str, lease_seconds: float,
                        deadline_seconds: float = 0.0) -> RunRecord | None:
        """`claim_runs` for one run: the run claimed, or None."""
        claimed = await self.claim_runs(worker_id, lease_seconds, deadline_seconds, limit=1)
        return claimed[0] if claimed else None

    def enter_run(self, run: RunRecord) -> None:
        """Called in the task that executes a claimed `run`, before it starts: what this task writes for it is
        written as the run was stored (encrypted storage takes the run's encryption context). By default,
        nothing."""
        return None

    @abc.abstractmethod
    async def heartbeat_runs(self, worker_id: str, held: dict[str, int], lease_seconds: float) -> set[str]:
        """Extend the leases of the runs `worker_id` holds (`run_id -> attempt`); return those still held."""

    @abc.abstractmethod
    async def release_runs(self, worker_id: str, held: dict[str, int]) -> list[str]:
        """Graceful shutdown: put runs this worker holds back in the queue without spending an attempt."""

    @abc.abstractmethod
    async def finish_run(
        self, run_id: str, status: FinalRunStatus, *, error: Any = None, output: Any = None,
        thread_changes: Row | None = None, worker_id: str | None = None, attempt: int | None = None,
        delete_thread: bool = False,
    ) -> RunRecord | None:
        """End a run and reconcile its thread: busy while it has other active runs, else `thread_changes`.
        With `delete_thread` (the temporary thread of a stateless run), the thread is deleted instead, with
        its checkpoints; its runs are kept.

        When `worker_id` and `attempt` are given, only the holder of that claim may end it (returns None
        otherwise): a worker whose lease expired and whose run was claimed again writes nothing.
        """

    @abc.abstractmethod
    async def cancel_pending_runs(self, run_ids: list[str], status: FinalRunStatus) -> list[str]:
        """End runs that are still pending (no worker has them); return the ids that were."""

    @abc.abstractmethod
    async def get_run(self, run_id: str, *, output: JsonRead = True) -> RunRecord | None:
        """The run; without `output`, read without it (`statements.RUN_COLUMNS_BUT_OUTPUT`): the API's run
        object has none, and a thread run's is the whole state again. `"text"`: see `JsonRead`."""

    @abc.abstractmethod
    async def search_runs(
        self, *, thread_id: str | None, assistant_id: str | None, status: str | None,
        metadata: dict[str, Any] | None, limit: int, offset: int, thread_filters: dict[str, Any] | None = None,
        with_output: bool = True,
    ) -> list[RunRecord]:
        """Runs, newest first; `thread_filters` (as `get_thread`'s `filters`) keeps only runs whose thread
        passes it, inside the query (a run is its thread's: authorization on runs is on their threads).
        Without `with_output`, read without their outputs, as `get_run(output=False)`."""

    @abc.abstractmethod
    async def delete_run(self, run_id: str) -> bool: ...

    @abc.abstractmethod
    async def active_runs(self, thread_id: str) -> list[RunRecord]:
        """Pending and running runs of a thread, oldest first."""

    @abc.abstractmethod
    async def next_run(self, thread_id: str, after_seq: int) -> RunRecord | None:
        """The thread's first run created after the run numbered `after_seq` (rows carry their `seq`)."""

    @abc.abstractmethod
    async def last_run_seq(self, thread_id: str) -> int:
        """The `seq` of the thread's newest run, 0 when it has none."""

    @abc.abstractmethod
    async def recover_runs(self, max_attempts: int, *, expired_only: bool) -> tuple[list[RunRecord], list[RunRecord]]:
        """Put runs whose worker is gone back in the queue (up to `max_attempts`), or fail them.

        `expired_only`: only runs whose lease has expired (other live processes hold the rest);
        otherwise every run left `running` (the single-process backend at start).
        Returns (requeued runs, failed runs). Threads of failed runs are reconciled.
        """

    @abc.abstractmethod
    async def sweep_quota_slots(self) -> int:
        """Give back what a cap on active runs holds for runs no longer active, and drop what no run holds
        (PostgreSQL's quota slots: a run's end gives its own back; this catches what bypassed that, and the rows
        of identities no longer active). Safe beside concurrent enqueues; the lease sweeper calls it. How many
        slots it gave back or dropped (0 where a backend counts the active runs themselves)."""

    @abc.abstractmethod
    async def end_stalled_sessions(self, seconds: float) -> int:
        """End this deployment's database sessions stopped for `seconds` or more inside a transaction that the
        server's own idle timeout does not end (PostgreSQL: a pipeline whose process stalled before its Sync),
        so that their row locks do not block the runs the sweeper gives to other workers. How many it ended."""

    @abc.abstractmethod
    async def queue_stats(self) -> QueueStats:
        """Pending count, running count and the age in seconds of the oldest pending run."""

    # --- limits (issue 16: run deadlines) ---------------------------------------
    @abc.abstractmethod
    async def set_run_deadline(self, run_id: str, seconds: float) -> float:
        """Give the run a deadline `seconds` from now unless it has one already (a retried run keeps the one
        its first start set); return the seconds left until it, on the database's clock (<= 0: passed). A
        deadline this process stamped when it claimed the run (`claim_run`, `claim_for`) is answered without
        a write when `seconds` are the ones it stamped, and replaced by `seconds` otherwise.

        `recover_runs` ends a run whose worker is gone and whose deadline has passed as `timeout` (its
        thread `error`, `timed_out()`) instead of queueing it again; those are among the runs it fails."""

    # --- checkpoints helpers not in LangGraph's saver contract ---------------
    @abc.abstractmethod
    async def delete_checkpoints_for_run(self, thread_id: str, run_id: str) -> None: ...

    @abc.abstractmethod
    async def copy_checkpoints(self, source_thread_id: str, target_thread_id: str) -> None: ...

    @abc.abstractmethod
    async def prune_checkpoints(self, thread_id: str, strategy: Literal["delete", "keep_latest"]) -> None: ...

    # --- protocol events ---------------------------------------------------------
    @abc.abstractmethod
    async def append_thread_events(self, thread_id: str, run_id: str | None,
                                   events: list[NewThreadEvent]) -> list[int]:
        """Append events to the thread's log in one transaction; return their `seq`s (consecutive, from 1).

        Numbers are allocated atomically per thread, also between processes, and commit in order: once a
        reader has seen seq n, no event numbered below n appears later. Keeps the newest
        `THREAD_EVENTS_KEPT` events of the thread.
        """

    @abc.abstractmethod
    async def read_thread_events(self, thread_id: str, *, after: int = 0, limit: int = 500,
                                 run_id: str | None = None, method: str | None = None) -> list[ThreadEventRecord]:
        """Events with `seq > after`, oldest first: rows of seq, run_id, method, channel, namespace, params."""

    @abc.abstractmethod
    async def thread_event_bounds(self, thread_id: str) -> tuple[int, int]:
        """(oldest kept seq, newest seq) of the thread's events; (0, 0) when it has none."""

    # --- crons -------------------------------------------------------------------
    # Rows: cron_id, assistant_id, thread_id (None: stateless), user_id and auth_user (the creator), schedule,
    # timezone, end_time,
    # enabled, on_run_completed, payload, metadata, next_run_date, created_at, updated_at.
    # Statements: storage/statements.py; transactions: storage/crons.py.
    @abc.abstractmethod
    async def create_cron(self, row: CronRecord) -> CronRecord:
        """Insert a cron; NotFound when its `thread_id` names no thread. An assistant's or a thread's crons are
        deleted with it, in the same transaction."""

    @abc.abstractmethod
    async def get_cron(self, cron_id: str, *, filters: dict[str, Any] | None = None) -> CronRecord | None:
        """The cron, or None; `filters` as in `get_thread`, on the cron's metadata."""

    @abc.abstractmethod
    async def update_cron(self, cron_id: str, change: Callable[[CronRecord], Row]) -> CronRecord | None:
        """In one transaction: read the cron, `change(row)` gives the columns to set, write them; the updated
        row (None when there is no such cron)."""

    @abc.abstractmethod
    async def delete_cron(self, cron_id: str) -> bool: ...

    @abc.abstractmethod
    async def search_crons(self, *, assistant_id: str | None, thread_id: str | None, enabled: bool | None,
                           metadata: dict[str, Any] | None, limit: int, offset: int, sort_by: str | None,
                           sort_order: SortOrder | None, filters: dict[str, Any] | None = None) -> list[CronRecord]: ...

    @abc.abstractmethod
    async def count_crons(self, *, assistant_id: str | None, thread_id: str | None, enabled: bool | None,
                          metadata: dict[str, Any] | None, filters: dict[str, Any] | None = None) -> int: ...

    @abc.abstractmethod
    async def due_crons(self, now: str, limit: int) -> list[CronRecord]:
        """Enabled crons whose `next_run_date` is at or before `now` and within their `end_time`, and whose
        tick no live claim holds; earliest first."""

    @abc.abstractmethod
    async def claim_cron_tick(self, cron_id: str, tick: str, *, now: str, until: str) -> bool:
        """Claim the cron's tick `tick` (its `next_run_date`) until `until`: true for exactly one caller, in
        any process, until the claim lapses or the tick moves on (`advance_cron`)."""

    @abc.abstractmethod
    async def advance_cron(self, cron_id: str, tick: str, next_run_date: str | None) -> bool:
        """Move a cron on from `tick` to `next_run_date` and drop its claim; false if the tick had already
        moved (a PATCH rescheduled it)."""

    @abc.abstractmethod
    async def release_cron_tick(self, cron_id: str, tick: str) -> None:
        """Drop the claim on `tick` without moving on (its run could not be created; the next pass retries)."""
