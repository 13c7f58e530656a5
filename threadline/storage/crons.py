"""Every SQL statement on the `crons` table, written once with slots for what differs between dialects.

`{p}` is the parameter placeholder (`?` for SQLite, `%s` for PostgreSQL) and `{true}` the literal of a true
boolean (`1` / `TRUE`); `Dialect.sql(name)` fills them. Each backend's `# --- crons` section runs these and
decodes rows with `cron_row`. Timestamps are passed as ISO-8601 UTC strings of one format
(`threadline.storage.sql.now_iso`), so SQLite compares them as text and PostgreSQL as `timestamptz`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from threadline.storage.base import Row, SortOrder

#: The columns a cron row is written with, in order.
COLUMNS = ("cron_id", "assistant_id", "thread_id", "user_id", "auth_user", "schedule", "timezone", "end_time", "enabled",
           "on_run_completed", "payload", "metadata", "next_run_date", "created_at", "updated_at")
JSON = frozenset({"payload", "metadata", "auth_user"})
#: What `search_crons` may sort by (as LangGraph's server).
SORTABLE = frozenset({"cron_id", "assistant_id", "thread_id", "created_at", "updated_at", "next_run_date",
                      "end_time"})

STATEMENTS = {
    "insert": f"INSERT INTO crons ({', '.join(COLUMNS)}) VALUES ({', '.join('{p}' for _ in COLUMNS)}) RETURNING *",
    "thread_exists": "SELECT 1 AS ok FROM threads WHERE thread_id = {p}",
    "get": "SELECT * FROM crons WHERE cron_id = {p}",
    "get_for_update": "SELECT * FROM crons WHERE cron_id = {p}{for_update}",
    "delete": "DELETE FROM crons WHERE cron_id = {p}",
    # The ticks due by now: enabled, not past their end_time, and not held by a live claim of another process.
    "due": "SELECT * FROM crons WHERE enabled = {true} AND next_run_date <= {p} "
           "AND (end_time IS NULL OR end_time >= next_run_date) AND (claim_until IS NULL OR claim_until < {p}) "
           "ORDER BY next_run_date LIMIT {p}",
    # Claiming a tick: a conditional update, true for exactly one of the processes that try it (the row's
    # write lock orders them; the loser's WHERE no longer matches once the winner has committed).
    "claim": "UPDATE crons SET claim_until = {p} WHERE cron_id = {p} AND next_run_date = {p} AND enabled = {true} "
             "AND (claim_until IS NULL OR claim_until < {p})",
    # After the tick's run exists: the next tick, and the claim released. A PATCH that moved the tick
    # meanwhile wins (the WHERE no longer matches), and its own next_run_date stands.
    "advance": "UPDATE crons SET next_run_date = {p}, claim_until = NULL WHERE cron_id = {p} AND next_run_date = {p}",
    "release": "UPDATE crons SET claim_until = NULL WHERE cron_id = {p} AND next_run_date = {p}",
}


@dataclass(frozen=True)
class Dialect:
    """What differs between the SQL backends for the crons table."""

    mark: str  # the parameter placeholder
    true: str  # a true boolean literal
    for_update: str  # the row lock of a read in a transaction ("" where the one writer suffices)
    encode_json: Any  # a JSON column's parameter from a Python value
    metadata_key: Any  # the JSON path parameter of a top-level key
    metadata_match: str  # one metadata key's equality, with two `{p}`: the key path, then the value

    def sql(self, name: str, **slots: str) -> str:
        return STATEMENTS[name].format(p=self.mark, true=self.true, for_update=self.for_update, **slots)

    def params(self, row: Row) -> list[Any]:
        """A row's parameters in `COLUMNS` order."""
        return [self.value(c, row.get(c)) for c in COLUMNS]

    def value(self, column: str, value: Any) -> Any:
        if column in JSON and value is not None:
            return self.encode_json(value)
        if column == "enabled" and self.true == "1":
            return int(bool(value))
        return value

    def filters(self, *, assistant_id: str | None, thread_id: str | None, enabled: bool | None,
                metadata: dict[str, Any] | None) -> tuple[str, list[Any]]:
        parts: list[str] = []
        params: list[Any] = []
        for column, wanted in (("assistant_id", assistant_id), ("thread_id", thread_id)):
            if wanted is not None:
                parts.append(f"{column} = {self.mark}")
                params.append(wanted)
        if enabled is not None:
            parts.append(f"enabled = {self.mark}")
            params.append(self.value("enabled", enabled))
        for key, value in (metadata or {}).items():
            parts.append(self.metadata_match.format(p=self.mark))
            params += [self.metadata_key(key), self.encode_json(value)]
        return ("WHERE " + " AND ".join(parts) if parts else ""), params

    def search(self, where: str, sort_by: str | None, sort_order: SortOrder | None) -> str:
        column = sort_by if sort_by in SORTABLE else "created_at"
        direction = "ASC" if sort_order == "asc" else "DESC"
        return (f"SELECT * FROM crons {where} ORDER BY {column} {direction}, cron_id {direction} "
                f"LIMIT {self.mark} OFFSET {self.mark}")

    def count(self, where: str) -> str:
        return f"SELECT COUNT(*) AS n FROM crons {where}"

    def update(self, columns: list[str]) -> str:
        sets = ", ".join(f"{c} = {self.mark}" for c in columns)
        return f"UPDATE crons SET {sets} WHERE cron_id = {self.mark} RETURNING *"


def cron_row(row: Row) -> Row:
    """A row as the contract returns it: JSON columns decoded, `enabled` a bool, without the claim lease."""
    out = dict(row)
    for column in JSON:
        if isinstance(out.get(column), str):
            out[column] = json.loads(out[column])
    out["enabled"] = bool(out.get("enabled"))
    out.pop("claim_until", None)
    return out
