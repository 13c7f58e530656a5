"""The storage contract, run against every backend: the run queue (claim order, one running run per thread,
reject and enqueue), the finish guard, thread status, recovery with leases, heartbeats and release, what a
delete takes with it, search order and paging, and the TTL sweep.

Storage is opened directly (`open_storage`), not through the API. Tests that need a second process of a
deployment take `peer`: on PostgreSQL another `Storage` on the same database (its own pool, as another
process has), on SQLite the same one (the file belongs to one process, which holds it locked). Races with
another program's transaction are forced deterministically with `OtherConnection`, a raw connection to the
same database.

Both backends run the same statements and rules (`storage/statements.py`, `rules.py`, `scripts.py`), and no
test here is marked for one backend: the divergences this suite once named as strict xfails (tie order, JSON
filter key order and case folding on SQLite, a stale heartbeat, a thread and its checkpoints deleted in two
transactions, two clocks) are fixed.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import orjson
import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from tests.services import DB_PREFIX, PG_ADMIN_URL, owned_name
from threadline.errors import Conflict, NotFound, QuotaExceeded
from threadline.shapes import FinalRunStatus
from threadline.storage import open_storage
from threadline.storage.base import Claim, NewThreadEvent, Quota, Row, RunMetadata, Storage
from threadline.storage.records import AssistantRecord, NewRun, RunRecord, ThreadRecord
from threadline.storage.sql import MIGRATIONS_TABLE, now_iso, pending_migrations, thread_ttl_columns


@pytest.fixture
async def storage(database_url: str) -> AsyncIterator[Storage]:
    opened = await open_storage(database_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def peer(storage: Storage, database_url: str) -> AsyncIterator[Storage]:
    """Another process of `storage`'s deployment (on a one-process backend, the deployment is `storage`)."""
    if not storage.capabilities.get("multi_process"):
        yield storage
        return
    other = await open_storage(database_url)
    try:
        yield other
    finally:
        await other.close()


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="microseconds")


def later(**delta: float) -> str:
    return iso(datetime.now(UTC) + timedelta(**delta))


async def enqueue(storage: Storage, thread_id: str | None = None, *, create: bool = True, reject: bool = False,
                  after_seconds: float = 0, claim_for: Claim | tuple[str, float] | None = None,
                  **kwargs: Any) -> RunRecord:
    """A run as `Runs.create` makes one (pending, the thread created if missing unless `create` is false)."""
    now = datetime.now(UTC)
    run: NewRun = {"run_id": str(uuid.uuid4()), "thread_id": thread_id or str(uuid.uuid4()), "assistant_id": "agent",
           "status": "pending", "metadata": {}, "kwargs": {}, "multitask_strategy": "enqueue",
           "available_at": iso(now + timedelta(seconds=after_seconds)), "created_at": iso(now),
           "updated_at": iso(now)}
    return await storage.enqueue_run(run, thread_metadata=kwargs.pop("thread_metadata", {}), create_thread=create,
                                     reject_if_active=reject, claim_for=claim_for, **kwargs)


async def create_thread(storage: Storage, thread_id: str | None = None, *, ttl_minutes: float | None = None,
                        **columns: Any) -> ThreadRecord:
    now = now_iso()
    row = {"thread_id": thread_id or str(uuid.uuid4()), "status": "idle", "metadata": {}, "config": {},
           "values": None, "interrupts": {}, "created_at": now, "updated_at": now,
           **thread_ttl_columns(ttl_minutes), **columns}
    return await storage.create_thread(row, if_exists="raise")


async def create_assistant(storage: Storage, assistant_id: str, **columns: Any) -> AssistantRecord:
    now = now_iso()
    row: Any = {"assistant_id": assistant_id, "graph_id": "agent", "name": assistant_id, "description": None,
           "config": {}, "context": {}, "metadata": {}, "version": 1, "created_at": now, "updated_at": now,
           **columns}
    return await storage.create_assistant(row, if_exists="raise")


def _config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


async def put_checkpoint(storage: Storage, thread_id: str, run_id: str | None = None) -> None:
    """A checkpoint of the thread, written through LangGraph's saver as a run writes one."""
    await storage.checkpointer.aput(_config(thread_id), empty_checkpoint(),
                                    {"source": "loop", "step": 0, "run_id": run_id}, {})


async def has_checkpoints(storage: Storage, thread_id: str) -> bool:
    return await storage.checkpointer.aget_tuple(_config(thread_id)) is not None


class OtherConnection:
    """A raw connection of another program to the same database, to hold a transaction open at a chosen point.

    SQL is written once, with `?` marks. `begin()` takes SQLite's write lock (BEGIN IMMEDIATE: one writer
    per file); on PostgreSQL, `lock(...)` takes the row locks a statement of ours would wait on.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite:")
        self._lite: sqlite3.Connection | None = None
        self._pg: psycopg.AsyncConnection | None = None

    async def __aenter__(self) -> OtherConnection:
        if self.sqlite:
            self._lite = sqlite3.connect(self.url.removeprefix("sqlite:").removeprefix("///"), isolation_level=None,
                                         check_same_thread=False)
        else:
            self._pg = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._lite is not None:
            if self._lite.in_transaction:
                self._lite.execute("ROLLBACK")
            self._lite.close()
        if self._pg is not None:
            await self._pg.close()

    async def execute(self, sql: str, params: tuple = ()) -> list[tuple]:
        if self._lite is not None:
            return self._lite.execute(sql, params).fetchall()
        assert self._pg is not None
        cur = await self._pg.execute(sql.replace("?", "%s"), params)
        return await cur.fetchall() if cur.description else []

    async def count(self, table: str, thread_id: str) -> int:
        return (await self.execute(f"SELECT count(*) FROM {table} WHERE thread_id = ?", (thread_id,)))[0][0]

    async def begin(self) -> None:
        await self.execute("BEGIN IMMEDIATE" if self.sqlite else "BEGIN")

    async def lock(self, table: str, thread_id: str) -> None:
        """Lock the thread's rows of `table` (SQLite: the whole database is already locked by `begin`)."""
        if not self.sqlite:
            await self.execute(f"SELECT 1 FROM {table} WHERE thread_id = ? FOR UPDATE", (thread_id,))

    async def commit(self) -> None:
        await self.execute("COMMIT")

    async def rollback(self) -> None:
        await self.execute("ROLLBACK")

    async def until_waited_for(self, task: asyncio.Task[Any]) -> None:
        """Until `task` waits for this connection's locks; it must not be able to finish meanwhile."""
        if self.sqlite:
            await asyncio.sleep(0.3)  # the writer hands locked work to its thread, which retries
        else:
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as watch:
                for _ in range(500):
                    cur = await watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                              "AND datname = current_database()")
                    if (await cur.fetchone())[0]:
                        break
                    await asyncio.sleep(0.01)
        assert not task.done(), "the operation did not wait for the other transaction"


# The queue: claim order and one running run per thread.


async def test_a_claim_takes_the_oldest_available_run_with_a_lease(storage: Storage) -> None:
    runs = [await enqueue(storage) for _ in range(3)]
    assert all(r["status"] == "pending" and r["attempt"] == 0 and r["worker_id"] is None for r in runs)
    before = datetime.now(UTC)
    claimed = await storage.claim_run("w1", 30)
    assert claimed is not None and claimed["run_id"] == runs[0]["run_id"]
    assert (claimed["status"], claimed["worker_id"], claimed["attempt"]) == ("running", "w1", 1)
    lease = ts(claimed["lease_expires_at"]) - before
    assert timedelta(seconds=29) < lease < timedelta(seconds=31)
    assert (await storage.get_run(runs[0]["run_id"]))["status"] == "running"
    assert [(await storage.claim_run("w1", 30))["run_id"] for _ in range(2)] == [r["run_id"] for r in runs[1:]]
    assert await storage.claim_run("w1", 30) is None


async def test_one_running_run_per_thread_and_a_threads_runs_in_order(storage: Storage) -> None:
    first = await enqueue(storage)
    second = await enqueue(storage, first["thread_id"])
    other = await enqueue(storage)
    assert [r["run_id"] for r in await storage.active_runs(first["thread_id"])] == [first["run_id"], second["run_id"]]
    assert (await storage.claim_run("w1", 30))["run_id"] == first["run_id"]
    assert (await storage.claim_run("w1", 30))["run_id"] == other["run_id"]  # not the thread's second run
    assert await storage.claim_run("w1", 30) is None
    await storage.finish_run(first["run_id"], "success", worker_id="w1", attempt=1)
    assert (await storage.claim_run("w1", 30))["run_id"] == second["run_id"]


async def test_a_run_not_yet_available_holds_back_the_runs_behind_it(storage: Storage) -> None:
    delayed = await enqueue(storage, after_seconds=60)
    behind = await enqueue(storage, delayed["thread_id"])  # due now, but behind the delayed run on its thread
    assert await storage.claim_run("w1", 30) is None
    free = await enqueue(storage)
    assert (await storage.claim_run("w1", 30))["run_id"] == free["run_id"]
    stats = await storage.queue_stats()
    assert (stats["pending"], stats["running"]) == (2, 1)
    assert ts(stats["oldest_pending_at"]) == ts(behind["available_at"])  # the earliest due, held back or not


async def test_concurrent_claims_take_each_thread_once(storage: Storage, peer: Storage) -> None:
    """Claims racing from two processes: every thread's first run is claimed exactly once, and no second run
    of a thread starts while its first is pending or running."""
    firsts = [await enqueue(storage) for _ in range(5)]
    for run in firsts:
        await enqueue(storage, run["thread_id"])
    claims = await asyncio.gather(*(s.claim_run(f"w{i}", 30) for i in range(20) for s in (storage, peer)))
    claimed = [c["run_id"] for c in claims if c is not None]
    assert sorted(claimed) == sorted(r["run_id"] for r in firsts)


async def test_one_claim_fills_several_slots_oldest_first_and_one_run_per_thread(storage: Storage) -> None:
    """A worker process claims for all its free slots in one statement: up to `limit` runs, oldest first,
    never two of one thread, each leased and fenced as a single claim is."""
    first = await enqueue(storage)
    second = await enqueue(storage, first["thread_id"])  # behind `first` on its thread
    others = [await enqueue(storage) for _ in range(3)]
    claimed = await storage.claim_runs("w1", 30, limit=3)
    assert [r["run_id"] for r in claimed] == [first["run_id"], others[0]["run_id"], others[1]["run_id"]]
    assert {(r["status"], r["worker_id"], r["attempt"]) for r in claimed} == {("running", "w1", 1)}
    assert all(r["lease_expires_at"] for r in claimed)
    rest = await storage.claim_runs("w2", 30, limit=10)  # not `second`: its thread's first run is running
    assert [r["run_id"] for r in rest] == [others[2]["run_id"]]
    assert await storage.claim_runs("w2", 30, limit=10) == []
    await storage.finish_run(first["run_id"], "success", worker_id="w1", attempt=1)
    assert [r["run_id"] for r in await storage.claim_runs("w2", 30, limit=10)] == [second["run_id"]]


