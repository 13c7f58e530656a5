"""Every SQL statement of our tables, written once and named, as `broker/keys.py` names every Redis key.

A statement is a template: parameters are `:name` (SQLite takes them as they are; psycopg gets `%(name)s`),
and the few true differences between the dialects are slots, which `Dialect.sql` fills:

| slot | SQLite | PostgreSQL |
|---|---|---|
| `{now}` | `:now`, the transaction's one timestamp (app clock) | `now()`, the transaction's start (database clock) |
| `{lease}` | `:lease_at` (now + `:lease_seconds`) | `now() + make_interval(secs => :lease_seconds)` |
| `{deadline}` | `:deadline_at` (now + `:deadline_seconds`) | `now() + make_interval(secs => :deadline_seconds)` |
| `{for_update}`, `{skip_locked}` | nothing (the one writer holds the lock) | `FOR UPDATE`, `FOR UPDATE SKIP LOCKED` |
| `{json:p}` | `:p` (JSON text) | `CAST(:p AS jsonb)` |
| `{jsontext:p}` | `:p` (JSON text) | `CAST(:p AS json)`: a `TEXT_JSON_COLUMNS` column's |
| `{ts:p}` | `:p` | `CAST(:p AS timestamptz)` |
| `{in:p}` (p a list) | `IN (SELECT value FROM json_each(:p))` | `= ANY(:p)` |
| `{pairs:p}` (p: JSON, text to int) | `json_each(:p)`: `key`, `value` | `jsonb_each_text(...)`, `value` as int |
| `{ilike:col:p}` | `lower(col) LIKE lower(:p) ESCAPE '\\'` (Python's `lower`) | `col ILIKE :p` |

Where a statement genuinely differs (LangGraph's checkpoint tables have other names on each), each dialect
states it under the same name in `DIALECT_STATEMENTS`. `tests/test_statements.py` checks that both dialects
define the same names and that every statement prepares on both databases.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from typing import Any, Literal

from threadline.storage.sql import JSON_COLUMNS, TEXT_JSON_COLUMNS, dumps, filter_terms

DialectName = Literal["sqlite", "postgres"]
ACTIVE = "status IN ('pending', 'running')"
_ACTIVE_RUN = f"EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = threads.thread_id AND r.{ACTIVE})"
#: Claimable: pending, available, and the oldest pending run of a thread with no running run (so no two
#: claimed together share a thread).
_CLAIMABLE = (
    "SELECT run_id FROM runs r WHERE status = 'pending' AND available_at <= {now} "
    "AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.thread_id = r.thread_id AND o.status = 'running') "
    "AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.thread_id = r.thread_id AND e.status = 'pending' AND e.seq < r.seq) "
    "ORDER BY seq LIMIT "
)
#: A run's columns but its `output`, what a run's end answers: the caller has the output, which for a thread run
#: is the whole state again (1 MB of JSON for a large one, read back and parsed for nothing). The same on both
#: backends (`tests/test_statements.py` checks them against the schemas).
RUN_COLUMNS_BUT_OUTPUT = ("seq", "run_id", "thread_id", "assistant_id", "status", "metadata", "kwargs",
                          "multitask_strategy", "available_at", "attempt", "worker_id", "error", "created_at",
                          "updated_at", "lease_expires_at", "deadline_at", "identity", "quota_slots")
#: Every column of a run but its output: what the reads that do not answer with the output select.
RUN_HEAD = ", ".join(RUN_COLUMNS_BUT_OUTPUT)
# The finish guard: with a worker named, only the holder of that attempt ends the run.
_FINISH_RUN = (
    "UPDATE runs SET status = :status, error = {json:error}, output = {jsontext:output}, lease_expires_at = NULL, "
    "updated_at = {now} WHERE run_id = :run_id AND (CAST(:worker_id AS TEXT) IS NULL OR "
    "(worker_id = :worker_id AND attempt = :attempt AND status = 'running')) RETURNING "
    + RUN_HEAD)
#: A running run's deadline has passed (limits, issue 16), on the clock `{now}` names.
_PAST_DEADLINE = "(deadline_at IS NOT NULL AND deadline_at <= {now}) AS past_deadline"

#: Every column of a thread's row but `values`, the cache of its latest state's values, which can be large
#: (1 MB of documents): what the reads that answer without them take (`get_thread(..., values=False)`).
THREAD_HEAD = ("thread_id, status, metadata, config, interrupts, error, ttl_strategy, ttl_minutes, expires_at, "
               "created_at, updated_at, state_updated_at")
#: A thread's row with its values as the JSON text stored, not parsed (`get_thread(..., values="text")`):
#: the reads whose answer writes them out as they are.
THREAD_VALUES_TEXT = f'{THREAD_HEAD}, CAST("values" AS text) AS values_text'
#: The columns a cron row is written with (`insert_cron`), in order.
CRON_COLUMNS = ("cron_id", "assistant_id", "thread_id", "user_id", "auth_user", "schedule", "timezone", "end_time",
                "enabled", "on_run_completed", "payload", "metadata", "next_run_date", "created_at", "updated_at",
                "identity")
#: Columns whose values are JSON or timestamps though `JSON_COLUMNS` or their name (`*_at`) does not say so:
#: the crons table's (`_value` gives them their slot).
_JSON_TOO = frozenset({"payload", "auth_user"})
_TIMES_TOO = frozenset({"end_time", "next_run_date", "claim_until"})


def _value(col: str) -> str:
    if col in TEXT_JSON_COLUMNS:
        return f"{{jsontext:{col}}}"
    if col in JSON_COLUMNS or col in _JSON_TOO:
        return f"{{json:{col}}}"
    if col.endswith("_at") or col in _TIMES_TOO:
        return f"{{ts:{col}}}"
    return f":{col}"


#: The statements both dialects share, by name.
STATEMENTS: dict[str, str] = {
    # --- assistants
    "get_assistant": "SELECT * FROM assistants WHERE assistant_id = :assistant_id",
    "lock_assistant": "SELECT * FROM assistants WHERE assistant_id = :assistant_id {for_update}",
    "insert_assistant_version": (
        "INSERT INTO assistant_versions (assistant_id, version, graph_id, name, description, config, context, "
        "metadata, created_at) VALUES (:assistant_id, :version, :graph_id, :name, :description, {json:config}, "
        "{json:context}, {json:metadata}, {ts:created_at})"),
    "latest_assistant_version": "SELECT MAX(version) AS v FROM assistant_versions WHERE assistant_id = :assistant_id",
    "get_assistant_version": (
        "SELECT * FROM assistant_versions WHERE assistant_id = :assistant_id AND version = :version"),
    "set_assistant": (
        "UPDATE assistants SET graph_id = :graph_id, name = :name, description = :description, "
        "config = {json:config}, context = {json:context}, metadata = {json:metadata}, version = :version, "
        "updated_at = {ts:updated_at} WHERE assistant_id = :assistant_id"),
    # Its versions go with it: ON DELETE CASCADE (SQLite: with PRAGMA foreign_keys, on every connection).
    "delete_assistant": "DELETE FROM assistants WHERE assistant_id = :assistant_id RETURNING assistant_id",
    # --- threads
    "get_thread": "SELECT * FROM threads WHERE thread_id = :thread_id",
    "get_thread_head": f"SELECT {THREAD_HEAD} FROM threads WHERE thread_id = :thread_id",
    "get_thread_text": f"SELECT {THREAD_VALUES_TEXT} FROM threads WHERE thread_id = :thread_id",
    # The thread's cache of its latest state, written after a change to its checkpoints; a thread a run holds
    # busy stays busy (the run's end reconciles it). Nothing read back: the caller has what it wrote. It stamps
    # `state_updated_at` itself: the stamping trigger would write the whole row again. Always the whole values,
    # as JSON text on both databases (PostgreSQL's `json`, migration 0019): replacing the keys an update changed
    # inside the stored text would parse it (on SQLite, `json_set` on 1 MB: 1.0 ms against 0.7 ms to write it
    # whole; on PostgreSQL, `json_each` and `json_object_agg` cost more than the whole write), and a key it adds
    # would go last where the state has it elsewhere.
    "store_thread_state": (
        "UPDATE threads SET \"values\" = {jsontext:values}, interrupts = {json:interrupts}, "
        "status = CASE WHEN status = 'busy' THEN status ELSE :status END, updated_at = {now}, "
        "state_updated_at = {now} WHERE thread_id = :thread_id RETURNING thread_id"),
    "lock_thread": "SELECT metadata FROM threads WHERE thread_id = :thread_id {for_update}",
    "insert_thread_if_missing": (
        "INSERT INTO threads (thread_id, status, metadata, config, interrupts, ttl_strategy, ttl_minutes, "
        "created_at, updated_at) VALUES (:thread_id, :status, {json:metadata}, '{}', '{}', :ttl_strategy, "
        ":ttl_minutes, {ts:now}, {ts:now}) ON CONFLICT (thread_id) DO NOTHING RETURNING thread_id"),
    "mark_thread_busy": (
        "UPDATE threads SET status = 'busy', metadata = {json:metadata}, updated_at = {ts:now} "
        "WHERE thread_id = :thread_id"),
    "thread_has_active_run": f"SELECT 1 AS active FROM runs WHERE thread_id = :thread_id AND {ACTIVE} LIMIT 1",
    "lock_thread_of_run": (
        "SELECT 1 FROM threads WHERE thread_id = (SELECT thread_id FROM runs WHERE run_id = :run_id) {for_update}"),
    "expired_threads": (
        "SELECT thread_id FROM threads t WHERE expires_at IS NOT NULL AND expires_at <= COALESCE({ts:cutoff}, {now}) "
        "AND status <> 'busy' AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.thread_id = t.thread_id "
        f"AND r.{ACTIVE}) ORDER BY expires_at LIMIT :limit {{skip_locked}}"),
    "delete_threads": "DELETE FROM threads WHERE thread_id {in:thread_ids} RETURNING thread_id",
    "delete_threads_runs": "DELETE FROM runs WHERE thread_id {in:thread_ids}",
    "delete_threads_events": "DELETE FROM thread_events WHERE thread_id {in:thread_ids}",
    "delete_threads_event_counters": "DELETE FROM thread_event_counters WHERE thread_id {in:thread_ids}",
    # Threads marked busy with no active run (a crash between writes).
    "idle_stray_busy_threads": (
        f"UPDATE threads SET status = 'idle', updated_at = {{now}} WHERE status = 'busy' AND NOT {_ACTIVE_RUN}"),
    # --- runs and the queue
    "get_run": "SELECT * FROM runs WHERE run_id = :run_id",
    # A run as the API shows it: without its output (a thread run's is the whole state again; only a join
    # answers with it).
    "get_run_head": f"SELECT {RUN_HEAD} FROM runs WHERE run_id = :run_id",
    "get_run_text": f"SELECT {RUN_HEAD}, CAST(output AS text) AS output_text FROM runs WHERE run_id = :run_id",
    "active_runs": f"SELECT * FROM runs WHERE thread_id = :thread_id AND {ACTIVE} ORDER BY seq",
    "next_run": "SELECT * FROM runs WHERE thread_id = :thread_id AND seq > :after_seq ORDER BY seq LIMIT 1",
    "last_run_seq": "SELECT MAX(seq) AS seq FROM runs WHERE thread_id = :thread_id",
    "next_claimable_run": _CLAIMABLE + "1",
    # Up to `:limit` of the oldest claimable runs, for one worker process's free slots: one statement, one
    # transaction, however many slots it fills; runs another claimer has locked are skipped, not waited for.
    "claim_runs": (
        f"WITH picked AS ({_CLAIMABLE}:limit {{skip_locked}}) "
        "UPDATE runs SET status = 'running', worker_id = :worker_id, attempt = attempt + 1, "
        "lease_expires_at = {lease}, updated_at = {now}, "
        # The run's deadline (limits) from its first start, unless it has one (a retried run keeps it).
        "deadline_at = CASE WHEN :deadline_seconds > 0 THEN COALESCE(deadline_at, {deadline}) ELSE deadline_at END "
        "WHERE run_id IN (SELECT run_id FROM picked) AND status = 'pending' RETURNING *"),
    # The finish guard: with a worker named, only the holder of that attempt ends the run.
    "finish_run": _FINISH_RUN,
    "heartbeat_runs": (
        "UPDATE runs SET lease_expires_at = {lease} FROM {pairs:held} AS h WHERE runs.run_id = h.key "
        "AND runs.attempt = h.value AND runs.worker_id = :worker_id AND runs.status = 'running' "
        "RETURNING runs.run_id"),
    # Back in the queue without spending an attempt, if the worker still holds that attempt.
    "release_runs": (
        "UPDATE runs SET status = 'pending', worker_id = NULL, lease_expires_at = NULL, "
        "attempt = runs.attempt - 1, updated_at = {now} FROM {pairs:held} AS h WHERE runs.run_id = h.key "
        "AND runs.attempt = h.value AND runs.worker_id = :worker_id AND runs.status = 'running' "
        "RETURNING runs.run_id"),
    "cancel_pending_runs": (
        "UPDATE runs SET status = :status, updated_at = {now} WHERE status = 'pending' AND run_id {in:run_ids} "
        "RETURNING run_id, thread_id"),
    "delete_run": "DELETE FROM runs WHERE run_id = :run_id RETURNING thread_id",
    "running_runs": f"SELECT *, {_PAST_DEADLINE} FROM runs WHERE status = 'running' ORDER BY seq {{skip_locked}}",
    "lapsed_runs": (
        f"SELECT *, {_PAST_DEADLINE} FROM runs WHERE status = 'running' AND lease_expires_at < {{now}} "
        "ORDER BY seq {skip_locked}"),
    "requeue_runs": (
        "UPDATE runs SET status = 'pending', worker_id = NULL, lease_expires_at = NULL, updated_at = {now} "
        "WHERE run_id {in:run_ids}"),
    # A run whose worker is gone, ended: `error` (no attempts left) or `timeout` (past its deadline).
    "fail_run": (
        "UPDATE runs SET status = :status, error = {json:error}, worker_id = NULL, lease_expires_at = NULL, "
        "updated_at = {now} WHERE run_id = :run_id"),
    "queue_stats": (
        "SELECT COUNT(CASE WHEN status = 'pending' THEN 1 END) AS pending, "
        "COUNT(CASE WHEN status = 'running' THEN 1 END) AS running, "
        f"MIN(CASE WHEN status = 'pending' THEN available_at END) AS oldest FROM runs WHERE {ACTIVE}"),
    # --- limits (issue 16): run deadlines and quotas
    # A deadline `:deadline_seconds` from now unless the run has one (a retried run keeps its first start's);
    # with the clock it is measured on, so the seconds left count on the database's clock.
    "set_run_deadline": (
        "UPDATE runs SET deadline_at = COALESCE(deadline_at, {deadline}) WHERE run_id = :run_id "
        "RETURNING deadline_at, {now} AS now_at"),
    # A deadline the claim stamped with the worker's default, replaced by the run's own (its config's).
    "replace_run_deadline": (
        "UPDATE runs SET deadline_at = {deadline} WHERE run_id = :run_id RETURNING deadline_at, {now} AS now_at"),
    # --- protocol events
    "bump_event_counter": (
        "INSERT INTO thread_event_counters AS c (thread_id, last_seq) VALUES (:thread_id, :count) "
        "ON CONFLICT (thread_id) DO UPDATE SET last_seq = c.last_seq + excluded.last_seq RETURNING last_seq"),
    "insert_event": (
        "INSERT INTO thread_events (thread_id, seq, run_id, method, channel, namespace, params, created_at) "
        "VALUES (:thread_id, :seq, :run_id, :method, :channel, :namespace, :params, {now})"),
    "trim_events": "DELETE FROM thread_events WHERE thread_id = :thread_id AND seq <= :upto",
    "event_bounds": "SELECT MIN(seq) AS lo, MAX(seq) AS hi FROM thread_events WHERE thread_id = :thread_id",
    # --- crons (their two transactions: `crons.py`). Timestamps are ISO-8601 UTC strings of one format
    # (`core/crons.py: iso`), so SQLite compares them as text and PostgreSQL as `timestamptz`.
    "insert_cron": (
        f"INSERT INTO crons ({', '.join(CRON_COLUMNS)}) VALUES ({', '.join(_value(c) for c in CRON_COLUMNS)}) "
        "RETURNING *"),
    "get_cron": "SELECT * FROM crons WHERE cron_id = :cron_id",
    "lock_cron": "SELECT * FROM crons WHERE cron_id = :cron_id {for_update}",
    "lock_cron_assistant": "SELECT 1 AS ok FROM assistants WHERE assistant_id = :assistant_id {for_update}",
    "lock_cron_thread": "SELECT 1 AS ok FROM threads WHERE thread_id = :thread_id {for_update}",
    "delete_cron": "DELETE FROM crons WHERE cron_id = :cron_id RETURNING cron_id",
    # The ticks due by now: enabled, not past their end_time, and not held by a live claim of another process.
    "due_crons": (
        "SELECT * FROM crons WHERE enabled AND next_run_date <= {ts:now_at} "
        "AND (end_time IS NULL OR end_time >= next_run_date) "
        "AND (claim_until IS NULL OR claim_until < {ts:now_at}) ORDER BY next_run_date LIMIT :limit"),
    # Claiming a tick: a conditional update, true for exactly one of the processes that try it (the row's
    # write lock orders them; the loser's WHERE no longer matches once the winner has committed).
    "claim_cron_tick": (
        "UPDATE crons SET claim_until = {ts:until} WHERE cron_id = :cron_id AND next_run_date = {ts:tick} AND enabled "
        "AND (claim_until IS NULL OR claim_until < {ts:now_at}) RETURNING cron_id"),
    # After the tick's run exists: the next tick, and the claim released. A PATCH that moved the tick
    # meanwhile wins (the WHERE no longer matches), and its own next_run_date stands.
    "advance_cron": (
        "UPDATE crons SET next_run_date = {ts:next_run_date}, claim_until = NULL "
        "WHERE cron_id = :cron_id AND next_run_date = {ts:tick} RETURNING cron_id"),
    "release_cron_tick": (
        "UPDATE crons SET claim_until = NULL WHERE cron_id = :cron_id AND next_run_date = {ts:tick} RETURNING cron_id"),
}

#: Statements that call a server's own functions: PostgreSQL's only (SQLite's writer steps the scripts they
#: replace there, at no round trip's cost). `tests/test_statements.py` prepares them on PostgreSQL.
SERVER_STATEMENTS: dict[str, str] = {
    # `scripts.enqueue_run_at_once`: the enqueue in one statement (migration 0012).
    "enqueue_run": (
        "SELECT * FROM threadline_enqueue_run(CAST(:run AS jsonb), CAST(:new_thread AS jsonb), "
        "CAST(:thread_metadata AS jsonb), CAST(:now AS timestamptz), CAST(:reject_if_active AS boolean), "
        "CAST(:metadata_base AS jsonb), CAST(:metadata_over AS jsonb), CAST(:worker AS text), "
        "CAST(:lease_seconds AS double precision), CAST(:deadline_seconds AS double precision), "
        "CAST(:identity AS text), CAST(:per_identity AS integer), CAST(:cap AS integer))"),
}

#: Statements on LangGraph's checkpoint tables, which each saver names and shapes its own way. One name may
#: be several statements, separated by "; " (`Dialect.statements` splits them; a script runs them in order).
DIALECT_STATEMENTS: dict[DialectName, dict[str, str]] = {
    "sqlite": {
        # `finish_run`, sent with the thread's reconciliation as the script's last step: SQLite's script sees
        # no row and rolls back (`Undo`) before its writer commits.
        "finish_run_or_refuse": _FINISH_RUN,
        # The enqueue's caps on active runs: the active runs of one identity and of the whole deployment,
        # counted in the enqueue's transaction, which the one writer (BEGIN IMMEDIATE) runs one at a time;
        # the script applies the rule to the counts (`rules.quota_refusal`), and a refusal rolls it back.
        "check_quota": (
            "SELECT COUNT(CASE WHEN identity = :identity THEN 1 END) AS mine, COUNT(*) AS total, 1 AS ok "
            f"FROM runs WHERE {ACTIVE}"),
        # Nothing to sweep: SQLite counts the active runs themselves, and holds no slots.
        "sweep_quota_slots": "SELECT 0 AS n",
        # No sessions: one process, one file (its writer holds no transaction across a stall of another's).
        "end_stalled_sessions": "SELECT 0 AS n",
        "delete_thread_checkpoints": (
            "DELETE FROM checkpoints WHERE thread_id {in:thread_ids}; "
            "DELETE FROM writes WHERE thread_id {in:thread_ids}; "
            "DELETE FROM checkpoint_blobs WHERE thread_id {in:thread_ids}"),
        # A rollback (`sqlite_saver.delete_run_checkpoints`, which then drops the values they alone held apart).
        "delete_run_checkpoints": (
            "DELETE FROM writes WHERE thread_id = :thread_id AND checkpoint_id IN (SELECT checkpoint_id FROM "
            "checkpoints WHERE thread_id = :thread_id AND json_extract(CAST(metadata AS TEXT), '$.run_id') = :run_id); "
            "DELETE FROM checkpoints WHERE thread_id = :thread_id "
            "AND json_extract(CAST(metadata AS TEXT), '$.run_id') = :run_id"),
        # The copies' metadata names the copy (`checkpoint_metadata`), as LangGraph's server's copies do.
        "copy_checkpoints": (
            "INSERT OR REPLACE INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, "
            "type, checkpoint, metadata) SELECT :target, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
            "checkpoint, CAST(json_set(CAST(metadata AS TEXT), '$.thread_id', :target) AS BLOB) "
            "FROM checkpoints WHERE thread_id = :source; "
            "INSERT OR REPLACE INTO writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, "
            "channel, type, value) SELECT :target, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, "
            "type, value FROM writes WHERE thread_id = :source; "
            "INSERT OR REPLACE INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) "
            "SELECT :target, checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs "
            "WHERE thread_id = :source"),
    },
    "postgres": {
        # `finish_run` that raises TL410 when it ends no run (migration 0015), so that it can go with the
        # reconciliation and the COMMIT in one round trip: the refusal aborts the pipeline, rolling all back.
        # Its row comes back without the output, as `finish_run`'s (migration 0017).
        "finish_run_or_refuse": (
            "SELECT * FROM threadline_finish_run(:run_id, :status, {json:error}, {jsontext:output}, "
            "CAST(:worker_id AS text), CAST(:attempt AS integer))"),
        # The run takes a free slot of each cap that applies (migration 0010: slot rows taken with SKIP LOCKED,
        # so concurrent enqueues never wait for each other) or is refused in this statement (TL429, with the
        # counts for `rules.quota_refusal` to word, through `threadline_check_quota`).
        "check_quota": "SELECT threadline_take_quota(:run_id, CAST(:identity AS text), :per_identity, :cap) AS ok",
        # Slots held by runs no longer active given back, and the rows of keys with none held deleted
        # (migration 0011): the lease sweeper's pass.
        "sweep_quota_slots": "SELECT threadline_sweep_quota_slots() AS n",
        # Sessions of this deployment (its `application_name`) stopped inside a transaction that the server's
        # idle-in-transaction timeout never ends: a pipeline (psycopg's, LangGraph's saver's) whose statements
        # ran but whose Sync never came, because its process stalled (SIGSTOP, a frozen VM). The server reports
        # them `active`, waiting on `ClientRead`, and their row locks block whoever takes the stalled runs over.
        "end_stalled_sessions": (
            "SELECT COUNT(*) FILTER (WHERE pg_terminate_backend(pid)) AS n FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
            "AND application_name = current_setting('application_name') AND usename = current_user "
            "AND state = 'active' "
            "AND wait_event = 'ClientRead' AND xact_start IS NOT NULL "
            "AND state_change < now() - make_interval(secs => :seconds)"),
        "delete_thread_checkpoints": (
            "DELETE FROM checkpoints WHERE thread_id {in:thread_ids}; "
            "DELETE FROM checkpoint_blobs WHERE thread_id {in:thread_ids}; "
            "DELETE FROM checkpoint_writes WHERE thread_id {in:thread_ids}"),
        # A rollback. First the values the run's checkpoints name (LangGraph keeps them apart, one row per
        # channel version) that no other checkpoint of the thread names: the versions the run wrote.
        "delete_run_checkpoints": (
            "DELETE FROM checkpoint_blobs b USING (SELECT DISTINCT c.checkpoint_ns, v.key AS channel, "
            "v.value AS version FROM checkpoints c, jsonb_each_text(c.checkpoint -> 'channel_versions') v "
            "WHERE c.thread_id = :thread_id AND c.metadata->>'run_id' = :run_id) gone "
            "WHERE b.thread_id = :thread_id AND b.checkpoint_ns = gone.checkpoint_ns AND b.channel = gone.channel "
            "AND b.version = gone.version AND NOT EXISTS (SELECT 1 FROM checkpoints k WHERE k.thread_id = :thread_id "
            "AND k.checkpoint_ns = b.checkpoint_ns AND (k.metadata->>'run_id') IS DISTINCT FROM :run_id "
            "AND k.checkpoint -> 'channel_versions' ->> b.channel = b.version); "
            "DELETE FROM checkpoint_writes WHERE thread_id = :thread_id AND checkpoint_id IN (SELECT checkpoint_id "
            "FROM checkpoints WHERE thread_id = :thread_id AND metadata->>'run_id' = :run_id); "
            "DELETE FROM checkpoints WHERE thread_id = :thread_id AND metadata->>'run_id' = :run_id"),
        "copy_checkpoints": (
            "INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
            "checkpoint, metadata) SELECT :target, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, "
            "checkpoint, metadata || jsonb_build_object('thread_id', CAST(:target AS text)) FROM checkpoints "
            "WHERE thread_id = :source ON CONFLICT DO NOTHING; "
            "INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob) SELECT :target, "
            "checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs WHERE thread_id = :source "
            "ON CONFLICT DO NOTHING; "
            "INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, "
            "channel, type, blob) SELECT :target, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, "
            "type, blob FROM checkpoint_writes WHERE thread_id = :source ON CONFLICT DO NOTHING"),
    },
}

_SLOT = re.compile(r"\{(\w+)(?::(\w+))?(?::(\w+))?\}")
_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


class Dialect:
    """How one database spells the slots and takes parameters."""

    def __init__(self, name: DialectName) -> None:
        self.name = name
        self.sqlite = name == "sqlite"

    def _slot(self, match: re.Match[str]) -> str:
        slot, arg, arg2 = match.groups()
        lite = self.sqlite
        if slot == "now":
            return ":now" if lite else "now()"
        if slot == "lease":
            return ":lease_at" if lite else "now() + make_interval(secs => :lease_seconds)"
        if slot == "deadline":
            return ":deadline_at" if lite else "now() + make_interval(secs => :deadline_seconds)"
        if slot == "for_update":
            return "" if lite else "FOR UPDATE"
        if slot == "skip_locked":
            return "" if lite else "FOR UPDATE SKIP LOCKED"
        if slot == "json":
            return f":{arg}" if lite else f"CAST(:{arg} AS jsonb)"
        if slot == "jsontext":
            return f":{arg}" if lite else f"CAST(:{arg} AS json)"
        if slot == "ts":
            return f":{arg}" if lite else f"CAST(:{arg} AS timestamptz)"
        if slot == "in":
            return f"IN (SELECT value FROM json_each(:{arg}))" if lite else f"= ANY(:{arg})"
        if slot == "pairs":
            return (f"(SELECT key, value FROM json_each(:{arg}))" if lite else
                    f"(SELECT key, CAST(value AS integer) AS value FROM jsonb_each_text(CAST(:{arg} AS jsonb)))")
        if slot == "ilike":
            return f"lower({arg}) LIKE lower(:{arg2}) ESCAPE '\\'" if lite else f"{arg} ILIKE :{arg2}"
        raise KeyError(f"unknown slot {{{slot}}}")

    @functools.lru_cache(maxsize=1024)  # noqa: B019 - two dialect objects, for the life of the process
    def sql(self, template: str) -> str:
        """The template in this dialect: slots filled, parameters marked the driver's way."""
        text = _SLOT.sub(self._slot, template)
        if self.sqlite:
            return text
        return _PARAM.sub(r"%(\1)s", text.replace("%", "%%"))

    def statement(self, name: str) -> str:
        template = STATEMENTS.get(name) or DIALECT_STATEMENTS[self.name].get(name)
        if template is None and not self.sqlite:
            template = SERVER_STATEMENTS[name]
        if template is None:
            raise KeyError(name)
        return self.sql(template)

    def params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Parameters as the driver takes them: JSON columns and objects as JSON text, lists as JSON text on
        SQLite (read with `json_each`) and as arrays on PostgreSQL."""
        out: dict[str, Any] = {}
        for key, value in params.items():
            if key in JSON_COLUMNS or isinstance(value, dict):
                out[key] = value if value is None or isinstance(value, Encoded) else dumps(value)
            elif isinstance(value, (list, tuple)) and self.sqlite:
                out[key] = dumps(list(value))
            else:
                out[key] = value
        return out

    def statements(self, name: str) -> list[str]:
        """The statement `name`, split where it is several (each driver executes one at a time)."""
        return self.statement(name).split("; ")

    # --- statements whose columns vary ------------------------------------------
    def insert(self, table: str, columns: Iterable[str], *, conflict: str | None = None, lease: bool = False,
               deadline: bool = False, returning: bool = False) -> str:
        """INSERT of `columns`; `lease`: `lease_expires_at` too, `{lease}` from now (`:lease_seconds`);
        `deadline`: `deadline_at` too, `{deadline}` from now (`:deadline_seconds`)."""
        slots = {"lease_expires_at": "{lease}"} if lease else {}
        if deadline:
            slots["deadline_at"] = "{deadline}"
        cols = [c for c in columns if c not in slots]
        values = [_value(c) for c in cols]
        cols += slots
        values += slots.values()
        return self.sql(f"INSERT INTO {table} ({', '.join(_q(c) for c in cols)}) VALUES ({', '.join(values)})"
                        + (f" ON CONFLICT {conflict}" if conflict else "") + (" RETURNING *" if returning else ""))

    def update(self, table: str, columns: Iterable[str], key: str, *, stamp: bool = False,
               returning: bool = False) -> str:
        """UPDATE of `columns` where `key` = `:key`; `stamp`: `updated_at` set to `{now}`."""
        sets = [f"{_q(c)} = {_value(c)}" for c in columns if not (stamp and c == "updated_at")]
        if stamp:
            sets.append("updated_at = {now}")
        return self.sql(f"UPDATE {table} SET {', '.join(sets)} WHERE {key} = :{key}"
                        + (" RETURNING *" if returning else ""))

    def reconcile_thread(self, columns: Iterable[str], *, of_run: bool, only_if_busy: bool,
                         returning: bool = False) -> str:
        """The thread status rule, in SQL so that nothing waits for a result: a thread is busy while it has an
        active run, else it takes `:status` (the finisher's: idle, interrupted or error). `only_if_busy`: a
        thread that is not busy and has no active run keeps its status. `of_run`: the thread of `:run_id`.
        `returning`: the thread's status after it."""
        target = "(SELECT thread_id FROM runs WHERE run_id = :run_id)" if of_run else ":thread_id"
        sets = "".join(f"{_q(c)} = {_value(c)}, " for c in columns)
        if "values" in columns or "interrupts" in columns:
            # Stamped here, as its trigger would: on SQLite the trigger writes the whole row (values and all)
            # a second time, once a run.
            sets += "state_updated_at = {now}, "
        guard = f" AND (status = 'busy' OR {_ACTIVE_RUN})" if only_if_busy else ""
        return self.sql(f"UPDATE threads SET {sets}updated_at = {{now}}, status = CASE WHEN {_ACTIVE_RUN} "
                        f"THEN 'busy' ELSE :status END WHERE thread_id = {target}{guard}"
                        + (" RETURNING status" if returning else ""))

    def search(self, table: str, where: str, order: str, columns: str = "*") -> str:
        return self.sql(f"SELECT {columns} FROM {table} {where} ORDER BY {order} LIMIT :limit OFFSET :offset")

    def count(self, table: str, where: str) -> str:
        return self.sql(f"SELECT COUNT(*) AS n FROM {table} {where}")

    def thread_events(self, run_id: bool, method: bool) -> str:
        return self.sql("SELECT * FROM thread_events WHERE thread_id = :thread_id AND seq > :after"
                        + (" AND run_id = :run_id" if run_id else "") + (" AND method = :method" if method else "")
                        + " ORDER BY seq LIMIT :limit")

    def json_equals(self, column: str, key: str, value: Any, name: str) -> tuple[str, dict[str, Any]]:
        """`column`'s top-level `key` equals `value` as JSON (objects whatever the order of their keys): a
        template and its parameters."""
        if not self.sqlite:
            return f"{_pg_field(column, name)} = {{json:{name}}}", {f"{name}_k": key, name: dumps(value)}
        params: dict[str, Any] = {}
        return " AND ".join(_lite_json_equals(_q(column), _path_key("$", key), value, name, params)), params

    def json_contains(self, column: str, key: str, items: list[Any], name: str) -> tuple[str, dict[str, Any]]:
        """`column`'s top-level `key` is a list holding each of `items` (scalars): a template and its parameters."""
        if not self.sqlite:
            field = _pg_field(column, name)
            return (f"(jsonb_typeof({field}) = 'array' AND {field} @> {{json:{name}}})"), {f"{name}_k": key,
                                                                                       name: dumps(items)}
        params: dict[str, Any] = {f"{name}_k": _path_key("$", key)}
        parts = []
        for i, item in enumerate(items):
            params[f"{name}_{i}"] = dumps(item)
            parts.append(f"EXISTS (SELECT 1 FROM json_each({_q(column)}, :{name}_k) AS e WHERE e.type NOT IN "
                         f"('object', 'array') AND json_quote(e.value) = json(:{name}_{i}))")
        return f"(json_type({_q(column)}, :{name}_k) = 'array' AND {' AND '.join(parts)})", params


def _pg_field(column: str, name: str) -> str:
    """PostgreSQL: `column`'s top-level key `:{name}_k` as jsonb. Of a `json` column, `->` reads the text up to
    that key and only the field is made jsonb."""
    field = f"{_q(column)} -> :{name}_k"
    return f"CAST({field} AS jsonb)" if column in TEXT_JSON_COLUMNS else f"({field})"


class Encoded(str):
    """A JSON value already encoded (to encode a large one once where two columns take it)."""


SQLITE = Dialect("sqlite")
POSTGRES = Dialect("postgres")


def statement_names(dialect: DialectName) -> set[str]:
    return set(STATEMENTS) | set(DIALECT_STATEMENTS[dialect])


def where(dialect: Dialect, clauses: list[tuple[str, dict[str, Any]]], *, metadata: dict[str, Any] | None = None,
          values: dict[str, Any] | None = None, filters: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """AND together clauses (templates with their parameters), plus top-level key equality on JSON columns, plus
    an authorization filter on `metadata` (`sql.filter_terms`); a template, for `Dialect.search` or
    `Dialect.count` to render."""
    parts = [c for c, _ in clauses]
    params = {k: v for _, ps in clauses for k, v in ps.items()}
    for column, wanted in (("metadata", metadata), ("values", values)):
        for i, (key, value) in enumerate((wanted or {}).items()):
            sql, ps = dialect.json_equals(column, key, value, f"{column[0]}{i}")
            parts.append(sql)
            params.update(ps)
    for i, (key, op, value) in enumerate(filter_terms(filters)):
        sql, ps = (dialect.json_equals("metadata", key, value, f"f{i}") if op == "$eq"
                   else dialect.json_contains("metadata", key, value, f"f{i}"))
        parts.append(sql)
        params.update(ps)
    return ("WHERE " + " AND ".join(parts) if parts else ""), params


def order_by(sort_by: str, sort_order: str, allowed: set[str], default: str, key: str) -> str:
    """The sort column, ties broken by the table's key in the same direction (the same order on every backend)."""
    col = sort_by if sort_by in allowed else default
    direction = "ASC" if sort_order == "asc" else "DESC"
    return f"{_q(col)} {direction}" + (f", {_q(key)} {direction}" if col != key else "")


def like_pattern(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, its wildcards escaped."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _q(col: str) -> str:
    return f'"{col}"'




def _path_key(path: str, key: str) -> str:
    return f'{path}."{key}"'


def _lite_json_equals(col: str, path: str, value: Any, name: str, params: dict[str, Any]) -> list[str]:
    """SQLite compares JSON as text, where key order and number spelling count: the value is compared
    structurally instead, as PostgreSQL's jsonb compares (an object: its type, its number of keys, each key)."""
    p = f"{name}_{len(params)}"
    params[p] = path
    kind = f"json_type({col}, :{p})"
    if isinstance(value, dict):
        n = f"{p}_n"
        params[n] = len(value)
        parts = [f"{kind} = 'object'", f"(SELECT COUNT(*) FROM json_each({col}, :{p})) = :{n}"]
        for key, item in value.items():
            parts += _lite_json_equals(col, _path_key(path, key), item, name, params)
        return parts
    if isinstance(value, list):
        n = f"{p}_n"
        params[n] = len(value)
        parts = [f"{kind} = 'array'", f"json_array_length({col}, :{p}) = :{n}"]
        for i, item in enumerate(value):
            parts += _lite_json_equals(col, f"{path}[{i}]", item, name, params)
        return parts
    if value is None or isinstance(value, bool):
        return [f"{kind} = '{'null' if value is None else str(value).lower()}'"]
    v = f"{p}_v"
    params[v] = value
    types = "('integer', 'real')" if isinstance(value, (int, float)) else "('text')"
    return [f"{kind} IN {types}", f"json_extract({col}, :{p}) = :{v}"]
