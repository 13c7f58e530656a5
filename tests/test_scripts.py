"""Unit tests of `threadline/storage/scripts.py`: each transaction script stepped by hand with fake rows.

A script yields statements and is sent their rows; no database here. The statements are told apart by name
(either dialect's text of each named statement), so a test says which statements a script sends for the
rows it is given, and what it returns or raises. `tests/test_statements.py` checks the statements themselves
on both databases; the storage conformance tests run the scripts on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from threadline.errors import Conflict, NotFound
from threadline.storage import scripts
from threadline.storage.base import THREAD_EVENTS_KEPT, NewThreadEvent
from threadline.storage.scripts import Final, Q, RunRefused, Script, Undo
from threadline.storage.statements import POSTGRES, SQLITE, Encoded, statement_names

D = SQLITE
_NAMES = {part: name for d in (POSTGRES, SQLITE)
          for name in sorted(statement_names("sqlite" if d.sqlite else "postgres"), reverse=True)
          for part in d.statements(name)}


def name(q: Q) -> str:
    """The statement's name; a statement built on the fly (`Dialect.insert`, `update`, ...) is shown as its
    first two words."""
    return _NAMES.get(q.sql) or " ".join(q.sql.split()[:2])


def names(step: Q | tuple[Q, ...]) -> list[str]:
    return [name(q) for q in ((step,) if isinstance(step, Q) else step)]  # a Q is a (named) tuple too


def drive(script: Script[Any], answers: Sequence[Any]) -> tuple[list[Any], Any]:
    """Step `script`, sending `answers` in turn (each the rows of one step: a list of rows, or a tuple of
    them for a step of several statements); the steps it yielded and what it returned. It must take exactly
    as many answers as given."""
    steps: list[Any] = []  # each a Q or a tuple of them, unpacked by the tests as they expect it
    try:
        steps.append(next(script))
        for answer in answers:
            steps.append(script.send(answer))
    except StopIteration as done:
        assert len(steps) == len(answers), f"the script ended after {len(steps)} steps, given {len(answers)}"
        return steps, done.value
    raise AssertionError(f"the script wanted more than {len(answers)} answers: its next step is {names(steps[-1])}")


# --- threads ---------------------------------------------------------------------------------------------------------
def test_create_thread_returns_the_stored_thread_and_refuses_a_duplicate_only_when_asked() -> None:
    row = {"thread_id": "t1", "metadata": {}}
    steps, found = drive(scripts.create_thread(D, row, "raise"), [([{"thread_id": "t1"}], [{"thread_id": "t1"}])])
    assert names(steps[0]) == ["INSERT INTO", "get_thread"] and found == {"thread_id": "t1"}
    _, found = drive(scripts.create_thread(D, row, "do_nothing"), [([], [{"thread_id": "t1", "old": True}])])
    assert found == {"thread_id": "t1", "old": True}
    with pytest.raises(Conflict, match="Thread with ID t1 already exists"):
        drive(scripts.create_thread(D, row, "raise"), [([], [{"thread_id": "t1"}])])


def test_update_thread_merges_metadata_under_the_row_lock() -> None:
    steps, found = drive(scripts.update_thread(D, "t1", {"status": "idle"}, {"b": 2}),
                         [[{"metadata": {"a": 1, "b": 1}}], (None, [{"thread_id": "t1"}])])
    assert names(steps[0]) == ["lock_thread"]
    update, get = steps[1]
    assert update.params == {"status": "idle", "metadata": {"a": 1, "b": 2}, "thread_id": "t1"}
    assert update.wait is False and name(get) == "get_thread" and found == {"thread_id": "t1"}


def test_update_thread_of_a_missing_thread_is_none() -> None:
    assert drive(scripts.update_thread(D, "t1", {}, {"b": 2}), [[]]) == ([scripts.q(D, "lock_thread",
                                                                                     thread_id="t1")], None)
    # Without metadata to merge there is no lock: the update, then the read that finds nothing.
    steps, found = drive(scripts.update_thread(D, "t1", {"status": "idle"}, None), [(None, [])])
    assert names(steps[0]) == ["UPDATE threads", "get_thread"] and found is None


def test_delete_threads_sends_nothing_for_no_threads_and_keeps_runs_when_asked() -> None:
    assert drive(scripts.delete_threads(D, []), []) == ([], [])
    every, deleted = drive(scripts.delete_threads(D, ["t1"]), [(None, None, None, None, [{"thread_id": "t1"}])])
    assert deleted == ["t1"]
    kept, _ = drive(scripts.delete_threads(D, ["t1"], keep_runs=True), [(None, None, None, [{"thread_id": "t1"}])])
    assert set(names(every[0])) - set(names(kept[0])) == {"delete_threads_runs"}
    assert names(every[0])[-1] == "delete_threads" and all(not q.wait for q in every[0][:-1])


# --- runs ------------------------------------------------------------------------------------------------------------
def finish(delete_thread: bool = False, **changes: Any) -> Script[Any]:
    return scripts.finish_run(D, "r1", "success", None, {"v": 1}, changes, "w1", 1, delete_thread)


def test_finish_run_ends_the_run_and_reconciles_its_thread_in_one_step() -> None:
    steps, finished = drive(finish(status="idle"), [([{"run_id": "r1", "thread_id": "t1"}], None,
                                                     [{"status": "idle"}])])
    # one final step: on PostgreSQL it goes with the COMMIT, one round trip
    final = steps[0]
    assert isinstance(final, Final) and isinstance(final.step, tuple) and len(steps) == 1
    # SQLite's one writer holds the file: the thread's row has no lock to take
    assert names(final.step)[0] == "finish_run" and len(final.step) == 2
    # PostgreSQL's end refuses in the database, as it cannot roll back once its rows are seen; the thread's
    # row is locked before its update, as an enqueue locks it
    first: Any = next(scripts.finish_run(POSTGRES, "r1", "success", None, None, {}, "w1", 1, False))
    assert "threadline_finish_run(" in first.step[0].sql and names(first.step)[1] == "lock_thread_of_run"
    # the output as given, not text; and whether the thread has another active run (here: no)
    assert finished == {"run_id": "r1", "thread_id": "t1", "output": {"v": 1}, "thread_busy": False}


def test_finish_run_says_when_its_thread_has_another_active_run() -> None:
    """The worker that ended the run claims the thread's next one at once only then (else its claim would
    find nothing, a claim per run for nothing)."""
    _, finished = drive(finish(status="idle"), [([{"run_id": "r1", "thread_id": "t1"}], None, [{"status": "busy"}])])
    assert finished["thread_busy"] is True


def test_finish_run_not_the_callers_to_end_rolls_back() -> None:
    with pytest.raises(Undo) as undone:
        drive(finish(status="idle"), [([], None, None)])
    assert undone.value.value is None
    # PostgreSQL's refusal comes as the database's error, thrown into the script at its final step
    script = finish(status="idle")
    next(script)
    with pytest.raises(Undo) as undone:
        script.throw(RunRefused())
    assert undone.value.value is None


def test_finish_run_encodes_an_output_that_is_also_the_threads_values_once() -> None:
    output = {"v": 1}
    script = scripts.finish_run(D, "r1", "success", None, output, {"values": output}, "w1", 1, False)
    step: Any = next(script)  # the finish and the thread's reconcile (its lock, its update)
    finish_q, *_, reconcile_q = step.step
    assert isinstance(finish_q.params["output"], Encoded)
    assert reconcile_q.params["values"] is finish_q.params["output"]


def test_finish_run_of_a_stateless_run_deletes_its_thread_but_keeps_the_run() -> None:
    steps, finished = drive(finish(delete_thread=True), [[{"run_id": "r1", "thread_id": "t1"}],
                                                         (None, None, None, [{"thread_id": "t1"}])])
    assert names(steps[0]) == ["finish_run"]
    assert "delete_threads_runs" not in names(steps[1]) and names(steps[1])[-1] == "delete_threads"
    assert finished["run_id"] == "r1" and finished["thread_busy"] is False
    assert drive(finish(delete_thread=True), [[]]) == ([steps[0]], None)  # not ours: nothing deleted


def test_cancel_pending_runs_reconciles_each_thread_once() -> None:
    assert drive(scripts.cancel_pending_runs(D, [], "interrupted"), []) == ([], [])
    rows = [{"run_id": "a", "thread_id": "t2"}, {"run_id": "b", "thread_id": "t1"}, {"run_id": "c", "thread_id": "t2"}]
    steps, cancelled = drive(scripts.cancel_pending_runs(POSTGRES, ["a", "b", "c"], "interrupted"), [rows, None])
    assert cancelled == ["a", "b", "c"]
    reconciled = steps[1]
    assert not isinstance(reconciled, Q)
    assert [q.params["thread_id"] for q in reconciled if name(q) == "lock_thread"] == ["t1", "t2"]
    # SQLite: each thread's update once, no lock (its one writer holds the file)
    steps, _ = drive(scripts.cancel_pending_runs(D, ["a", "b", "c"], "interrupted"), [rows, None])
    assert not any(name(q) == "lock_thread" for q in steps[1]) and len(steps[1]) == 2


def test_delete_run_reconciles_a_thread_only_if_it_is_busy() -> None:
    assert drive(scripts.delete_run(D, "r1"), [[]])[1] is False
    steps, deleted = drive(scripts.delete_run(POSTGRES, "r1"), [[{"thread_id": "t1"}], None])
    lock, rule = steps[1]
    assert deleted is True and name(lock) == "lock_thread" and rule.params == {"status": "idle", "thread_id": "t1"}
    assert rule.sql == POSTGRES.reconcile_thread([], of_run=False, only_if_busy=True)


def test_recover_runs_requeues_fails_and_idles_stray_threads_at_start() -> None:
    lapsed = [{"run_id": "a", "thread_id": "t1", "attempt": 1}, {"run_id": "b", "thread_id": "t2", "attempt": 9}]
    steps, (requeue, fail) = drive(scripts.recover_runs(D, 3, expired_only=False), [lapsed, None])
    assert names(steps[0]) == ["running_runs"]
    sent = names(steps[1])
    assert sent[0] == "requeue_runs" and sent[1] == "fail_run" and sent[-1] == "idle_stray_busy_threads"
    assert [r["run_id"] for r in requeue] == ["a"] and [r["run_id"] for r in fail] == ["b"]
    # A sweep of lapsed leases with nothing found writes nothing.
    assert drive(scripts.recover_runs(D, 3, expired_only=True), [[]])[1] == ([], [])


def test_heartbeat_release_and_deadline_with_nothing_to_do_send_nothing() -> None:
    assert drive(scripts.heartbeat_runs(D, "w1", {}, 30.0), []) == ([], set())
    assert drive(scripts.release_runs(D, "w1", {}), []) == ([], [])
    assert drive(scripts.heartbeat_runs(D, "w1", {"r1": 1}, 30.0), [[{"run_id": "r1"}]])[1] == {"r1"}
    assert drive(scripts.set_run_deadline(D, "r1", 5.0), [[]])[1] == 0.0  # the run is gone
    deadline = [{"now_at": "2026-12-02T10:00:00+00:00", "deadline_at": "2026-12-02T10:00:03+00:00"}]
    assert drive(scripts.set_run_deadline(D, "r1", 5.0), [deadline])[1] == 3.0  # a retried run keeps its deadline


# --- assistants ------------------------------------------------------------------------------------------------------
def test_update_assistant_of_a_missing_assistant_is_not_found() -> None:
    with pytest.raises(NotFound, match="Assistant a1 not found"):
        drive(scripts.update_assistant(D, "a1", {"name": "x"}), [([], [])])


def test_update_assistant_writes_the_next_version() -> None:
    current = {"assistant_id": "a1", "graph_id": "g", "name": "old", "description": None, "config": {},
               "context": {}, "metadata": {}, "version": 2, "created_at": "c", "updated_at": "u"}
    steps, found = drive(scripts.update_assistant(D, "a1", {"name": "new"}),
                         [([current], [{"v": 4}]), (None, None, [{"assistant_id": "a1", "version": 5}])])
    version, update, _ = steps[1]
    assert name(version) == "insert_assistant_version" and version.params["version"] == 5
    assert version.params["name"] == "new" and update.params["name"] == "new"
    assert found == {"assistant_id": "a1", "version": 5}


# --- protocol events ------------------------------------------------------------------------------------------------
def events(n: int) -> list[NewThreadEvent]:
    return [NewThreadEvent("m", "values", "[]", "{}") for _ in range(n)]


def test_appended_events_are_numbered_on_from_the_threads_counter() -> None:
    steps, seqs = drive(scripts.append_thread_events(D, "t1", "r1", events(3)), [([{"last_seq": 10}],), None])
    assert seqs == [8, 9, 10]
    (insert,) = steps[1]
    assert insert.many and [p["seq"] for p in insert.params] == [8, 9, 10]


def test_events_past_the_kept_number_are_trimmed() -> None:
    last = THREAD_EVENTS_KEPT + 5
    steps, _ = drive(scripts.append_thread_events(D, "t1", None, events(2)), [([{"last_seq": last}],), None])
    insert, trim = steps[1]
    assert name(trim) == "trim_events" and trim.params == {"thread_id": "t1", "upto": 5}