async def test_concurrent_multi_claims_take_each_run_once(storage: Storage, peer: Storage) -> None:
    """Claimers of several slots racing from two processes: each run is claimed by exactly one, and the
    claims together take every claimable run."""
    runs = [await enqueue(storage) for _ in range(30)]
    claims = await asyncio.gather(*(s.claim_runs(f"w{i}", 30, limit=4) for i in range(6) for s in (storage, peer)))
    claimed = [r["run_id"] for batch in claims for r in batch]
    assert len(claimed) == len(set(claimed))
    claimed += [r["run_id"] for r in await storage.claim_runs("w-last", 30, limit=30)]
    assert sorted(claimed) == sorted(r["run_id"] for r in runs)


async def test_a_run_started_at_once_is_inserted_claimed_only_on_a_free_thread(storage: Storage) -> None:
    started = await enqueue(storage, claim_for=("w1", 30))
    assert (started["status"], started["worker_id"], started["attempt"]) == ("running", "w1", 1)
    assert started["lease_expires_at"] is not None
    behind = await enqueue(storage, started["thread_id"], claim_for=("w1", 30))  # the thread has a run
    assert (behind["status"], behind["attempt"], behind["worker_id"]) == ("pending", 0, None)
    delayed = await enqueue(storage, after_seconds=60, claim_for=("w1", 30))  # not due yet
    assert delayed["status"] == "pending"
    assert await storage.claim_run("w2", 30) is None


# Enqueue and reject (multitask strategies).


async def test_enqueue_creates_the_thread_or_needs_it(storage: Storage) -> None:
    with pytest.raises(NotFound):
        await enqueue(storage, create=False)
    made = RunMetadata({"base": 1, "k": "base", "graph_id": "base"}, {"over": 2, "assistant_id": "over"})
    run = await enqueue(storage, thread_metadata={"graph_id": "agent"}, new_thread_metadata={"graph_id": "x", "k": 1},
                        run_metadata=made)
    thread = await storage.get_thread(run["thread_id"])
    assert thread["status"] == "busy" and thread["metadata"] == {"graph_id": "agent", "k": 1}
    # A run that creates its thread takes none of the thread's metadata.
    assert run["metadata"] == {"base": 1, "k": "base", "graph_id": "base", "over": 2, "assistant_id": "over"}
    again = await enqueue(storage, run["thread_id"], create=False, thread_metadata={"assistant_id": "a"},
                          run_metadata=made)
    # Base, then the thread as this run leaves it (its own metadata merged in), then over.
    assert again["metadata"] == {"base": 1, "k": 1, "graph_id": "agent", "over": 2, "assistant_id": "over"}
    merged = (await storage.get_thread(run["thread_id"]))["metadata"]
    assert merged == {"graph_id": "agent", "k": 1, "assistant_id": "a"}


async def test_reject_refuses_a_thread_with_a_pending_or_running_run(storage: Storage) -> None:
    thread = await create_thread(storage)
    run = await enqueue(storage, thread["thread_id"], reject=True)
    with pytest.raises(Conflict):
        await enqueue(storage, thread["thread_id"], reject=True)  # pending
    await storage.claim_run("w1", 30)
    with pytest.raises(Conflict):
        await enqueue(storage, thread["thread_id"], reject=True)  # running
    assert [r["run_id"] for r in await storage.search_runs(thread_id=thread["thread_id"], assistant_id=None,
                                                           status=None, metadata=None, limit=10, offset=0)] == [
        run["run_id"]]
    await storage.finish_run(run["run_id"], "success", worker_id="w1", attempt=1)
    assert (await enqueue(storage, thread["thread_id"], reject=True))["status"] == "pending"


async def test_concurrent_rejecting_enqueues_let_one_run_in(storage: Storage, peer: Storage) -> None:
    thread = await create_thread(storage)
    outcomes = await asyncio.gather(*(s.enqueue_run(
        {"run_id": str(uuid.uuid4()), "thread_id": thread["thread_id"], "assistant_id": "agent", "status": "pending",
         "metadata": {}, "kwargs": {}, "multitask_strategy": "reject", "available_at": now_iso(),
         "created_at": now_iso(), "updated_at": now_iso()},
        thread_metadata={}, create_thread=False, reject_if_active=True) for s in (storage, peer) * 3),
        return_exceptions=True)
    assert sum(isinstance(o, dict) for o in outcomes) == 1
    assert sum(isinstance(o, Conflict) for o in outcomes) == 5
    assert len(await storage.active_runs(thread["thread_id"])) == 1


# The finish: who may end a run, and the thread's status after it.


async def test_a_released_run_has_spent_no_attempt_and_a_stale_holder_cannot_release_it(storage: Storage) -> None:
    """SIGTERM hands runs back with release_runs: the next claim is the same attempt, and a release (or a
    finish) by a worker that no longer holds that attempt changes nothing."""
    run = await enqueue(storage)
    run_id, thread_id = run["run_id"], run["thread_id"]
    first = await storage.claim_run("w1", 30)
    assert first is not None and first["run_id"] == run_id and first["attempt"] == 1
    assert await storage.release_runs("w1", {run_id: 1}) == [run_id]
    released = await storage.get_run(run_id)
    assert released["status"] == "pending" and released["attempt"] == 0 and released["worker_id"] is None
    second = await storage.claim_run("w2", 30)
    assert second is not None and second["run_id"] == run_id and second["attempt"] == 1
    assert await storage.release_runs("w1", {run_id: 1}) == []  # w1 no longer holds it
    assert await storage.finish_run(run_id, "success", worker_id="w1", attempt=1,
                                    thread_changes={"values": {"stale": True}}) is None
    assert (await storage.get_run(run_id))["status"] == "running"
    thread = await storage.get_thread(thread_id)  # nor did the stale finish touch the thread
    assert thread["status"] == "busy" and thread["values"] != {"stale": True}
    assert (await storage.finish_run(run_id, "success", worker_id="w2", attempt=1))["status"] == "success"


async def test_a_finish_fenced_by_an_older_attempt_changes_nothing(storage: Storage, peer: Storage) -> None:
    """w1's lease lapsed, the run was recovered and claimed again by w2 in another process: w1's finish (same
    run, older attempt) writes nothing, and w2's ends the run."""
    run = await enqueue(storage)
    assert (await storage.claim_run("w1", -1))["attempt"] == 1  # a lease that has already run out
    requeued, failed = await peer.recover_runs(2, expired_only=True)
    assert [r["run_id"] for r in requeued] == [run["run_id"]] and failed == []
    taken = await peer.claim_run("w2", 30)
    assert (taken["run_id"], taken["attempt"], taken["worker_id"]) == (run["run_id"], 2, "w2")
    assert await storage.finish_run(run["run_id"], "error", error={"error": "stale"}, worker_id="w1", attempt=1,
                                    thread_changes={"status": "error"}) is None
    assert await storage.finish_run(run["run_id"], "success", worker_id="w2", attempt=1) is None  # w2 holds 2
    current = await storage.get_run(run["run_id"])
    assert (current["status"], current["error"], current["worker_id"]) == ("running", None, "w2")
    assert (await storage.get_thread(run["thread_id"]))["status"] == "busy"
    done = await peer.finish_run(run["run_id"], "success", worker_id="w2", attempt=2, output={"n": 1},
                                 thread_changes={"values": {"n": 1}})
    assert done is not None
    assert (done["status"], done["output"], done["lease_expires_at"]) == ("success", {"n": 1}, None)
    # Ended is ended: a second finish by the same holder is refused too.
    assert await storage.finish_run(run["run_id"], "error", worker_id="w2", attempt=2) is None
    assert (await storage.get_run(run["run_id"]))["status"] == "success"


@pytest.mark.parametrize(("status", "changes", "thread_status"), [
    ("success", {"values": {"n": 1}}, "idle"),
    ("error", {"status": "error", "error": {"message": "boom"}}, "error"),
    ("interrupted", {"status": "interrupted", "interrupts": {"t": [{"value": "?"}]}, "values": {"n": 1}},
     "interrupted"),
])
async def test_a_finish_sets_the_threads_status_and_state(storage: Storage, status: FinalRunStatus, changes: Row,
                                                         thread_status: str) -> None:
    run = await enqueue(storage)
    await storage.claim_run("w1", 30)
    finished = await storage.finish_run(run["run_id"], status, worker_id="w1", attempt=1, thread_changes=changes,
                                        error=changes.get("error"))
    assert finished["status"] == status
    thread: Row = {**await storage.get_thread(run["thread_id"])}
    assert thread["status"] == thread_status
    for column, value in changes.items():
        if column != "status":
            assert thread[column] == value


async def test_a_finish_stamps_the_run_and_its_thread_on_one_clock(
        storage: Storage) -> None:
    """The run's and its thread's `updated_at` after a finish are one instant, read from one clock."""
    run = await enqueue(storage)
    await storage.claim_run("w1", 30)
    finished = await storage.finish_run(run["run_id"], "success", worker_id="w1", attempt=1)
    thread = await storage.get_thread(run["thread_id"])
    assert ts(finished["updated_at"]) == ts(thread["updated_at"])


async def test_a_thread_stays_busy_while_it_has_another_run(storage: Storage) -> None:
    run = await enqueue(storage)
    queued = await enqueue(storage, run["thread_id"])
    await storage.claim_run("w1", 30)
    await storage.finish_run(run["run_id"], "error", worker_id="w1", attempt=1,
                             thread_changes={"status": "error", "values": {"n": 1}})
    thread = await storage.get_thread(run["thread_id"])
    assert thread["status"] == "busy" and thread["values"] == {"n": 1}  # the state is kept; the status waits
    assert await storage.cancel_pending_runs([queued["run_id"], run["run_id"]], "interrupted") == [queued["run_id"]]
    assert (await storage.get_run(queued["run_id"]))["status"] == "interrupted"
    assert (await storage.get_thread(run["thread_id"]))["status"] == "idle"


