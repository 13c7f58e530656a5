"""The queue's and the threads' decisions that are not SQL, as pure functions every backend calls.

They take what a transaction has read and say what it writes; they touch no connection, so each is the one
place its rule lives (the thread status rule itself is in SQL, `Dialect.reconcile_thread`, so that a
finish waits for no result; `thread_status_changes` says what it is given).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from threadline.errors import Conflict, NotFound, QuotaExceeded

if TYPE_CHECKING:
    from threadline.storage.base import Claim, Quota, RunMetadata

Row = dict[str, Any]


class EnqueuePlan(NamedTuple):
    """What an enqueue writes: the run row (claimed when it starts at once) and the thread's metadata."""

    run: Row
    thread_metadata: dict[str, Any]
    claimed: bool


def plan_enqueue(new: Mapping[str, Any], thread_metadata_before: dict[str, Any] | None, *, created: bool, active: bool,
                 thread_metadata: dict[str, Any], reject_if_active: bool, claim_for: Claim | None,
                 run_metadata: RunMetadata | None) -> EnqueuePlan:
    """Reject, claim at once, or just queue.

    `thread_metadata_before` is the thread's metadata as the transaction found it (None: no such thread);
    `created`: this transaction has just created it; `active`: it has a pending or running run.
    """
    run = cast(Row, new)  # the same row, as it was given: only ever replaced below, never changed
    if thread_metadata_before is None:
        raise no_thread(run["thread_id"])
    if reject_if_active and active:
        raise thread_busy()
    merged = {**thread_metadata_before, **thread_metadata}
    if run_metadata is not None:
        run = {**run, "metadata": run_metadata.made(None if created else merged)}
    claimed = claim_for is not None and not active and run["available_at"] <= run["created_at"]
    if claimed:
        assert claim_for is not None
        # As `claim_run` claims: running, attempt 1, leased for `lease_seconds` (the lease on the
        # backend's clock, filled by the statement).
        run = {**run, "status": "running", "worker_id": claim_for[0], "attempt": 1}
    return EnqueuePlan(run, merged, claimed)


def no_thread(thread_id: str) -> NotFound:
    """An enqueue's refusal: its thread does not exist (and it was not asked to create it)."""
    return NotFound(f"Thread with ID {thread_id} not found")


def thread_busy() -> Conflict:
    """An enqueue's refusal under the `reject` strategy: its thread has an active run."""
    return Conflict("Thread is already running a task. Wait for it to finish or choose a "
                    "different multitask strategy.")


def split_recovery(running: list[Row], max_attempts: int) -> tuple[list[Row], list[Row]]:
    """Runs whose worker is gone: a run whose deadline has passed (`past_deadline`, from the database's clock,
    limits) ends `timeout` with `timed_out()` and is not retried; the others go back in the queue while they
    have attempts left, else fail with `worker_lost` (the failed rows as they end, without `past_deadline`)."""
    requeue, fail = [], []
    for found in running:
        past_deadline = bool(found.get("past_deadline"))
        run = {k: v for k, v in found.items() if k != "past_deadline"}
        if past_deadline:
            fail.append({**run, "status": "timeout", "error": timed_out(), "worker_id": None,
                         "lease_expires_at": None})
        elif run["attempt"] <= max_attempts:
            requeue.append(run)
        else:
            fail.append({**run, "status": "error", "error": worker_lost(run["attempt"]), "worker_id": None,
                         "lease_expires_at": None})
    return requeue, fail


def worker_lost(attempts: int) -> dict[str, str]:
    """The error a run ends with when its worker died and no retries are left."""
    return {"error": "WorkerLost",
            "message": f"The process running this run stopped; no retries left after {attempts} attempts."}


def timed_out() -> dict[str, str]:
    """The error a run past its deadline ends with, on its thread too, as LangGraph's server records it."""
    return {"error": "TimeoutError", "message": ""}


def quota_refusal(quota: Quota, mine: int, total: int) -> str | None:
    """`enqueue_run`'s caps (limits): raise QuotaExceeded when one more active run would pass a cap of `quota`
    given the active runs of its identity (`mine`) and of the deployment (`total`); else
    the identity to store on the run (None when no per-identity cap applies, so it is not counted)."""
    if quota.total and total >= quota.total:
        raise QuotaExceeded(f"The run queue is full ({total} active runs, the cap is {quota.total}): "
                            "try again once some have finished.")
    identity = counted_identity(quota)
    if identity is not None and mine >= quota.per_identity:
        raise QuotaExceeded(f"Too many active runs for this client ({mine}, the cap is {quota.per_identity}): "
                            "try again once some have finished, or cancel some.")
    return identity


def counted_identity(quota: Quota) -> str | None:
    """The identity a run is stored (and counted) under: its creator's, when a per-identity cap applies."""
    return quota.identity if quota.per_identity and quota.identity is not None else None


def quota_slots(quota: Quota) -> int:
    """How many caps of `quota` count a run (the whole queue's, its identity's): PostgreSQL's slots it takes."""
    return (1 if quota.total else 0) + (1 if counted_identity(quota) is not None else 0)


def seconds_left(now_at: str, deadline_at: str | None) -> float:
    """Seconds from `now_at` to `deadline_at` (ISO timestamps, both on the database's clock); 0 without one."""
    if deadline_at is None:
        return 0.0
    return (datetime.fromisoformat(deadline_at) - datetime.fromisoformat(now_at)).total_seconds()


def thread_status_changes(changes: Row, *, only_if_busy: bool = False) -> tuple[Row, str, bool]:
    """A finisher's thread changes as the status rule takes them: (the other columns, the status the thread
    takes when no run of it is active (the finisher's, else idle), whether only a busy thread changes).

    A thread is busy while it has an active run; otherwise it takes the status the finisher computed
    (idle, interrupted or error). `only_if_busy` (a run deleted): with no status given, a thread that is
    not busy keeps the status it has.
    """
    status = changes.get("status")
    columns = {k: v for k, v in changes.items() if k != "status"}
    return columns, status or "idle", only_if_busy and status is None


VERSION_COLUMNS = ("assistant_id", "version", "graph_id", "name", "description", "config", "context", "metadata")


def next_assistant_version(current: Row, changes: Row, latest_version: int | None, now: str) -> Row:
    """The assistant after an update: `changes` applied, numbered after its latest version."""
    return {**current, **changes, "version": (latest_version or 0) + 1, "updated_at": now}
