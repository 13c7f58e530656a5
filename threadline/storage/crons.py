"""Every SQL statement on the `crons` table, named and written once in `statements.py`'s template language
(`:name` parameters; `{json:p}`, `{ts:p}`, `{for_update}` slots, filled by `Dialect.sql`), and the two
transactions on it as driver-neutral scripts (`scripts.py`). `SQLStorage`'s `# --- crons` section runs them.

Timestamps are passed as ISO-8601 UTC strings of one format (`core/crons.py: iso`), so SQLite compares them
as text and PostgreSQL as `timestamptz`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

from threadline.errors import NotFound
from threadline.storage.base import Row
from threadline.storage.records import CronRecord
from threadline.storage.scripts import Q, Script
from threadline.storage.statements import Dialect

#: The columns a cron row is written with, in order.
COLUMNS = ("cron_id", "assistant_id", "thread_id", "user_id", "auth_user", "schedule", "timezone", "end_time",
           "enabled", "on_run_completed", "payload", "metadata", "next_run_date", "created_at", "updated_at",
           "identity")
JSON = frozenset({"payload", "metadata", "auth_user"})
TIMES = frozenset({"end_time", "next_run_date", "created_at", "updated_at", "claim_until"})
#: What `search_crons` may sort by (as LangGraph's server).
SORTABLE = {"cron_id", "assistant_id", "thread_id", "created_at", "updated_at", "next_run_date", "end_time"}


def _value(column: str) -> str:
    return f"{{json:{column}}}" if column in JSON else f"{{ts:{column}}}" if column in TIMES else f":{column}"


STATEMENTS = {
    "insert_cron": f"INSERT INTO crons ({', '.join(COLUMNS)}) VALUES ({', '.join(_value(c) for c in COLUMNS)}) "
                   "RETURNING *",
    "get_cron": "SELECT * FROM crons WHERE cron_id = :cron_id",
    "lock_cron": "SELECT * FROM crons WHERE cron_id = :cron_id {for_update}",
    "lock_cron_assistant": "SELECT 1 AS ok FROM assistants WHERE assistant_id = :assistant_id {for_update}",
    "lock_cron_thread": "SELECT 1 AS ok FROM threads WHERE thread_id = :thread_id {for_update}",
    "delete_cron": "DELETE FROM crons WHERE cron_id = :cron_id RETURNING cron_id",
    # The ticks due by now: enabled, not past their end_time, and not held by a live claim of another process.
    "due_crons": "SELECT * FROM crons WHERE enabled AND next_run_date <= {ts:now_at} "
                 "AND (end_time IS NULL OR end_time >= next_run_date) "
                 "AND (claim_until IS NULL OR claim_until < {ts:now_at}) ORDER BY next_run_date LIMIT :limit",
    # Claiming a tick: a conditional update, true for exactly one of the processes that try it (the row's
    # write lock orders them; the loser's WHERE no longer matches once the winner has committed).
    "claim_cron_tick": "UPDATE crons SET claim_until = {ts:until} WHERE cron_id = :cron_id "
                       "AND next_run_date = {ts:tick} AND enabled "
                       "AND (claim_until IS NULL OR claim_until < {ts:now_at}) RETURNING cron_id",
    # After the tick's run exists: the next tick, and the claim released. A PATCH that moved the tick
    # meanwhile wins (the WHERE no longer matches), and its own next_run_date stands.
    "advance_cron": "UPDATE crons SET next_run_date = {ts:next_run_date}, claim_until = NULL "
                    "WHERE cron_id = :cron_id AND next_run_date = {ts:tick} RETURNING cron_id",
    "release_cron_tick": "UPDATE crons SET claim_until = NULL WHERE cron_id = :cron_id AND next_run_date = {ts:tick} "
                         "RETURNING cron_id",
}


def statement(d: Dialect, name: str) -> str:
    return d.sql(STATEMENTS[name])


def update_statement(d: Dialect, columns: list[str]) -> str:
    sets = ", ".join(f"{c} = {_value(c)}" for c in columns)
    return d.sql(f"UPDATE crons SET {sets} WHERE cron_id = :cron_id RETURNING *")


def cron_row(row: Row) -> CronRecord:
    """A row as the contract returns it: JSON columns decoded, `enabled` a bool, without the claim lease."""
    out = dict(row)
    for column in JSON:
        if isinstance(out.get(column), str):
            out[column] = json.loads(out[column])
    out["enabled"] = bool(out.get("enabled"))
    out.pop("claim_until", None)
    return cast("CronRecord", out)


# --- transactions ------------------------------------------------------------------------------
def create_cron(d: Dialect, row: CronRecord) -> Script[CronRecord]:
    """Insert a cron, its assistant and thread locked first: neither can be deleted before it commits, so it
    is never left behind by theirs (which delete their crons)."""
    assistant, thread = yield (Q(statement(d, "lock_cron_assistant"), {"assistant_id": row["assistant_id"]}),
                               Q(statement(d, "lock_cron_thread"), {"thread_id": row.get("thread_id")}))
    if not assistant:
        raise NotFound(f"Assistant {row['assistant_id']} not found")
    if row.get("thread_id") is not None and not thread:
        raise NotFound(f"Thread with ID {row['thread_id']} not found")
    created = yield Q(statement(d, "insert_cron"), {c: row.get(c) for c in COLUMNS})
    return cron_row(created[0])


def update_cron(d: Dialect, cron_id: str, change: Callable[[CronRecord], Row]) -> Script[CronRecord | None]:
    """Read (locked), change and write the cron in one transaction."""
    found = yield Q(statement(d, "lock_cron"), {"cron_id": cron_id})
    if not found:
        return None
    columns = change(cron_row(found[0]))
    if not columns:
        return cron_row(found[0])
    updated = yield Q(update_statement(d, list(columns)), {**columns, "cron_id": cron_id})
    return cron_row(updated[0]) if updated else None


def one_statement(d: Dialect, name: str, params: dict[str, Any]) -> Script[bool]:
    """One named statement as its own transaction: whether it changed (returned) a row."""
    rows = yield Q(statement(d, name), params)
    return bool(rows)