async def test_a_thread_read_without_values_is_the_row_without_them(storage: Storage) -> None:
    values = {"documents": ["x" * 1000] * 5, "notes": "n"}
    thread = await create_thread(storage, metadata={"owner": "a"}, ttl_minutes=5, values=values)
    whole = await storage.get_thread(thread["thread_id"])
    assert whole is not None and whole["values"] == values
    head = await storage.get_thread(thread["thread_id"], values=False)
    # Every other column, as read whole.
    assert head == {k: v for k, v in whole.items() if k != "values"}
    assert await storage.get_thread(thread["thread_id"], filters={"owner": "a"}, values=False) == head
    assert await storage.get_thread(thread["thread_id"], filters={"owner": "b"}, values=False) is None


async def test_a_search_without_values_reads_the_rows_without_them(storage: Storage) -> None:
    """`POST /threads/search` whose `select` leaves `values` out (a thread list) reads none: on PostgreSQL,
    writing a large state's jsonb out as text is most of the read. Filters on the values still apply."""
    values = {"documents": ["x" * 1000] * 5, "notes": "n"}
    thread = await create_thread(storage, metadata={"owner": "a"}, values=values)
    await create_thread(storage, metadata={"owner": "a"}, values={"notes": "other"})
    query: dict[str, Any] = {"ids": None, "metadata": {"owner": "a"}, "values": {"notes": "n"}, "status": None,
                             "limit": 10, "offset": 0, "sort_by": "created_at", "sort_order": "desc"}
    [whole] = await storage.search_threads(**query)
    assert whole["thread_id"] == thread["thread_id"] and whole["values"] == values
    [head] = await storage.search_threads(**query, with_values=False)
    assert head == {k: v for k, v in whole.items() if k != "values"}
    assert head == await storage.get_thread(thread["thread_id"], values=False)


async def test_a_run_read_without_its_output_is_the_row_without_it(storage: Storage) -> None:
    """The API's run object has no output, and a thread run's is the whole state again: the run reads that
    answer with that object (a thread's run list, `GET /runs/{id}`) leave it in storage. A wait's answer
    takes it as the stored text (`output="text"`): the keys in the order written (PostgreSQL's `json`)."""
    run = await enqueue(storage)
    await storage.claim_run("w1", 30)
    output = {"zeta": ["x" * 1000] * 5, "a": {"n": 2**63 - 1}}
    assert await storage.finish_run(run["run_id"], "success", output=output, worker_id="w1", attempt=1)
    whole = await storage.get_run(run["run_id"])
    assert whole is not None and whole["output"] == output and list(whole["output"]) == ["zeta", "a"]
    head = await storage.get_run(run["run_id"], output=False)
    assert head == {k: v for k, v in whole.items() if k != "output"}
    text = await storage.get_run(run["run_id"], output="text")
    assert text is not None and isinstance(text["output"], orjson.Fragment)
    assert orjson.dumps(text["output"]) == orjson.dumps(output) and {**text, "output": None} == {**head, "output": None}
    pending = await enqueue(storage)
    assert (await storage.get_run(pending["run_id"], output="text"))["output"] is None
    query: dict[str, Any] = {"thread_id": run["thread_id"], "assistant_id": None, "status": None, "metadata": None,
                             "limit": 10, "offset": 0}
    assert await storage.search_runs(**query) == [whole]
    assert await storage.search_runs(**query, with_output=False) == [head]


async def test_storing_a_threads_state_keeps_a_busy_thread_busy(storage: Storage) -> None:
    idle = await create_thread(storage, ttl_minutes=5)
    fields = {"values": {"n": 2}, "interrupts": {"t": [{"value": "?", "id": "i"}]}, "status": "interrupted"}
    assert await storage.store_thread_state(idle["thread_id"], fields)
    stored = await storage.get_thread(idle["thread_id"])
    assert {k: v for k, v in stored.items() if k in fields} == fields
    assert ts(stored["updated_at"]) > ts(idle["updated_at"])
    assert ts(stored["state_updated_at"]) == ts(stored["updated_at"])  # the state's stamp follows
    assert ts(stored["expires_at"]) > ts(idle["expires_at"])  # the TTL counts from the write
    run = await enqueue(storage)
    assert await storage.store_thread_state(run["thread_id"], {**fields, "status": "idle"})
    busy = await storage.get_thread(run["thread_id"])
    assert busy["status"] == "busy" and busy["values"] == {"n": 2}
    assert not await storage.store_thread_state(str(uuid.uuid4()), fields)


async def test_a_threads_values_come_back_as_they_were_written(storage: Storage) -> None:
    """A thread's values are stored as JSON text on both databases (PostgreSQL's `json`, migration 0019): its
    keys in the state's order (jsonb sorted them by length), and every value as written, whether the row is
    read parsed or as its text (`values="text"`, what an answer writes out as it is). A search by values still
    compares them as JSON."""
    thread = await create_thread(storage)
    tid = thread["thread_id"]
    values = {"zeta": 1, "messages": [{"content": "é \u2028 \\ \" 😀", "n": 2**64 - 1}], "a": {"y": None, "b": 1.5},
              "big": -(2**63), "empty": {}}
    assert await storage.store_thread_state(tid, {"values": values, "interrupts": {}, "status": "idle"})
    stored = await storage.get_thread(tid)
    assert stored is not None and list(stored["values"]) == list(values) and stored["values"] == values
    as_text = await storage.get_thread(tid, values="text")
    assert as_text is not None and isinstance(as_text["values"], orjson.Fragment)
    assert orjson.dumps(as_text["values"]) == orjson.dumps(values)
    assert {k: v for k, v in as_text.items() if k != "values"} == {k: v for k, v in stored.items() if k != "values"}
    search: dict[str, Any] = dict(ids=[tid], metadata=None, status=None, limit=10, offset=0, sort_by="created_at",
                  sort_order="desc")
    found = await storage.search_threads(**search, values={"a": {"b": 1.5, "y": None}}, with_values="text")
    assert [orjson.dumps(t["values"]) for t in found] == [orjson.dumps(values)]
    assert await storage.search_threads(**search, values={"zeta": 2}) == []
    assert await storage.count_threads(metadata=None, values={"big": -(2**63)}, status=None) == 1
    assert not await storage.store_thread_state(str(uuid.uuid4()), {"values": {}, "interrupts": {}, "status": "idle"})
    # Past 64 bits orjson writes nothing and the standard encoder writes the text; NaN is null there too, so the
    # text is JSON that any client reads.
    odd = (await create_thread(storage))["thread_id"]
    assert await storage.store_thread_state(odd, {"values": {"huge": 2**70, "nan": float("nan"), "n": [1.5]},
                                                  "interrupts": {}, "status": "idle"})
    odd_text = (await storage.get_thread(odd, values="text"))["values"]
    assert orjson.loads(orjson.dumps(odd_text)) == {"huge": float(2**70), "nan": None, "n": [1.5]}
    assert (await storage.get_thread(odd))["values"] == {"huge": float(2**70), "nan": None, "n": [1.5]}
    # A thread without values: null, in both forms.
    empty = await create_thread(storage)
    assert (await storage.get_thread(empty["thread_id"], values="text"))["values"] == (
        await storage.get_thread(empty["thread_id"]))["values"]


