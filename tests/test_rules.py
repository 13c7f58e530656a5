"""Unit tests of `threadline/storage/rules.py`: the queue's and the threads' decisions, as pure functions.

No database: each rule is given what a transaction would have read and says what it writes.
"""

from __future__ import annotations

from typing import Any

import pytest

from threadline.errors import Conflict, NotFound, QuotaExceeded
from threadline.storage.base import Quota, RunMetadata
from threadline.storage.rules import (
    next_assistant_version,
    plan_enqueue,
    quota_refusal,
    seconds_left,
    split_recovery,
    thread_status_changes,
    timed_out,
    worker_lost,
)

NOW = "2026-12-02T10:00:00.000000+00:00"
LATER = "2026-12-02T10:00:05.000000+00:00"


def run(**fields: Any) -> dict[str, Any]:
    return {"run_id": "r1", "thread_id": "t1", "status": "pending", "metadata": {}, "created_at": NOW,
            "available_at": NOW, **fields}


def plan(r: dict[str, Any] | None = None, before: dict[str, Any] | None = None, **options: Any) -> Any:
    given: dict[str, Any] = {"created": False, "active": False, "thread_metadata": {}, "reject_if_active": False,
                             "claim_for": None, "run_metadata": None, **options}
    return plan_enqueue(r or run(), {} if before is None else before, **given)


# --- plan_enqueue ------------------------------------------------------------------------------------------------
def test_an_enqueue_on_a_missing_thread_is_not_found() -> None:
    with pytest.raises(NotFound, match="Thread with ID t1 not found"):
        plan_enqueue(run(), None, created=False, active=False, thread_metadata={}, reject_if_active=False,
                     claim_for=None, run_metadata=None)


def test_reject_refuses_only_a_thread_with_an_active_run() -> None:
    with pytest.raises(Conflict, match="already running a task"):
        plan(active=True, reject_if_active=True)
    assert plan(active=False, reject_if_active=True).run["status"] == "pending"
    assert plan(active=True, reject_if_active=False).run["status"] == "pending"  # enqueue: queued behind it


def test_a_run_is_claimed_at_once_only_when_asked_the_thread_is_free_and_it_is_due() -> None:
    claimed = plan(claim_for=("w1", 30.0))
    assert claimed.claimed is True
    assert (claimed.run["status"], claimed.run["worker_id"], claimed.run["attempt"]) == ("running", "w1", 1)
    assert plan(claim_for=None).claimed is False
    assert plan(claim_for=("w1", 30.0), active=True).claimed is False  # another run of the thread goes first
    later = plan(run(available_at=LATER), claim_for=("w1", 30.0))  # `after_seconds`: not due yet
    assert later.claimed is False and later.run["status"] == "pending" and "worker_id" not in later.run


def test_the_thread_metadata_is_merged_over_what_the_transaction_found() -> None:
    found = plan(before={"a": 1, "b": 1}, thread_metadata={"b": 2}).thread_metadata
    assert found == {"a": 1, "b": 2}


def test_run_metadata_takes_the_thread_metadata_of_an_existing_thread_only() -> None:
    made = RunMetadata({"owner": "base", "b": 1}, {"o": 2, "graph_id": "over"})
    # Base, then the thread as the run leaves it (before, its own metadata merged in), then over.
    assert plan(before={"owner": "x", "graph_id": "old"}, thread_metadata={"graph_id": "g", "t": 3},
                run_metadata=made).run["metadata"] == {"owner": "x", "b": 1, "graph_id": "over", "t": 3, "o": 2}
    # A thread this transaction created has no metadata of its own yet.
    assert plan(before={"owner": "x"}, thread_metadata={"t": 3}, run_metadata=made, created=True).run["metadata"] \
        == {"owner": "base", "b": 1, "o": 2, "graph_id": "over"}


def test_plan_enqueue_does_not_change_the_run_it_is_given() -> None:
    given = run()
    plan(given, claim_for=("w1", 30.0), run_metadata=RunMetadata({}, {"m": 1}))
    assert given == run()


