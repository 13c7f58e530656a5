"""Every multi-statement transaction of our tables, written once as a driver-neutral script.

A script is a generator: it yields a `Q` (a statement and its parameters) or a tuple of them, and receives
their rows (a list of rows per statement; None for a `Q` with `wait=False`, whose result decides nothing).
It returns the transaction's result, raises to roll it back, or raises `Undo(value)` to roll it back and
return `value`. SQLite's writer steps a script synchronously on its connection, inside one `BEGIN
IMMEDIATE` transaction (`sqlite.py`); PostgreSQL awaits it in one pipelined transaction (`postgres.py`):
the statements of a tuple, and every `wait=False` one, are sent together, so a tuple costs one round trip.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, NamedTuple, TypeVar, cast

from threadline.errors import Conflict, NotFound
from threadline.storage.base import THREAD_EVENTS_KEPT, Claim, NewThreadEvent, Quota, RunMetadata
from threadline.storage.records import AssistantRecord, NewRun, RunRecord, ThreadRecord
from threadline.storage.rules import (
    VERSION_COLUMNS,
    Row,
    counted_identity,
    next_assistant_version,
    no_thread,
    plan_enqueue,
    quota_refusal,
    quota_slots,
    seconds_left,
    split_recovery,
    thread_busy,
    thread_status_changes,
)
from threadline.storage.sql import dumps, now_iso, thread_ttl_columns
from threadline.storage.statements import Dialect, Encoded

T = TypeVar("T")


class Q(NamedTuple):
    """One statement of a script: its SQL (in the driver's dialect), parameters, and whether its rows are
    waited for. `many`: `params` is a list of parameter sets, one execution each."""

    sql: str
    params: Any
    wait: bool = True
    many: bool = False


class Final(NamedTuple):
    """A script's last step: its statements may be sent with the transaction's COMMIT (PostgreSQL: one round
    trip for both). The script receives their rows once the transaction has committed, and only returns."""

    step: Q | tuple[Q, ...]


Step = Q | tuple[Q, ...] | Final
Script = Generator[Step, Any, T]


class QuotaRefused(Exception):
    """A driver's translation of the database refusing a run over a cap (`check_quota`), thrown into the script
    at its step: the active runs of the quota's identity (`mine`) and of the whole queue (`total`)."""

    def __init__(self, mine: int, total: int) -> None:
        super().__init__(mine, total)
        self.mine, self.total = mine, total


class ThreadRefused(Exception):
    """A driver's translation of the database refusing an enqueue in `enqueue_run_at_once`: no such thread, or
    (`busy`) the `reject` strategy's thread has an active run."""

    def __init__(self, busy: bool) -> None:
        super().__init__(busy)
        self.busy = busy


class RunRefused(Exception):
    """A driver's translation of the database refusing a run's end in `finish_run` (PostgreSQL's
    `threadline_finish_run`): the run was not the caller's to end."""


class Undo(Exception):
    """Roll the script's transaction back and return `value`."""

    def __init__(self, value: Any = None) -> None:
        super().__init__()
        self.value = value


def q(d: Dialect, name: str, /, *, wait: bool = True, **params: Any) -> Q:
    return Q(d.statement(name), params, wait)


# --- threads -----------------------------------------------------------------
def create_thread(d: Dialect, row: Row, if_exists: str) -> Script[ThreadRecord]:
    inserted, found = yield (Q(d.insert("threads", row, conflict="(thread_id) DO NOTHING RETURNING thread_id"), row),
                             q(d, "get_thread", thread_id=row["thread_id"]))
    if not inserted and if_exists == "raise":
        raise Conflict(f"Thread with ID {row['thread_id']} already exists")
    return cast("ThreadRecord", found[0])


def update_thread(d: Dialect, thread_id: str, changes: Row,
                  merge_metadata: dict[str, Any] | None) -> Script[ThreadRecord | None]:
    changes = dict(changes)
    if merge_metadata:
        locked = yield q(d, "lock_thread", thread_id=thread_id)
        if not locked:
            return None
        changes["metadata"] = {**locked[0]["metadata"], **merge_metadata}
    # Read after the write: triggers keep `expires_at` and `state_updated_at`, and SQLite's RETURNING shows
    # the row from before its AFTER triggers ran.
    _, found = yield (Q(d.update("threads", changes, "thread_id", stamp=True), {**changes, "thread_id": thread_id},
                        wait=False), q(d, "get_thread", thread_id=thread_id))
    return found[0] if found else None


def store_thread_state(d: Dialect, thread_id: str, fields: Row) -> Script[bool]:
    """The thread's cache of its latest state, written whole."""
    rows = yield q(d, "store_thread_state", thread_id=thread_id, values=fields["values"],
                   interrupts=fields["interrupts"], status=fields["status"])
    return bool(rows)


def delete_threads(d: Dialect, thread_ids: list[str], *, keep_runs: bool = False) -> Script[list[str]]:
    """The threads with their events, checkpoints and (unless `keep_runs`) runs; the ids deleted."""
    if not thread_ids:
        return []
    names = ["delete_threads_events", "delete_threads_event_counters", "delete_thread_checkpoints",
             *([] if keep_runs else ["delete_threads_runs"])]
    steps = [Q(part, {"thread_ids": thread_ids}, wait=False) for name in names for part in d.statements(name)]
    *_, deleted = yield (*steps, q(d, "delete_threads", thread_ids=thread_ids))
    return [r["thread_id"] for r in deleted]


def delete_expired_threads(d: Dialect, cutoff: str | None, limit: int) -> Script[list[str]]:
    # In one transaction, the expired threads locked (PostgreSQL) or the file (SQLite): no run can be enqueued
    # between finding a thread idle and deleting it; SKIP LOCKED lets concurrent sweepers take disjoint threads.
    expired = yield q(d, "expired_threads", cutoff=cutoff, limit=limit)
    return (yield from delete_threads(d, [r["thread_id"] for r in expired]))


def reconcile(d: Dialect, changes: Row, *, thread_id: str | None = None, run_id: str | None = None,
              only_if_busy: bool = False, returning: bool = False) -> tuple[Q, ...]:
    """The thread status rule (`Dialect.reconcile_thread`), its row locked first as `enqueue_run` locks it:
    a run enqueued concurrently is then either seen (the thread stays busy) or enqueued after us (and marks
    the thread busy itself). Neither statement is waited for, but the update when `returning` (its row, the
    last step's: the thread's status after it). SQLite has no row to lock: its one writer holds the file."""
    columns, status, only_busy = thread_status_changes(changes, only_if_busy=only_if_busy)
    key = {"run_id": run_id} if run_id is not None else {"thread_id": thread_id}
    update = Q(d.reconcile_thread(columns, of_run=run_id is not None, only_if_busy=only_busy, returning=returning),
               {**columns, "status": status, **key}, wait=returning)
    if d.sqlite:
        return (update,)
    return q(d, "lock_thread_of_run" if run_id is not None else "lock_thread", wait=False, **key), update


# --- runs and the queue ---------------------------------------------------------
def enqueue_run(d: Dialect, run: NewRun, thread_metadata: dict[str, Any], create_thread: bool, reject_if_active: bool,
                ttl_minutes: float | None, new_thread_metadata: dict[str, Any],
                claim_for: Claim | None, run_metadata: RunMetadata | None,
                quota: Quota | None = None) -> Script[RunRecord]:
    """Two round trips: one reads what decides (the thread, created if asked; its row lock orders concurrent
    enqueues, so a reject sees the other's run; its active run), one writes and commits (`Final`). With a
    `quota`, the second also checks its caps (`check_quota`): on PostgreSQL the run takes a free slot of each
    cap (slot rows taken with SKIP LOCKED: concurrent enqueues never wait for each other, and no lock is held
    across round trips), or is refused in that statement; SQLite's one writer counts the active runs."""
    now, thread_id = run["created_at"], run["thread_id"]
    need_active = reject_if_active or claim_for is not None
    steps = [q(d, "lock_thread", thread_id=thread_id)]
    if create_thread:
        steps.insert(0, q(d, "insert_thread_if_missing", thread_id=thread_id, status="busy", now=now,
                          metadata={**new_thread_metadata, **thread_metadata},
                          **{"ttl_strategy": None, "ttl_minutes": None, **thread_ttl_columns(ttl_minutes)}))
    if need_active:
        steps.append(q(d, "thread_has_active_run", thread_id=thread_id))
    found = yield tuple(steps)
    created = bool(found[0]) if create_thread else False
    thread = found[1 if create_thread else 0]
    plan = plan_enqueue(run, thread[0]["metadata"] if thread else None, created=created,
                        active=bool(found[-1]) if need_active else False, thread_metadata=thread_metadata,
                        reject_if_active=reject_if_active, claim_for=claim_for, run_metadata=run_metadata)
    checks: tuple[Q, ...] = ()
    if quota is not None:  # limits (issue 16): refused in the transaction, nothing of this run is written
        counted = counted_identity(quota)
        plan = plan._replace(run={**plan.run, "identity": counted, "quota_slots": quota_slots(quota)})
        checks = (q(d, "check_quota", run_id=plan.run["run_id"], identity=counted, per_identity=quota.per_identity,
                    cap=quota.total),)
    stamp = plan.claimed and claim_for is not None and claim_for.deadline_seconds > 0
    insert = Q(d.insert("runs", plan.run, lease=plan.claimed, deadline=stamp, returning=True),
               {**plan.run, "lease_seconds": claim_for.lease_seconds if plan.claimed and claim_for else None,
                "deadline_seconds": claim_for.deadline_seconds if stamp and claim_for else None})
    mark = () if created else (q(d, "mark_thread_busy", wait=False, thread_id=thread_id,
                                 metadata=plan.thread_metadata, now=now),)
    try:
        results = yield Final((*checks, *mark, insert))
    except QuotaRefused as refused:  # PostgreSQL refused it in `check_quota`: nothing was committed
        if quota is not None:
            quota_refusal(quota, refused.mine, refused.total)
        raise
    counts = results[0][0] if quota is not None else {}
    if quota is not None and "total" in counts:  # SQLite's counts before this run: refused here, rolled back
        quota_refusal(quota, int(counts["mine"] or 0), int(counts["total"] or 0))
    return cast("RunRecord", results[-1][0])


def sweep_quota_slots(d: Dialect) -> Script[int]:
    rows = yield q(d, "sweep_quota_slots")
    return int(rows[0]["n"] or 0) if rows else 0


def enqueue_run_at_once(d: Dialect, run: NewRun, thread_metadata: dict[str, Any], create_thread: bool,
                        reject_if_active: bool, ttl_minutes: float | None, new_thread_metadata: dict[str, Any],
                        claim_for: Claim | None, run_metadata: RunMetadata | None,
                        quota: Quota | None = None) -> Script[RunRecord]:
    """`enqueue_run` in one statement, for a server that runs `plan_enqueue`'s rule itself (PostgreSQL's
    `threadline_enqueue_run`, migration 0012): sent with its BEGIN and COMMIT, one round trip in all, the caps
    included; a refusal rolls it back and is worded here, as `enqueue_run` words it."""
    row: dict[str, Any] = dict(run)
    counted = None
    if quota is not None:
        counted = counted_identity(quota)
        row.update(identity=counted, quota_slots=quota_slots(quota))
    new_thread = None if not create_thread else {
        "metadata": {**new_thread_metadata, **thread_metadata},
        **{"ttl_strategy": None, "ttl_minutes": None, **thread_ttl_columns(ttl_minutes)}}
    try:
        rows = yield Final(q(
            d, "enqueue_run", run=Encoded(dumps(row)), new_thread=new_thread, thread_metadata=thread_metadata,
            now=run["created_at"], reject_if_active=reject_if_active,
            metadata_base=run_metadata.base if run_metadata is not None else None,
            metadata_over=run_metadata.over if run_metadata is not None else {},
            worker=claim_for.worker_id if claim_for is not None else None,
            lease_seconds=claim_for.lease_seconds if claim_for is not None else 0.0,
            deadline_seconds=claim_for.deadline_seconds if claim_for is not None else 0.0,
            identity=counted, per_identity=quota.per_identity if quota is not None else 0,
            cap=quota.total if quota is not None else 0))
    except ThreadRefused as refused:
        raise (thread_busy() if refused.busy else no_thread(run["thread_id"])) from None
    except QuotaRefused as refused:
        if quota is not None:
            quota_refusal(quota, refused.mine, refused.total)
        raise
    return cast("RunRecord", rows[0])


def set_run_deadline(d: Dialect, run_id: str, seconds: float, replace: bool = False) -> Script[float]:
    rows = yield q(d, "replace_run_deadline" if replace else "set_run_deadline", run_id=run_id,
                   deadline_seconds=seconds)
    return seconds_left(rows[0]["now_at"], rows[0]["deadline_at"]) if rows else 0.0


def finish_run(d: Dialect, run_id: str, status: str, error: Any, output: Any, thread_changes: Row,
               worker_id: str | None, attempt: int | None, delete_thread: bool) -> Script[RunRecord | None]:
    """The run ended (fenced by worker and attempt when given) and its thread reconciled in one round trip;
    rolled back when the run was not the caller's to end. The run as ended, with `thread_busy`: its thread
    has another active run (one that waited for this one: the worker that ended it may claim it at once)."""
    encoded = Encoded(dumps(output)) if output is not None else None
    if encoded is not None and thread_changes.get("values") is output:  # the output, often the whole state,
        thread_changes = {**thread_changes, "values": encoded}          # is encoded once
    finish = q(d, "finish_run", run_id=run_id, status=status, error=error, output=encoded, worker_id=worker_id,
               attempt=attempt)
    if delete_thread:  # a stateless run's temporary thread: deleted with its checkpoints, its runs kept
        finished = yield finish
        if not finished:
            return None
        yield from delete_threads(d, [finished[0]["thread_id"]], keep_runs=True)
        thread: list[Row] | None = None
    else:
        # One round trip on PostgreSQL: the end, the thread's reconciliation and the COMMIT in one pipeline;
        # an end refused in the database (`RunRefused`) rolls the reconciliation back with it.
        refusing = q(d, "finish_run_or_refuse", run_id=run_id, status=status, error=error, output=encoded,
                     worker_id=worker_id, attempt=attempt)
        try:
            finished, *_, thread = yield Final((refusing, *reconcile(d, thread_changes, run_id=run_id,
                                                                     returning=True)))
        except RunRefused:
            raise Undo(None) from None
        if not finished:  # SQLite steps a final step as any other, and rolls back here
            raise Undo(None)
    busy = thread is not None and bool(thread) and thread[0]["status"] == "busy"
    return cast("RunRecord", {**finished[0], "output": output, "thread_busy": busy})


def heartbeat_runs(d: Dialect, worker_id: str, held: dict[str, int], lease_seconds: float) -> Script[set[str]]:
    if not held:
        return set()
    rows = yield q(d, "heartbeat_runs", worker_id=worker_id, held=held, lease_seconds=lease_seconds)
    return {r["run_id"] for r in rows}


def release_runs(d: Dialect, worker_id: str, held: dict[str, int]) -> Script[list[str]]:
    if not held:
        return []
    rows = yield q(d, "release_runs", worker_id=worker_id, held=held)
    return [r["run_id"] for r in rows]


def cancel_pending_runs(d: Dialect, run_ids: list[str], status: str) -> Script[list[str]]:
    if not run_ids:
        return []
    rows = yield q(d, "cancel_pending_runs", run_ids=list(run_ids), status=status)
    steps = [step for thread_id in sorted({r["thread_id"] for r in rows})
             for step in reconcile(d, {}, thread_id=thread_id)]
    if steps:
        yield tuple(steps)
    return [r["run_id"] for r in rows]


def delete_run(d: Dialect, run_id: str) -> Script[bool]:
    found = yield q(d, "delete_run", run_id=run_id)
    if not found:
        return False
    yield reconcile(d, {}, thread_id=found[0]["thread_id"], only_if_busy=True)
    return True


def recover_runs(d: Dialect, max_attempts: int,
                 expired_only: bool) -> Script[tuple[list[RunRecord], list[RunRecord]]]:
    """Runs whose lease lapsed (`expired_only`), or every running run (the one-process backend at start),
    split by `split_recovery`; at start, a thread left busy with no active run becomes idle too."""
    running = yield q(d, "lapsed_runs" if expired_only else "running_runs")
    requeue, fail = split_recovery(running, max_attempts)
    steps: list[Q] = []
    if requeue:
        steps.append(q(d, "requeue_runs", wait=False, run_ids=[r["run_id"] for r in requeue]))
    for r in fail:
        steps.append(q(d, "fail_run", wait=False, run_id=r["run_id"], status=r["status"], error=r["error"]))
        steps += reconcile(d, {"status": "error", "error": r["error"]}, thread_id=r["thread_id"])
    if not expired_only:
        steps.append(q(d, "idle_stray_busy_threads", wait=False))
    if steps:
        yield tuple(steps)
    return cast("list[RunRecord]", requeue), cast("list[RunRecord]", fail)


# --- assistants -------------------------------------------------------------------
def create_assistant(d: Dialect, row: Row, if_exists: str) -> Script[AssistantRecord]:
    inserted = yield Q(d.insert("assistants", row, conflict="(assistant_id) DO NOTHING RETURNING assistant_id"), row)
    if inserted:
        version = {k: row[k] for k in (*VERSION_COLUMNS, "created_at")}
        yield q(d, "insert_assistant_version", wait=False, **version)
    elif if_exists == "raise":
        raise Conflict(f"Assistant {row['assistant_id']} already exists")
    return cast("AssistantRecord", (yield q(d, "get_assistant", assistant_id=row["assistant_id"]))[0])


def ensure_assistants(d: Dialect, rows: list[Row]) -> Script[list[AssistantRecord]]:
    """`create_assistant(row, "do_nothing")` of every row, in one transaction of two steps (on PostgreSQL, one
    round trip each, the second with the COMMIT): the rows inserted, then the inserted ones' versions and
    every row as stored. Inserted in the ids' order: two processes starting at once on one database, whose
    projects list their graphs in other orders, wait for each other's rows in the same order, not deadlock."""
    if not rows:
        return []
    ordered = sorted(rows, key=lambda row: row["assistant_id"])
    inserted = yield tuple(Q(d.insert("assistants", row, conflict="(assistant_id) DO NOTHING RETURNING assistant_id"),
                             row) for row in ordered)
    versions = tuple(q(d, "insert_assistant_version", wait=False,
                       **{k: row[k] for k in (*VERSION_COLUMNS, "created_at")})
                     for row, new in zip(ordered, inserted, strict=True) if new)
    found = yield Final((*versions, *(q(d, "get_assistant", assistant_id=row["assistant_id"]) for row in rows)))
    return [cast("AssistantRecord", one[0]) for one in found[len(versions):]]


def update_assistant(d: Dialect, assistant_id: str, changes: Row) -> Script[AssistantRecord]:
    current, latest = yield (q(d, "lock_assistant", assistant_id=assistant_id),
                             q(d, "latest_assistant_version", assistant_id=assistant_id))
    if not current:
        raise NotFound(f"Assistant {assistant_id} not found")
    new = next_assistant_version(current[0], changes, latest[0]["v"] if latest else None, now_iso())
    version = {**{k: new[k] for k in VERSION_COLUMNS}, "created_at": new["updated_at"]}
    cols = {k: v for k, v in new.items() if k != "assistant_id"}
    _, _, found = yield (q(d, "insert_assistant_version", wait=False, **version),
                         Q(d.update("assistants", cols, "assistant_id"), new, wait=False),
                         q(d, "get_assistant", assistant_id=assistant_id))
    return cast("AssistantRecord", found[0])


def set_assistant_version(d: Dialect, assistant_id: str, version: int) -> Script[AssistantRecord | None]:
    found = yield q(d, "get_assistant_version", assistant_id=assistant_id, version=version)
    if not found:
        return None
    v = found[0]
    _, current = yield (q(d, "set_assistant", wait=False, updated_at=now_iso(), **{
        k: v[k] for k in ("assistant_id", "graph_id", "name", "description", "config", "context", "metadata",
                          "version")}), q(d, "get_assistant", assistant_id=assistant_id))
    return current[0] if current else None


def delete_assistant(d: Dialect, assistant_id: str) -> Script[bool]:
    return bool((yield q(d, "delete_assistant", assistant_id=assistant_id)))


# --- checkpoints and protocol events ------------------------------------------------
def run_named(d: Dialect, name: str, params: dict[str, Any]) -> Script[None]:
    """A statement that may be several (LangGraph's checkpoint tables), in one transaction."""
    yield tuple(Q(part, params, wait=False) for part in d.statements(name))


def append_thread_events(d: Dialect, thread_id: str, run_id: str | None,
                         events: list[NewThreadEvent]) -> Script[list[int]]:
    """Number the events on from the thread's counter and store them, keeping the newest. The counter's
    upsert holds its row until commit (PostgreSQL; SQLite: the file's write lock): a concurrent appender on
    the thread takes the numbers after ours, so seqs also commit in order."""
    ((counter,),) = yield q(d, "bump_event_counter", thread_id=thread_id, count=len(events)),
    last = int(counter["last_seq"])
    first = last - len(events) + 1
    steps = [Q(d.statement("insert_event"), [
        {"thread_id": thread_id, "seq": first + i, "run_id": run_id, "method": e.method, "channel": e.channel,
         "namespace": e.namespace, "params": e.params} for i, e in enumerate(events)], wait=False, many=True)]
    if last > THREAD_EVENTS_KEPT:
        steps.append(q(d, "trim_events", wait=False, thread_id=thread_id, upto=last - THREAD_EVENTS_KEPT))
    yield tuple(steps)
    return list(range(first, last + 1))