async def count_row_writes(other: OtherConnection) -> None:
    """From now on, every write of a `threads` row (a trigger's own included) adds a row to `row_writes`
    (counted by thread: the tests of a module may share a database, and each counts its own thread's)."""
    await other.execute("CREATE TABLE IF NOT EXISTS row_writes (thread_id TEXT)")
    if other.sqlite:
        await other.execute("CREATE TRIGGER IF NOT EXISTS count_row_writes AFTER UPDATE ON threads BEGIN "
                            "INSERT INTO row_writes VALUES (NEW.thread_id); END")
        return
    await other.execute("CREATE OR REPLACE FUNCTION count_row_write() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                        "INSERT INTO row_writes VALUES (NEW.thread_id); RETURN NEW; END $$")
    await other.execute("CREATE OR REPLACE TRIGGER count_row_writes AFTER UPDATE ON threads FOR EACH ROW "
                        "EXECUTE FUNCTION count_row_write()")


async def test_storing_a_threads_state_writes_its_row_once(storage: Storage, database_url: str) -> None:
    """A thread's row holds its values (1 MB for a large state): SQLite's stamping trigger wrote it all a second
    time after each state write, to set `state_updated_at`; the write stamps it itself now."""
    thread = await create_thread(storage)
    async with OtherConnection(database_url) as other:
        await count_row_writes(other)
        assert await storage.store_thread_state(thread["thread_id"], {"values": {"n": 1}, "interrupts": {},
                                                                      "status": "idle"})
        assert await other.count("row_writes", thread["thread_id"]) == 1
    stored = await storage.get_thread(thread["thread_id"])
    assert stored is not None and stored["values"] == {"n": 1}
    assert ts(stored["state_updated_at"]) == ts(stored["updated_at"]) > ts(thread["updated_at"])
    # Another write of the values (none of ours does it today) is still stamped by the trigger.
    async with OtherConnection(database_url) as other:
        await other.execute("UPDATE threads SET \"values\" = '{\"n\": 2}', updated_at = ? WHERE thread_id = ?",
                            (now_iso(), thread["thread_id"]))
    restamped = await storage.get_thread(thread["thread_id"])
    assert restamped is not None and ts(restamped["state_updated_at"]) == ts(restamped["updated_at"])
    assert ts(restamped["state_updated_at"]) > ts(stored["state_updated_at"])


async def test_a_run_finishing_writes_its_threads_row_once(storage: Storage, database_url: str) -> None:
    """The finish stores the thread's values (the run's output, 1 MB for a large state) with its status: on
    SQLite the stamping trigger wrote the whole row a second time on every run; the finish stamps it itself."""
    thread = await create_thread(storage)
    run = await enqueue(storage, thread["thread_id"])
    await storage.claim_run("w1", 30)
    async with OtherConnection(database_url) as other:
        await count_row_writes(other)
        before = await other.count("row_writes", thread["thread_id"])  # the enqueue's, if counted already
        assert await storage.finish_run(run["run_id"], "success", output={"n": 1}, worker_id="w1", attempt=1,
                                        thread_changes={"values": {"n": 1}, "interrupts": {}, "status": "idle",
                                                        "error": None})
        assert await other.count("row_writes", thread["thread_id"]) - before == 1
    stored = await storage.get_thread(thread["thread_id"])
    assert stored is not None and stored["values"] == {"n": 1} and stored["status"] == "idle"
    assert ts(stored["state_updated_at"]) == ts(stored["updated_at"]) > ts(thread["updated_at"])


async def test_a_state_write_fires_no_trigger_that_would_change_nothing(storage: Storage, database_url: str) -> None:
    """PostgreSQL's triggers on `threads` are PL/pgSQL, and each copies the row it is handed: a state write's row
    holds the whole values uncompressed, about 1.4 ms a trigger on a 1 MB state. They fire only when they have
    something to change (migration 0018); SQLite's stamping is counted by the test above."""
    if database_url.startswith("sqlite:"):
        pytest.skip("SQLite's triggers write the row again, and the row writes are counted above")
    names = ["threadline_thread_state_updated", "threadline_thread_expiry"]
    async with OtherConnection(database_url) as other:
        bodies = await other.execute("SELECT proname, prosrc FROM pg_proc WHERE proname = ANY(?)", (names,))
        assert sorted(name for name, _ in bodies) == sorted(names)

        async def define(name: str, body: str) -> None:
            await other.execute(f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
                                f"$body${body}$body$")

        await other.execute("CREATE TABLE IF NOT EXISTS trigger_calls (thread_id TEXT, name TEXT)")
        try:
            for name, body in bodies:  # each function as it is, but that it counts its calls first
                await define(name, body.replace("BEGIN", "BEGIN INSERT INTO trigger_calls VALUES "
                                                         "(NEW.thread_id, TG_NAME);", 1))

            async def calls(thread_id: str) -> list[str]:
                rows = await other.execute("DELETE FROM trigger_calls WHERE thread_id = ? RETURNING name",
                                           (thread_id,))
                return sorted(row[0] for row in rows)

            tid = (await create_thread(storage))["thread_id"]
            await calls(tid)
            fields = {"values": {"docs": ["x" * 5000], "notes": "a"}, "interrupts": {}, "status": "idle"}
            assert await storage.store_thread_state(tid, fields)
            assert await storage.store_thread_state(tid, {**fields, "values": {"notes": "b"}})
            stored = await storage.get_thread(tid)
            assert stored is not None and ts(stored["state_updated_at"]) == ts(stored["updated_at"])
            assert await storage.update_thread(tid, {"metadata": {"k": 1}})
            assert await calls(tid) == []
            stored = await storage.get_thread(tid)
            assert stored is not None and stored["values"] == {"notes": "b"} and stored["expires_at"] is None
            # A write of the values that stamps nothing is still stamped (the metadata's update moved
            # `updated_at` alone).
            await other.execute("UPDATE threads SET \"values\" = '{\"n\": 2}' WHERE thread_id = ?", (tid,))
            assert await calls(tid) == ["threads_state_updated"]
            written = await storage.get_thread(tid)
            assert written is not None
            assert ts(written["state_updated_at"]) == ts(written["updated_at"]) > ts(stored["state_updated_at"])
            # A thread with a TTL: its expiry moves with each write.
            timed = await create_thread(storage, ttl_minutes=5)
            await calls(timed["thread_id"])
            assert await storage.store_thread_state(timed["thread_id"], fields)
            assert await calls(timed["thread_id"]) == ["threads_expiry"]
            moved = await storage.get_thread(timed["thread_id"])
            assert moved is not None and ts(moved["expires_at"]) == ts(moved["updated_at"]) + timedelta(minutes=5)
        finally:
            for name, body in bodies:
                await define(name, body)


async def _skip_unless_lz4(database_url: str, why_not_sqlite: str) -> None:
    """Skip on SQLite (`why_not_sqlite`), and on a PostgreSQL built without lz4."""
    if database_url.startswith("sqlite:"):
        pytest.skip(why_not_sqlite)
    async with OtherConnection(database_url) as other:
        try:
            await other.execute("CREATE TEMP TABLE lz4_probe (v bytea COMPRESSION lz4)")
        except psycopg.errors.FeatureNotSupported:
            pytest.skip("this PostgreSQL was built without lz4")


async def test_what_every_run_writes_whole_is_compressed_with_lz4(storage: Storage, database_url: str) -> None:
    """A thread run's output and its thread's values are the whole state (1 MB for a large one), written by every
    run: on PostgreSQL both are compressed with lz4 where the server has it, not pglz, which took most of its time
    for such a run (migrations 0014 and 0016, and since 0019 changed their type, `postgres._LZ4_COLUMNS` at every
    start; bench/README.md)."""
    await _skip_unless_lz4(database_url, "SQLite stores the JSON text as it is")
    thread = await create_thread(storage)
    run = await enqueue(storage, thread["thread_id"])
    await storage.claim_run("w1", 30)
    state = {"documents": [{"id": i, "text": "the quick brown fox jumps over the lazy dog " * 40} for i in range(50)]}
    assert await storage.finish_run(run["run_id"], "success", output=state, worker_id="w1", attempt=1,
                                    thread_changes={"values": state, "interrupts": {}, "status": "idle",
                                                    "error": None})
    async with OtherConnection(database_url) as other:
        assert await other.execute("SELECT pg_column_compression(output) FROM runs WHERE run_id = ?",
                                   (run["run_id"],)) == [("lz4",)]
        assert await other.execute('SELECT pg_column_compression("values") FROM threads WHERE thread_id = ?',
                                   (thread["thread_id"],)) == [("lz4",)]
    stored = await storage.get_run(run["run_id"])
    assert stored is not None and stored["output"] == state


async def test_a_postgres_database_from_before_json_values_is_upgraded(database_url: str) -> None:
    """PostgreSQL only: a database that migrations 0001-0018 made, holding a thread's values and a run's output as
    jsonb (and the patch's `values_checkpoint_id`), is upgraded when opened (0019: both `json`). What it held
    reads back the same (the keys in the order jsonb kept them), parsed and as text; a search by values finds
    the thread; a run's end (the function 0019 made again with a `json` output, and by its older signature, which
    workers of the older version call during an upgrade) and a state write work; both columns are lz4 again
    where the server has it."""
    if database_url.startswith("sqlite:"):
        pytest.skip("SQLite's JSON columns were always text")
    name = owned_name(DB_PREFIX, "_")
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = database_url.rsplit("/", 1)[0] + f"/{name}"
    tid, done, pending = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    values = {"zeta": 1, "a": [1, "é", None], "big": 2**62}
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(MIGRATIONS_TABLE)
            for migration, script in pending_migrations("postgres", set()):
                if migration >= "0019":
                    break
                await conn.execute(script, prepare=False)
                await conn.execute("INSERT INTO threadline_migrations VALUES (%s, %s)", (migration, now_iso()))
            await conn.execute('INSERT INTO threads (thread_id, "values", values_checkpoint_id, created_at, '
                               "updated_at) VALUES (%s, %s::jsonb, 'c1', now(), now())",
                               (tid, orjson.dumps(values).decode()))
            for run_id, status, output in ((done, "success", values), (pending, "pending", None)):
                await conn.execute("INSERT INTO runs (run_id, thread_id, assistant_id, status, available_at, output, "
                                   "created_at, updated_at) "
                                   "VALUES (%s, %s, 'agent', %s, now(), %s::jsonb, now(), now())",
                                   (run_id, tid, status, None if output is None else orjson.dumps(output).decode()))
        storage = await open_storage(url)
        try:
            assert "0019_values_and_output_json.sql" in storage.applied_migrations
            thread = await storage.get_thread(tid)
            assert thread is not None and thread["values"] == values and "values_checkpoint_id" not in thread
            assert list(thread["values"]) == ["a", "big", "zeta"]  # jsonb's order, as it was stored
            as_text = await storage.get_thread(tid, values="text")
            assert as_text is not None and orjson.loads(orjson.dumps(as_text["values"])) == values
            found = await storage.search_threads(ids=None, metadata=None, values={"zeta": 1}, status=None, limit=10,
                                                 offset=0, sort_by="created_at", sort_order="desc")
            assert [t["thread_id"] for t in found] == [tid]
            assert (await storage.get_run(done))["output"] == values
            assert (await storage.claim_run("w1", 30))["run_id"] == pending
            assert await storage.finish_run(pending, "success", output={"n": 2}, worker_id="w1", attempt=1,
                                            thread_changes={"values": {"n": 2}, "interrupts": {}, "status": "idle",
                                                            "error": None})
            assert (await storage.get_run(pending))["output"] == {"n": 2}
            async with OtherConnection(url) as other:  # a worker of the older version ends its run, as it did
                await other.execute("UPDATE runs SET status = 'running' WHERE run_id = ?", (done,))
                await other.execute("SELECT * FROM threadline_finish_run(?, 'success', NULL, CAST(? AS jsonb), "
                                    "NULL, NULL)", (done, '{"n": 3}'))
            assert (await storage.get_run(done))["output"] == {"n": 3}
            assert (await storage.get_thread(tid))["values"] == {"n": 2}
            assert await storage.store_thread_state(tid, {"values": values, "interrupts": {}, "status": "idle"})
            assert list((await storage.get_thread(tid))["values"]) == list(values)  # written now: the state's order
        finally:
            await storage.close()
        async with OtherConnection(url) as other:
            kinds = await other.execute("SELECT attrelid::regclass::text, atttypid::regtype::text FROM pg_attribute "
                                        "WHERE (attrelid, attname) IN (('threads'::regclass, 'values'), "
                                        "('runs'::regclass, 'output')) ORDER BY 1")
            assert kinds == [("runs", "json"), ("threads", "json")]
        await _skip_unless_lz4(url, "")
        async with OtherConnection(url) as other:
            compression = await other.execute("SELECT attcompression FROM pg_attribute WHERE (attrelid, attname) IN "
                                              "(('threads'::regclass, 'values'), ('runs'::regclass, 'output'))")
            assert compression == [("l",), ("l",)]
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_an_sqlite_database_from_before_the_in_place_stamp_is_upgraded(tmp_path: Path) -> None:
    """SQLite only (PostgreSQL's stamp was always set in the written row, by a BEFORE trigger): a database the
    migrations before `0012_thread_state_stamped_in_place.sql` made, with a thread in it, is upgraded when
    opened, and its thread's state is then written once and stamped."""
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    await (await open_storage(url)).close()
    old = sqlite3.connect(path, isolation_level=None)  # back to the trigger 0008 made, 0012 not applied
    old.execute("DROP TRIGGER threads_state_updated_on_update")
    old.execute('CREATE TRIGGER threads_state_updated_on_update AFTER UPDATE OF "values", interrupts ON threads '
                "BEGIN UPDATE threads SET state_updated_at = NEW.updated_at WHERE thread_id = NEW.thread_id; END")
    old.execute("DELETE FROM threadline_migrations WHERE name = '0012_thread_state_stamped_in_place.sql'")
    stamp = now_iso()
    old.execute("INSERT INTO threads (thread_id, created_at, updated_at) VALUES ('t', ?, ?)", (stamp, stamp))
    old.close()
    storage = await open_storage(url)
    try:
        assert "0012_thread_state_stamped_in_place.sql" in storage.applied_migrations
        async with OtherConnection(url) as other:
            await count_row_writes(other)
            assert await storage.store_thread_state("t", {"values": {"n": 1}, "interrupts": {}, "status": "idle"})
            assert await other.count("row_writes", "t") == 1
        stored = await storage.get_thread("t")
        assert stored is not None and stored["values"] == {"n": 1}
        assert ts(stored["state_updated_at"]) == ts(stored["updated_at"]) > ts(stamp)
    finally:
        await storage.close()


def _lines_graph(checkpointer: Any) -> Any:
    """A one-node graph whose state is a list of lines, a non-primitive value: held apart on both backends
    (LangGraph's PostgreSQL saver keeps strings and numbers inline in the checkpoint)."""
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    class Lines(TypedDict, total=False):
        lines: list[str]

    def answer(state: Lines) -> Lines:
        return {"lines": [*state.get("lines", []), "and the answer"]}

    return StateGraph(Lines).add_node("answer", answer).add_edge(START, "answer").compile(checkpointer=checkpointer)


async def test_a_checkpoints_large_values_and_writes_are_compressed_with_lz4(storage: Storage,
                                                                           database_url: str) -> None:
    """A long conversation's messages (1 MB) are stored again by every step that adds one, in LangGraph's
    `checkpoint_blobs`, and the step's input in `checkpoint_writes`: on PostgreSQL both are compressed with lz4
    where the server has it (set after LangGraph's setup, once), not pglz, which cost PostgreSQL about 8 ms of CPU
    more per MB stored (bench/README.md, "Large state on SQLite, a long conversation, and lz4 ...")."""
    await _skip_unless_lz4(database_url, "SQLite stores the serialized bytes as they are")
    graph = _lines_graph(storage.checkpointer)
    tid = str(uuid.uuid4())
    lines = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(20_000)]  # 0.9 MB
    answered = await graph.ainvoke({"lines": lines}, {"configurable": {"thread_id": tid}})
    assert answered["lines"][-1] == "and the answer"
    async with OtherConnection(database_url) as other:
        blobs = await other.execute("SELECT pg_column_compression(blob) FROM checkpoint_blobs "
                                    "WHERE thread_id = ? AND channel = 'lines' AND length(blob) > 100000", (tid,))
        writes = await other.execute("SELECT pg_column_compression(blob) FROM checkpoint_writes "
                                     "WHERE thread_id = ? AND length(blob) > 100000", (tid,))
    assert blobs and set(blobs) == {("lz4",)}
    assert writes and set(writes) == {("lz4",)}