# --- split_recovery ----------------------------------------------------------------------------------------------
def test_recovery_requeues_runs_with_attempts_left_and_fails_the_rest() -> None:
    runs = [run(run_id="a", attempt=1), run(run_id="b", attempt=3), run(run_id="c", attempt=4)]
    requeue, fail = split_recovery(runs, max_attempts=3)
    assert [r["run_id"] for r in requeue] == ["a", "b"]
    assert [(r["run_id"], r["status"], r["error"]) for r in fail] == [("c", "error", worker_lost(4))]
    assert fail[0]["worker_id"] is None and fail[0]["lease_expires_at"] is None


def test_recovery_ends_a_run_past_its_deadline_as_timeout_whatever_its_attempts() -> None:
    requeue, fail = split_recovery([run(run_id="a", attempt=1, past_deadline=True),
                                    run(run_id="b", attempt=1, past_deadline=False)], max_attempts=3)
    assert [r["run_id"] for r in requeue] == ["b"] and "past_deadline" not in requeue[0]
    assert [(r["run_id"], r["status"], r["error"]) for r in fail] == [("a", "timeout", timed_out())]
    assert "past_deadline" not in fail[0]


def test_the_errors_a_recovered_run_ends_with() -> None:
    assert timed_out() == {"error": "TimeoutError", "message": ""}
    lost = worker_lost(2)
    assert lost["error"] == "WorkerLost" and "after 2 attempts" in lost["message"]


# --- quota_refusal ------------------------------------------------------------------------------------------------
def test_the_deployment_cap_refuses_the_run_that_would_pass_it() -> None:
    with pytest.raises(QuotaExceeded, match="The run queue is full"):
        quota_refusal(Quota(identity=None, per_identity=0, total=5), mine=0, total=5)
    assert quota_refusal(Quota(identity=None, per_identity=0, total=5), mine=0, total=4) is None


def test_the_per_identity_cap_applies_to_a_known_identity_and_is_stored_on_its_runs() -> None:
    quota = Quota(identity="alice", per_identity=2, total=0)
    assert quota_refusal(quota, mine=1, total=100) == "alice"
    with pytest.raises(QuotaExceeded, match="Too many active runs for this client"):
        quota_refusal(quota, mine=2, total=2)
    # No identity (an anonymous caller): nothing to count it by, so nothing stored and no cap.
    assert quota_refusal(Quota(identity=None, per_identity=2, total=0), mine=9, total=9) is None
    # No per-identity cap: the identity is not stored (its runs are not counted).
    assert quota_refusal(Quota(identity="alice", per_identity=0, total=0), mine=9, total=9) is None


# --- seconds_left, thread_status_changes, next_assistant_version ---------------------------------------------------
def test_seconds_left_is_measured_on_the_database_clock() -> None:
    assert seconds_left(NOW, LATER) == 5.0
    assert seconds_left(LATER, NOW) == -5.0  # past: the caller treats it as due now
    assert seconds_left(NOW, None) == 0.0


@pytest.mark.parametrize(("changes", "only_if_busy", "expected"), [
    ({"status": "error", "error": {"e": 1}}, False, ({"error": {"e": 1}}, "error", False)),
    ({"values": {"v": 1}}, False, ({"values": {"v": 1}}, "idle", False)),
    ({}, True, ({}, "idle", True)),  # a run deleted: a thread that is not busy keeps its status
    ({"status": "interrupted"}, True, ({}, "interrupted", False)),  # a status given: it applies
])
def test_thread_status_changes(changes: dict[str, Any], only_if_busy: bool, expected: tuple[Any, ...]) -> None:
    assert thread_status_changes(changes, only_if_busy=only_if_busy) == expected


def test_an_assistant_update_is_numbered_after_its_latest_version() -> None:
    current = {"assistant_id": "a", "name": "old", "version": 3, "updated_at": NOW}
    assert next_assistant_version(current, {"name": "new"}, 7, LATER) == {
        "assistant_id": "a", "name": "new", "version": 8, "updated_at": LATER}
    assert next_assistant_version(current, {}, None, LATER)["version"] == 1
