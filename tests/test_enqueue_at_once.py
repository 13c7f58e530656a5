"""PostgreSQL's enqueue in one statement (`threadline_enqueue_run`, migration 0012) against the two-step script
SQLite's writer steps (`scripts.enqueue_run`, whose rule is `rules.plan_enqueue`): the same cases through both on
one database give the same runs, the same threads and the same refusals, so the rule written twice cannot drift
unseen."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.services import ScaleOut
from threadline.errors import ThreadlineError
from threadline.storage import open_storage
from threadline.storage.base import Claim, Quota, RunMetadata
from threadline.storage.postgres import PostgresStorage
from threadline.storage.records import NewRun
from threadline.storage.sql import now_iso

pytestmark = pytest.mark.integration

#: Columns that differ between two runs of the same case: ids, clocks, the queue's sequence; of the clocks that
#: may be unset, only whether they are set is compared.
VARYING = {"run_id", "thread_id", "seq", "created_at", "updated_at", "available_at"}
SET_OR_NOT = {"lease_expires_at", "deadline_at", "expires_at", "state_updated_at"}
MADE = RunMetadata({"base": 1, "k": "base"}, {"over": 2})


@pytest.fixture
async def storage(scaleout_services: ScaleOut) -> AsyncIterator[PostgresStorage]:
    opened = await open_storage(scaleout_services.fresh().database_url)
    assert isinstance(opened, PostgresStorage)
    try:
        yield opened
    finally:
        await opened.close()


def _run(thread_id: str, *, after_seconds: float = 0) -> NewRun:
    now = now_iso()
    later = datetime.now(UTC) + timedelta(seconds=after_seconds)
    available = later.isoformat(timespec="microseconds") if after_seconds else now
    return NewRun(run_id=str(uuid.uuid4()), thread_id=thread_id, assistant_id="agent", status="pending",
                  kwargs={"input": {"n": 1.5}}, metadata={"given": True}, multitask_strategy="enqueue",
                  available_at=available, created_at=now, updated_at=now)


#: (name, whether the thread exists before, how many active runs it has, enqueue_run's options, the run's delay)
CASES: list[tuple[str, bool, int, dict[str, Any], float]] = [
    ("creates its thread", False, 0, {"create_thread": True}, 0),
    ("creates its thread, metadata made", False, 0, {"create_thread": True, "run_metadata": MADE}, 0),
    ("on an existing thread, metadata made", True, 0, {"run_metadata": MADE}, 0),
    ("no such thread", False, 0, {}, 0),
    ("reject, thread free", True, 0, {"reject_if_active": True}, 0),
    ("reject, thread busy", True, 1, {"reject_if_active": True}, 0),
    ("queued behind an active run", True, 1, {}, 0),
    ("claimed at once", True, 0, {"claim_for": Claim("w", 30.0, 60.0)}, 0),
    ("claimed at once, no deadline", False, 0, {"create_thread": True, "claim_for": Claim("w", 30.0)}, 0),
    ("not claimed: the thread is busy", True, 1, {"claim_for": Claim("w", 30.0)}, 0),
    ("not claimed: not due yet", True, 0, {"claim_for": Claim("w", 30.0)}, 60),
    ("under both caps", True, 0, {"quota": Quota("alice", 2, 5)}, 0),
    ("under the queue's cap only", True, 0, {"quota": Quota("alice", 0, 5)}, 0),
    ("over the identity's cap", True, 1, {"quota": Quota("alice", 1, 5)}, 0),
    ("over the queue's cap", True, 1, {"quota": Quota(None, 0, 1)}, 0),
]


async def _case(storage: PostgresStorage, at_once: bool, exists: bool, active: int, options: dict[str, Any],
                after: float) -> tuple[Any, Any]:
    storage.enqueues_at_once = at_once
    thread_id = str(uuid.uuid4())
    base: dict[str, Any] = {"thread_metadata": {"graph_id": "agent"}, "create_thread": False, "reject_if_active": False,
            "thread_ttl_minutes": 5.0, "new_thread_metadata": {"k": "new"}}
    if exists:
        await storage.enqueue_run(_run(thread_id), **{**base, "create_thread": True})
        await storage.cancel_pending_runs([r["run_id"] for r in await storage.active_runs(thread_id)], "success")
        for _ in range(active):
            await storage.enqueue_run(_run(thread_id), **{**base, "quota": options.get("quota")})
    try:
        # Its thread metadata overrides the thread's (the run's metadata must take the thread's as it leaves it).
        run: Any = await storage.enqueue_run(_run(thread_id, after_seconds=after),
                                             **{**base, "thread_metadata": {"graph_id": "second"}, **options})
    except ThreadlineError as exc:  # the refusals: NotFound, Conflict, QuotaExceeded
        return (type(exc).__name__, str(exc).replace(thread_id, "<thread>")), None
    thread = await storage.get_thread(thread_id)
    assert thread is not None
    return _compared(run), _compared(thread)


def _compared(row: Any) -> dict[str, Any]:
    return {k: (v is not None if k in SET_OR_NOT else v) for k, v in row.items() if k not in VARYING}


@pytest.mark.parametrize(("name", "exists", "active", "options", "after"), CASES, ids=[c[0] for c in CASES])
async def test_one_statement_and_the_script_agree(storage: PostgresStorage, name: str, exists: bool, active: int,
                                                  options: dict[str, Any], after: float) -> None:
    script = await _case(storage, False, exists, active, options, after)
    for row in await storage.search_runs(thread_id=None, assistant_id=None, status=None, metadata=None,
                                         limit=1000, offset=0):
        await storage.delete_run(row["run_id"])  # the caps count from nothing again
    at_once = await _case(storage, True, exists, active, options, after)
    assert at_once == script