async def test_a_rolled_back_runs_large_values_go_with_its_checkpoints(storage: Storage, database_url: str) -> None:
    """A rollback deletes the run's checkpoints; the values they held apart (a long conversation's messages: a
    version per step) go too, on both backends, and the thread's other checkpoints keep theirs and read back."""
    graph = _lines_graph(storage.checkpointer)
    tid = str(uuid.uuid4())
    kept, gone = str(uuid.uuid4()), str(uuid.uuid4())
    lines = [f"the quick brown fox {i} jumps over the lazy dog" for i in range(2_000)]  # 90 KB

    async def held() -> list[tuple[Any, ...]]:
        async with OtherConnection(database_url) as other:
            rows = await other.execute("SELECT channel, version FROM checkpoint_blobs WHERE thread_id = ? "
                                       "AND channel = ?", (tid, "lines"))
        return sorted(tuple(r) for r in rows)

    await graph.ainvoke({"lines": lines}, {"configurable": {"thread_id": tid, "run_id": kept}})
    before = await held()
    assert before  # the value is large: held apart on both backends
    after_first = (await graph.aget_state({"configurable": {"thread_id": tid}})).values
    await graph.ainvoke({"lines": [*lines, "again"]}, {"configurable": {"thread_id": tid, "run_id": gone}})
    assert len(await held()) > len(before)
    await storage.delete_checkpoints_for_run(tid, gone)
    assert await held() == before
    assert (await graph.aget_state({"configurable": {"thread_id": tid}})).values == after_first


def _schema_of(path: Path, tables: tuple[str, ...]) -> set[tuple[str, str, str]]:
    """The indexes and triggers of `tables`, their SQL with whitespace and `IF NOT EXISTS` taken out."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT type, name, sql FROM sqlite_master WHERE type IN ('index', 'trigger') "
                          f"AND tbl_name IN ({', '.join('?' * len(tables))})", tables).fetchall()
    finally:
        db.close()
    return {(kind, name, " ".join((sql or "").replace("IF NOT EXISTS ", "").split())) for kind, name, sql in rows}


async def test_an_sqlite_database_from_before_large_columns_last_is_upgraded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite only: a database the migrations before `0015_large_columns_last.sql` made (a thread's `values` and a
    run's `output` in the middle of their rows) is rebuilt when opened: those columns last, every row as it was,
    the same indexes and triggers, working, and the run sequence going on past a deleted run's `seq`."""
    from threadline.storage import sql

    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    every = sql.pending_migrations
    monkeypatch.setattr(sql, "pending_migrations", lambda dialect, done: [
        (name, script) for name, script in every(dialect, done) if name != "0015_large_columns_last.sql"])
    storage = await open_storage(url)
    try:
        thread = await create_thread(storage, ttl_minutes=5.0, values={"documents": ["x" * 5000] * 3})
        runs = [await enqueue(storage, thread["thread_id"]) for _ in range(3)]
        assert await storage.delete_run(runs[-1]["run_id"])
    finally:
        await storage.close()
    old = sqlite3.connect(path)
    assert [c[1] for c in old.execute("PRAGMA table_info(threads)")].index("values") == 4
    tables = ("threads", "runs")
    before_rows = {table: old.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall() for table in tables}
    before_columns = {table: [c[1] for c in old.execute(f"PRAGMA table_info({table})")] for table in tables}
    old.close()
    before_schema = _schema_of(path, ("threads", "runs"))
    monkeypatch.setattr(sql, "pending_migrations", every)

    storage = await open_storage(url)
    try:
        assert storage.applied_migrations == ["0015_large_columns_last.sql"]
        assert _schema_of(path, ("threads", "runs")) == before_schema
        new = sqlite3.connect(path)
        for table, last in (("threads", "values"), ("runs", "output")):
            columns = [c[1] for c in new.execute(f"PRAGMA table_info({table})")]
            assert columns[-1] == last and sorted(columns) == sorted(before_columns[table])
            names = ", ".join(f'"{c}"' for c in before_columns[table])
            rows = new.execute(f"SELECT {names} FROM {table} ORDER BY 1").fetchall()
            assert rows == before_rows[table]
        new.close()
        stored = await storage.get_thread(thread["thread_id"])
        assert stored is not None and stored["values"] == {"documents": ["x" * 5000] * 3}
        assert await storage.update_thread(thread["thread_id"], {"metadata": {"k": 1}})
        updated = await storage.get_thread(thread["thread_id"])
        assert updated is not None and updated["expires_at"] > stored["expires_at"]  # the TTL trigger, made again
        later = await enqueue(storage, thread["thread_id"])
        new = sqlite3.connect(path)
        seqs = dict(new.execute("SELECT run_id, seq FROM runs").fetchall())
        new.close()
        assert seqs[later["run_id"]] == max(seqs[r["run_id"]] for r in runs[:-1]) + 2  # the deleted run's seq skipped
    finally:
        await storage.close()


async def test_cancelling_a_pending_run_leaves_a_running_one_alone(storage: Storage) -> None:
    running = await enqueue(storage)
    pending = await enqueue(storage, running["thread_id"])
    await storage.claim_run("w1", 30)
    assert await storage.cancel_pending_runs([running["run_id"], pending["run_id"]], "interrupted") == [
        pending["run_id"]]
    assert (await storage.get_run(running["run_id"]))["status"] == "running"
    assert (await storage.get_thread(running["thread_id"]))["status"] == "busy"


async def test_deleting_runs_reconciles_a_busy_thread_only(storage: Storage) -> None:
    run = await enqueue(storage)
    assert await storage.delete_run(run["run_id"]) and not await storage.delete_run(run["run_id"])
    assert (await storage.get_thread(run["thread_id"]))["status"] == "idle"
    waiting = await enqueue(storage)
    await storage.claim_run("w1", 30)
    await storage.finish_run(waiting["run_id"], "interrupted", worker_id="w1", attempt=1,
                             thread_changes={"status": "interrupted"})
    assert await storage.delete_run(waiting["run_id"])
    assert (await storage.get_thread(waiting["thread_id"]))["status"] == "interrupted"


async def test_a_finish_does_not_mark_idle_a_thread_that_just_got_a_run(database_url: str, storage: Storage) -> None:
    """Another program is enqueueing a second run on the thread while its first run finishes: it holds the
    thread's row (PostgreSQL) or the database's write lock (SQLite), not yet committed. The finish waits for
    it and then sees the new run: the thread stays busy."""
    first = await enqueue(storage)
    tid = first["thread_id"]
    assert (await storage.claim_run("w1", 30))["run_id"] == first["run_id"]
    async with OtherConnection(database_url) as other:
        await other.begin()
        await other.lock("threads", tid)
        await other.execute("INSERT INTO runs (run_id, thread_id, assistant_id, status, available_at, created_at, "
                            "updated_at) VALUES (?, ?, 'a', 'pending', ?, ?, ?)",
                            (str(uuid.uuid4()), tid, now_iso(), now_iso(), now_iso()))
        await other.execute("UPDATE threads SET status = 'busy' WHERE thread_id = ?", (tid,))
        finishing = asyncio.create_task(storage.finish_run(first["run_id"], "success", worker_id="w1", attempt=1))
        await other.until_waited_for(finishing)
        await other.commit()
    assert (await finishing)["status"] == "success"
    assert (await storage.get_thread(tid))["status"] == "busy"


# Recovery, leases, heartbeats.


