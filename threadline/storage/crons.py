"""The `crons` table's two transactions, as driver-neutral scripts (`scripts.py`), and its rows as the contract
returns them. Its statements are named in the one registry, `statements.py` (`insert_cron`, `due_crons`, …);
`SQLStorage`'s `# --- crons` section runs both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

from threadline.errors import NotFound
from threadline.storage.base import Row
from threadline.storage.records import CronRecord
from threadline.storage.scripts import Q, Script
from threadline.storage.statements import CRON_COLUMNS, Dialect

#: The columns stored as JSON, decoded when a row is read (`cron_row`).
JSON = frozenset({"payload", "metadata", "auth_user"})
#: What `search_crons` may sort by (as LangGraph's server).
SORTABLE = {"cron_id", "assistant_id", "thread_id", "created_at", "updated_at", "next_run_date", "end_time"}


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
    assistant, thread = yield (Q(d.statement("lock_cron_assistant"), {"assistant_id": row["assistant_id"]}),
                               Q(d.statement("lock_cron_thread"), {"thread_id": row.get("thread_id")}))
    if not assistant:
        raise NotFound(f"Assistant {row['assistant_id']} not found")
    if row.get("thread_id") is not None and not thread:
        raise NotFound(f"Thread with ID {row['thread_id']} not found")
    created = yield Q(d.statement("insert_cron"), {c: row.get(c) for c in CRON_COLUMNS})
    return cron_row(created[0])


def update_cron(d: Dialect, cron_id: str, change: Callable[[CronRecord], Row]) -> Script[CronRecord | None]:
    """Read (locked), change and write the cron in one transaction."""
    found = yield Q(d.statement("lock_cron"), {"cron_id": cron_id})
    if not found:
        return None
    columns = change(cron_row(found[0]))
    if not columns:
        return cron_row(found[0])
    updated = yield Q(d.update("crons", list(columns), "cron_id", returning=True), {**columns, "cron_id": cron_id})
    return cron_row(updated[0]) if updated else None


def one_statement(d: Dialect, name: str, params: dict[str, Any]) -> Script[bool]:
    """One named statement as its own transaction: whether it changed (returned) a row."""
    rows = yield Q(d.statement(name), params)
    return bool(rows)