async def test_recovery_takes_back_only_lapsed_leases_and_fails_runs_out_of_attempts(
        storage: Storage, peer: Storage) -> None:
    lapsed = await enqueue(storage)
    live = await enqueue(storage)
    assert (await storage.claim_run("w1", -1))["run_id"] == lapsed["run_id"]
    assert (await storage.claim_run("w1", 30))["run_id"] == live["run_id"]
    requeued, failed = await peer.recover_runs(1, expired_only=True)
    assert [r["run_id"] for r in requeued] == [lapsed["run_id"]] and failed == []
    back = await storage.get_run(lapsed["run_id"])
    assert (back["status"], back["attempt"], back["worker_id"], back["lease_expires_at"]) == ("pending", 1, None, None)
    assert (await storage.get_run(live["run_id"]))["status"] == "running"
    # Attempt 2 lapses too, and one attempt is all there is: the run fails with its thread.
    assert (await storage.claim_run("w2", -1))["attempt"] == 2
    requeued, failed = await peer.recover_runs(1, expired_only=True)
    assert requeued == [] and [r["run_id"] for r in failed] == [lapsed["run_id"]]
    assert failed[0]["status"] == "error" and failed[0]["error"]["error"] == "WorkerLost"
    ended = await storage.get_run(lapsed["run_id"])
    assert (ended["status"], ended["error"]["error"], ended["worker_id"]) == ("error", "WorkerLost", None)
    thread = await storage.get_thread(lapsed["thread_id"])
    assert thread["status"] == "error" and thread["error"]["error"] == "WorkerLost"
    assert (await storage.get_thread(live["thread_id"]))["status"] == "busy"


async def test_a_run_over_a_cap_writes_nothing_not_even_the_thread_it_would_create(storage: Storage) -> None:
    """The cap is checked with the insert and the commit (on PostgreSQL refused by the counting statement
    itself): a refused run leaves no run and no thread behind, and the message carries the counts."""
    queued = await enqueue(storage, quota=Quota("a", 5, 1))
    thread_id = str(uuid.uuid4())
    with pytest.raises(QuotaExceeded, match=r"\(1 active runs, the cap is 1\)"):
        await enqueue(storage, thread_id, quota=Quota("a", 0, 1))
    assert await storage.get_thread(thread_id) is None
    with pytest.raises(QuotaExceeded, match="Too many active runs for this client"):
        await enqueue(storage, thread_id, quota=Quota("a", 1, 0))
    mine = await enqueue(storage, thread_id, quota=Quota("b", 1, 2))
    assert mine["identity"] == "b" and (await storage.get_run(queued["run_id"]))["status"] == "pending"


async def test_a_claim_stamps_the_deadline_and_a_run_s_own_timeout_replaces_it(storage: Storage,
                                                                                  peer: Storage) -> None:
    """The claim stamps the run's deadline (the worker's default) in the same statement, so a start writes
    nothing of its own; the run's own timeout (its config's) replaces it; a retried run keeps its first
    start's; a run created claimed carries its deadline from its insert."""
    default, own = await enqueue(storage), await enqueue(storage)
    claimed = await storage.claim_run("w1", 30, 3600)
    assert claimed["run_id"] == default["run_id"] and claimed["deadline_at"] is not None
    assert 3500 < await storage.set_run_deadline(default["run_id"], 3600) <= 3600
    assert (await storage.get_run(default["run_id"]))["deadline_at"] == claimed["deadline_at"]
    assert (await storage.claim_run("w1", 30, 3600))["run_id"] == own["run_id"]
    assert 0 < await storage.set_run_deadline(own["run_id"], 60) <= 60  # its config's 60 s, not 3600
    assert await peer.set_run_deadline(own["run_id"], 3600) <= 60  # kept by another process: not pushed back
    # Its worker died: the retry's claim keeps the first start's deadline.
    lapsed = await enqueue(storage)
    first = await storage.claim_run("w1", -1, 60)
    assert first["run_id"] == lapsed["run_id"]
    await peer.recover_runs(5, expired_only=True)
    again = await peer.claim_run("w2", 30, 3600)
    assert (again["run_id"], again["attempt"], again["deadline_at"]) == (lapsed["run_id"], 2, first["deadline_at"])
    assert await peer.set_run_deadline(lapsed["run_id"], 3600) <= 60
    here = await enqueue(storage, claim_for=Claim("w1", 30, 120))
    assert here["status"] == "running" and here["deadline_at"] is not None
    assert 100 < await storage.set_run_deadline(here["run_id"], 120) <= 120
    unlimited = await enqueue(storage)
    assert (await storage.claim_run("w1", 30, 0))["deadline_at"] is None and unlimited["deadline_at"] is None


async def test_a_run_keeps_its_first_deadline_and_ends_timeout_once_it_passed_without_a_worker(
        storage: Storage, peer: Storage) -> None:
    """Limits (issue 16): the deadline is set once (a retried run keeps its first start's); a lapsed run past it
    ends `timeout` with its thread `error`, attempts left or not, while one within it is queued again."""
    late = await enqueue(storage)
    timely = await enqueue(storage)
    assert (await storage.claim_run("w1", -1))["run_id"] == late["run_id"]
    assert (await storage.claim_run("w1", -1))["run_id"] == timely["run_id"]
    assert await storage.set_run_deadline(late["run_id"], 0.0) <= 0
    assert await storage.set_run_deadline(late["run_id"], 3600) <= 0  # kept: not pushed back
    assert 3500 < await storage.set_run_deadline(timely["run_id"], 3600) <= 3600
    requeued, failed = await peer.recover_runs(5, expired_only=True)
    assert [r["run_id"] for r in requeued] == [timely["run_id"]]
    assert [(r["run_id"], r["status"], r["error"]["error"]) for r in failed] == [
        (late["run_id"], "timeout", "TimeoutError")]
    assert all("past_deadline" not in r for r in requeued + failed)
    ended = await storage.get_run(late["run_id"])
    assert (ended["status"], ended["error"]["error"], ended["worker_id"]) == ("timeout", "TimeoutError", None)
    thread = await storage.get_thread(late["thread_id"])
    assert thread["status"] == "error" and thread["error"]["error"] == "TimeoutError"
    assert (await storage.get_run(timely["run_id"]))["status"] == "pending"


async def test_recovery_at_start_takes_back_every_running_run(storage: Storage) -> None:
    """The one-process backend at start: every `running` run was the dead process's, leased or not; a thread
    left busy with no active run (a crash between writes) becomes idle."""
    runs = [await enqueue(storage) for _ in range(2)]
    await storage.claim_run("w1", 3600)
    await storage.claim_run("w1", 3600)
    stray = await create_thread(storage)
    await storage.update_thread(stray["thread_id"], {"status": "busy"})
    requeued, failed = await storage.recover_runs(1, expired_only=False)
    assert sorted(r["run_id"] for r in requeued) == sorted(r["run_id"] for r in runs) and failed == []
    assert [(await storage.get_run(r["run_id"]))["status"] for r in runs] == ["pending", "pending"]
    assert (await storage.get_thread(stray["thread_id"]))["status"] == "idle"
    assert (await storage.get_thread(runs[0]["thread_id"]))["status"] == "busy"


async def test_a_heartbeat_keeps_a_lease_only_for_its_holder(storage: Storage, peer: Storage) -> None:
    run = await enqueue(storage)
    other = await enqueue(storage)
    await storage.claim_run("w1", -1)
    await storage.claim_run("w1", 30)
    before = datetime.now(UTC)
    assert await storage.heartbeat_runs("w1", {run["run_id"]: 1, other["run_id"]: 1}, 60) == {
        run["run_id"], other["run_id"]}
    extended = await storage.get_run(run["run_id"])
    assert ts(extended["lease_expires_at"]) - before > timedelta(seconds=59)
    assert await peer.recover_runs(1, expired_only=True) == ([], [])  # the heartbeat renewed the lapsed lease
    assert await storage.heartbeat_runs("w2", {run["run_id"]: 1}, 60) == set()  # not w2's
    assert await storage.heartbeat_runs("w1", {}, 60) == set()
    await storage.finish_run(other["run_id"], "success", worker_id="w1", attempt=1)
    assert await storage.heartbeat_runs("w1", {run["run_id"]: 1, other["run_id"]: 1}, 60) == {run["run_id"]}


async def test_a_heartbeat_for_an_older_attempt_extends_nothing(
        storage: Storage) -> None:
    """A worker that lost attempt 1 and then claimed the same run again (attempt 2) sends a heartbeat that
    still names attempt 1: it is not reported held, and it must not renew attempt 2's lease either."""
    run = await enqueue(storage)
    await storage.claim_run("w1", -1)
    await storage.recover_runs(2, expired_only=True)
    again = await storage.claim_run("w1", 5)
    assert again["attempt"] == 2
    assert await storage.heartbeat_runs("w1", {run["run_id"]: 1}, 3600) == set()
    assert (await storage.get_run(run["run_id"]))["lease_expires_at"] == again["lease_expires_at"]


async def test_a_released_run_goes_back_ahead_of_later_runs(storage: Storage) -> None:
    first = await enqueue(storage)
    second = await enqueue(storage)
    await storage.claim_run("w1", 30)
    assert await storage.release_runs("w1", {first["run_id"]: 1, "no-such-run": 1}) == [first["run_id"]]
    assert await storage.release_runs("w1", {}) == []
    assert (await storage.claim_run("w2", 30))["run_id"] == first["run_id"]
    assert (await storage.claim_run("w2", 30))["run_id"] == second["run_id"]


# What a delete takes with it.


async def test_deleting_a_thread_deletes_its_runs_checkpoints_and_events(storage: Storage) -> None:
    run = await enqueue(storage)
    kept = await enqueue(storage)
    for r in (run, kept):
        await put_checkpoint(storage, r["thread_id"], r["run_id"])
        await storage.append_thread_events(r["thread_id"], r["run_id"], [NewThreadEvent("m", "values", "[]", "{}")])
    assert await storage.delete_thread(run["thread_id"])
    assert await storage.get_thread(run["thread_id"]) is None
    assert await storage.get_run(run["run_id"]) is None
    assert not await has_checkpoints(storage, run["thread_id"])
    assert await storage.thread_event_bounds(run["thread_id"]) == (0, 0)
    assert not await storage.delete_thread(run["thread_id"])
    # Another thread keeps everything.
    assert await storage.get_run(kept["run_id"]) is not None and await has_checkpoints(storage, kept["thread_id"])
    assert await storage.thread_event_bounds(kept["thread_id"]) == (1, 1)
    # A thread made again under the same id starts empty.
    await create_thread(storage, run["thread_id"])
    assert not await has_checkpoints(storage, run["thread_id"])
    assert await storage.search_runs(thread_id=run["thread_id"], assistant_id=None, status=None, metadata=None,
                                     limit=10, offset=0) == []


async def test_a_stateless_runs_finish_deletes_its_thread_and_keeps_the_run(storage: Storage) -> None:
    run = await enqueue(storage)
    await put_checkpoint(storage, run["thread_id"], run["run_id"])
    await storage.claim_run("w1", 30)
    finished = await storage.finish_run(run["run_id"], "success", worker_id="w1", attempt=1, output={"n": 1},
                                        delete_thread=True)
    assert finished["status"] == "success"
    assert await storage.get_thread(run["thread_id"]) is None
    assert not await has_checkpoints(storage, run["thread_id"])
    assert (await storage.get_run(run["run_id"]))["output"] == {"n": 1}


async def test_a_thread_and_its_checkpoints_go_in_one_transaction(
        database_url: str, storage: Storage) -> None:
    """While a thread's delete waits on another transaction, a reader sees the thread with its checkpoints or
    neither: never the thread gone and its checkpoints left (which a thread made again under that id would
    inherit, if the second step failed)."""
    thread = await create_thread(storage)
    tid = thread["thread_id"]
    await put_checkpoint(storage, tid)
    async with OtherConnection(database_url) as other, OtherConnection(database_url) as reader:
        await other.begin()
        await other.lock("checkpoints", tid)
        deleting = asyncio.create_task(storage.delete_thread(tid))
        try:
            await other.until_waited_for(deleting)
            seen = (await reader.count("threads", tid), await reader.count("checkpoints", tid))
        finally:
            await other.rollback()
            assert await deleting
        assert seen[0] == 1 and seen[1] > 0, f"mid-delete: {seen[0]} thread row(s), {seen[1]} checkpoint(s)"
    assert (await reader_counts(database_url, tid)) == (0, 0)


async def reader_counts(url: str, thread_id: str) -> tuple[int, int]:
    async with OtherConnection(url) as reader:
        return await reader.count("threads", thread_id), await reader.count("checkpoints", thread_id)


async def test_deleting_an_assistant_deletes_its_versions(storage: Storage) -> None:
    await create_assistant(storage, "a1")
    await storage.update_assistant("a1", {"name": "renamed"})
    await create_assistant(storage, "a2")

    async def versions(assistant_id: str) -> list[int]:
        rows = await storage.list_assistant_versions(assistant_id, metadata=None, limit=10, offset=0)
        return [r["version"] for r in rows]

    assert await versions("a1") == [2, 1]
    assert await storage.delete_assistant("a1") and not await storage.delete_assistant("a1")
    assert await storage.get_assistant("a1") is None and await versions("a1") == []
    # Made again under the same id, it starts at version 1 with no history.
    await create_assistant(storage, "a1")
    assert await versions("a1") == [1] and await versions("a2") == [1]


async def test_ensure_assistants_stores_what_create_assistant_does_and_keeps_what_is_stored(storage: Storage) -> None:
    """`ensure_assistants` (the system assistants at every start, in one transaction) stores each row as
    `create_assistant(row, if_exists="do_nothing")` does, one transaction each: the same rows under other ids,
    written both ways, read back the same; an id stored already (here at version 2) is left as it is."""
    stored = await create_assistant(storage, "e-kept")
    kept = await storage.update_assistant("e-kept", {"name": "renamed"})
    kept_versions = await storage.list_assistant_versions("e-kept", metadata=None, limit=10, offset=0)
    rows: list[Any] = []
    for i, name in enumerate(["one", "two", "three"]):
        now = now_iso()
        rows.append({"assistant_id": f"e-{i}", "graph_id": f"graph-{i}", "name": name, "description": None,
                     "config": {"configurable": {"i": i}}, "context": {"i": i}, "metadata": {"created_by": "system"},
                     "version": 1, "created_at": now, "updated_at": now})
    rows.insert(1, {**rows[0], "assistant_id": "e-kept", "name": "not written"})
    copies = [cast("AssistantRecord", {**row, "assistant_id": "c" + row["assistant_id"]})
              for row in rows if row["assistant_id"] != "e-kept"]
    one_by_one = [await storage.create_assistant(row, if_exists="do_nothing") for row in copies]

    ensured = await storage.ensure_assistants(rows)
    assert [a["assistant_id"] for a in ensured] == ["e-0", "e-kept", "e-1", "e-2"]
    assert ensured[1] == kept and kept["version"] == 2 and kept["created_at"] == stored["created_at"]
    assert await storage.list_assistant_versions("e-kept", metadata=None, limit=10, offset=0) == kept_versions
    made = [a for a in ensured if a["assistant_id"] != "e-kept"]
    assert [{**a, "assistant_id": "c" + a["assistant_id"]} for a in made] == one_by_one
    for ours, theirs in zip(made, one_by_one, strict=True):
        assert ours == await storage.get_assistant(ours["assistant_id"])
        versions = await storage.list_assistant_versions(ours["assistant_id"], metadata=None, limit=10, offset=0)
        reference = await storage.list_assistant_versions(theirs["assistant_id"], metadata=None, limit=10, offset=0)
        assert [{**v, "assistant_id": "c" + v["assistant_id"]} for v in versions] == reference
        assert [(v["version"], v["created_at"]) for v in versions] == [(1, ours["created_at"])]
    # Again: nothing is written, each is returned as stored.
    assert await storage.ensure_assistants(rows) == ensured
    assert await storage.ensure_assistants([]) == []


# Search order and paging: the same on every backend.

THREAD_IDS = ["t-5", "t-2", "t-7", "t-1", "t-4", "t-6", "t-3"]  # inserted in this order, not the ids' order


async def _threads_with_ties(storage: Storage) -> None:
    """Seven threads: created at three instants (ties), two statuses."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for i, thread_id in enumerate(THREAD_IDS):
        moment = iso(base + timedelta(seconds=i % 3))
        await create_thread(storage, thread_id, created_at=moment, updated_at=moment,
                            status="idle" if i % 2 else "busy", metadata={"n": i})


def _expected(sort_by: str, sort_order: str) -> list[str]:
    """Sorted by the key, ties broken by the id, both in the order asked."""
    base = datetime(2026, 1, 1, tzinfo=UTC)
    def key(i: int, tid: str) -> tuple[str, str]:
        if sort_by in ("created_at", "updated_at"):
            return iso(base + timedelta(seconds=i % 3)), tid
        if sort_by == "status":
            return ("idle" if i % 2 else "busy"), tid
        return tid, tid

    keys = {tid: key(i, tid) for i, tid in enumerate(THREAD_IDS)}
    return sorted(THREAD_IDS, key=keys.__getitem__, reverse=sort_order == "desc")


async def _search_threads(storage: Storage, *, limit: int = 100, offset: int = 0, **kwargs: Any) -> list[str]:
    rows = await storage.search_threads(**{"ids": None, "metadata": None, "values": None, "status": None,
                                           "sort_by": "created_at", "sort_order": "desc", **kwargs},
                                        limit=limit, offset=offset)
    return [r["thread_id"] for r in rows]


@pytest.mark.parametrize("sort_order", ["asc", "desc"])
async def test_threads_sort_by_a_unique_key_and_page(storage: Storage, sort_order: str) -> None:
    await _threads_with_ties(storage)
    everything = await _search_threads(storage, sort_by="thread_id", sort_order=sort_order)
    assert everything == _expected("thread_id", sort_order)
    pages = [await _search_threads(storage, sort_by="thread_id", sort_order=sort_order, limit=2, offset=o)
             for o in range(0, 8, 2)]
    assert [t for page in pages for t in page] == everything and pages[-1] == everything[6:]
    assert await _search_threads(storage, limit=5, offset=7) == []


@pytest.mark.parametrize("sort_by", ["created_at", "updated_at", "status"])
@pytest.mark.parametrize("sort_order", ["asc", "desc"])
async def test_threads_with_equal_sort_keys_are_ordered_by_id(
        storage: Storage, sort_by: str, sort_order: str) -> None:
    """Ties in the sort key are broken by the thread id in the same direction, so that pages neither repeat
    nor skip a thread and every backend lists the same order."""
    await _threads_with_ties(storage)
    assert await _search_threads(storage, sort_by=sort_by, sort_order=sort_order) == _expected(sort_by, sort_order)


async def test_thread_pages_neither_repeat_nor_skip_with_ties(storage: Storage) -> None:
    await _threads_with_ties(storage)
    for sort_by in ("created_at", "status"):
        everything = await _search_threads(storage, sort_by=sort_by)
        pages = [t for o in range(0, 7, 3) for t in await _search_threads(storage, sort_by=sort_by, limit=3, offset=o)]
        assert pages == everything and sorted(pages) == sorted(THREAD_IDS)


async def test_thread_filters_and_counts_agree(storage: Storage) -> None:
    await _threads_with_ties(storage)
    assert await _search_threads(storage, status="busy", sort_by="thread_id", sort_order="asc") == [
        "t-3", "t-4", "t-5", "t-7"]
    assert await storage.count_threads(metadata=None, values=None, status="busy") == 4
    assert await _search_threads(storage, metadata={"n": 3}) == ["t-1"]
    assert await storage.count_threads(metadata={"n": 3}, values=None, status=None) == 1
    assert await _search_threads(storage, ids=["t-1", "t-2", "nope"], sort_by="thread_id", sort_order="asc") == [
        "t-1", "t-2"]
    await storage.update_thread("t-2", {"values": {"topic": {"a": 1, "b": [1, 2]}}})
    assert await _search_threads(storage, values={"topic": {"a": 1, "b": [1, 2]}}) == ["t-2"]
    assert await storage.count_threads(metadata=None, values={"topic": {"a": 1}}, status=None) == 0


async def test_a_json_filter_ignores_the_order_of_keys(
        storage: Storage) -> None:
    """A metadata filter on an object matches the same object written with its keys in another order (JSON
    objects have no order; PostgreSQL's jsonb compares them so)."""
    thread = await create_thread(storage, metadata={"owner": {"a": 1, "b": 2}})
    assert await _search_threads(storage, metadata={"owner": {"b": 2, "a": 1}}) == [thread["thread_id"]]


async def test_assistants_sort_page_and_break_ties_by_id(
        storage: Storage) -> None:
    moment = now_iso()
    for assistant_id in ("a-3", "a-1", "a-2"):
        await create_assistant(storage, assistant_id, created_at=moment, updated_at=moment)

    async def listed(**kwargs: Any) -> list[str]:
        rows = await storage.search_assistants(**{"graph_id": None, "name": None, "metadata": None, "limit": 10,
                                                  "offset": 0, "sort_by": "created_at", "sort_order": "desc",
                                                  **kwargs})
        return [r["assistant_id"] for r in rows]

    assert await listed(sort_by="assistant_id", sort_order="asc") == ["a-1", "a-2", "a-3"]
    assert await listed(sort_by="assistant_id", sort_order="desc", limit=1, offset=1) == ["a-2"]
    assert await storage.count_assistants(graph_id="agent", name="a-", metadata=None) == 3
    assert await listed(sort_order="asc") == ["a-1", "a-2", "a-3"]
    assert await listed(sort_order="desc") == ["a-3", "a-2", "a-1"]


async def test_runs_list_newest_first_and_page(storage: Storage) -> None:
    first = await enqueue(storage)
    runs = [first] + [await enqueue(storage, first["thread_id"]) for _ in range(4)]
    await enqueue(storage)  # another thread's

    async def listed(limit: int, offset: int, **kwargs: Any) -> list[str]:
        rows = await storage.search_runs(**{"thread_id": first["thread_id"], "assistant_id": None, "status": None,
                                            "metadata": None, **kwargs}, limit=limit, offset=offset)
        return [r["run_id"] for r in rows]

    newest_first = [r["run_id"] for r in reversed(runs)]
    assert await listed(10, 0) == newest_first
    assert await listed(2, 0) + await listed(2, 2) + await listed(2, 4) == newest_first
    await storage.claim_run("w1", 30)
    assert await listed(10, 0, status="running") == [first["run_id"]]
    assert await storage.last_run_seq(first["thread_id"]) == runs[-1]["seq"]
    assert (await storage.next_run(first["thread_id"], runs[1]["seq"]))["run_id"] == runs[2]["run_id"]


# Thread TTL.


def expires_a_minute_after_update(thread: ThreadRecord) -> bool:
    """`expires_at` is `updated_at` plus the TTL. SQLite keeps `expires_at` rounded to the millisecond (its
    `strftime('%f')`), PostgreSQL to the microsecond: compared at SQLite's precision."""
    off = ts(thread["expires_at"]) - ts(thread["updated_at"]) - timedelta(minutes=1)
    return abs(off) <= timedelta(microseconds=500)


async def test_an_expired_thread_is_swept_with_what_it_holds(storage: Storage) -> None:
    thread = await create_thread(storage, ttl_minutes=1)
    assert expires_a_minute_after_update(thread)
    forever = await create_thread(storage)
    assert forever["expires_at"] is None
    run = await enqueue(storage, thread["thread_id"])
    await put_checkpoint(storage, thread["thread_id"], run["run_id"])
    busy = await enqueue(storage, thread_ttl_minutes=1)
    assert (await storage.get_thread(busy["thread_id"]))["expires_at"] is not None
    assert await storage.delete_expired_threads(limit=10) == []  # not yet
    assert await storage.delete_expired_threads(limit=10, now=later(minutes=2)) == []  # each has a pending run
    await storage.claim_run("w1", 30)
    await storage.finish_run(run["run_id"], "success", worker_id="w1", attempt=1)
    assert await storage.delete_expired_threads(limit=10, now=later(minutes=2)) == [thread["thread_id"]]
    assert await storage.get_thread(thread["thread_id"]) is None and await storage.get_run(run["run_id"]) is None
    assert not await has_checkpoints(storage, thread["thread_id"])
    assert await storage.get_thread(forever["thread_id"]) is not None
    assert await storage.get_thread(busy["thread_id"]) is not None


async def test_an_update_pushes_the_expiry_back(storage: Storage) -> None:
    thread = await create_thread(storage, ttl_minutes=1)
    await asyncio.sleep(0.01)
    updated = await storage.update_thread(thread["thread_id"], {}, merge_metadata={"k": 1})
    assert ts(updated["expires_at"]) > ts(thread["expires_at"])
    assert expires_a_minute_after_update(updated)
    assert await storage.delete_expired_threads(limit=10, now=iso(ts(updated["expires_at"]) - timedelta(
        milliseconds=5))) == []


async def test_concurrent_sweeps_take_each_thread_once_and_respect_the_limit(storage: Storage, peer: Storage) -> None:
    ids = {(await create_thread(storage, ttl_minutes=1))["thread_id"] for _ in range(6)}
    now = later(minutes=2)
    assert len(await storage.delete_expired_threads(limit=2, now=now)) == 2
    swept = await asyncio.gather(*(s.delete_expired_threads(limit=2, now=now) for s in (storage, peer) * 2))
    taken = [t for batch in swept for t in batch]
    assert len(taken) == len(set(taken)) == 4 and set(taken) < ids
    assert await storage.count_threads(metadata=None, values=None, status=None) == 0



async def test_an_assistant_name_filter_ignores_case_beyond_ascii(
        storage: Storage) -> None:
    await create_assistant(storage, "a1", name="Ärger Agent")
    assert await storage.count_assistants(graph_id=None, name="ärger", metadata=None) == 1
    assert await storage.count_assistants(graph_id=None, name="AGENT", metadata=None) == 1


async def test_an_authorization_filter_is_part_of_the_thread_queries(storage: Storage) -> None:
    """`filters` (what an `@auth.on` handler returns) narrows get, search and count inside the query: pages
    stay full, counts are right, and an excluded thread is None, as a missing one."""
    alice = [await create_thread(storage, metadata={"owner": "alice", "team": ["red", "blue"], "n": i})
             for i in range(3)]
    bob = await create_thread(storage, metadata={"owner": "bob", "team": ["blue"]})
    await create_thread(storage, metadata={"owner": "carol", "team": "red"})  # a string, not a list
    mine = {"owner": "alice"}
    page: dict[str, Any] = dict(ids=None, metadata=None, values=None, status=None, sort_by="created_at",
                                sort_order="asc")
    found = await storage.search_threads(**page, limit=2, offset=0, filters=mine)
    assert [t["thread_id"] for t in found] == [t["thread_id"] for t in alice[:2]]
    rest = await storage.search_threads(**page, limit=2, offset=2, filters=mine)
    assert [t["thread_id"] for t in rest] == [alice[2]["thread_id"]]
    assert await storage.count_threads(metadata=None, values=None, status=None, filters=mine) == 3
    assert await storage.count_threads(metadata=None, values=None, status=None, filters={"owner": {"$eq": "bob"}}) == 1
    assert await storage.get_thread(bob["thread_id"], filters=mine) is None
    assert (await storage.get_thread(alice[0]["thread_id"], filters=mine))["thread_id"] == alice[0]["thread_id"]
    assert await storage.get_thread(alice[0]["thread_id"], filters={"owner": "alice", "n": 1}) is None
    blue = await storage.search_threads(**page, limit=10, offset=0, filters={"team": {"$contains": "blue"}})
    assert {t["thread_id"] for t in blue} == {*(t["thread_id"] for t in alice), bob["thread_id"]}
    both = {"team": {"$contains": ["blue", "red"]}}
    assert await storage.count_threads(metadata=None, values=None, status=None, filters=both) == 3
    red = await storage.count_threads(metadata=None, values=None, status=None, filters={"team": {"$contains": "red"}})
    assert red == 3  # carol's `team` is a string: $contains needs a list
    # With the request's own metadata filter too (ANDed).
    assert await storage.count_threads(metadata={"n": 0}, values=None, status=None, filters=mine) == 1


@pytest.mark.parametrize("bad", [{"owner": {"$ne": "x"}}, {"owner": ["a"]}, {"owner": {"$contains": []}},
                                 {"owner": {"$eq": "a", "$contains": "b"}}])
async def test_a_filter_that_cannot_be_applied_is_refused(storage: Storage, bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        await storage.count_threads(metadata=None, values=None, status=None, filters=bad)


async def test_an_authorization_filter_is_part_of_the_assistant_cron_and_run_queries(storage: Storage) -> None:
    """Assistants and crons are filtered on their own metadata; runs on their thread's (a run is its thread's),
    each inside the query, as threads are."""
    mine, theirs = {"owner": "alice"}, {"owner": "bob"}
    ours = await create_assistant(storage, str(uuid.uuid4()), metadata=mine)
    other = await create_assistant(storage, str(uuid.uuid4()), metadata=theirs)
    assert (await storage.get_assistant(ours["assistant_id"], filters=mine))["assistant_id"] == ours["assistant_id"]
    assert await storage.get_assistant(other["assistant_id"], filters=mine) is None
    page: dict[str, Any] = dict(graph_id=None, name=None, metadata=None, limit=10, offset=0, sort_by="created_at",
                                sort_order="asc")
    assert [a["assistant_id"] for a in await storage.search_assistants(**page, filters=mine)] == [ours["assistant_id"]]
    assert await storage.count_assistants(graph_id=None, name=None, metadata=None, filters=theirs) == 1
    assert await storage.count_assistants(graph_id=None, name=None, metadata=None) == 2

    alice_thread = await create_thread(storage, metadata=mine)
    bob_thread = await create_thread(storage, metadata=theirs)
    alice_run = await enqueue(storage, alice_thread["thread_id"], create=False)
    await enqueue(storage, bob_thread["thread_id"], create=False)
    runs: dict[str, Any] = dict(thread_id=None, assistant_id=None, status=None, metadata=None, limit=10, offset=0)
    assert [r["run_id"] for r in await storage.search_runs(**runs, thread_filters=mine)] == [alice_run["run_id"]]
    assert len(await storage.search_runs(**runs)) == 2
    assert await storage.search_runs(**{**runs, "thread_id": bob_thread["thread_id"]}, thread_filters=mine) == []

    now = now_iso()
    crons = []
    for owner, thread in ((mine, alice_thread), (theirs, bob_thread)):
        crons.append(await storage.create_cron({
            "cron_id": str(uuid.uuid4()), "assistant_id": ours["assistant_id"], "thread_id": thread["thread_id"],
            "user_id": owner["owner"], "auth_user": None, "schedule": "0 0 1 1 *", "timezone": None,
            "end_time": None, "enabled": True, "on_run_completed": None, "payload": {}, "metadata": owner,
            "next_run_date": later(days=30), "created_at": now, "updated_at": now, "identity": None}))
    assert (await storage.get_cron(crons[0]["cron_id"], filters=mine))["cron_id"] == crons[0]["cron_id"]
    assert await storage.get_cron(crons[1]["cron_id"], filters=mine) is None
    found = await storage.search_crons(assistant_id=None, thread_id=None, enabled=None, metadata=None, limit=10,
                                       offset=0, sort_by=None, sort_order=None, filters=theirs)
    assert [c["cron_id"] for c in found] == [crons[1]["cron_id"]]
    assert await storage.count_crons(assistant_id=None, thread_id=None, enabled=None, metadata=None,
                                     filters=mine) == 1
